"""README's "The same from your own program", run as written: its Python block, alone in an
empty directory, as a new interpreter, with the port 8765 replaced by a free one (the only
change); then its `loopdock dsh-patch --dock --ping` line (the same port) and a real `dsh
headless` with that patch, twice. Real everything: the DSH host, the LoopX CLI on Node 22 for
the program's LoopX start-up (which installs the `loopx` skill DSH's skill tool then finds).
Offline: temporary HOME, LOOPDOCK_HOME and DSH_HOME, telemetry off, the ping model, loopback.

The README's task is replaced by the test's: each says FOLLOWUP, which makes the ping model
hold its answer until a followup is queued for the agent's next turn, so that the program's
message lands while `dsh headless` still runs, whatever the machine's load (DSH exits once
its agent is idle with nothing queued). The second task also makes the model call DSH's
`skill` tool with `{"name": "loopx"}`.

What it shows: the program's dock answered DSH's `select` (the binding is in DSH's log), the
ping model answered the task, the program's followup reached the DSH agent and was answered
in a turn of its own, the agent's end reached the program, and only the session whose model
called the skill (DSH logs `tool/result {message: {role: tool, toolCallId}}`) has its LoopX
continuation activated, the continuation `loopdock serve` attaches (both use
``Runtime.serve_bridge``'s composition)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from line_reader import Lines
from readme_blocks import blocks, blocks_for
from terminal import ctrl_c_as_at_a_terminal

from loopdock.bridge._dsh_files import dsh_process, event_source, event_text, session_log, split_turns, turn_end

DSH = Path(sys.executable).parent / "dsh"
SECTION = "### The same from your own program"
PHASE = 240  # an interpreter start and LoopX's start-up (a few CLI calls on Node 22), or one DSH run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def the_block() -> str:
    (block,) = blocks_for("dsh")
    assert block in blocks("python", SECTION)[0], "the DSH block is the section's program"
    assert block.count("8765") == 1, "the port is the one thing the test changes"
    return block


async def test_the_readmes_program_serves_a_real_dsh_headless(tmp_path, loopx_env):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    block = the_block()
    (followup,) = re.findall(r'agent\.followup\("([^"]+)"\)', block)
    patch_line, dsh_line = blocks("sh", SECTION)[0].strip().splitlines()
    port = free_port()
    program, work, dsh_home = tmp_path / "program", tmp_path / "work", tmp_path / "dsh-home"
    program.mkdir()
    work.mkdir()
    (program / "bridge.py").write_text(block.replace("8765", str(port)))
    # As Install says: DSH_HOME, telemetry off, LOOPDOCK_HOME (one home for the program and
    # dsh-patch: the token), Node 22 and the loopx and dsh commands on PATH. One HOME for
    # the program and DSH: the loopx skill start-up installs is where DSH looks for it.
    env = {
        **loopx_env, "DSH_HOME": str(dsh_home), "DSH_TELEMETRY_MODE": "DISABLED",
        "DSH_TELEMETRY_OTLP_URL": "http://127.0.0.1:9/v1/logs",
        "LOOPDOCK_HOME": str(Path(loopx_env["HOME"]) / ".loopdock"),
    }

    with trio.fail_after(5 * PHASE):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "bridge.py"], cwd=program, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=ctrl_c_as_at_a_terminal,
        )
        try:
            out, err = Lines(proc.stdout, PHASE), Lines(proc.stderr)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_drain, err)  # read as it comes: a full pipe would stall the program
                await out.until(rf"^serving DSH hosts at ws://127\.0\.0\.1:{port}$")

                made = await trio.run_process(
                    ["bash", "-c", "set -euo pipefail\n" + patch_line.replace("8765", str(port))],
                    cwd=work, env=env, capture_stdout=True, capture_stderr=True, check=False,
                )
                assert made.returncode == 0, made.stderr.decode()
                argv = shlex.split(dsh_line)
                assert argv[:3] == ["dsh", "headless", "--patch"] and len(argv) == 5, argv

                tasks = ["Draft the release notes, then answer the FOLLOWUP", 'call: skill {"name": "loopx"}\nFOLLOWUP']
                sessions = []
                for i, task in enumerate(tasks):
                    async with dsh_process(DSH, [*argv[1:4], task], cwd=work, env=env,
                                           output=tmp_path / f"dsh-{i}.out") as dsh:
                        code = await dsh.wait()
                    said = (tmp_path / f"dsh-{i}.out").read_text(errors="replace")
                    assert code == 0, said
                    assert f"pong: {followup}\n" in said, said  # headless prints the last answer
                    new = "".join(f"(?!{re.escape(known)}:)" for known in sessions)
                    started = await out.until(rf"^{new}session-\S+: started in {re.escape(str(work))}$")
                    session = started.split(":", 1)[0]
                    sessions.append(session)
                    await out.until(rf"^{session}: invoked loopx: ")

                proc.send_signal(signal.SIGINT)  # the README's Ctrl-C
                code = await proc.wait()
            # (the nursery waited for the end of its stderr)
            assert code == 0, "\n".join(err.lines)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert err.lines == [] and err.buffer == b"", err.lines  # a quiet library: nothing on stderr

    for session, task, invoked in zip(sessions, tasks, ("False", "True"), strict=True):
        printed = [f"started in {work}", f"pong: {task}", f"pong: {followup}", f"invoked loopx: {invoked}"]
        assert "".join(f"{session}: {line}\n" for line in printed) in "".join(f"{line}\n" for line in out.lines)

        events = [e for e in session_log(dsh_home, session) if "seq" in e]
        # the program's dock answered DSH's select: the binding DSH recorded
        assert [e["data"] for e in events if e["type"] == "plugin:loopdock/binding"] == [
            {"loop": "standard", "driver": "default"}
        ]
        asked, answered = split_turns(events)
        assert (turn_end(asked), turn_end(answered)) == ({"kind": "completed"}, {"kind": "completed"})
        assert [event_text(e) for e in asked if e["type"] == "assistant/message"][-1] == f"pong: {task}"
        # the program's message, a turn of its own, answered by the ping model
        (message,) = [e for e in answered if e["type"] == "user/message"]
        assert (event_text(message), event_source(message)) == (followup, {"kind": "user"})
        assert [event_text(e) for e in answered if e["type"] == "assistant/message"] == [f"pong: {followup}"]

        calls = [e for e in events if e["type"] == "tool/call"]
        if invoked == "False":
            assert calls == []
            continue
        # the model's skill call and DSH's own record of its result: what activated LoopX
        (call,) = calls
        assert (call["data"]["name"], json.loads(call["data"]["arguments"])) == ("skill", {"name": "loopx"})
        (result,) = [e for e in events if e["type"] == "tool/result"]
        message = result["data"]["message"]
        assert (message["role"], message["toolCallId"], message["isError"]) == ("tool", call["data"]["callId"], False)
        assert call in asked and result in asked


async def _drain(lines: Lines) -> None:
    """Read a stream to its end (its lines stay in ``lines.lines``)."""
    while True:
        chunk = await lines.stream.receive_some()
        if not chunk:
            return
        lines.buffer += chunk
        *done, lines.buffer = lines.buffer.split(b"\n")
        lines.lines += [line.decode() for line in done]


def test_the_readme_shows_the_commands_that_reach_the_program():
    assert "rt.serve_bridge(port=8765)" in the_block()
    patch_line, dsh_line = blocks("sh", SECTION)[0].strip().splitlines()
    assert patch_line == "loopdock dsh-patch --url ws://127.0.0.1:8765 --out ./dsh-patch --dock --ping"
    assert dsh_line.startswith("dsh headless --patch ./dsh-patch/patch.yml ")
