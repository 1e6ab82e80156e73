"""``reserve`` from a cluster client: the reservation is made on the agent's worker and
settled there; the client reads how from the session's log. Real redis-server, a real
worker in this process (the ``gated`` loop from tests/gated_loops.py, the shell tool for
``sleep``)."""

from __future__ import annotations

import functools
import signal
from contextlib import asynccontextmanager

import pytest
import trio
from cluster_workers import until_event

from loopdock import open_cluster
from loopdock._worker import run_worker
from loopdock.actors import InvalidReservationError
from loopdock.runtime._messages import ProducerSource, user_message
from loopdock.runtime.cluster import keys
from loopdock.runtime.tools import ShellPolicy

PRODUCER = ProducerSource(kind="test-producer")


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w", config={"loopPackages": ["gated_loops"]}, shards=4,
        worker_id="w", shell=ShellPolicy(allow=frozenset({"sleep"}))))


async def _busy(agent) -> None:
    """Keep ``agent`` in a turn for about a second (a shell ``sleep``), from its tool call on."""
    agent.followup('call: shell {"command": "sleep 1"}')
    await until_event(agent, lambda e: e.type == "tool/call")


@asynccontextmanager
async def _written_in_one_read(rt, monkeypatch, *, human_first=False):
    """What the client posts in the block is held back, then written in one transaction:
    the worker's next read brings all of it (``human_first``: the people's lane's entries
    first, as a worker takes them when both lanes have some). Yields what was posted."""
    posted = []
    sent = trio.Event()
    sent.set()
    with monkeypatch.context() as patch:
        patch.setattr(rt, "post", lambda message: posted.append(message) or sent)
        yield posted
    order = sorted(posted, key=lambda m: m.lane != "human") if human_first else posted
    async with rt._redis.pipeline(transaction=True) as pipe:
        for message in order:
            pipe.xadd(keys.inbox(keys.shard_of(message.session, rt.shards), message.lane), message.to_fields())


