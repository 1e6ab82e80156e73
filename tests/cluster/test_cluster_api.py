"""The cluster's API from a harness process, against a real redis-server and a worker."""

from __future__ import annotations

import functools

import pytest
import trio

from loopdock import Runtime
from loopdock._worker import run_worker


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w1", shards=4, lease_ttl=2.0, worker_id="w1"))


async def test_an_agent_created_through_the_cluster_answers_and_its_log_is_in_redis(redis_server, worker):
    with trio.fail_after(30):
        async with Runtime.open(cluster=redis_server.url) as rt:
            handle = await rt.create_agent(session_id="a1", loop="minimal-first")
            sent = handle.agent.followup("hello there")
            await handle.agent.wait_idle()
            events = await rt.read_events("a1")
    types = [e.type for e in events]
    assert types.count("turn/start") == 1 and types.count("turn/end") == 1
    user = [e for e in events if e.type == "user/message"]
    assert [e.data["id"] for e in user] == [sent.id]
    assert any(e.type == "assistant/message" for e in events)
    end = [e for e in events if e.type == "turn/end"][0]
    assert end.data["reason"]["kind"] == "completed"
    assert [e.seq for e in events] == list(range(len(events)))
