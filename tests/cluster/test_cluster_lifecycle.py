"""A worker passivates its idle agents and activates them on their next message; a
takeover resumes only the sessions that were not passivated (docs/cluster.md,
"Passivation").

Rules: a real redis-server per test, loopback only, an absolute ``fail_after`` on every
test. The clock is the real one, with short ``passivate_after`` values: a worker in this
process waits on Redis, and trio's autojump clock would jump its leases' local expiry
past every renewal while it does. Nothing sleeps to synchronise: the tests wait on the
lifecycle's notifications, the worker's log lines, the client's ``wait_idle`` and events.
"""

from __future__ import annotations

import functools
import re

import trio
from cluster_workers import start_worker, until_event

from loopdock import open_cluster
from loopdock._worker import run_worker
from loopdock.runtime._messages import ProducerSource, user_message
from loopdock.runtime.cluster import keys

SLEEP_CALL = 'call: shell {"command": "sleep 30"}'
#: What one turn of ``minimal-first`` on a plain message logs, from the message on.
TURN = ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "step/start", "user/message", "request/header",
        "assistant/message", "step/end", "turn/end"]


async def _sets(rt, session_id: str) -> tuple[bool, bool]:
    """Whether ``session_id`` is in its shard's live set, and in its passive set."""
    shard = keys.shard_of(session_id, rt.shards)
    return (bool(await rt._redis.sismember(keys.live(shard), session_id)),
            bool(await rt._redis.sismember(keys.passive(shard), session_id)))


def _turn(events, message_id: str) -> list:
    """The events of the turn that took ``message_id``, from its splice to its end."""
    start = next(i for i, e in enumerate(events)
                 if e.type == "agent/inbox/spliced" and e.data["messageId"] == message_id)
    end = next(i for i, e in enumerate(events) if i > start and e.type == "turn/end")
    return events[start : end + 1]


async def test_an_idle_agent_is_passivated_and_its_next_message_brings_it_back(redis_server, tmp_path, nursery):
    with trio.fail_after(60):
        worker = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "w", shards=4, lease_ttl=2.0, worker_id="w",
            passivate_after=0.3))
        lifecycle = worker.runtime.supervisor.lifecycle
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="p1", loop="minimal-first")
            first = handle.agent.followup("first")
            await handle.agent.wait_idle()
            await lifecycle.wait_until(lambda: lifecycle.passivations == 1)
            assert "p1" not in worker.host.handles and "p1" not in worker.runtime.supervisor.agents
            assert "p1" not in worker.ownership.active
            assert await _sets(rt, "p1") == (True, True)  # still live (the console lists it), passivated
            before = await rt.read_events("p1")
            second = handle.agent.followup("second")
            await handle.agent.wait_idle()
            events = await rt.read_events("p1")
            assert await _sets(rt, "p1") == (True, False)
            assert "p1" in worker.host.handles
            assert (await rt.live_sessions()) == {"p1"}
    assert events[: len(before)] == before
    # Passivating and activating wrote nothing: what came after is the second turn only.
    added = events[len(before) :]
    assert [e.type for e in added] == TURN
    assert [e.type for e in _turn(events, first.id)] == TURN
    [message] = [e for e in added if e.type == "user/message"]
    assert message.data["id"] == second.id and message.data["content"][0]["text"] == "second"
    assert added[-1].data["reason"]["kind"] == "completed"
    assert [e.seq for e in events] == list(range(len(events)))


async def test_messages_racing_with_a_passivation_are_processed_once_and_in_order(
    redis_server, tmp_path, nursery, monkeypatch
):
    with trio.fail_after(60):
        worker = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "w", shards=4, lease_ttl=10.0, worker_id="w",
            passivate_after=3600))  # passivated below, by the lifecycle's own call
        host, lifecycle = worker.host, worker.runtime.supervisor.lifecycle
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r1", loop="minimal-first")
            handle.agent.followup("before")
            await handle.agent.wait_idle()
            automatic = ProducerSource(kind="test-producer")
            sent: list = []
            reader_waits = trio.Event()
            disposed, set_op = host._disposed, host._set_op

            async def waiting_for_the_passivation(session_id):
                if session_id == "r1":
                    reader_waits.set()
                await disposed(session_id)

            async def messages_come_meanwhile(token, session_id, op):
                # The agent is disposed, its session not marked passivated yet: the
                # messages sent now are read, and their activation waits for the mark.
                if op == "passive":
                    sent.extend(handle.agent.followup(f"person {i}") for i in range(3))
                    sent.extend(handle.agent.followup(user_message(f"automatic {i}", source=automatic))
                                for i in range(2))
                    await rt.wait_sent()
                    await reader_waits.wait()
                return await set_op(token, session_id, op)

            monkeypatch.setattr(host, "_disposed", waiting_for_the_passivation)
            monkeypatch.setattr(host, "_set_op", messages_come_meanwhile)
            agent = host.handles["r1"].agent
            await agent.wait_idle()  # the worker's own agent: its turn is over there too
            assert await lifecycle.passivate(agent)
            await handle.agent.wait_idle()
            events = await rt.read_events("r1")
            # Marked, then unmarked by the activation: a takeover would resume it.
            assert await _sets(rt, "r1") == (True, False)
            assert "r1" in host.handles
    ids = [e.data["id"] for e in events if e.type == "user/message"][1:]
    assert ids == [m.id for m in sent]  # each once; people's in order, then the automatic ones in order
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"] * 6
    assert [e.seq for e in events] == list(range(len(events)))


