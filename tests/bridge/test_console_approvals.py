"""A console page answers a runtime agent's approval questions over the bridge, exactly
once across surfaces: the rows carry the open questions (read from the agent whenever one
is asked or closed, whoever closed it), an ``approval`` frame answers one, and a bad
frame gets a typed error on a connection that stays usable.

The pages are websocket clients speaking the page's side of the protocol, against the
handlers ``loopdock serve`` composes (the page itself in Chromium: test_console_browser.py)."""

from __future__ import annotations

import functools
import json
from contextlib import asynccontextmanager
from itertools import count

import trio
from trio_websocket import open_websocket

from loopdock import Runtime
from loopdock._bridge import compose_handlers, goalbar_service
from loopdock.bridge._server import serve_bridge

TOKEN = "console-approvals-token"
WRITE = 'call: write_file {"path": "notes.txt", "content": "hello"}'
HINTS = {"approvals": {"default": "hints"}}


class Page:
    """A console page's connection: the rows it was sent, and the replies to its requests."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.rows: dict[str, dict] = {}
        self.replies: dict[str, dict] = {}
        self._ids = count(1)

    async def receive(self) -> None:
        frame = json.loads(await self.ws.get_message())
        if frame["type"] == "live":
            for item in frame["data"]["items"]:
                if item["type"] == "console/agent":
                    if item["data"].get("gone"):
                        self.rows.pop(item["agentId"], None)
                    else:
                        self.rows[item["agentId"]] = item["data"]
        elif frame["type"] == "ping":
            await self.ws.send_message(json.dumps({"v": 1, "type": "pong", "re": frame["id"], "data": {}}))
        elif "re" in frame:
            self.replies[frame["re"]] = frame

    async def until(self, predicate) -> None:
        while not predicate(self):
            await self.receive()

    def questions(self, agent_id: str) -> list[dict] | None:
        row = self.rows.get(agent_id)
        return None if row is None else row["approvals"]

    async def send(self, data: dict | str, type_: str = "approval") -> str:
        request_id = f"q{next(self._ids)}"
        await self.ws.send_message(json.dumps({"v": 1, "type": type_, "id": request_id, "data": data}))
        return request_id

    async def reply(self, request_id: str) -> dict:
        await self.until(lambda p: request_id in p.replies)
        return self.replies.pop(request_id)

    async def answer(self, data: dict) -> dict:
        return await self.reply(await self.send(data))


@asynccontextmanager
async def served(tmp_path):
    async with Runtime.open(tmp_path / "home") as rt:
        live = rt.subscribe_live()
        async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
            console = await compose_handlers(rt, service, tmp_path, nursery, live)
            port = await nursery.start(functools.partial(serve_bridge, console, token=TOKEN))
            yield rt, port
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def page(port, capabilities=("live", "goalbar", "console")):
    async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
        await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": {
            "token": TOKEN, "role": "goalbar", "protocol": 1, "capabilities": list(capabilities)}}))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        yield Page(ws)


async def careful_agent(rt, tmp_path, session_id="careful-1"):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    handle = await rt.create_agent(session_id=session_id, cwd=str(work), agent_options=HINTS)
    return handle.agent, work


async def tool_results(agent):
    return [(b.content, b.is_error) for m in await agent.read_transcript() if m.role == "tool" for b in m.content]


async def test_a_page_sees_the_question_and_its_approval_runs_the_call(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port) as p:
            agent, work = await careful_agent(rt, tmp_path)
            await p.until(lambda p: p.questions(agent.id) == [])
            agent.followup(WRITE)
            await p.until(lambda p: p.questions(agent.id))
            [approval] = agent.pending_approvals()
            assert p.questions(agent.id) == [{
                "id": approval.id, "tool": "write_file", "arguments": '{"content": "hello", "path": "notes.txt"}',
                "reason": "write_file is not declared read-only",
            }]
            assert p.rows[agent.id]["approvalsOpen"] == 1
            assert not (work / "notes.txt").exists()  # the turn waits

            reply = await p.answer({"agentId": agent.id, "approvalId": approval.id, "decision": "approve"})
            assert reply["type"] == "approvalDone", reply
            assert reply["data"] == {"agentId": agent.id, "approvalId": approval.id, "decision": "approve"}
            await p.until(lambda p: p.questions(agent.id) == [])
            await agent.wait_idle()
            assert (work / "notes.txt").read_text() == "hello"
            assert await tool_results(agent) == [("wrote 5 bytes to notes.txt", False)]
            answered = [e.data for e in await agent.session.read_events() if e.type == "approval/answered"]
            assert answered == [{"id": approval.id, "decision": "approve"}]
            assert [e.data.get("reason", {}).get("kind") for e in await agent.session.read_events()
                    if e.type == "turn/end"] == ["completed"]

            # Answered: a second answer is refused, typed, and changes nothing.
            again = await p.answer({"agentId": agent.id, "approvalId": approval.id, "decision": "refuse"})
            assert (again["type"], again["data"]["code"]) == ("error", "APPROVAL_CLOSED"), again
            assert len([e for e in await agent.session.read_events() if e.type == "approval/answered"]) == 1


async def test_a_refusal_with_a_reason_reaches_the_model_as_the_call_s_error(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port) as p:
            agent, work = await careful_agent(rt, tmp_path)
            agent.followup(WRITE)
            await p.until(lambda p: p.questions(agent.id))
            [question] = p.questions(agent.id)
            reply = await p.answer({"agentId": agent.id, "approvalId": question["id"], "decision": "refuse",
                                    "reason": "not in that folder"})
            assert reply["type"] == "approvalDone", reply
            await agent.wait_idle()
            assert not (work / "notes.txt").exists()
            assert await tool_results(agent) == [("refused by a person: not in that folder", True)]
            await p.until(lambda p: p.questions(agent.id) == [])


async def test_two_pages_answer_one_question_one_wins_the_other_gets_approval_closed(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port) as a, page(port) as b:
            agent, work = await careful_agent(rt, tmp_path)
            agent.followup(WRITE)
            for p in (a, b):
                await p.until(lambda p: p.questions(agent.id))
            [question] = a.questions(agent.id)
            assert b.questions(agent.id) == [question]
            # Both sent before either reply is read: they race in the runtime.
            sent_a = await a.send({"agentId": agent.id, "approvalId": question["id"], "decision": "approve"})
            sent_b = await b.send({"agentId": agent.id, "approvalId": question["id"], "decision": "refuse",
                                   "reason": "b says no"})
            replies = {"a": await a.reply(sent_a), "b": await b.reply(sent_b)}
            [winner] = [name for name, r in replies.items() if r["type"] == "approvalDone"]
            [loser] = [r for r in replies.values() if r["type"] != "approvalDone"]
            assert (loser["type"], loser["data"]["code"]) == ("error", "APPROVAL_CLOSED"), loser
            for p in (a, b):  # gone from both pages
                await p.until(lambda p: p.questions(agent.id) == [])
            await agent.wait_idle()
            answered = [e.data["decision"] for e in await agent.session.read_events() if e.type == "approval/answered"]
            assert answered == [{"a": "approve", "b": "refuse"}[winner]]
            assert (work / "notes.txt").exists() == (winner == "a")


async def test_questions_answered_elsewhere_or_withdrawn_leave_the_page(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port) as p:
            agent, work = await careful_agent(rt, tmp_path)
            # Answered from the API: the page follows.
            agent.followup(WRITE)
            await p.until(lambda p: p.questions(agent.id))
            [approval] = agent.pending_approvals()
            await approval.answer("approve")
            await p.until(lambda p: p.questions(agent.id) == [])
            await agent.wait_idle()
            # Withdrawn (the turn was cancelled): the page follows too, and answering it is closed.
            agent.followup('call: write_file {"path": "other.txt", "content": "x"}')
            await p.until(lambda p: p.questions(agent.id))
            [question] = p.questions(agent.id)
            assert json.loads(question["arguments"]) == {"path": "other.txt", "content": "x"}
            agent.cancel("changed my mind")
            await p.until(lambda p: p.questions(agent.id) == [])
            reply = await p.answer({"agentId": agent.id, "approvalId": question["id"], "decision": "approve"})
            assert (reply["type"], reply["data"]["code"]) == ("error", "APPROVAL_CLOSED"), reply
            assert not (work / "other.txt").exists()


async def test_long_arguments_are_cut_for_the_row(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port) as p:
            agent, _ = await careful_agent(rt, tmp_path)
            agent.followup('call: write_file {"path": "big.txt", "content": "%s"}' % ("x" * 5000))
            await p.until(lambda p: p.questions(agent.id))
            [question] = p.questions(agent.id)
            assert len(question["arguments"]) == 400 and question["arguments"].endswith("…")
            # The agent's question keeps them whole.
            [approval] = agent.pending_approvals()
            assert len(approval.arguments["content"]) == 5000
            agent.cancel("done looking")
            await agent.wait_idle()


async def test_bad_answer_frames_get_typed_errors_and_the_connection_stays_usable(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port) as p:
            agent, work = await careful_agent(rt, tmp_path)
            agent.followup(WRITE)
            await p.until(lambda p: p.questions(agent.id))
            [question] = p.questions(agent.id)
            good = {"agentId": agent.id, "approvalId": question["id"], "decision": "approve"}
            cases = [
                ({**good, "agentId": "ghost"}, "UNKNOWN_AGENT"),
                ({**good, "agentId": "../etc"}, "INVALID_SESSION_ID"),
                ({**good, "agentId": "x" * 100_000}, "INVALID_SESSION_ID"),
                ({**good, "approvalId": "ap-0000000000000000"}, "APPROVAL_CLOSED"),
                ({**good, "approvalId": "a" * 100_000}, "BAD_DATA"),
                ({**good, "decision": "refuse", "reason": "r" * 100_000}, "BAD_DATA"),
                ({**good, "approvalId": 12}, "BAD_DATA"),
                ({**good, "decision": "edit"}, "BAD_DATA"),
                ({**good, "decision": None}, "BAD_DATA"),
                ({**good, "reason": {"why": "x"}}, "BAD_DATA"),
                ({**good, "arguments": {"path": "evil.txt"}}, "BAD_DATA"),
                ({"agentId": agent.id}, "BAD_DATA"),
            ]
            for data, code in cases:
                reply = await p.answer(data)
                assert (reply["type"], reply["data"]["code"]) == ("error", code), (data if len(str(data)) < 300 else code, reply)
                assert len(reply["data"]["message"]) <= 1000
            # data that is not an object at all: a typed error answering the request too
            reply = await p.reply(await p.send("approve"))
            assert (reply["type"], reply["data"]["code"]) == ("error", "BAD_ENVELOPE"), reply
            # Nothing of it answered the question: it is still open, and the page still answers it.
            assert [a.id for a in agent.pending_approvals()] == [question["id"]]
            reply = await p.answer(good)
            assert reply["type"] == "approvalDone", reply
            await agent.wait_idle()
            assert (work / "notes.txt").read_text() == "hello"


async def test_only_a_console_page_answers(tmp_path):
    with trio.fail_after(30):
        async with served(tmp_path) as (rt, port), page(port, capabilities=("live", "goalbar")) as bar:
            agent, _ = await careful_agent(rt, tmp_path)
            agent.followup(WRITE)
            [approval] = await agent.wait_approvals()
            reply = await bar.answer({"agentId": agent.id, "approvalId": approval.id, "decision": "approve"})
            assert (reply["type"], reply["data"]["code"]) == ("error", "NOT_SERVED"), reply
            assert agent.pending_approvals() == [approval]
            agent.cancel("test over")
            await agent.wait_idle()


async def test_a_question_found_open_in_a_resumed_agent_s_log_shows_and_is_answered(tmp_path):
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home") as rt:  # asks, then closes with the question open
            agent, work = await careful_agent(rt, tmp_path)
            agent.followup(WRITE)
            [asked] = await agent.wait_approvals()
        async with served(tmp_path) as (rt, port), page(port) as p:
            handle = await rt.resume_agent(resume_session_id="careful-1", agent_options=HINTS)
            agent = handle.agent
            await p.until(lambda p: p.questions(agent.id))
            assert [q["id"] for q in p.questions(agent.id)] == [asked.id]
            reply = await p.answer({"agentId": agent.id, "approvalId": asked.id, "decision": "approve"})
            assert reply["type"] == "approvalDone", reply
            await p.until(lambda p: p.questions(agent.id) == [])
            await agent.wait_idle()
            assert (work / "notes.txt").read_text() == "hello"
