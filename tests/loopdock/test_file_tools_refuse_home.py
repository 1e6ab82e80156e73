"""The file tools refuse the runtime's home, wherever it is: here it sits inside the
agent's cwd, as ``./.loopdock`` used to by default, and the agent tries to read the
bridge token and another session's transcript, list the home and overwrite the database
(which once lost every session in that home)."""

from __future__ import annotations

import json

import trio

from loopdock import Runtime
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall

SCRIPTED = {"provider": "scripted", "model": "script-1"}
REFUSED = "inside the runtime's home"


async def test_file_tools_refuse_the_token_the_database_and_the_home_itself(tmp_path):
    work = tmp_path / "work"
    home = work / ".loopdock"
    work.mkdir()
    (work / "notes.txt").write_text("fine to read")
    (work / "escape").symlink_to(home)  # the home again, under another name
    attempts = [
        ToolCall("read_file", {"path": ".loopdock/bridge.token"}, call_id="token"),
        ToolCall("read_file", {"path": str(home / "sessions.db")}, call_id="db"),
        ToolCall("read_file", {"path": "escape/sessions.db"}, call_id="link"),
        ToolCall("list_dir", {"path": ".loopdock"}, call_id="list"),
        ToolCall("write_file", {"path": ".loopdock/sessions.db", "content": "pwned"}, call_id="overwrite"),
        ToolCall("write_file", {"path": ".loopdock/new/file.txt", "content": "x"}, call_id="create"),
        ToolCall("read_file", {"path": "notes.txt"}, call_id="allowed"),
    ]
    with trio.fail_after(30):
        async with Runtime.open(home) as rt:
            (home / "bridge.token").write_text("the-bridge-secret")
            # One script for both agents, used in turn: the other agent's reply, then
            # the prober's tool calls and its last word.
            rt.register_adapter("scripted", ScriptedAdapter([Reply("earlier work"), Reply(tool_calls=attempts), "done"]))
            other = await rt.create_agent(session_id="other", agent_options=SCRIPTED, cwd=str(work))
            other.agent.followup("a private transcript")
            await other.agent.wait_idle()
            await other.agent.session.flush()
            handle = await rt.create_agent(session_id="prober", agent_options=SCRIPTED, cwd=str(work))
            handle.agent.followup("look around")
            await handle.agent.wait_idle()
            results = {
                block["callId"]: block
                for e in (await handle.agent.session.read_events())
                if e.type == "tool/result"
                for block in e.data["content"]
            }
    for call in attempts[:-1]:
        assert results[call.call_id]["isError"], call
        assert REFUSED in results[call.call_id]["content"], results[call.call_id]
        assert "the-bridge-secret" not in json.dumps(results)
    assert results["allowed"]["content"] == "fine to read"
    assert not (home / "new").exists()
    # The database is intact: the other session is still there after a restart.
    async with Runtime.open(home) as rt:
        sessions = {header.id for header in await rt.list_sessions()}
    assert {"other", "prober"} <= sessions
