"""A real redis-server (Debian's, installed by scripts/test) per test, on a free loopback
port, with its append-only file in the test's temporary directory."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (scripts/test installs Debian's redis-server)"
        self.process = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
             "--loglevel", "notice"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.monotonic() + 20
        assert self.process.stdout is not None
        for line in self.process.stdout:  # blocks until redis says it is ready (or exits)
            if "Ready to accept connections" in line:
                return
            assert time.monotonic() < deadline, "redis-server did not start within 20 s"
        raise AssertionError(f"redis-server exited with {self.process.wait()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=20)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
