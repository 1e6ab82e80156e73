"""Fixtures of the loopdock (public face) tests: ``children``, a runtime in a child
process (``home_child.py``) for the tests that compete with it or kill it, started with
its stdout read line by line and its stderr kept in a file; ``main``, loopdock's main in
this process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import trio

from loopdock._cli import main as _main

CHILD = Path(__file__).with_name("home_child.py")


class Child:
    def __init__(self, process: trio.Process, stderr: Path) -> None:
        self.process = process
        self.pid = process.pid
        self.stderr = stderr  # where to look when it ends early
        assert process.stdout is not None
        self._stdout = process.stdout
        self._buffer = b""

    async def line(self) -> str | None:
        """The next line it printed, or None once its output ended."""
        while b"\n" not in self._buffer:
            chunk = await self._stdout.receive_some()
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    async def kill_9(self) -> None:
        """SIGKILL, then wait until it is gone."""
        self.process.send_signal(signal.SIGKILL)
        assert await self.process.wait() == -signal.SIGKILL


class Children:
    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._started = 0

    async def start(self, *args: str) -> Child:
        self._started += 1
        stderr = self._directory / f"child-{self._started}.err"
        async with await trio.open_file(stderr, "wb") as err:
            process = await trio.lowlevel.open_process(
                [sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=err.wrapped
            )
        return Child(process, stderr)


@pytest.fixture
def children(tmp_path_factory) -> Children:
    return Children(tmp_path_factory.mktemp("children"))


@pytest.fixture
def main():
    """``loopdock``'s main. It configures structlog to print to the stderr of the moment
    (capsys's, closed after the test): the configuration is put back afterwards, so that
    later tests' warnings do not go to a closed file."""
    saved = structlog.get_config()
    yield _main
    structlog.configure(**saved)
