"""Approval questions of cluster agents, seen and answered from a cluster client: against
a real redis-server and real workers (in this process, and as processes for kill -9)."""

from __future__ import annotations

import functools
import json
import signal

import pytest
import trio
import trio.testing
from cluster_workers import start_worker

from loopdock import ApprovalClosedError, open_cluster
from loopdock._cluster import ClusterRequestError, RemoteApproval
from loopdock._worker import run_worker

ASK_WRITES = {"approvals": {"tools": {"write_file": "ask"}}}
WRITE_CALL = 'call: write_file {"path": "notes.txt", "content": "hello"}'


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w1", shards=4, lease_ttl=2.0, worker_id="w1"))


async def asking_agent(rt, session_id, cwd):
    cwd.mkdir(exist_ok=True)
    handle = await rt.create_agent(
        session_id=session_id, loop="minimal-first", agent_options=ASK_WRITES, cwd=str(cwd))
    handle.agent.followup(WRITE_CALL)
    return handle.agent


def tool_results(events):
    """(callId, text, isError) of every ``tool/result`` in ``events``."""
    found = []
    for event in events:
        if event.type == "tool/result":
            for block in event.data["content"]:
                found.append((block["callId"], json.dumps(block["content"]), block.get("isError", False)))
    return found


def typed(events, *wanted):
    return [e for e in events if e.type in wanted]


async def test_a_question_shows_on_the_client_and_its_answer_runs_the_call(redis_server, worker, tmp_path):
    cwd = tmp_path / "cwd"
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            agent = await asking_agent(rt, "q1", cwd)
            [approval] = await agent.wait_approvals()
            assert agent.pending_approvals() == [approval]
            assert (approval.tool, approval.arguments) == ("write_file", {"path": "notes.txt", "content": "hello"})
            assert approval.turn == 1 and approval.call_id and approval.reason
            assert not (cwd / "notes.txt").exists()  # the turn waits for the answer
            await approval.answer("approve")
            assert agent.pending_approvals() == []
            await agent.wait_idle()
            events = await rt.read_events("q1")
    assert (cwd / "notes.txt").read_text() == "hello"
    [asked] = typed(events, "approval/requested")
    [answered] = typed(events, "approval/answered")
    assert answered.data["id"] == approval.id == asked.data["id"] and answered.data["decision"] == "approve"
    assert answered.data["requestId"]  # the request that carried it
    [(call_id, text, is_error)] = tool_results(events)
    assert call_id == approval.call_id and not is_error and "wrote 5 bytes" in text
    assert asked.seq < answered.seq < [e.seq for e in events if e.type == "tool/result"][0]
    assert [e.data["reason"]["kind"] for e in typed(events, "turn/end")] == ["completed"]
    assert len(typed(events, "turn/start")) == 1


async def test_a_refusal_reaches_the_model_as_the_calls_error_result(redis_server, worker, tmp_path):
    cwd = tmp_path / "cwd"
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            agent = await asking_agent(rt, "q2", cwd)
            [approval] = await agent.wait_approvals()
            await approval.answer("refuse", reason="not in this folder")
            await agent.wait_idle()
            events = await rt.read_events("q2")
    assert not (cwd / "notes.txt").exists()
    [answered] = typed(events, "approval/answered")
    assert answered.data["decision"] == "refuse" and answered.data["reason"] == "not in this folder"
    [(_, text, is_error)] = tool_results(events)
    assert is_error and "refused by a person: not in this folder" in text
    # The model's next step read it (ping answers with the last tool result).
    last = typed(events, "assistant/message")[-1]
    assert "refused by a person: not in this folder" in json.dumps(last.data)
    assert [e.data["reason"]["kind"] for e in typed(events, "turn/end")] == ["completed"]


async def test_an_edit_runs_the_call_with_the_new_arguments(redis_server, worker, tmp_path):
    cwd = tmp_path / "cwd"
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            agent = await asking_agent(rt, "q3", cwd)
            [approval] = await agent.wait_approvals()
            with pytest.raises(ValueError, match="only an edit gives arguments"):
                await approval.answer("approve", arguments={"path": "x"})  # checked before it is sent
            await approval.answer("edit", arguments={"path": "notes.txt", "content": "edited"})
            await agent.wait_idle()
    assert (cwd / "notes.txt").read_text() == "edited"


