"""``loopdock serve`` options a server user needs, run as a subprocess (LoopX off: no Node):
the dock config, the log lines for session start/end and loop decisions, the printed page
URLs, and one-line errors for a taken port and a bad config."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio
from line_reader import Lines
from trio_websocket import open_websocket

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$")
ENV = {**os.environ}

CONFIG = """\
defaultLoop: standard
sessionLoops:
  dsh-routed: minimal-first
agents:
  - id: helper
    model: ping-1
"""


def frame(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


async def test_serve_with_a_config_answers_from_it_and_logs_what_happens(tmp_path):
    config = tmp_path / "agents.yml"
    config.write_text(CONFIG)
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-P", "-m", "loopdock._cli", "serve", "--port", "0", "--no-loopx", "--home",
             str(tmp_path / "home"), "--config", str(config)],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
        )
        try:
            out, err = Lines(proc.stdout), Lines(proc.stderr)
            match = READY.match(await out.until(r"^loopdock serve: "))
            port, token = int(match[1]), (await trio.Path(match[2]).read_text()).strip()
            assert (await out.until(r"console: ")).strip() == f"console: http://127.0.0.1:{port}/console#token={token}"
            assert "goalbar?session=" in await out.until(r"goalbar: ")
            # the configured agent started, with its own id as its session id
            started = await err.until(r"session start")
            assert "origin='runtime'" in started and "session_id='helper'" in started and "loop='standard'" in started

            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                hello = {"token": token, "role": "dsh-host", "protocol": 1, "capabilities": ["dock", "live"]}
                await ws.send_message(frame("hello", hello))
                assert json.loads(await ws.get_message())["type"] == "welcome"
                await ws.send_message(frame("select", {"op": "create", "sessionId": "dsh-routed"}, id="q1"))
                answer = json.loads(await ws.get_message())
                assert (answer["type"], answer["data"]["loop"]) == ("selection", "minimal-first")
                decision = await err.until(r"loop decision")
                assert "session_id='dsh-routed'" in decision and "loop='minimal-first'" in decision
                items = [{"type": "agent/created", "agentId": "dsh-routed", "data": {"source": "startup", "sessionId": "dsh-routed"}}]
                await ws.send_message(frame("live", {"items": items}))
                assert "session_id='dsh-routed'" in await err.until(r"session start.*origin='dsh'")
                await ws.send_message(frame("live", {"items": [{"type": "agent/disposed", "agentId": "dsh-routed", "data": {}}]}))
                assert "session_id='dsh-routed'" in await err.until(r"session end")
                await ws.send_message(frame("select", {"op": "resume", "sessionId": "dsh-routed",
                                                       "binding": {"loop": "standard"}}, id="q2"))
                refused = json.loads(await ws.get_message())
                assert (refused["type"], refused["data"]["code"]) == ("error", "LOOP_SWITCH")
                assert "code='LOOP_SWITCH'" in await err.until(r"loop refused")
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_a_taken_port_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-P", "-m", "loopdock._cli", "serve", "--port", str(port), "--home", str(tmp_path / "h")],
            capture_output=True, text=True, timeout=60, env=ENV,
        )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"loopdock: PORT_IN_USE: 127.0.0.1:{port} is in use")
    assert not (tmp_path / "h").exists()  # refused before the runtime (and LoopX) started


def test_a_bad_config_is_one_line_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("agents:\n  - id: a\n    maxTokens: 0\n")
    for argv in (["serve", "--config", str(bad)], ["run", "x", "--config", str(bad), "--home", str(tmp_path / "h")]):
        done = subprocess.run([sys.executable, "-P", "-m", "loopdock._cli", *argv], capture_output=True, text=True,
                              timeout=60, env=ENV)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "INVALID_CONFIG" in done.stderr and "agents[0].maxTokens must be a positive integer" in done.stderr
