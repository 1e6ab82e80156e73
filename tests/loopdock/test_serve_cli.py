"""``loopdock serve`` run as a user runs it: a subprocess, its readiness line, a client;
and the GoalBar it serves, on the REAL loopx CLI (2.1.1, Node 22 from scripts/test) in
the tests that use the LoopX fixtures (e2e), and without LoopX in the others."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from trio_websocket import open_websocket

from loopdock import LoopxSettings, Runtime
from loopdock._bridge import goalbar_project_for, goalbar_service
from loopdock._serve import serve_command
from loopdock.runtime._errors import InvalidOptionsError
from loopdock.runtime.loopx import HOST_SURFACE, LoopxClient, LoopxOk

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$")
PHASE = 120  # interpreter start, runtime open, LoopX start-up (a few CLI calls), busy machine


async def read_line(stream):
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        assert chunk, f"serve exited before its readiness line; got {data!r}"
        data += chunk
    return data.decode().rstrip("\n")


def frame(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


async def goalbar_hello(ws, token):
    await ws.send_message(frame("hello", {"token": token, "role": "goalbar", "protocol": 1,
                                          "capabilities": ["goalbar"]}))
    welcome = json.loads(await ws.get_message())
    assert welcome["type"] == "welcome", welcome


async def ask(ws, type_, data, request_id):
    """Send one GoalBar request; its answer (pushed ``goalbar`` frames are skipped)."""
    await ws.send_message(frame(type_, data, id=request_id))
    while True:
        reply = json.loads(await ws.get_message())
        if reply.get("re") == request_id:
            return reply


async def http_get(port, path):
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body


@asynccontextmanager
async def serve_process(*args, env, cwd):
    """``loopdock serve --port 0 ARGS`` as a subprocess: yields (process, port, token path)
    once it printed its readiness line; killed if the test did not stop it."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-P", "-m", "loopdock._cli", "serve", "--port", "0", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        env={**env},
    )
    try:
        line = await read_line(proc.stdout)
        match = READY.match(line)
        assert match, line
        yield proc, int(match[1]), Path(match[2])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_prints_its_readiness_line_and_accepts_the_token_from_the_file(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):  # a cold interpreter start and a runtime open, on a busy machine
        async with serve_process("--home", str(home), "--no-loopx", env=os.environ, cwd=tmp_path) as (
            proc, port, token_path
        ):
            assert token_path == home / "bridge.token"
            assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
            token = token_path.read_text().strip()
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                hello = {"token": token, "role": "dsh-host", "protocol": 1, "capabilities": ["dock"]}
                await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": hello}))
                welcome = json.loads(await ws.get_message())
                assert welcome["type"] == "welcome" and welcome["data"]["capabilities"] == ["dock"]

            # Without LoopX the GoalBar is served but shows no bar, saying why; a click is
            # refused. Nothing calls a CLI.
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await goalbar_hello(ws, token)
                reply = await ask(ws, "goalbarRead", {"sessionId": "dsh-session-any"}, "r1")
                assert reply["data"] == {"state": {
                    "kind": "hidden", "sessionId": "dsh-session-any", "reason": "loopx-off",
                    "detail": "the LoopX integration is off in this runtime", "pending": False,
                }, "outcome": "read"}
                reply = await ask(ws, "goalbarPause", {"sessionId": "dsh-session-any"}, "p1")
                assert (reply["data"]["outcome"], reply["data"]["reason"]) == ("refused", "loopx-off")
                assert reply["data"]["state"]["reason"] == "loopx-off"

            # SIGTERM is a normal way to stop it: a clean close, exit status 0.
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0


async def loopx_ok(client, *args):
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)
    return result.payload


async def bind_session(client, goal, agent, session, objective, todos=()):
    """A goal with one agent lane (and its todos), bound to ``session``: as the loopx skill
    sets it up through the real CLI."""
    await loopx_ok(client, "bootstrap", "--project", ".", "--goal-id", goal, "--objective", objective,
                   "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
    await loopx_ok(client, "register-agent", "--goal-id", goal, "--agent-id", agent, "--require-new", "--execute")
    for text in todos:
        await loopx_ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent",
                       "--claimed-by", agent, "--task-class", "advancement_task", "--text", text)
    await loopx_ok(client, "bind-agent-thread", "--goal-id", goal, "--thread-id", session,
                   "--host-surface", HOST_SURFACE, "--agent-id", agent, "--execute")


