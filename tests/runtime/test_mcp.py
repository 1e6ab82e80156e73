"""MCP servers as an agent's tools, against a real server written with the SDK
(tests/mcp_server.py): stdio (a child under the launcher) and streamable HTTP."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from loopdock import Runtime
from loopdock.runtime import AgentOptions, InvalidOptionsError
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")
TIMEOUT = 60


def options(**server):
    spec = {"name": "t", "command": [sys.executable, SERVER, "stdio"], **server}
    return {"provider": "scripted", "model": "script-1", "mcp_servers": [spec]}


def call(name, call_id, **arguments):
    return Reply(tool_calls=[ToolCall(name, arguments, call_id=call_id)])


async def results(agent):
    events = await agent.session.read_events()
    return {b["callId"]: (b["content"], b["isError"]) for e in events if e.type == "tool/result" for b in e.data["content"]}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def run_turn(rt, adapter, session_id="a1", **server):
    rt.register_adapter("scripted", adapter)
    handle = await rt.create_agent(session_id=session_id, agent_options=options(**server))
    handle.agent.followup("go")
    await handle.agent.wait_idle()
    return handle


async def test_the_model_calls_an_mcp_tool_and_the_server_dies_with_the_agent(tmp_path):
    adapter = ScriptedAdapter([call("t__echo", "c1", text="hi"), call("t__pid", "c2"), call("t__fail", "c3"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await run_turn(rt, adapter)
            got = await results(handle.agent)
            assert got["c1"] == ("echo: hi", False)
            assert got["c3"][1] is True and "boom" in got["c3"][0]
            pid = int(got["c2"][0])
            assert alive(pid)
            # The server's tools were offered with the server's schema.
            [spec] = [t for t in adapter.requests[0].tools if t.name == "t__echo"]
            assert spec.parameters["properties"]["text"]["type"] == "string"
            await handle.dispose()
            assert not alive(pid)


async def test_the_tool_list_is_refreshed_when_the_server_says_it_changed(tmp_path):
    adapter = ScriptedAdapter([call("t__grow", "c1"), "grown", call("t__late", "c2"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await run_turn(rt, adapter)
            assert "t__late" not in [t.name for t in adapter.requests[0].tools]
            with trio.fail_after(10):  # the refresh the notification started
                await handle.agent.tools.wait_until(lambda: "t__late" in handle.agent.tools.names())
            handle.agent.followup("again")
            await handle.agent.wait_idle()
            assert (await results(handle.agent))["c2"] == ("late one", False)
            await handle.dispose()


async def test_a_crash_mid_call_fails_that_call_and_the_next_call_restarts_the_server(tmp_path):
    adapter = ScriptedAdapter([call("t__pid", "c1"), call("t__crash", "c2"), call("t__pid", "c3"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await run_turn(rt, adapter)
            got = await results(handle.agent)
            assert got["c2"][1] is True and "exited during the call" in got["c2"][0]
            first, second = int(got["c1"][0]), int(got["c3"][0])
            assert first != second and not alive(first) and alive(second)
            await handle.dispose()
            assert not alive(second)


async def test_past_the_restart_budget_the_tools_answer_unavailable(tmp_path):
    adapter = ScriptedAdapter([call("t__crash", "c1"), call("t__crash", "c2"), call("t__echo", "c3", text="x"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await run_turn(rt, adapter, maxRestarts=1)
            got = await results(handle.agent)
            assert got["c3"][1] is True and "unavailable" in got["c3"][0]
            assert (handle.agent.status, adapter.remaining) == ("idle", 0)  # the agent went on
            await handle.dispose()


async def test_a_server_that_never_answers_costs_only_its_call(tmp_path):
    adapter = ScriptedAdapter([call("t__hang", "c1"), call("t__echo", "c2", text="after"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await run_turn(rt, adapter, timeout=1)
            got = await results(handle.agent)
            assert got["c1"][1] is True and "did not answer within 1 s" in got["c1"][0]
            assert got["c2"] == ("echo: after", False)
            await handle.dispose()


def test_bad_server_specs_are_refused():
    with pytest.raises(InvalidOptionsError, match="exactly one of command"):
        AgentOptions.from_value({"mcp_servers": [{"name": "x"}]})
    with pytest.raises(InvalidOptionsError, match="name"):
        AgentOptions.from_value({"mcp_servers": [{"name": "a.b", "url": "http://127.0.0.1:1/mcp"}]})
    spec = AgentOptions.from_value({"mcpServers": [{"name": "x", "command": ["srv"], "maxRestarts": 2}]}).mcp_servers
    assert (spec[0].command, spec[0].max_restarts) == (("srv",), 2)


async def test_a_configured_agent_mounts_the_servers_its_config_names(tmp_path):
    config = {"agents": [{"id": "cfg", "provider": "ping", "model": "ping-1",
                          "mcpServers": [{"name": "t", "command": [sys.executable, SERVER, "stdio"]}]}]}  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", config=config) as rt:
            started = await rt.dock.wait_configured()
            assert rt.dock.warnings == []
            tools = started["cfg"].agent.tools.names()
            assert {"t__echo", "t__pid", "t__crash"} <= set(tools)
            await started["cfg"].dispose()


@pytest.fixture
async def http_server(nursery):
    """The test server on streamable HTTP at 127.0.0.1 (a free port), once it listens."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await nursery.start(
        functools.partial(trio.run_process, [sys.executable, SERVER, "http", str(port)], stderr=subprocess.PIPE,
                          check=False)  # fmt: skip
    )
    seen = b""
    with trio.fail_after(TIMEOUT):
        while b"Uvicorn running on" not in seen:  # its own word that it listens
            chunk = await process.stderr.receive_some()
            assert chunk, f"the server exited before listening: {seen.decode(errors='replace')}"
            seen += chunk
    nursery.start_soon(_drain, process.stderr)
    yield f"http://127.0.0.1:{port}/mcp", process
    process.kill()


