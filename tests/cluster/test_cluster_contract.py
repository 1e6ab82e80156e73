"""The ``Agent`` contract on a cluster agent (``RemoteAgent``), where it differed from the
embedded agent's: a message its worker refuses is an error the sender sees at
``wait_idle`` (it used to wait forever), ``inject("text")`` is a person's message for
the next step that wakes nobody, and ``cancel`` carries its cause. Against a real
redis-server and a worker in this process; every wait is bounded by ``trio.fail_after``."""

from __future__ import annotations

import functools

import pytest
import trio
from cluster_workers import until_event

from loopdock import MessageRefusedError, open_cluster
from loopdock._worker import run_worker
from loopdock.runtime._messages import ProducerSource, user_message
from loopdock.runtime.cluster import keys
from loopdock.runtime.tools import ShellPolicy


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w1", shards=4, lease_ttl=2.0, worker_id="w1",
        shell=ShellPolicy(allow=frozenset({"sleep"}))))


@pytest.mark.parametrize("kind", ["followup", "steer", "inject"])
async def test_a_message_for_a_session_that_cannot_be_activated_is_refused_at_wait_idle(redis_server, worker, kind):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            ghost = rt.get_agent("no-such-session")  # a handle is not checked: the worker refuses
            sent = getattr(ghost, kind)("anyone there?")
            with pytest.raises(MessageRefusedError) as refused:
                await ghost.wait_idle()
            await ghost.wait_idle()  # raised once: nothing else is outstanding
            done = await rt._redis.smembers(keys.done("no-such-session"))
            exists = await rt.store.aexists("no-such-session")
    error = refused.value
    assert (error.code, error.message_id, error.host_code) == ("MESSAGE_REFUSED", sent.id, "SESSION_NOT_FOUND")
    assert "no-such-session" in error.reason
    assert sent.id in done and not exists  # recorded as done (never processed again), nothing made


async def test_a_refusal_goes_to_the_object_that_sent_it_and_the_agent_goes_on(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="r1", loop="minimal-first")
            await handle.dispose()
            await rt._redis.delete([keys.header("r1"), keys.log("r1")])  # the session is gone
            agent = handle.agent
            first = agent.followup("one")
            second = agent.followup("two")
            with pytest.raises(MessageRefusedError) as one:
                await agent.wait_idle()
            with pytest.raises(MessageRefusedError) as two:
                await agent.wait_idle()
            await agent.wait_idle()
            # another object on the same session sent nothing: it has nothing to raise
            await rt.get_agent("r1").wait_idle()
            live = await rt.create_agent(session_id="r2", loop="minimal-first")
            live.agent.followup("still served")
            await live.agent.wait_idle()
            ends = [e.data["reason"]["kind"] for e in await rt.read_events("r2") if e.type == "turn/end"]
    assert [one.value.message_id, two.value.message_id] == [first.id, second.id]  # oldest first
    assert ends == ["completed"]


async def test_a_refused_reservation_settles_cancelled_without_raising(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            ghost = rt.get_agent("nobody")
            reservation = ghost.reserve(user_message("automatic", source=ProducerSource("test-producer")))
            assert await reservation.wait() == "cancelled"
            await ghost.wait_idle()  # a reservation's refusal is its own state, not an error
            other = rt.get_agent("nobody-either")
            unwaited = other.reserve(user_message("automatic", source=ProducerSource("test-producer")))
            await other.wait_idle()  # the agent's wait settles it too
    assert "SESSION_NOT_FOUND" in reservation.reason
    assert unwaited.state == "cancelled" and "SESSION_NOT_FOUND" in unwaited.reason


async def test_inject_text_is_a_persons_message_for_the_next_step_that_wakes_nobody(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="i1", loop="minimal-first")
            agent = handle.agent
            injected = agent.inject("a quiet note")
            inserted = await until_event(agent, lambda e: e.type == "agent/inbox/spliced"
                                         and e.data["messageId"] == injected.id)
            await agent.wait_idle()  # an injected message wakes nobody: nothing to wait for
            woken = agent.followup("now go")
            await agent.wait_idle()
            events = await rt.read_events("i1")
    assert inserted.data["placement"] == "inject" and inserted.data["list"] == "nextStep"
    types = [e.type for e in events]
    assert types.count("turn/start") == 1  # the inject did not open a turn of its own
    users = [e.data for e in events if e.type == "user/message"]
    assert [u["id"] for u in users] == [woken.id, injected.id]  # it entered the woken turn's step
    assert users[1]["source"] == {"kind": "user"}


async def test_cancel_carries_its_cause_to_the_aborted_turn(redis_server, worker):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="c1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/call")
            handle.agent.cancel("the person changed their mind")
            await handle.agent.wait_idle()
            ends = [e.data["reason"] for e in await rt.read_events("c1") if e.type == "turn/end"]
    assert ends == [{"kind": "aborted", "cause": "the person changed their mind"}]
