"""An open approval question survives its process: killed with SIGKILL, or closed, the
runtime that opens the same home again shows it pending, and answering it continues the
same turn without asking the model again for what the log holds."""

from __future__ import annotations

import signal
import subprocess
import sys

import trio

from loopdock import Runtime
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool

OPTIONS = {"provider": "scripted", "model": "script-1", "approvals": {"tools": {"touch": "ask"}}}

# The first runtime asks, says so on stdout, then (mode ``ask``) waits until it is
# killed, or (mode ``answer``) approves and kills itself with SIGKILL as its tool starts
# (its ``tool/started`` is durable by then).
# Its tool never completes: only the second runtime's may.
CHILD = """
import os
import signal
import sys

import trio

from loopdock import Runtime
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool


async def touch(arguments, ctx):
    if sys.argv[2] != "answer":
        raise SystemExit("touch ran before it was approved")
    os.kill(os.getpid(), signal.SIGKILL)


async def main(home):
    async with Runtime.open(home) as rt:
        rt.register_tool(Tool("touch", "touches a file", {"type": "object"}, touch))
        call = ToolCall("touch", {"path": "a.txt"}, call_id="c1")
        rt.register_adapter("scripted", ScriptedAdapter([Reply("on it", tool_calls=[call])]))
        options = {"provider": "scripted", "model": "script-1", "approvals": {"tools": {"touch": "ask"}}}
        handle = await rt.create_agent(session_id="s1", agent_options=options)
        handle.agent.followup("touch a.txt")
        [approval] = await handle.agent.wait_approvals()
        await handle.agent.session.flush()
        print("asked", approval.id, flush=True)
        if sys.argv[2] == "answer":
            await approval.answer("approve")
        await trio.sleep_forever()


trio.run(main, sys.argv[1])
"""


def touch_tool(ran):
    async def touch(arguments, ctx):
        ran.append(dict(arguments))
        return f"touched {arguments.get('path')}"

    return Tool("touch", "touches a file", {"type": "object"}, touch)


def results(request):
    return [(b.call_id, b.content, b.is_error) for m in request.messages if m.role == "tool" for b in m.content]


async def typed(agent, *wanted):
    return [(e.type, dict(e.data)) for e in await agent.session.read_events() if e.type in wanted]


async def ask_then_kill(home, mode="ask") -> str:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-P", "-c", CHILD, str(home), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    buffer = b""
    try:
        while b"\n" not in buffer:
            chunk = await process.stdout.receive_some()
            assert chunk, "the first runtime ended before it asked"
            buffer += chunk
        if mode == "answer":  # it kills itself once its tool starts
            await process.wait()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)  # this test started it
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    word, approval_id = buffer.decode().split()
    assert word == "asked"
    return approval_id


async def resume(rt, replies, ran):
    rt.register_tool(touch_tool(ran))
    adapter = ScriptedAdapter(replies)
    rt.register_adapter("scripted", adapter)
    handle = await rt.resume_agent(resume_session_id="s1", agent_options=OPTIONS)
    return handle.agent, adapter


async def test_a_question_open_at_kill_9_is_answered_after_restart_and_the_turn_goes_on(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        approval_id = await ask_then_kill(home)
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran)
            [approval] = agent.pending_approvals()
            assert (approval.id, approval.tool, approval.call_id) == (approval_id, "touch", "c1")
            assert ran == [] and adapter.requests == []  # nothing runs before the answer
            await approval.answer("approve")
            await agent.wait_idle()
            # The tool ran once; the one model call after the restart is the next step's,
            # and it carries the tool's result.
            assert ran == [{"path": "a.txt"}]
            assert len(adapter.requests) == 1
            assert results(adapter.requests[0]) == [("c1", "touched a.txt", False)]
            log = await typed(agent, "turn/start", "turn/end", "approval/answered", "tool/result", "assistant/message")
    kinds = [kind for kind, _ in log]
    assert kinds == ["turn/start", "assistant/message", "approval/answered", "tool/result", "assistant/message", "turn/end"]
    assert log[-1][1] == {"turn": 1, "reason": {"kind": "completed"}}  # the same turn, not interrupted


async def test_a_question_open_when_the_runtime_closes_is_still_open_after_it_opens_again(tmp_path):
    home = tmp_path / "home"
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            rt.register_tool(touch_tool(ran))
            call = ToolCall("touch", {"path": "a.txt"}, call_id="c1")
            rt.register_adapter("scripted", ScriptedAdapter([Reply("on it", tool_calls=[call])]))
            handle = await rt.create_agent(session_id="s1", agent_options=OPTIONS)
            handle.agent.followup("touch a.txt")
            [asked] = await handle.agent.wait_approvals()
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["understood"], ran)
            [approval] = agent.pending_approvals()
            assert approval.id == asked.id
            await approval.answer("refuse", reason="not today")
            await agent.wait_idle()
            log = await typed(agent, "turn/end", "tool/result")
    assert ran == []
    assert results(adapter.requests[0]) == [("c1", "refused by a person: not today", True)]
    # Neither a "cancelled" result nor an aborted end was written when the first runtime closed.
    assert [kind for kind, _ in log] == ["tool/result", "turn/end"]
    assert log[-1][1]["reason"] == {"kind": "completed"}


