"""``loopdock serve`` run as a user runs it: a subprocess, its readiness line, a client."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import trio
from trio_websocket import open_websocket

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$")


async def read_line(stream):
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        assert chunk, f"serve exited before its readiness line; got {data!r}"
        data += chunk
    return data.decode().rstrip("\n")


async def test_serve_prints_its_readiness_line_and_accepts_the_token_from_the_file(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):  # a cold interpreter start and a runtime open, on a busy machine
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "runtime._cli", "serve", "--port", "0", "--home", str(home), "--no-loopx"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            line = await read_line(proc.stdout)
            match = READY.match(line)
            assert match, line
            port, token_path = int(match[1]), Path(match[2])
            assert token_path == home / "bridge.token"
            assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
            token = token_path.read_text().strip()
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                hello = {"token": token, "role": "dsh-host", "protocol": 1, "capabilities": ["dock"]}
                await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": hello}))
                welcome = json.loads(await ws.get_message())
                assert welcome["type"] == "welcome" and welcome["data"]["capabilities"] == ["dock"]
            # SIGTERM is a normal way to stop it: a clean close, exit status 0.
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