async def test_two_clients_racing_one_wins_the_other_gets_approval_closed(redis_server, worker, tmp_path):
    outcomes: dict[str, object] = {}
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as first, open_cluster(redis_server.url) as second:
            agent = await asking_agent(first, "q4", tmp_path / "cwd")
            [mine] = await agent.wait_approvals()
            [theirs] = await second.get_agent("q4").wait_approvals()
            assert theirs.id == mine.id

            async def answer(name, approval, decision):
                try:
                    await approval.answer(decision, reason=name)
                    outcomes[name] = "won"
                except ApprovalClosedError as error:
                    outcomes[name] = error

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer, "first", mine, "approve")
                nursery.start_soon(answer, "second", theirs, "refuse")
            await agent.wait_idle()
            events = await first.read_events("q4")
    assert sorted(o if o == "won" else "closed" for o in outcomes.values()) == ["closed", "won"]
    [lost] = [o for o in outcomes.values() if isinstance(o, ApprovalClosedError)]
    assert lost.code == "APPROVAL_CLOSED"
    [answered] = typed(events, "approval/answered")
    winner = [name for name, o in outcomes.items() if o == "won"][0]
    assert answered.data["reason"] == winner
    assert len(tool_results(events)) == 1


async def test_answers_to_closed_or_unknown_questions_and_unknown_agents_are_typed_errors(
    redis_server, worker, tmp_path
):
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            agent = await asking_agent(rt, "q5", tmp_path / "cwd")
            [approval] = await agent.wait_approvals()
            await approval.answer("approve")
            with pytest.raises(ApprovalClosedError):
                await approval.answer("approve")  # answered already
            unknown = RemoteApproval("ap-never-asked", "c1", "write_file", {}, "", 1, agent)
            with pytest.raises(ApprovalClosedError) as closed:
                await unknown.answer("approve")
            assert closed.value.code == "APPROVAL_CLOSED"
            nobody = rt.get_agent("no-such-session")
            ghost = RemoteApproval("ap-x", "c1", "write_file", {}, "", 1, nobody)
            with pytest.raises(ClusterRequestError) as missing:
                await ghost.answer("approve")
            assert missing.value.code == "SESSION_NOT_FOUND"
            await agent.wait_idle()
            events = await rt.read_events("q5")
    assert len(typed(events, "approval/answered")) == 1 and len(tool_results(events)) == 1


async def test_a_question_open_when_its_worker_is_killed_is_answered_on_the_next_owner(
    redis_server, tmp_path, nursery
):
    cwd = tmp_path / "cwd"
    with trio.fail_after(90):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            agent = await asking_agent(rt, "k1", cwd)
            [approval] = await agent.wait_approvals()
            a.signal(signal.SIGKILL)
            await a.process.wait()
            # The log shows it open still (the client reads it, whichever worker runs the
            # agent, or none).
            [pending] = await rt.get_agent("k1").wait_approvals()
            assert pending.id == approval.id
            answered = trio.Event()

            async def answer() -> None:
                await pending.answer("approve")  # waits in the shard's inbox for an owner
                answered.set()

            async with trio.open_nursery() as answering:
                answering.start_soon(answer)
                await trio.testing.wait_all_tasks_blocked()  # it posted its request
                await rt.wait_sent()  # which is in Redis, with no worker to take it
                assert not answered.is_set()
                b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            # b took the shard, resumed the agent with its question open, and answered it.
            await agent.wait_idle()
            events = await rt.read_events("k1")
            await b.stop()
    assert (cwd / "notes.txt").read_text() == "hello"
    assert [e.data["reason"]["kind"] for e in typed(events, "turn/end")] == ["completed"]
    assert len(typed(events, "turn/start")) == 1  # the same turn went on
    [asked] = typed(events, "approval/requested")  # not asked again
    [answered] = typed(events, "approval/answered")  # nor withdrawn
    assert answered.data["decision"] == "approve" and asked.data["id"] == approval.id
    [(call_id, _, is_error)] = tool_results(events)
    assert call_id == approval.call_id and not is_error
    assert [e.seq for e in events] == list(range(len(events)))


async def test_an_answer_request_delivered_again_after_it_was_given_is_answered_ok(redis_server, worker, tmp_path):
    # As when a worker dies after the answer is durable and before its request is
    # settled: the next owner gets the request again, finds the answer logged under the
    # request's id, and replies ok (not APPROVAL_CLOSED to the answer that won).
    from loopdock.runtime.cluster import InboxMessage, keys

    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            agent = await asking_agent(rt, "q6", tmp_path / "cwd")
            [approval] = await agent.wait_approvals()
            await approval.answer("approve")
            await agent.wait_idle()
            [answered] = typed(await rt.read_events("q6"), "approval/answered")
            request_id = answered.data["requestId"]
            await rt._redis.srem(keys.done("q6"), [request_id])  # as if never settled
            rt.post(InboxMessage(request_id, "answer", "q6", {"approval": approval.id, "decision": "approve"}))
            await rt.wait_sent()
            reply = await rt._redis.blpop([keys.reply(request_id)], timeout=20)
            events = await rt.read_events("q6")
    assert reply is not None and json.loads(reply[1]) == {"ok": True}
    assert len(typed(events, "approval/answered")) == 1 and len(tool_results(events)) == 1