async def test_a_reservation_on_an_idle_agent_is_admitted(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r1", loop="gated")
            reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            assert reservation.state == "pending"
            assert await reservation.wait() == "admitted"
            await handle.agent.wait_idle()
            events = await rt.read_events("r1")
    assert [e.data["id"] for e in events if e.type == "user/message"] == [reservation.message.id]
    assert reservation.reason is None


async def test_a_vetoed_reservation_is_rejected_with_the_listeners_reason(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r2", loop="gated")
            reservation = handle.agent.reserve(user_message("work over the weekend", source=PRODUCER))
            assert await reservation.wait() == "rejected"
            await handle.agent.wait_idle()
    assert reservation.reason == "not on weekends"


async def test_a_persons_message_cancels_a_reservation_not_yet_admitted(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r3", loop="gated")
            await _busy(handle.agent)
            reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            await until_event(handle.agent, lambda e: e.type == "agent/inbox/spliced"
                         and e.data.get("messageId") == reservation.message.id)  # queued on the worker
            person = handle.agent.followup("a person")
            assert await reservation.wait() == "cancelled"
            await handle.agent.wait_idle()
            events = await rt.read_events("r3")
    assert reservation.reason  # why, as the agent recorded it
    assert [e.data["id"] for e in events if e.type == "user/message"][-1] == person.id
    assert reservation.message.id not in {e.data["id"] for e in events if e.type == "user/message"}


async def test_only_a_producer_reserves_and_a_bad_placement_is_dropped(redis_server, worker):
    from loopdock.runtime._serde import message_to_wire
    from loopdock.runtime.cluster import InboxMessage

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r4", loop="gated")
            with pytest.raises(InvalidReservationError):
                handle.agent.reserve(user_message("a person's words"))
            odd = user_message("odd placement", source=PRODUCER)
            rt.post(InboxMessage(odd.id, "reserve", "r4", {"message": message_to_wire(odd), "placement": "sideways"},
                                 "auto"))
            # A program's message, on the auto lane behind the odd one: the worker handles
            # that lane's entries one at a time, in order, so this one reaching the agent
            # means the odd one was settled before it.
            handle.agent.followup(user_message("after it", source=PRODUCER))
            await handle.agent.wait_idle()
            # Dropped without a trace in the log: recorded as done, so never delivered again.
            assert odd.id in await rt._redis.smembers(keys.done("r4"))
            events = await rt.read_events("r4")
    assert [e.data["content"][0]["text"] for e in events if e.type == "user/message"] == ["after it"]


async def test_a_reservation_queued_on_a_worker_killed_mid_turn_is_settled_by_the_next_owner(
    redis_server, tmp_path, nursery
):
    from cluster_workers import start_worker

    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="k1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/started")
            reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            await until_event(handle.agent, lambda e: e.type == "agent/inbox/spliced"
                         and e.data.get("messageId") == reservation.message.id)
            a.signal(signal.SIGKILL)
            await a.process.wait()
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            # The killed turn goes on first; its cut call asks a person (never the reservation).
            [again] = await handle.agent.wait_approvals()
            assert reservation.state == "pending"
            await again.answer("refuse", reason="enough")
            assert await reservation.wait() == "admitted"  # delivered again, once, to the new owner
            await handle.agent.wait_idle()
            events = await rt.read_events("k1")
            await b.stop()
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed", "completed"]
    assert [e.data["id"] for e in events if e.type == "user/message"][-1:] == [reservation.message.id]


async def test_a_reservation_withdrawn_right_after_it_was_sent_is_cancelled_and_never_runs(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="w1", loop="gated")
            await _busy(handle.agent)
            reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            # Sent at once: the worker must not see the withdrawal before the reservation
            # (a person's lane is drained first; a withdrawal rides behind what it withdraws).
            handle.agent.withdraw(reservation, "plans changed")
            assert await reservation.wait() == "cancelled"
            await handle.agent.wait_idle()  # the reservation's message is settled: nothing to wait for
            events = await rt.read_events("w1")
    assert reservation.reason == "plans changed"
    assert reservation.message.id not in {e.data["id"] for e in events if e.type == "user/message"}
    discards = [e.data for e in events if e.type == "agent/inbox/spliced" and e.data.get("op") == "discard"]
    assert [d["messageId"] for d in discards] == [reservation.message.id]
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"]


async def test_withdrawing_an_admitted_reservation_changes_nothing(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="w2", loop="gated")
            first = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            assert await first.wait() == "admitted"
            handle.agent.withdraw(first)
            # The same lane, in order: once the next reservation is settled, the worker has
            # handled the withdrawal before it.
            second = handle.agent.reserve(user_message("more automatic work", source=PRODUCER))
            assert await second.wait() == "admitted"
            await handle.agent.wait_idle()
            events = await rt.read_events("w2")
    assert [e.data["id"] for e in events if e.type == "user/message"] == [first.message.id, second.message.id]
    assert not [e for e in events if e.type == "agent/inbox/spliced" and e.data.get("op") == "discard"]
    assert first.state == "admitted"


async def test_a_withdrawal_is_never_handled_before_the_reservation_it_withdraws(
    redis_server, worker, monkeypatch
):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="w3", loop="gated")
            await _busy(handle.agent)
            # People's lane first, each lane in order, as a worker takes them: the test
            # does not depend on how Redis serves a read blocked on two streams.
            async with _written_in_one_read(rt, monkeypatch, human_first=True) as posted:
                reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
                handle.agent.withdraw(reservation, "plans changed")
            assert await reservation.wait() == "cancelled"
            await handle.agent.wait_idle()
            events = await rt.read_events("w3")
    assert [m.kind for m in posted] == ["reserve", "withdraw"]
    assert reservation.message.id not in {e.data["id"] for e in events if e.type == "user/message"}


async def test_a_withdrawal_sent_while_the_worker_is_dead_settles_the_reservation_once(redis_server, tmp_path, nursery):
    from cluster_workers import start_worker

    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="k2", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/started")
            reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            await until_event(handle.agent, lambda e: e.type == "agent/inbox/spliced"
                         and e.data.get("messageId") == reservation.message.id)
            a.signal(signal.SIGKILL)
            await a.process.wait()
            handle.agent.withdraw(reservation, "plans changed")
            await rt.wait_sent()
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            # The next owner continues the killed turn first: its cut call may have run.
            [again] = await handle.agent.wait_approvals()
            await again.answer("refuse", reason="enough")
            # It gets the reservation again (reclaimed entries before new ones), and the
            # agent, idle after the turn, may admit it before the withdrawal is read.
            # Whichever way it went: once, and the log says the same.
            state = await reservation.wait()
            await handle.agent.wait_idle()
            events = await rt.read_events("k2")
            await b.stop()
    admitted = [e for e in events if e.type == "user/message" and e.data["id"] == reservation.message.id]
    discarded = [e for e in events if e.type == "agent/inbox/spliced" and e.data.get("op") == "discard"
                 and e.data.get("messageId") == reservation.message.id]
    assert (state, len(admitted), len(discarded)) in {("admitted", 1, 0), ("cancelled", 0, 1)}
    if state == "cancelled":
        assert reservation.reason == "plans changed"


async def test_a_reservation_and_its_withdrawal_read_together_reach_the_agent_together(
    redis_server, worker, monkeypatch
):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="w4", loop="gated")  # idle: it would run at once
            # The worker hands the whole batch to the agents before any of them runs, so
            # the withdrawal finds the reservation still queued (handled one at a time,
            # with a round trip to Redis in between, the idle agent admitted it first).
            async with _written_in_one_read(rt, monkeypatch):
                reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
                handle.agent.withdraw(reservation, "plans changed")
            assert await reservation.wait() == "cancelled"
            await handle.agent.wait_idle()
            events = await rt.read_events("w4")
    assert reservation.reason == "plans changed"
    assert not [e for e in events if e.type == "turn/start"]


