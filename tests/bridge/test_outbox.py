"""The outgoing queue on pure values: order, batching limits, bounded size, and the budget
the queues of one server share."""

import json
import sys

import pytest

from loopdock.bridge import Outbox, OutboxBudget


def item(n, pad=0):
    return json.dumps({"n": n, "pad": "x" * pad}, separators=(",", ":"))


def items_of(frame):
    decoded = json.loads(frame)
    return decoded["type"], [entry["n"] for entry in decoded["data"]["items"]]


def test_frames_go_before_event_items():
    box = Outbox()
    box.put_item("events", item(1))
    box.put_frame('{"welcome":1}')
    assert box.take() == '{"welcome":1}'
    assert items_of(box.take()) == ("events", [1])
    assert box.take() is None


def test_many_items_leave_in_few_frames_in_order():
    box = Outbox(batch_items=10)
    for n in range(25):
        assert box.put_item("events", item(n))
    batches = [items_of(box.take()) for _ in range(3)]
    assert batches == [("events", list(range(10))), ("events", list(range(10, 20))), ("events", list(range(20, 25)))]
    assert box.take() is None and len(box) == 0 and box.size == 0


def test_a_batch_stops_at_the_byte_budget_but_an_oversized_item_still_goes():
    box = Outbox(batch_bytes=100)
    for n in range(3):
        box.put_item("events", item(n, pad=40))  # about 55 characters each
    box.put_item("events", item(3, pad=500))
    assert items_of(box.take()) == ("events", [0])
    assert items_of(box.take()) == ("events", [1])
    assert items_of(box.take()) == ("events", [2])
    assert items_of(box.take()) == ("events", [3])  # alone, over budget: never stuck


def test_a_batch_never_mixes_kinds_and_keeps_their_interleaving():
    box = Outbox()
    for n, kind in enumerate(["events", "events", "live", "events"]):
        box.put_item(kind, item(n))
    assert [items_of(box.take()) for _ in range(3)] == [("events", [0, 1]), ("live", [2]), ("events", [3])]


def test_a_full_outbox_refuses_without_waiting():
    box = Outbox(max_items=3, max_bytes=1000)
    assert all(box.put_item("events", item(n)) for n in range(3))
    assert not box.put_item("events", item(3))
    assert not box.put_frame("{}")
    box.take()  # draining makes room again
    assert box.put_frame("{}")


def test_the_byte_bound_counts_too():
    text = item(0, pad=30)
    box = Outbox(max_items=100, max_bytes=sys.getsizeof(text) + 10)
    assert box.put_item("live", text)
    assert not box.put_item("live", item(1, pad=30))
    assert len(box) == 1


def test_bytes_are_memory_not_characters():
    # One character outside Latin-1 makes Python store every character of the text in
    # 2 or 4 bytes: a queue of such text costs the server that much.
    ascii_text, wide_text = "x" * 1000, "\U0001f600" * 1000
    box = Outbox()
    box.put_frame(ascii_text)
    narrow = box.size
    box.put_frame(wide_text)
    assert narrow >= 1000 and box.size - narrow >= 4000
    box.take()
    box.take()
    assert box.size == 0


# -- the budget the outboxes of one server share -------------------------------------------------


def test_within_the_budget_every_outbox_takes_its_fill():
    budget = OutboxBudget(10_000)
    boxes = [Outbox(budget=budget) for _ in range(3)]
    for box in boxes:
        assert box.put_frame("x" * 2000)
    assert budget.used == sum(box.size for box in boxes) <= 10_000
    for box in boxes:
        box.take()
    assert budget.used == 0


def test_past_the_budget_the_outbox_holding_the_most_is_emptied_and_told():
    budget = OutboxBudget(10_000)
    evicted = []
    small, big, other = (Outbox(budget=budget) for _ in range(3))
    for name, box in [("small", small), ("big", big), ("other", other)]:
        box.on_evicted = lambda name=name: evicted.append(name)
    assert big.put_frame("x" * 5000)
    assert small.put_frame("x" * 2000)
    assert other.put_frame("x" * 2000)
    assert other.put_frame("x" * 2000)  # past the budget: big holds the most
    assert evicted == ["big"]
    assert (big.size, len(big), budget.used) == (0, 0, small.size + other.size)
    assert not big.put_frame("{}")  # an evicted outbox takes nothing more
    assert len(budget) == 2


def test_an_outbox_that_would_hold_the_most_is_refused_itself():
    budget = OutboxBudget(10_000)
    evicted = []
    first, second = Outbox(budget=budget), Outbox(budget=budget)
    for box in (first, second):
        box.on_evicted = lambda box=box: evicted.append(box)
    assert first.put_frame("x" * 4000)
    assert second.put_frame("x" * 4000)
    assert not second.refused_by_budget
    assert not second.put_frame("x" * 3000)  # it would hold 7000: the offender is itself
    assert second.refused_by_budget
    assert not first.put_frame("x" * 20_000)  # more than the whole budget: evicts nobody
    assert evicted == [] and budget.used == first.size + second.size


def test_on_a_tie_the_newest_outbox_is_the_offender():
    budget = OutboxBudget(10_000)
    evicted = []
    boxes = [Outbox(budget=budget) for _ in range(3)]
    for n, box in enumerate(boxes):
        box.on_evicted = lambda n=n: evicted.append(n)
    boxes[0].put_frame("x" * 4000)
    boxes[1].put_frame("x" * 4000)
    assert boxes[2].put_frame("x" * 1000)
    assert boxes[2].put_frame("x" * 1000)
    assert evicted == [1]


def test_a_closed_outbox_gives_its_bytes_back_and_leaves():
    budget = OutboxBudget(10_000)
    box = Outbox(budget=budget)
    box.put_item("events", item(1, pad=3000))
    box.close()
    assert (budget.used, len(budget), box.size, len(box)) == (0, 0, 0, 0)
    assert not box.put_frame("{}") and box.take() is None
    alone = Outbox()
    alone.close()
    assert not alone.put_frame("{}")


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        Outbox(batch_items=0)
