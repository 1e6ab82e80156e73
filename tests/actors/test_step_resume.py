"""A turn killed midway (SIGKILL of a real process) goes on from its last durable step
when its session is resumed: the model is not asked again for what the log holds, a
call that may have run is run again only if its tool says that is harmless (else a
person is asked), and a driver that cannot resume a step closes the turn as before."""

from __future__ import annotations

import signal
import sys

import trio

from loopdock import Runtime
from loopdock.actors._step_resume import resume_point
from loopdock.runtime import Event
from loopdock.runtime.models import ScriptedAdapter
from loopdock.runtime.tools import Tool

# The first runtime: one agent, one turn, killed with SIGKILL (by itself, at a point its
# mode names) before the turn ends. ``touch`` is not read-only, ``peek`` is; either one
# kills the process as it starts, so no tool call of this runtime ever completes, except
# in the modes ``results`` and ``cut``, whose calls complete before the kill:
# - results: as the turn's second step is about to begin (step 1's results are durable);
# - cut: as the model is asked for step 2 (its reply never comes);
# - touch / peek: as the step-1 call's tool starts (no approval policy);
# - answered: the call asks; the person approves and the process dies as the answer
#   is durable, before the tool can start;
# - plain (third argument): the agent runs on a driver that cannot resume a step.
CHILD = """
import os
import signal
import sys

import trio

from loopdock import Runtime
from loopdock.actors import ReactBody, create_with_body, resume_with_body
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool

home, mode, driver = sys.argv[1:4]
live = {}


def die():
    os.kill(os.getpid(), signal.SIGKILL)


async def tool(arguments, ctx):
    if mode not in ("results", "cut"):
        await live["agent"].session.flush()  # what came before is durable (a read-only call marks no start)
        die()
    return f"touched {arguments.get('path')}"


class Plain(ReactBody):
    resumes_steps = False


class PlainDriver:
    async def create_agent(self, owner, options):
        return await create_with_body(owner, options, Plain())

    async def resume(self, owner, options):
        return await resume_with_body(owner, options, Plain())


async def main():
    async with Runtime.open(home) as rt:
        rt.register_driver("plain", PlainDriver())
        rt.register_tool(Tool("touch", "touches a file", {"type": "object"}, tool))
        rt.register_tool(Tool("peek", "reads a file", {"type": "object"}, tool, read_only=True))
        name = "peek" if mode == "peek" else "touch"
        first = Reply("on it", tool_calls=[ToolCall(name, {"path": "a.txt"}, call_id="c1")])
        asked = []

        async def respond(request):
            asked.append(request)
            if len(asked) == 2 and mode == "cut":
                await live["agent"].session.flush()
                die()
            return first if len(asked) == 1 else "done"

        rt.register_adapter("scripted", ScriptedAdapter(respond))
        steps = []

        async def before_step():
            steps.append(1)
            if len(steps) == 2 and mode == "results":
                await live["agent"].session.flush()
                die()

        rt.supervisor.step_preparers.append(before_step)
        options = {"provider": "scripted", "model": "script-1"}
        if mode == "answered":
            options["approvals"] = {"tools": {"touch": "ask"}}
        handle = await rt.create_agent(session_id="s1", agent_options=options, driver=driver)
        live["agent"] = agent = handle.agent
        agent.followup("touch a.txt")
        if mode == "answered":
            [approval] = await agent.wait_approvals()
            await approval.answer("approve")  # returns once the answer is durable
            die()  # no checkpoint since: the tool has not started
        await trio.sleep_forever()


trio.run(main)
"""

TOUCH = {"provider": "scripted", "model": "script-1"}
ASK_TOUCH = {**TOUCH, "approvals": {"tools": {"touch": "ask"}}}


async def killed(home, mode, driver="default"):
    """Run the first runtime until it is killed; returns its log's event types."""
    done = await trio.run_process(
        [sys.executable, "-P", "-c", CHILD, str(home), mode, driver],
        check=False, capture_stdout=True, capture_stderr=True,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]


class _NoStepResume:
    def body(self):
        from loopdock.actors import ReactBody

        class Plain(ReactBody):
            resumes_steps = False

        return Plain()

    async def create_agent(self, owner, options):
        from loopdock.actors import create_with_body

        return await create_with_body(owner, options, self.body())

    async def resume(self, owner, options):
        from loopdock.actors import resume_with_body

        return await resume_with_body(owner, options, self.body())