async def test_serve_serves_the_goalbar_of_a_session_bound_in_real_loopx(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    session, goal, agent = "dsh-session-served-1", "goal-served", "agent-served"
    # No --runtime-root: serve's LoopX calls use the default one under HOME (loopx_env's).
    client = LoopxClient(loopx_command, project=loopx_project, env=loopx_env, timeout=60)
    with trio.fail_after(PHASE):
        await bind_session(client, goal, agent, session, "Publish the served GoalBar", ["[P0] One", "[P1] Two"])

    home = tmp_path / "home"
    with trio.fail_after(2 * PHASE):
        # LoopX on (the default), the project named with --project, started elsewhere.
        async with serve_process("--home", str(home), "--project", str(loopx_project),
                                 env=loopx_env, cwd=tmp_path) as (proc, port, token_path):
            token = token_path.read_text().strip()
            # What a browser opens: the page, on the same port.
            status, body = await http_get(port, f"/goalbar?session={session}&token={token}")
            assert status == "HTTP/1.1 200 OK" and b"goalbarWatch" in body

            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await goalbar_hello(ws, token)
                reply = await ask(ws, "goalbarRead", {"sessionId": session}, "r1")
                assert reply["type"] == "goalbarResult"
                assert reply["data"] == {"state": {
                    "kind": "visible", "sessionId": session, "goalId": goal, "agentId": agent,
                    "goalText": "Publish the served GoalBar", "lifecycleState": "active",
                    "processed": 0, "remaining": 2, "total": 2, "pending": False,
                    "agentRunning": False,  # no live agent of that session here: no continuation either
                }, "outcome": "read"}
                reply = await ask(ws, "goalbarRead", {"sessionId": "dsh-session-unbound"}, "r2")
                assert reply["data"]["state"] == {"kind": "hidden", "sessionId": "dsh-session-unbound",
                                                  "reason": "unbound", "pending": False}
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0


async def test_the_goalbar_uses_the_runtimes_loopx_integration(tmp_path, loopx_env, loopx_command, loopx_project):
    session, goal, agent = "dsh-session-integration", "goal-integration", "agent-integration"
    settings = LoopxSettings(env=loopx_env, command=tuple(loopx_command), initialize=False)
    with trio.fail_after(3 * PHASE):
        async with Runtime.open(tmp_path / "home", loopx=settings) as rt:
            await bind_session(rt.loopx.client_for(loopx_project), goal, agent, session, "Follow the runtime")
            project_for = goalbar_project_for(rt, loopx_project)
            async with goalbar_service(rt) as service:
                shown = await service.read(session, project_for(session))
                assert (shown.kind, shown.goal_id, shown.goal_text) == ("visible", goal, "Follow the runtime")
                # The CLI command is the integration's, read at every call: a command that
                # start-up or /loopx-init adopts is used from the next read on (here one
                # that cannot start, so the bar says LoopX failed instead of guessing).
                rt.loopx.command = (str(tmp_path / "no-such-loopx"),)
                broken = await service.read(session, project_for(session))
                assert (broken.kind, broken.reason) == ("hidden", "loopx-failure")
                rt.loopx.command = tuple(loopx_command)
                assert await service.read(session, project_for(session)) == shown


async def test_the_goalbar_project_is_a_runtime_agents_cwd_else_the_serve_project(rt, tmp_path):
    workdir = tmp_path / "agent-work"
    workdir.mkdir()
    handle = await rt.create_agent(session_id="runtime-agent-1", cwd=str(workdir))
    project_for = goalbar_project_for(rt, tmp_path / "serve-project")
    assert project_for("runtime-agent-1") == workdir
    assert project_for("dsh-session-elsewhere") == tmp_path / "serve-project"
    await handle.dispose()
    assert project_for("runtime-agent-1") == tmp_path / "serve-project"


async def test_the_goalbar_project_of_a_dsh_session_is_the_cwd_its_host_announced(rt, tmp_path):
    from loopdock.actors import LiveEvent
    from loopdock.bridge._host_handler import HostHandler

    class Conn:
        id, role, closed = "c1", "dsh-host", None

    host = HostHandler(rt.dock)
    project_for = goalbar_project_for(rt, tmp_path / "serve-project", host)
    await host.on_live(Conn(), [
        LiveEvent("agent/created", "a1", {"source": "startup", "sessionId": "dsh-1", "cwd": "/srv/repo", "inheritedEvents": 3}),
        LiveEvent("agent/created", "a2", {"source": "startup", "sessionId": "dsh-2", "cwd": "relative/path", "inheritedEvents": True}),
    ])
    assert (host.agents["a1"].cwd, host.agents["a1"].inherited_events) == ("/srv/repo", 3)
    assert (host.agents["a2"].cwd, host.agents["a2"].inherited_events) == (None, None)  # not trusted
    assert project_for("dsh-1") == Path("/srv/repo")
    assert project_for("dsh-2") == tmp_path / "serve-project"
    # once its agent ended (dsh headless after its task), while its mirror is kept: where
    # `goal bind` bound it, as the README's walkthrough does
    await host.on_live(Conn(), [LiveEvent("agent/disposed", "a1", {})])
    assert "a1" not in host.agents and project_for("dsh-1") == Path("/srv/repo")


async def test_serve_refuses_a_project_that_is_not_a_directory(tmp_path):
    with pytest.raises(InvalidOptionsError, match="--project is not a directory"):
        await serve_command(str(tmp_path / "home"), None, 0, None, loopx=False, project=tmp_path / "missing")
    assert not (tmp_path / "home").exists()  # refused before the runtime opened


@pytest.mark.e2e  # a real DSH host (and LoopX on, the default)
async def test_the_readmes_commands_run_a_real_dsh_on_the_runtimes_dock(tmp_path, loopx_env):
    """README, "A real DeepSeek Harness host on the bridge": `loopdock serve`, `loopdock
    dsh-patch --dock --ping`, then `dsh headless --patch ...`: DSH asks the runtime's dock
    for the loop, runs the task on it and records the binding in its own log."""
    from loopdock.bridge._dsh_files import (
        dsh_process,
        event_text,
        quiet_env,
        session_log,
        split_turns,
        turn_end,
    )

    dsh = Path(sys.executable).parent / "dsh"
    home, work, dsh_home = tmp_path / "home", tmp_path / "work", tmp_path / "dsh-home"
    work.mkdir()
    with trio.fail_after(3 * PHASE):
        async with serve_process("--home", str(home), env=loopx_env, cwd=tmp_path) as (proc, port, _):
            patch_dir = tmp_path / "dsh-patch"
            made = await trio.run_process(
                [sys.executable, "-P", "-m", "loopdock._cli", "dsh-patch", "--url", f"ws://127.0.0.1:{port}",
                 "--out", str(patch_dir), "--dock", "--ping", "--home", str(home)],
                env={**loopx_env}, capture_stdout=True,
            )
            assert f"wrote {patch_dir / 'patch.yml'}" in made.stdout.decode()
            async with dsh_process(
                dsh, ["headless", "--patch", str(patch_dir / "patch.yml"), "hello from the README"],
                cwd=work, env=quiet_env(dsh_home, tmp_path / "dsh-user"), output=tmp_path / "dsh.out",
            ) as headless:
                code = await headless.wait()
            assert code == 0, (tmp_path / "dsh.out").read_text(errors="replace")
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0

    (log_file,) = dsh_home.glob("sessions/*/*/session.v4.jsonl.zstd")
    events = [e for e in session_log(dsh_home, log_file.parent.name) if "seq" in e]
    bindings = [e["data"] for e in events if e["type"] == "plugin:loopdock/binding" and e.get("ignorable")]
    assert bindings == [{"loop": "standard", "driver": "default"}]
    (turn,) = split_turns(events)
    assert turn_end(turn) == {"kind": "completed"}
    assert [event_text(e) for e in turn if e["type"] == "assistant/message"] == ["pong: hello from the README"]
