"""Inbox ordering and priority invariants, property-tested."""

from hypothesis import given
from hypothesis import strategies as st

from actors._inbox import Entry, Inbox, Reservation
from loopdock import Message, ProducerSource, TextBlock, user_message

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


@given(ops)
def test_inbox_invariants(operations):
    inbox = Inbox()
    queued: list[Entry] = []  # model: every entry in arrival order
    for n, op in enumerate(operations):
        if op[0] == "add":
            _, human, placement, reserved = op
            entry = make(n, human, placement, reserved and not human)
            displaced = inbox.add(entry)
            if human:
                expected = [e for e in queued if e.reservation is not None]
                assert {id(e) for e in displaced} == {id(e) for e in expected}
                assert all(e.reservation is not None for e in displaced)
                queued = [e for e in queued if e.reservation is None]
            else:
                assert displaced == []
            queued.append(entry)
            # No reservation survives a human message that arrived after it.
            last_human = max((i for i, e in enumerate(queued) if e.human), default=-1)
            assert all(e.reservation is None for e in queued[: max(last_human, 0)])
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
            assert taken == [e for e in step_queue if e.human] + [e for e in step_queue if not e.human]
            queued = [e for e in queued if e.placement == "followup"]
        assert len(inbox) == len(queued)
        assert inbox.has_wakeable() == any(e.placement in ("followup", "steer") for e in queued)