def tools(ran):
    async def run(arguments, ctx):
        ran.append(dict(arguments))
        return f"touched {arguments.get('path')}"

    return [
        Tool("touch", "touches a file", {"type": "object"}, run),
        Tool("peek", "reads a file", {"type": "object"}, run, read_only=True),
    ]


async def resume(rt, replies, ran, options=TOUCH):
    rt.register_driver("plain", _NoStepResume())
    for tool in tools(ran):
        rt.register_tool(tool)
    adapter = ScriptedAdapter(replies)
    rt.register_adapter("scripted", adapter)
    handle = await rt.resume_agent(resume_session_id="s1", agent_options=options)
    return handle.agent, adapter


def results(request):
    return [(b.call_id, b.content, b.is_error) for m in request.messages if m.role == "tool" for b in m.content]


async def typed(agent, *wanted):
    return [(e.type, dict(e.data)) for e in await agent.session.read_events() if e.type in wanted]


async def test_killed_after_a_step_s_results_are_durable_the_turn_goes_on_with_its_next_step(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "results")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran)
            await agent.wait_idle()
            log = await typed(agent, "step/start", "assistant/message", "tool/result", "tool/started", "turn/end")
    assert ran == []  # the call's result is in the log: not run again
    [request] = adapter.requests  # only step 2's: step 1's reply is in the log
    assert results(request) == [("c1", "touched a.txt", False)]
    assert [m.text for m in request.messages if m.role == "user"] == ["touch a.txt"]
    assert [kind for kind, _ in log] == [
        "step/start", "assistant/message", "tool/started", "tool/result",  # before the kill
        "step/start", "assistant/message", "turn/end",  # after the restart
    ]
    assert [data["step"] for kind, data in log if kind == "step/start"] == [1, 2]
    assert log[-1][1] == {"turn": 1, "reason": {"kind": "completed"}}


async def test_a_reply_cut_mid_stream_is_asked_again_and_nothing_before_it(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "cut")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran)
            await agent.wait_idle()
            log = await typed(agent, "step/start", "step/end", "request/header", "assistant/message", "turn/end")
    assert ran == []
    [request] = adapter.requests
    assert results(request) == [("c1", "touched a.txt", False)]
    # Step 2 was begun before the kill: asked again within it, not as a step 3.
    assert [kind for kind, _ in log] == [
        "step/start", "request/header", "assistant/message", "step/end",
        "step/start", "request/header",  # cut here
        "request/header", "assistant/message", "step/end", "turn/end",
    ]
    assert log[-1][1] == {"turn": 1, "reason": {"kind": "completed"}}


async def test_a_call_that_may_have_run_runs_again_only_once_a_person_approves(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "touch")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran)
            [approval] = await agent.wait_approvals()
            assert (approval.call_id, approval.tool, dict(approval.arguments)) == ("c1", "touch", {"path": "a.txt"})
            assert "may have run" in approval.reason
            assert ran == [] and adapter.requests == []  # nothing runs before the answer
            await approval.answer("approve")
            await agent.wait_idle()
            log = await typed(agent, "approval/requested", "approval/answered", "tool/started", "tool/result", "turn/end")
    assert ran == [{"path": "a.txt"}]  # once
    [request] = adapter.requests
    assert results(request) == [("c1", "touched a.txt", False)]
    assert [kind for kind, _ in log] == [
        "tool/started",  # the killed process's
        "approval/requested", "approval/answered", "tool/started", "tool/result", "turn/end",
    ]
    assert log[-1][1] == {"turn": 1, "reason": {"kind": "completed"}}


async def test_a_call_that_may_have_run_and_is_refused_gives_the_model_the_refusal(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "touch")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["understood"], ran)
            [approval] = await agent.wait_approvals()
            await approval.answer("refuse", reason="it did run")
            await agent.wait_idle()
            ends = await typed(agent, "turn/end")
    assert ran == []
    [request] = adapter.requests
    assert results(request) == [("c1", "refused by a person: it did run", True)]
    assert ends == [("turn/end", {"turn": 1, "reason": {"kind": "completed"}})]


async def test_a_read_only_call_cut_by_the_kill_runs_again_without_a_question(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "peek")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran)
            await agent.wait_idle()
            log = await typed(agent, "approval/requested", "tool/started", "tool/result", "turn/end")
    assert ran == [{"path": "a.txt"}]
    [request] = adapter.requests
    assert results(request) == [("c1", "touched a.txt", False)]
    # No question; and a read-only call's start is not marked (it needs no mark to run again).
    assert [kind for kind, _ in log] == ["tool/result", "turn/end"]


