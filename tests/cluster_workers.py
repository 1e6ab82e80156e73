"""Real worker processes (``loopdock worker --cluster``) for the cluster's tests, and
``until_event``: wait for an event in a (remote) agent's log."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import trio

LOOPDOCK = [sys.executable, "-P", "-m", "loopdock"]


class WorkerProcess:
    """A worker and every line it wrote (one task reads them all, so it never blocks on
    a full pipe); ``until(pattern)`` waits for a matching line."""

    def __init__(self, process: trio.Process, name: str) -> None:
        self.process, self.name = process, name
        self.lines: list[str] = []
        self._changed = trio.Event()
        self._ended = False

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            self.lines += [line.decode(errors="replace") for line in done]
            self._changed.set()
            self._changed = trio.Event()
        self._ended = True
        self._changed.set()

    async def until(self, pattern: str) -> str:
        regex, index = re.compile(pattern), 0
        while True:
            for line in self.lines[index:]:
                if regex.search(line):
                    return line
            index = len(self.lines)
            assert not self._ended, f"worker {self.name} ended before {pattern!r}: {self.lines[-20:]}"
            await self._changed.wait()

    def signal(self, sig: int) -> None:
        if self.process.returncode is None:
            os.kill(self.process.pid, sig)

    async def stop(self) -> int:
        self.signal(signal.SIGTERM)
        with trio.fail_after(30):
            return await self.process.wait()


async def start_worker(nursery: trio.Nursery, url: str, home: Path, name: str, *, ttl: float = 1.0,
                       shards: int = 4, passivate_after: float | None = None) -> WorkerProcess:
    """``passivate_after``: the worker's ``--passivate-after`` (None: its default)."""
    passivation = [] if passivate_after is None else ["--passivate-after", str(passivate_after)]
    # Started by the nursery: cancelling it (the test's end) kills the worker.
    process = await nursery.start(functools.partial(
        trio.run_process,
        [*LOOPDOCK, "-v", "worker", "--cluster", url, "--home", str(home), "--id", name, "--lease-ttl", str(ttl),
         "--shards", str(shards), "--shell-allow", "sleep", *passivation],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
    ))
    worker = WorkerProcess(process, name)
    nursery.start_soon(worker.read)
    with trio.fail_after(60):
        await worker.until(f"loopdock worker {name}: serving")
    return worker


async def until_event(agent, predicate, start=0):
    """The first event of ``agent``'s log from seq ``start`` on for which ``predicate``
    holds, once it is durable."""
    async for event in agent.events(start):
        if predicate(event):
            return event