async def _taken_over(worker, shards: int) -> dict[int, int]:
    """shard -> how many sessions ``worker`` resumed taking it over, once it took all."""
    resumed = {}
    for shard in range(shards):
        line = await worker.until(rf"shard taken over' shard={shard} resumed=\d+")
        resumed[shard] = int(re.search(r"resumed=(\d+)", line).group(1))
    return resumed


async def test_a_takeover_after_kill_9_resumes_the_interrupted_turn_not_the_passivated_agents(
    redis_server, tmp_path, nursery
):
    import signal

    idle = [f"q{i}" for i in range(6)]
    with trio.fail_after(120):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a", passivate_after=0.5)
        async with open_cluster(redis_server.url) as rt:
            handles = {s: await rt.create_agent(session_id=s, loop="minimal-first") for s in idle}
            firsts = {s: h.agent.followup("first") for s, h in handles.items()}
            for h in handles.values():
                await h.agent.wait_idle()
            for session_id in idle:
                await a.until(f"agent passivated' session='{session_id}'")
            busy = await rt.create_agent(session_id="busy", loop="minimal-first")
            busy.agent.followup(SLEEP_CALL)
            await until_event(busy.agent, lambda e: e.type == "tool/started")
            a.signal(signal.SIGKILL)
            await a.process.wait()
            assert [await _sets(rt, s) for s in idle] == [(True, True)] * len(idle)
            assert await _sets(rt, "busy") == (True, False)

            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            resumed = await _taken_over(b, rt.shards)
            # The interrupted turn was resumed at once (no message was sent to it): it
            # goes on from its last durable step, and asks whether to run the cut call again.
            [again] = await busy.agent.wait_approvals()
            assert "may have run" in again.reason
            # Not one of the passivated sessions was: each is still marked passivated.
            assert sum(resumed.values()) == 1 and resumed[keys.shard_of("busy", rt.shards)] == 1
            assert [await _sets(rt, s) for s in idle] == [(True, True)] * len(idle)

            later = handles["q3"].agent.followup("after the takeover")
            await handles["q3"].agent.wait_idle()
            await again.answer("refuse", reason="it ran long enough")
            await busy.agent.wait_idle()
            q3 = await rt.read_events("q3")
            busy_events = await rt.read_events("busy")
            assert await _sets(rt, "q3") == (True, False)
            assert [await _sets(rt, s) for s in idle if s != "q3"] == [(True, True)] * (len(idle) - 1)
            await b.stop()
    assert [e.data["id"] for e in q3 if e.type == "user/message"] == [firsts["q3"].id, later.id]
    assert [e.type for e in _turn(q3, later.id)] == TURN
    assert [e.data["reason"]["kind"] for e in q3 if e.type == "turn/end"] == ["completed", "completed"]
    assert [e.data["reason"]["kind"] for e in busy_events if e.type == "turn/end"] == ["completed"]


async def test_a_stopping_worker_passivates_its_quiescent_agents_for_the_next_owner(redis_server, tmp_path, nursery):
    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")  # passivate_after: 300 s
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="s1", loop="minimal-first")
            handle.agent.followup("first")
            await handle.agent.wait_idle()
            assert await _sets(rt, "s1") == (True, False)  # active
            await a.stop()  # hands its shards back: the idle agent is passivated, not just disposed
            assert await _sets(rt, "s1") == (True, True)
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            assert sum((await _taken_over(b, rt.shards)).values()) == 0
            later = handle.agent.followup("second")
            await handle.agent.wait_idle()
            events = await rt.read_events("s1")
            await b.stop()
    assert [e.type for e in _turn(events, later.id)] == TURN