async def test_nothing_a_batch_awaits_lets_an_agent_admit_a_reservation_withdrawn_in_it(
    redis_server, worker, monkeypatch
):
    from loopdock.runtime._ids import MESSAGE_IDS
    from loopdock.runtime._serde import message_to_wire
    from loopdock.runtime.cluster import InboxMessage

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            a = await rt.create_agent(session_id="w5", loop="gated")  # idle: it would run at once
            earlier = a.agent.followup(user_message("earlier", source=PRODUCER))
            await a.agent.wait_idle()
            b = await rt.create_agent(session_id="w6", loop="gated")
            await b.dispose()  # not live: a message to it activates it first
            async with _written_in_one_read(rt, monkeypatch) as posted:
                reservation = a.agent.reserve(user_message("automatic work", source=PRODUCER))
                b.agent.followup(user_message("wake up", source=PRODUCER))  # the auto lane too
                rt.post(InboxMessage(MESSAGE_IDS.new(), "withdraw", "w5", {"message_id": "not-queued"}, "auto"))
                retry = InboxMessage(earlier.id, "followup", "w5", {"message": message_to_wire(earlier)}, "auto")
                rt.post(retry)  # a producer's retry of a message done already
                a.agent.withdraw(reservation, "plans changed")
            # Between the reservation and its withdrawal: an agent to activate, a
            # withdrawal to settle, a duplicate to drop. None may let the idle agent run.
            assert await reservation.wait() == "cancelled"
            await b.agent.wait_idle()
            await a.agent.wait_idle()
            b_events = await rt.read_events("w6")
            a_events = await rt.read_events("w5")
            auto = keys.inbox(keys.shard_of("w5", rt.shards), "auto")
            # The withdrawals settle after, in the worker's background: only Redis's consumer
            # group shows it, and Redis tells nobody when an entry is acknowledged.
            while (await rt._redis.xpending(auto, keys.GROUP)).pending:  # noqa: ASYNC110 - Redis state, no notification
                await trio.sleep(0.01)
    assert [m.lane for m in posted] == ["auto"] * 5
    assert [e.data["reason"]["kind"] for e in b_events if e.type == "turn/end"] == ["completed"]
    assert [e.data["id"] for e in a_events if e.type == "user/message"] == [earlier.id]  # the retry dropped