async def test_killed_between_the_answer_and_the_tool_s_start_the_call_runs_once_on_resume(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "answered")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done"], ran, ASK_TOUCH)
            await agent.wait_idle()
            assert agent.pending_approvals() == []  # answered before the kill: not asked again
            log = await typed(agent, "approval/requested", "approval/answered", "tool/started", "tool/result", "turn/end")
    assert ran == [{"path": "a.txt"}]
    [request] = adapter.requests
    assert results(request) == [("c1", "touched a.txt", False)]
    assert [kind for kind, _ in log] == [
        "approval/requested", "approval/answered",  # the killed process's: the tool had not started
        "tool/started", "tool/result", "turn/end",
    ]
    assert log[1][1]["decision"] == "approve"
    assert log[-1][1] == {"turn": 1, "reason": {"kind": "completed"}}


async def test_a_driver_that_cannot_resume_a_step_closes_the_killed_turn_interrupted(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "results", "plain")
    ran = []
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["next"], ran)
            # Closed as the session is loaded, before the agent runs.
            assert (await typed(agent, "turn/end")) == [("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}})]
            await agent.wait_idle()
            assert adapter.requests == [] and ran == []
            agent.followup("again")
            await agent.wait_idle()
            ends = await typed(agent, "turn/end")
    assert [data["reason"]["kind"] for _, data in ends] == ["interrupted", "completed"]


async def test_cancel_during_a_resumed_turn_ends_it_aborted(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "results")
    asked = trio.Event()

    async def hang(request):
        asked.set()
        await trio.sleep_forever()

    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, hang, [])
            await asked.wait()  # the resumed turn's next step asks the model
            agent.cancel("enough")
            await agent.wait_idle()
            ends = await typed(agent, "turn/end")
    assert ends == [("turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "enough"}})]


async def test_the_resumed_turn_runs_before_a_message_queued_meanwhile(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        await killed(home, "results")
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            agent, adapter = await resume(rt, ["done", "second"], [])
            agent.followup("a new question")
            await agent.wait_idle()
            log = await typed(agent, "turn/start", "turn/end")
    first, second = adapter.requests
    assert "a new question" not in [m.text for m in first.messages]
    assert [m.text for m in second.messages if m.role == "user"][-1] == "a new question"
    assert [(kind, data["turn"]) for kind, data in log] == [
        ("turn/start", 1), ("turn/end", 1), ("turn/start", 2), ("turn/end", 2),
    ]


# -- where a turn goes on, from its events alone -------------------------------------


def events(*specs):
    return [Event(kind, seq, seq, data) for seq, (kind, data) in enumerate(specs)]


def assistant(*call_ids):
    content = [{"type": "text", "text": "x"}] + [
        {"type": "tool-call", "callId": c, "name": "touch", "arguments": "{}"} for c in call_ids
    ]
    return ("assistant/message", {"id": "a", "role": "assistant", "content": content})


def user():
    return ("user/message", {"id": "u", "role": "user", "content": [{"type": "text", "text": "hi"}]})


def test_a_turn_with_no_durable_message_or_step_is_not_continued():
    assert resume_point(events(("turn/start", {"turn": 1}))) is None
    assert resume_point(events(("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}))) is None


def test_a_question_withdrawn_in_the_last_step_is_not_continued():
    point = resume_point(events(
        ("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}), user(), assistant("c1"),
        ("approval/requested", {"id": "q", "callId": "c1"}),
        ("approval/answered", {"id": "q", "decision": "withdrawn", "reason": "stop"}),
    ))
    assert point is None


def test_an_answer_given_before_the_call_started_is_superseded_by_its_start():
    head = [("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}), user(), assistant("c1", "c2")]
    asked = [("approval/requested", {"id": "q", "callId": "c1"}), ("approval/answered", {"id": "q", "decision": "approve"})]
    point = resume_point(events(*head, *asked))
    assert point is not None and point.answers["c1"].decision == "approve" and point.started == frozenset()
    assert [c.call_id for c in point.calls] == ["c1", "c2"] and point.questions == {}
    point = resume_point(events(*head, *asked, ("tool/started", {"turn": 1, "step": 1, "callId": "c1"})))
    assert point is not None and point.answers == {} and point.started == {"c1"}


def test_a_message_without_calls_whose_step_ended_ends_the_turn():
    point = resume_point(events(
        ("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}), user(), assistant(),
        ("step/end", {"turn": 1, "step": 1}),
    ))
    assert point is not None and (point.answered, point.step_ended, point.more, point.calls) == (True, True, False, ())
