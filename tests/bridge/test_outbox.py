"""The outgoing queue on pure values: order, batching limits, and bounded size."""

import json

import pytest

from bridge import Outbox


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
    box = Outbox(max_items=100, max_bytes=60)
    assert box.put_item("live", item(0, pad=30))
    assert not box.put_item("live", item(1, pad=30))
    assert len(box) == 1


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        Outbox(batch_items=0)
