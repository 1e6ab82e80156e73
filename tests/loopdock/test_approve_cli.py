"""``loopdock sessions approve``: a stopped session's open question answered from the
command line; the next resume continues the turn as the answer says."""

from __future__ import annotations

import trio

from loopdock import Runtime
from loopdock._cli import main
from loopdock._sessions import STORE_FILE
from loopdock.runtime import SessionStore
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool

OPTIONS = {"provider": "scripted", "model": "script-1", "approvals": {"tools": {"touch": "ask"}}}


def touch_tool(ran):
    async def touch(arguments, ctx):
        ran.append(dict(arguments))
        return "touched"

    return Tool("touch", "touches a file", {"type": "object"}, touch)


async def ask_and_close(home) -> str:
    async with Runtime.open(home) as rt:
        rt.register_tool(touch_tool([]))
        call = ToolCall("touch", {"path": "a.txt"}, call_id="c1")
        rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[call])]))
        handle = await rt.create_agent(session_id="s1", agent_options=OPTIONS)
        handle.agent.followup("touch a.txt")
        with trio.fail_after(10):
            [approval] = await handle.agent.wait_approvals()
        return approval.id


async def resume(home, ran):
    async with Runtime.open(home) as rt:
        rt.register_tool(touch_tool(ran))
        adapter = ScriptedAdapter(["understood"])
        rt.register_adapter("scripted", adapter)
        handle = await rt.resume_agent(resume_session_id="s1", agent_options=OPTIONS)
        with trio.fail_after(10):
            await handle.agent.wait_idle()
        return adapter, handle.agent.pending_approvals()


def test_a_refusal_from_the_command_line_reaches_the_model_at_the_next_resume(tmp_path, capsys):
    home = tmp_path / "home"
    approval_id = trio.run(ask_and_close, home)
    assert main(["sessions", "approve", "s1", approval_id, "--refuse", "not on a Friday", "--home", str(home)]) == 0
    assert f"s1: {approval_id} refused" in capsys.readouterr().out
    # Exactly once: a second answer is refused with the typed error's code.
    assert main(["sessions", "approve", "s1", approval_id, "--home", str(home)]) == 2
    assert "APPROVAL_CLOSED" in capsys.readouterr().err
    ran = []
    adapter, pending = trio.run(resume, home, ran)
    assert ran == [] and pending == []
    [request] = adapter.requests
    results = [(b.call_id, b.content, b.is_error) for m in request.messages if m.role == "tool" for b in m.content]
    assert results == [("c1", "refused by a person: not on a Friday", True)]


def test_an_approval_from_the_command_line_runs_the_call_at_the_next_resume(tmp_path, capsys):
    home = tmp_path / "home"
    approval_id = trio.run(ask_and_close, home)
    assert main(["sessions", "approve", "s1", approval_id, "--home", str(home)]) == 0
    assert f"s1: {approval_id} approved" in capsys.readouterr().out
    ran = []
    adapter, pending = trio.run(resume, home, ran)
    assert ran == [{"path": "a.txt"}] and pending == []
    assert len(adapter.requests) == 1


def test_unknown_questions_and_sessions_are_errors(tmp_path, capsys):
    home = tmp_path / "home"
    trio.run(ask_and_close, home)
    assert main(["sessions", "approve", "s1", "ap-nope", "--home", str(home)]) == 2
    assert "APPROVAL_CLOSED" in capsys.readouterr().err
    assert main(["sessions", "approve", "nobody", "ap-nope", "--home", str(home)]) == 2
    assert "SESSION_NOT_FOUND" in capsys.readouterr().err


def test_a_home_a_runtime_holds_is_refused(tmp_path, capsys):
    home = tmp_path / "home"
    approval_id = trio.run(ask_and_close, home)

    async def while_open():
        async with Runtime.open(home):
            return await trio.to_thread.run_sync(main, ["sessions", "approve", "s1", approval_id, "--home", str(home)])

    assert trio.run(while_open) == 2
    assert "HOME_IN_USE" in capsys.readouterr().err


def _logged(home, session_id="s1"):
    with SessionStore.open(home / STORE_FILE) as store:
        loaded = store.load(session_id)
    assert loaded is not None
    return [(e.type, e.data) for e in loaded[1]]


def test_run_on_a_session_waiting_for_a_person_says_how_to_answer_and_sends_nothing(tmp_path, capsys):
    home = tmp_path / "home"
    approval_id = trio.run(ask_and_close, home)
    before = _logged(home)
    # Nobody at `loopdock run` answers: it says so at once instead of waiting forever.
    assert main(["run", "next task", "--session-id", "s1", "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert "APPROVAL_PENDING" in err and f"loopdock sessions approve s1 {approval_id}" in err and "touch" in err
    after = _logged(home)
    assert not any(t == "user/message" and "next task" in str(d) for t, d in after)  # the task was not queued
    assert [e for e in after if e[0].startswith("approval/")] == [e for e in before if e[0].startswith("approval/")]
    # The question is still open, and answered as usual.
    assert main(["sessions", "approve", "s1", approval_id, "--refuse", "no", "--home", str(home)]) == 0
