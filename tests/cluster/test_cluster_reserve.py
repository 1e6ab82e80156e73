"""``reserve`` from a cluster client: the reservation is made on the agent's worker and
settled there; the client reads how from the session's log. Real redis-server, a real
worker in this process (the ``gated`` loop from tests/gated_loops.py, the shell tool for
``sleep``)."""

from __future__ import annotations

import functools
import signal

import pytest
import trio
from cluster_workers import until_event

from actors import InvalidReservationError
from loopdock import Runtime
from loopdock._worker import run_worker
from runtime._messages import ProducerSource, user_message
from runtime.tools import ShellPolicy

PRODUCER = ProducerSource(kind="test-producer")


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w", config={"loopPackages": ["gated_loops"]}, shards=4,
        worker_id="w", shell=ShellPolicy(allow=frozenset({"sleep"}))))


async def test_a_reservation_on_an_idle_agent_is_admitted(redis_server, worker):
    with trio.fail_after(30):
        async with Runtime.open(cluster=redis_server.url) as rt:
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
        async with Runtime.open(cluster=redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r2", loop="gated")
            reservation = handle.agent.reserve(user_message("work over the weekend", source=PRODUCER))
            assert await reservation.wait() == "rejected"
            await handle.agent.wait_idle()
    assert reservation.reason == "not on weekends"


async def test_a_persons_message_cancels_a_reservation_not_yet_admitted(redis_server, worker):
    with trio.fail_after(30):
        async with Runtime.open(cluster=redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r3", loop="gated")
            handle.agent.followup('call: shell {"command": "sleep 1"}')  # the agent is busy meanwhile
            await until_event(handle.agent, lambda e: e.type == "tool/call")
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
    from runtime._serde import message_to_wire
    from runtime.cluster import InboxMessage
    from runtime.cluster import _keys as keys

    with trio.fail_after(30):
        async with Runtime.open(cluster=redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r4", loop="gated")
            with pytest.raises(InvalidReservationError):
                handle.agent.reserve(user_message("a person's words"))
            odd = user_message("odd placement", source=PRODUCER)
            rt.post(InboxMessage(odd.id, "reserve", "r4", {"message": message_to_wire(odd), "placement": "sideways"},
                                 "auto"))
            handle.agent.followup("after it")
            await handle.agent.wait_idle()
            # Dropped without a trace in the log: recorded as done, so never delivered again.
            while odd.id not in await rt._redis.smembers(keys.done("r4")):
                await trio.sleep(0.01)
            events = await rt.read_events("r4")
    assert [e.data["content"][0]["text"] for e in events if e.type == "user/message"] == ["after it"]


async def test_a_reservation_queued_on_a_worker_killed_mid_turn_is_settled_by_the_next_owner(
    redis_server, tmp_path, nursery
):
    from cluster_workers import start_worker

    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with Runtime.open(cluster=redis_server.url) as rt:
            handle = await rt.create_agent(session_id="k1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/call")
            reservation = handle.agent.reserve(user_message("automatic work", source=PRODUCER))
            await until_event(handle.agent, lambda e: e.type == "agent/inbox/spliced"
                         and e.data.get("messageId") == reservation.message.id)
            a.signal(signal.SIGKILL)
            await a.process.wait()
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            assert await reservation.wait() == "admitted"  # delivered again, once, to the new owner
            await handle.agent.wait_idle()
            events = await rt.read_events("k1")
            await b.stop()
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["interrupted", "completed"]
    assert [e.data["id"] for e in events if e.type == "user/message"][-1:] == [reservation.message.id]
