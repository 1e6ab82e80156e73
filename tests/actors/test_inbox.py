"""Inbox ordering and priority invariants, property-tested against a model of the queue.

Every check reads the real ``Inbox`` (its two queues), never the model alone: the model
only says what the inbox should hold and in which order messages arrived."""

from hypothesis import given
from hypothesis import strategies as st

from loopdock import Message, ProducerSource, TextBlock, user_message
from loopdock.actors._inbox import Entry, Inbox, Reservation

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.booleans(), st.sampled_from(["followup", "steer", "inject"]), st.booleans()),
        st.tuples(st.just("turn")),
        st.tuples(st.just("step")),
    ),
    max_size=60,
)


def make(n: int, human: bool, placement: str, reserved: bool) -> Entry:
    if human:
        message = user_message(f"h{n}")
        return Entry(message, placement)
    message = Message("user", (TextBlock(f"a{n}"),), ProducerSource("test-driver"))
    return Entry(message, placement, Reservation(message, placement) if reserved else None)


def ids(entries) -> list[int]:
    return [id(e) for e in entries]


@given(ops)
def test_inbox_invariants(operations):
    inbox = Inbox()
    queued: list[Entry] = []  # model: every entry in arrival order
    arrival: dict[int, int] = {}  # id(entry) -> when it arrived
    for n, op in enumerate(operations):
        if op[0] == "add":
            _, human, placement, reserved = op
            entry = make(n, human, placement, reserved and not human)
            arrival[id(entry)] = n
            displaced = inbox.add(entry)
            if human:
                expected = [e for e in queued if e.reservation is not None]
                assert {id(e) for e in displaced} == {id(e) for e in expected}
                assert all(e.reservation is not None for e in displaced)
                queued = [e for e in queued if e.reservation is None]
                # The inbox itself holds no reservation any more, in either queue.
                assert [e for e in inbox.entries() if e.reservation is not None] == []
            else:
                assert displaced == []
            queued.append(entry)
        elif op[0] == "turn":
            turn_queue = [e for e in queued if e.placement == "followup"]
            taken = inbox.take_turn()
            humans = [e for e in turn_queue if e.human]
            expected = humans[0] if humans else (turn_queue[0] if turn_queue else None)
            assert taken is expected
            if taken is not None:
                queued.remove(taken)
        else:
            step_queue = [e for e in queued if e.placement != "followup"]
            taken = inbox.take_step()
            # Humans first, FIFO inside each class.
            assert ids(taken) == ids([e for e in step_queue if e.human] + [e for e in step_queue if not e.human])
            assert not inbox.has_step_input()
            queued = [e for e in queued if e.placement == "followup"]
        # The real queues hold exactly what the model says, each in arrival order.
        assert ids(inbox.next_turn) == ids(e for e in queued if e.placement == "followup")
        assert ids(inbox.next_step) == ids(e for e in queued if e.placement != "followup")
        # No reservation in the inbox arrived before a human message that is in it too.
        held = inbox.entries()
        last_human = max((arrival[id(e)] for e in held if e.human), default=-1)
        assert all(arrival[id(e)] > last_human for e in held if e.reservation is not None)
        assert inbox.has_human() == any(e.human for e in queued)
        assert len(inbox) == len(queued)
        assert inbox.has_wakeable() == any(e.placement in ("followup", "steer") for e in queued)