async def _drain(stream) -> None:
    while await stream.receive_some():
        pass


async def test_a_streamable_http_server_s_tools_work_and_its_death_costs_only_its_calls(tmp_path, http_server):
    url, process = http_server
    adapter = ScriptedAdapter([call("h__echo", "c1", text="over http"), call("h__crash", "c2"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.register_adapter("scripted", adapter)
            options = {"provider": "scripted", "model": "script-1",
                       "mcp_servers": [{"name": "h", "url": url, "timeout": 3}]}  # fmt: skip
            handle = await rt.create_agent(session_id="h1", agent_options=options)
            handle.agent.followup("go")
            await handle.agent.wait_idle()
            got = await results(handle.agent)
            assert got["c1"] == ("echo: over http", False)
            assert got["c2"][1] is True  # the server died mid-call: that call fails, the turn goes on
            assert (handle.agent.status, adapter.remaining) == ("idle", 0)
            await handle.dispose()
        assert await process.wait() == 3  # crash() exited the server as asked


async def test_a_server_that_exits_before_its_handshake_fails_at_once_not_at_its_timeout(tmp_path):
    # A 300 s handshake timeout, and a bound of 60 s on the whole test: only the exit can end it.
    dead = {"name": "d", "command": [sys.executable, "-c", "import sys; sys.exit(4)"], "timeout": 300,
            "maxRestarts": 0}  # fmt: skip
    adapter = ScriptedAdapter([call("d__anything", "c1"), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.register_adapter("scripted", adapter)
            options = {"provider": "scripted", "model": "script-1", "mcp_servers": [dead]}
            handle = await rt.create_agent(session_id="d1", agent_options=options)
            assert not [name for name in handle.agent.tools.names() if name.startswith("d__")]
            handle.agent.followup("go")
            await handle.agent.wait_idle()
            got = await results(handle.agent)
            assert got["c1"][1] is True  # the model's call of a tool that never came is an error it sees
            assert (handle.agent.status, adapter.remaining) == ("idle", 0)
            await handle.dispose()


async def test_images_stderr_floods_and_stdout_floods_cost_only_what_they_must(tmp_path):
    adapter = ScriptedAdapter([call("t__picture", "c1"), call("t__shout", "c2"), call("t__flood", "c3"),
                               call("t__echo", "c4", text="after"), "done"])  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await run_turn(rt, adapter)
            got = await results(handle.agent)
            assert got["c1"] == ("[image image/png, 100 bytes]", False)  # a placeholder, not 100 bytes of base64
            assert got["c2"] == ("still here", False)  # a megabyte of stderr is read and dropped past the cap
            assert got["c3"][1] is True  # a 9 MiB line on the protocol's channel stops that server...
            assert got["c4"] == ("echo: after", False)  # ...and the next call has a new one
            await handle.dispose()
