"""The bridge workload (workload 4): the websocket bridge over loopback, server side.

This process plays the runtime as ``loopdock serve`` would: a real ``Runtime`` (on a
temporary home), ``serve_bridge`` on 127.0.0.1 with a ``HostHandler`` (mirrors the host's
sessions, answers pre-steps through ``gate(agent_id, callback)``), wrapped in a
``GoalBarHandler`` (the ``/goalbar`` endpoint: session events wake the watched bars). A
second process (``benchmarks._bridge_client``, its own trio loop) plays the DSH host with
the plugin's frames and a GoalBar page; see that module for what is timed.

Two things here are the bench's, not the library's, and are labelled so in the figures:

- LoopX is not called: the GoalBar service gets a stand-in LoopX client (its injectable
  ``client_for``) answering at once: "bound, active, processed = the events the
  ``HostHandler`` has mirrored for the session". So a bar changes with every re-read that
  follows new events, and the figures are the bridge's and the service's own cost.
- No shipped handler forwards host session events to GoalBar pages (``publish_event`` is
  the server's outgoing, batched path for them, unused by the runtime so far): for the
  relay figure the bench's handler publishes each mirrored event of session
  ``bench-relay-0`` to every connected page.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from loopdock import GC_THRESHOLD, Runtime
from loopdock.bridge import (
    BridgeConnection,
    Disconnect,
    GoalBarHandler,
    GoalBarService,
    HostHandler,
    PreStep,
    SessionEvent,
    Verdict,
    serve_bridge,
)
from loopdock.runtime.loopx import (
    LifecycleResult,
    LoopxClient,
    LoopxOk,
    ThreadBinding,
    TodoProgress,
)

from ._bridge_client import AGENT_PREFIX, INGEST_PREFIX, OWNED_KIND, RELAY_SESSION
from ._common import PROGRESS_PREFIX, Progress, peak_rss_bytes

GOAL_ID = "bench-goal"


class MirrorLoopx(LoopxClient):
    """A stand-in for LoopX (no CLI is run): every session is bound to ``bench-goal``,
    lifecycle ``active``, and its agent lane has done as many todos as the host handler
    mirrored events of that session. A raw call (``run``) is answered for ``status`` (the
    goal's text) and refused otherwise, so a new read cannot reach for a real CLI."""

    def __init__(self, host: HostHandler, project: Path) -> None:
        super().__init__(("loopx-is-not-run-by-the-bench",), project=project)
        self._host = host
        self.reads = 0

    async def run(self, *args: str, retry: bool = False) -> LoopxOk:  # type: ignore[override]
        if args[:1] == ("status",):
            return LoopxOk({"run_history": {"goals": [{"id": GOAL_ID, "display_name": "the bench's goal"}]}})
        raise RuntimeError(f"the bench's LoopX stand-in was asked for {' '.join(args[:2])!r}")

    async def resolve_thread(self, thread_id: str) -> ThreadBinding:  # type: ignore[override]
        return ThreadBinding("bound", GOAL_ID, thread_id)

    async def goal_lifecycle(self, goal_id: str, operation: str, *, execute: bool) -> LifecycleResult:  # type: ignore[override]
        return LifecycleResult(operation, "active", "active", False, False, "not_executed", False, {})

    async def todo_progress(self, goal_id: str, agent_id: str) -> TodoProgress:  # type: ignore[override]
        self.reads += 1
        done = len(self._host.sessions.get(agent_id, ()))
        return TodoProgress(done, 0, done)


class BenchHandler(GoalBarHandler):
    """``GoalBarHandler`` around a ``HostHandler``, plus the bench's relay of session
    ``bench-relay-0`` to connected GoalBar pages (see the module docstring)."""

    def __init__(self, service: GoalBarService, project: Path, nursery: trio.Nursery, host: HostHandler) -> None:
        super().__init__(service, lambda session_id: project, nursery, inner=host)
        self.pages: list[BridgeConnection] = []
        self.relayed = 0
        self.not_relayed = 0
        self.endings: list[dict[str, str]] = []

    def connected(self, conn: BridgeConnection) -> None:
        super().connected(conn)
        if conn.role == "goalbar":
            self.pages.append(conn)

    def disconnected(self, conn: BridgeConnection, reason: Disconnect) -> None:
        if conn in self.pages:
            self.pages.remove(conn)
        self.endings.append({"role": conn.role, "kind": reason.kind, "detail": reason.detail})
        super().disconnected(conn, reason)

    async def on_events(self, conn: BridgeConnection, items: Sequence[SessionEvent]) -> None:  # type: ignore[override]
        await super().on_events(conn, items)
        for item in items:
            if item.session_id == RELAY_SESSION:
                for page in self.pages:
                    if page.publish_event(item.session_id, item.event):
                        self.relayed += 1
                    else:
                        self.not_relayed += 1


def _gate(request: PreStep) -> Verdict:
    """The runtime's verdict: enter for messages of the kind it owns (all the bench sends)."""
    if all(m.get("source", {}).get("kind") == OWNED_KIND for m in request.messages):
        return Verdict("enter")
    return Verdict("reject", "not a message of a kind this runtime owns")


async def _run_client(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The client process: params on stdin, figures on stdout, progress on stderr."""
    env = dict(os.environ)
    tail: list[str] = []
    chunks: list[bytes] = []
    process = await trio.lowlevel.open_process(
        [sys.executable, "-P", "-m", "loopdock.benchmarks._bridge_client"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdout, stderr = process.stdout, process.stderr

    async def read_stdout() -> None:
        async for chunk in stdout:
            chunks.append(chunk)

    async def read_stderr() -> None:
        pending = b""
        async for chunk in stderr:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if line.startswith(PROGRESS_PREFIX):
                    fraction, _, label = line[len(PROGRESS_PREFIX):].strip().partition(" ")
                    progress(float(fraction), label)
                else:
                    tail.append(line)
                    del tail[:-40]

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stdout)
            nursery.start_soon(read_stderr)
            async with process.stdin:
                await process.stdin.send_all(json.dumps(params).encode())
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if code != 0:
        raise RuntimeError(f"the bridge client failed (exit {code}):\n" + "\n".join(tail))
    return json.loads(b"".join(chunks))


def _make_scratch() -> tempfile.TemporaryDirectory[str]:
    scratch = tempfile.TemporaryDirectory(prefix="loopdock-bench-bridge-")
    Path(scratch.name, "project").mkdir()
    return scratch


@asynccontextmanager
async def _scratch() -> AsyncIterator[Path]:
    """A temporary folder with an empty ``project`` folder, removed afterwards; both on
    the disk in a worker thread, as the runtime does its own disk work."""
    scratch = await trio.to_thread.run_sync(_make_scratch)
    try:
        yield Path(scratch.name)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(scratch.cleanup)


async def run_bridge(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``sequential``, ``warmup``, ``bursts``, ``burst_size``, ``agents``,
    ``ingest_events``, ``ingest_sessions``, ``relay_events``, ``relay_window``,
    ``goalbar_wakes``, ``goalbar_flood``."""
    token = secrets.token_urlsafe(24)
    async with _scratch() as scratch:
        project = scratch / "project"
        async with Runtime.open(scratch / "home", gc_threshold=GC_THRESHOLD) as rt:
            host = HostHandler(rt.dock)
            readers: dict[Path, MirrorLoopx] = {}

            def client_for(path: Path) -> MirrorLoopx:  # one client per project, as a runtime keeps
                if path not in readers:
                    readers[path] = MirrorLoopx(host, path)
                return readers[path]

            for i in range(params["agents"]):
                host.gate(f"{AGENT_PREFIX}{i}", _gate)
            async with GoalBarService.open(client_for) as service, trio.open_nursery() as nursery:
                handler = BenchHandler(service, project, nursery, host)
                port = await nursery.start(functools.partial(serve_bridge, handler, token=token))
                cpu_started = time.process_time()
                client = await _run_client({**params, "port": port, "token": token}, progress)
                cpu = time.process_time() - cpu_started
                nursery.cancel_scope.cancel()
            ingest_sessions = [s for s in host.sessions if s.startswith(INGEST_PREFIX)]
            mirrored = {
                "ingest_events": sum(len(host.sessions[s]) for s in ingest_sessions),
                "relay_events": len(host.sessions.get(RELAY_SESSION, ())),
                "gaps": len(host.gaps),
            }
    return {
        "status": "ok",
        "setup": "client process (DSH host frames + a GoalBar page) -> loopback websocket -> "
        "serve_bridge + HostHandler + GoalBarHandler in the bench process",
        **client,
        "server": {
            **mirrored,
            "relayed": handler.relayed,
            "not_relayed": handler.not_relayed,
            "goalbar_reads": sum(r.reads for r in readers.values()),
            "endings": handler.endings,
            "cpu_seconds": cpu,
            "peak_rss_mb": peak_rss_bytes() / 2**20,
        },
    }
