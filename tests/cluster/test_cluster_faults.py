"""The cluster under faults: real redis-server, real worker processes, loopback only."""

from __future__ import annotations

import json
import signal

import trio
from cluster_workers import start_worker, until_event

from loopdock import open_cluster
from loopdock.runtime._messages import ProducerSource, user_message

SLEEP_CALL = 'call: shell {"command": "sleep 30"}'


async def test_kill_9_mid_turn_moves_the_shard_and_the_next_owner_continues_the_turn(redis_server, tmp_path, nursery):
    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="k1", loop="minimal-first")
            first = handle.agent.followup(SLEEP_CALL)
            await until_event(handle.agent, lambda e: e.type == "tool/started")
            queued = handle.agent.followup("after the crash")
            await rt.wait_sent()
            a.signal(signal.SIGKILL)
            await a.process.wait()
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            # The cut call may have run (shell is not read-only): a person decides.
            [again] = await handle.agent.wait_approvals()
            assert "may have run" in again.reason
            await again.answer("refuse", reason="it ran long enough")
            await handle.agent.wait_idle()
            events = await rt.read_events("k1")
            await b.stop()
    ends = [e.data["reason"]["kind"] for e in events if e.type == "turn/end"]
    assert ends == ["completed", "completed"]  # the killed turn went on, on the next owner
    user_ids = [e.data["id"] for e in events if e.type == "user/message"]
    assert user_ids == [first.id, queued.id]  # each processed once, in order
    assert [e.seq for e in events] == list(range(len(events)))


async def test_a_worker_paused_past_its_lease_cannot_write_after_it_resumes(redis_server, tmp_path, nursery):
    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="p1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 2"}')
            await until_event(handle.agent, lambda e: e.type == "tool/started")
            a.signal(signal.SIGSTOP)
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            # B continues the turn: the call may have run (it is running, paused, on A).
            [again] = await handle.agent.wait_approvals()
            asked = await until_event(handle.agent, lambda e: e.type == "approval/requested")
            # A wakes up after its sleep tool finished: everything it tries to write
            # for that turn must be refused.
            a.signal(signal.SIGCONT)
            await a.until("lease expired locally|lease lost")
            await again.answer("refuse", reason="it ran on the paused worker")
            later = handle.agent.followup("on the new owner")
            await handle.agent.wait_idle()
            events = await rt.read_events("p1")
            await b.stop()
            await a.stop()
    after = events[asked.seq + 1:]
    results = [b["content"] for e in after if e.type == "tool/result" for b in e.data["content"]]
    assert results == ["refused by a person: it ran on the paused worker"], "the paused ex-owner wrote after the takeover"
    assert [e.data["id"] for e in after if e.type == "user/message"] == [later.id]
    assert [e.seq for e in events] == list(range(len(events)))


async def test_workers_reconnect_after_redis_restarts_and_nothing_acknowledged_is_lost(
    redis_server, tmp_path, nursery
):
    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a", ttl=3.0)
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r1", loop="minimal-first")
            handle.agent.followup("before the restart")
            await handle.agent.wait_idle()
            before = await rt.read_events("r1")
            await trio.to_thread.run_sync(redis_server.restart)
            handle.agent.followup("after the restart")
            await handle.agent.wait_idle()
            events = await rt.read_events("r1")
            await a.stop()
    assert events[: len(before)] == before
    texts = [e.data["content"][0]["text"] for e in events if e.type == "user/message"]
    assert texts == ["before the restart", "after the restart"]
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed", "completed"]


async def test_human_input_is_taken_before_automatic_input_after_a_takeover(redis_server, tmp_path, nursery):
    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="h1", loop="minimal-first")
            await a.stop()  # the shard has no owner now: messages wait in its inbox
            automatic = ProducerSource(kind="test-producer")
            injected = [handle.agent.followup(user_message(f"automatic {i}", source=automatic)) for i in range(20)]
            person = handle.agent.followup("a person")
            await rt.wait_sent()
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            await handle.agent.wait_idle()
            events = await rt.read_events("h1")
            await b.stop()
    inserted = [e.data["messageId"] for e in events if e.type == "agent/inbox/spliced" and e.data["op"] == "insert"]
    assert inserted[0] == person.id
    assert sorted(inserted[1:]) == sorted(m.id for m in injected)


async def test_a_message_sent_twice_is_processed_once(redis_server, tmp_path, nursery):
    from loopdock.runtime._serde import message_to_wire
    from loopdock.runtime.cluster import InboxMessage, keys

    with trio.fail_after(60):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            await rt.create_agent(session_id="d1", loop="minimal-first")
            message = user_message("once only")
            wire = InboxMessage(message.id, "followup", "d1", {"message": message_to_wire(message)})
            rt.post(wire)
            rt.post(wire)  # a producer's retry: the same id again
            agent = rt.get_agent("d1")
            await rt.wait_sent()
            await until_event(agent, lambda e: e.type == "turn/end")
            rt.post(wire)  # and once more, after it was processed
            agent.followup("a marker")
            await agent.wait_idle()
            events = await rt.read_events("d1")
            shard = keys.shard_of("d1", rt.shards)
            pending = await rt._redis.xpending(keys.inbox(shard, "human"), keys.GROUP)
            await a.stop()
    assert [e.data["id"] for e in events if e.type == "user/message"].count(message.id) == 1
    assert pending.pending == 0  # every entry was acknowledged, the duplicates too


async def test_a_garbage_inbox_entry_is_dropped_and_the_worker_goes_on(redis_server, tmp_path, nursery):
    from loopdock.runtime.cluster import keys

    with trio.fail_after(60):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="g1", loop="minimal-first")
            stream = keys.inbox(keys.shard_of("g1", rt.shards), "human")
            for fields in ({"x": "y"}, {"id": "1", "kind": "explode", "session": "g1", "body": "{}"},
                           {"id": "2", "kind": "followup", "session": "g1", "body": "[" * 100_000},
                           {"id": "3", "kind": "followup", "session": "g1", "body": json.dumps({"message": 5})}):
                await rt._redis.xadd(stream, fields)
            handle.agent.followup("still here")
            await handle.agent.wait_idle()
            events = await rt.read_events("g1")
            await a.stop()
    assert [e.data["content"][0]["text"] for e in events if e.type == "user/message"] == ["still here"]