async def test_a_resumed_question_can_be_withdrawn_by_cancel(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        approval_id = await ask_then_kill(home)
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, [], [])
            await agent.wait_approvals()
            agent.cancel("no longer needed")
            await agent.wait_idle()
            assert agent.pending_approvals() == [] and adapter.requests == []
            log = await typed(agent, "approval/answered", "turn/end")
    assert log == [
        ("approval/answered", {"id": approval_id, "decision": "withdrawn", "reason": "no longer needed"}),
        ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "no longer needed"}}),
    ]


async def test_killed_as_the_approved_call_started_a_person_is_asked_whether_it_runs_again(tmp_path):
    # (Killed after the answer but before the tool's start: tests/actors/test_step_resume.py.)
    home = tmp_path / "home"
    with trio.fail_after(60):
        approval_id = await ask_then_kill(home, "answer")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran)
            [again] = await agent.wait_approvals()  # the tool had started: it may have run
            assert again.id != approval_id and again.call_id == "c1" and "may have run" in again.reason
            assert ran == [] and adapter.requests == []
            await again.answer("approve")
            await agent.wait_idle()
            log = await typed(agent, "approval/requested", "approval/answered", "tool/started", "tool/result", "turn/end")
    assert ran == [{"path": "a.txt"}]
    assert len(adapter.requests) == 1 and results(adapter.requests[0]) == [("c1", "touched a.txt", False)]
    assert [kind for kind, _ in log] == [
        "approval/requested", "approval/answered", "tool/started",  # the killed process's
        "approval/requested", "approval/answered", "tool/started", "tool/result", "turn/end",
    ]
    assert log[1][1] == {"id": approval_id, "decision": "approve"}
    assert log[-1][1] == {"turn": 1, "reason": {"kind": "completed"}}


async def test_after_the_resumed_step_a_repeated_call_id_is_a_new_call_and_asks_again(tmp_path):
    home = tmp_path / "home"
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            rt.register_tool(touch_tool(ran))
            call = ToolCall("touch", {"path": "a.txt"}, call_id="c1")
            rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[call])]))
            handle = await rt.create_agent(session_id="s1", agent_options=OPTIONS)
            handle.agent.followup("touch a.txt")
            [first] = await handle.agent.wait_approvals()
        async with Runtime.open(home) as rt:
            # A new process's model numbers its calls from the start again: "c1" once more.
            again = ToolCall("touch", {"path": "b.txt"}, call_id="c1")
            agent, adapter = await resume(rt, [Reply(tool_calls=[again]), "done"], ran)
            [resumed] = agent.pending_approvals()
            await resumed.answer("approve")
            [second] = await agent.wait_approvals()
            assert second.id != first.id and dict(second.arguments) == {"path": "b.txt"}
            assert ran == [{"path": "a.txt"}]
            await second.answer("refuse", reason="one is enough")
            await agent.wait_idle()
    assert ran == [{"path": "a.txt"}]
    assert results(adapter.requests[1])[-1] == ("c1", "refused by a person: one is enough", True)


class _NoStepResume:
    """The react driver, but with a turn body that cannot finish a resumed step."""

    def body(self):
        from loopdock.actors import ReactBody

        class Body(ReactBody):
            resumes_steps = False

        return Body()

    async def create_agent(self, owner, options):
        from loopdock.actors import create_with_body

        return await create_with_body(owner, options, self.body())

    async def resume(self, owner, options):
        from loopdock.actors import resume_with_body

        return await resume_with_body(owner, options, self.body())


async def test_a_driver_that_cannot_resume_a_step_closes_the_turn_interrupted_and_withdraws(tmp_path):
    home = tmp_path / "home"
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            rt.register_driver("plain", _NoStepResume())
            rt.register_tool(touch_tool(ran))
            call = ToolCall("touch", {"path": "a.txt"}, call_id="c1")
            rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[call])]))
            handle = await rt.create_agent(session_id="s1", agent_options=OPTIONS, driver="plain")
            handle.agent.followup("touch a.txt")
            [asked] = await handle.agent.wait_approvals()
        async with Runtime.open(home) as rt:
            rt.register_driver("plain", _NoStepResume())
            agent, adapter = await resume(rt, [], ran)
            await agent.wait_idle()
            assert agent.pending_approvals() == [] and adapter.requests == [] and ran == []
            log = await typed(agent, "approval/answered", "turn/end")
    assert log == [
        ("approval/answered", {"id": asked.id, "decision": "withdrawn", "reason": "interrupted"}),
        ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
    ]


async def test_an_answer_given_while_the_resumed_turn_is_set_up_is_the_one_used(tmp_path, monkeypatch):
    from loopdock.actors import AgentActor

    home = tmp_path / "home"
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            rt.register_tool(touch_tool(ran))
            call = ToolCall("touch", {"path": "a.txt"}, call_id="c1")
            rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[call])]))
            handle = await rt.create_agent(session_id="s1", agent_options=OPTIONS)
            handle.agent.followup("touch a.txt")
            await handle.agent.wait_approvals()
        load = AgentActor._load_transcript

        async def answered_while_loading(agent):
            # The person answers after the resumed turn read the log, before it runs.
            [approval] = agent.pending_approvals()
            await approval.answer("refuse", reason="too late to ask")
            await load(agent)

        monkeypatch.setattr(AgentActor, "_load_transcript", answered_while_loading)
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["ok"], ran)
            await agent.wait_idle()
            assert agent.pending_approvals() == []
            requested = await typed(agent, "approval/requested")
    assert ran == [] and len(requested) == 1  # not asked a second time
    assert results(adapter.requests[0]) == [("c1", "refused by a person: too late to ask", True)]
