"""``loopdock serve``: the runtime and its bridge server, until interrupted."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TextIO

import trio

from loopdock.actors.dock import load_config
from loopdock.actors.loopx import LoopxSettings
from loopdock.bridge import DEFAULT_HOST, TOKEN_FILE
from loopdock.runtime import GC_THRESHOLD, InvalidOptionsError, PortInUseError, get_logger, resolve_home
from loopdock.runtime.tools import ShellPolicy

from ._bridge import open_bridge, page_urls
from ._open_cluster import open_cluster
from ._otlp import otlp_tracing, traces_url
from ._project import checked_project
from ._runtime import Runtime

if TYPE_CHECKING:
    from ._serve_cluster import ClusterFollower

log = get_logger(__name__)


def check_port(host: str, port: int) -> None:
    """PortInUseError if ``host:port`` cannot be bound; checked before the runtime and
    LoopX's start-up, so a taken port is one line at once, not a traceback later."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio's listener
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUseError(
                f"{host}:{port} is in use ({exc.strerror or exc}): stop what listens there, "
                "or pick another --port (--port 0: any free port)"
            ) from None


@asynccontextmanager
async def follow_cluster(url: str | None, rt: Runtime) -> AsyncIterator[tuple[ClusterFollower | None, int]]:
    """With a cluster URL: the follower of its agents for the console, and how many
    workers are live; its workers must offer this serve's loops and drivers."""
    if url is None:
        yield None, 0
        return
    # Here, not at the top: the cluster needs coredis (pip install 'loopdock[cluster]').
    from ._serve_cluster import ClusterFollower, check_registry

    async with open_cluster(url) as cluster:
        workers = await check_registry(cluster, rt.dock)
        if not workers:
            log.warning("no worker is live in the cluster yet; its agents show once workers run them")
        yield ClusterFollower(cluster, rt.dock), workers


async def serve_command(
    home: str | None,
    host: str | None,
    port: int,
    out: TextIO,
    loopx: bool = True,
    project: str | os.PathLike[str] | None = None,
    *,
    config: str | os.PathLike[str] | None = None,
    shell: ShellPolicy | None = None,
    cluster: str | None = None,
    otlp: str | None = None,
) -> None:
    """Open the runtime on ``home``, serve the bridge on ``host`` (default loopback) and
    ``port`` (0: any free port), print one readiness line on ``out`` (then the console's
    and the GoalBar's URLs), and run until SIGINT or SIGTERM; then close everything
    (sessions made durable).

    The bridge answers DSH hosts' loop selection from the runtime's dock (``config``: the
    dock's YAML, as ``Runtime.open(config=...)``), mirrors every live DSH agent as a
    ``DshAgent`` with a LoopX continuation driver (with ``loopx``), serves the GoalBar
    and the console (pages and websocket), and logs each session start and end and each
    loop decision (logger ``loopdock.serve``, info). ``loopx``: enable the LoopX
    integration. ``shell``: the shell tool's policy for the runtime's own agents.
    ``project``: the LoopX project of sessions the runtime does not own and no DSH host
    announced a ``cwd`` for (default: the current directory). ``cluster``: a cluster's
    ``redis://`` URL; its workers must offer the loops and drivers this dock offers
    (REGISTRY_MISMATCH), its agents show on the console, and ``config`` may not name
    agents (they would run here, outside the cluster). ``otlp``: an OTLP/HTTP collector's
    URL (``http://127.0.0.1:4318``): the runtime's spans are exported there
    (``loopdock[otel]``; ``loopdock._otlp``), the rest flushed on exit."""
    host = host or DEFAULT_HOST
    project_dir = await trio.to_thread.run_sync(checked_project, project, "--project")
    # A bad file: one line, now.
    dock_config = await trio.to_thread.run_sync(load_config, config) if config is not None else None
    if cluster is not None:
        from loopdock.runtime.cluster import check_url, redact  # needs coredis, as follow_cluster

        check_url(cluster)
        if dock_config is not None and dock_config.agents:
            raise InvalidOptionsError(
                "--config names agents, which would run in this serve process, outside the cluster: "
                "create them on the cluster instead (loopdock.open_cluster(url), then create_agent)"
            )
    if otlp is not None:
        traces_url(otlp)  # a bad URL: one line, now
    check_port(host, port)
    # The LoopX integration is on for serve: start-up initialises the CLI and the skills
    # (a failure is a safe diagnostic in rt.loopx.startup; /loopx-init repairs it).
    # serve owns its process: it hides its environment block from the programs its agents
    # run and tunes the collector for many agents (an embedded runtime does neither unasked).
    async with (
        otlp_tracing(otlp) as tracer_provider,
        Runtime.open(
            resolve_home(home), config=dock_config, shell=shell, loopx=LoopxSettings() if loopx else None,
            hide_environment=True, gc_threshold=GC_THRESHOLD, tracer_provider=tracer_provider,
        ) as rt,
    ):
        live = rt.subscribe_live()  # before any checkpoint: the configured agents start at the first one
        async with (
            follow_cluster(cluster, rt) as (follower, workers),
            open_bridge(rt, host=host, port=port, project=project_dir, live=live, cluster=follower) as bridge,
        ):
            # SIGTERM too: a supervisor stopping us should get the same clean close as ^C.
            # Received before the ready lines: a stop sent as soon as they show is clean too.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                print(f"loopdock serve: {bridge.url} (token in {rt.home / TOKEN_FILE})", file=out, flush=True)
                console_url, goalbar_url = page_urls(host, bridge.port, bridge.token)
                print(f"  console: {console_url}", file=out, flush=True)
                print(f"  goalbar: {goalbar_url}", file=out, flush=True)
                if otlp is not None:
                    print(f"  traces: {traces_url(otlp)}", file=out, flush=True)
                if cluster is not None:
                    live_workers = f"{workers} live worker{'' if workers == 1 else 's'}"
                    print(f"  cluster: {redact(cluster)} ({live_workers})", file=out, flush=True)
                async for _ in signals:
                    break
