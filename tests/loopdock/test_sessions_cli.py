"""``loopdock sessions list | show | tail``, run as a user runs them (subprocesses), over a
runtime's store and DSH logs written as DSH writes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from loopdock import Runtime
from loopdock.bridge._dsh_binding import BINDING_RECORD, _write
from loopdock.bridge._dsh_files import SESSION_FILE

ROOT = Path(__file__).resolve().parents[2]


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "loopdock._cli", *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )


def dsh_log(dsh_home: Path, session_id: str) -> None:
    header = {"type": "session", "version": 4, "id": session_id, "createdAt": 1, "cwd": "/w",
              "isSeeded": False, "delegationDepth": 0}
    events = [
        {"type": BINDING_RECORD, "seq": 0, "time": 1_000, "data": {"loop": "minimal-first", "driver": "default"}, "ignorable": True},
        {"type": "turn/start", "seq": 1, "time": 2_000, "data": {"turn": 1}},
        {"type": "user/message", "seq": 2, "time": 3_000,
         "data": {"role": "user", "id": "m1", "content": [{"type": "text", "text": "hello dsh"}], "source": {"kind": "user"}}},
        {"type": "assistant/message", "seq": 3, "time": 4_000,
         "data": {"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "pong: hello dsh"}]}}},
        {"type": "turn/end", "seq": 4, "time": 5_000, "data": {"turn": 1, "reason": {"kind": "error"}}},
    ]
    path = dsh_home / "sessions" / "--w--" / session_id / SESSION_FILE
    path.parent.mkdir(parents=True)
    _write(path, [header, *events])


async def test_list_and_show_cover_the_runtimes_sessions_and_dshs(tmp_path):
    home, dsh_home = tmp_path / "home", tmp_path / "dsh"
    with trio.fail_after(60):
        async with Runtime.open(home) as rt:
            handle = await rt.create_agent(session_id="writer-1", loop="minimal-first")
            handle.agent.followup("hello runtime")
            await handle.agent.wait_idle()
    dsh_log(dsh_home, "dsh-1")

    listed = cli("sessions", "list", "--home", str(home), "--dsh-home", str(dsh_home))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "FROM", "LOOP", "DRIVER", "STATUS", "TURNS", "LAST", "EVENT", "AT", "(UTC)"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["writer-1"][:6] == ["writer-1", "runtime", "minimal-first", "default", "completed", "1"]
    assert rows["dsh-1"][:7] == ["dsh-1", "dsh", "minimal-first", "default", "error", "1", "turn/end"]

    shown = cli("sessions", "show", "writer-1", "--home", str(home))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "writer-1 (runtime): loop minimal-first on driver default; completed; 1 turns"
    assert "[user] hello runtime" in shown.stdout and "pong: hello runtime" in shown.stdout

    shown = cli("sessions", "show", "dsh-1", "--home", str(home), env={"DSH_HOME": str(dsh_home)})
    assert shown.returncode == 0, shown.stderr
    assert "dsh-1 (dsh): loop minimal-first on driver default; error; 1 turns" in shown.stdout
    assert "pong: hello dsh" in shown.stdout and "turn 1 error" in shown.stdout

    missing = cli("sessions", "show", "nope", "--home", str(home))
    assert missing.returncode == 2
    assert missing.stderr.startswith("loopdock: SESSION_NOT_FOUND: no session 'nope'") and "Traceback" not in missing.stderr


async def test_tail_prints_the_last_events_then_follows_new_ones(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(120):
        async with Runtime.open(home) as rt:
            handle = await rt.create_agent(session_id="t1")
            handle.agent.followup("first")
            await handle.agent.wait_idle()
            await handle.agent.session.flush()
            done = cli("sessions", "tail", "t1", "-n", "2", "--no-follow", "--home", str(home))
            assert done.returncode == 0, done.stderr
            assert len(done.stdout.splitlines()) == 2 and "turn 1 completed" in done.stdout.splitlines()[-1]

            proc = await trio.lowlevel.open_process(
                [sys.executable, "-P", "-m", "loopdock._cli", "sessions", "tail", "t1", "-n", "1", "--home", str(home)],
                stdout=subprocess.PIPE, env={**os.environ},
            )
            try:
                seen = b""

                async def until(text: bytes) -> None:
                    nonlocal seen
                    while text not in seen:
                        chunk = await proc.stdout.receive_some()
                        assert chunk, seen
                        seen += chunk

                await until(b"turn 1 completed")  # the last past event, first
                handle.agent.followup("second")   # now a new turn, while it follows
                await handle.agent.wait_idle()
                await handle.agent.session.flush()
                await until(b"turn 2 completed")
                assert b"pong: second" in seen and b"pong: first" not in seen
            finally:
                proc.kill()
                await proc.wait()
