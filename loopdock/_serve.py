"""``loopdock serve``: the runtime and its bridge server, until interrupted."""

from __future__ import annotations

import functools
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import trio

from loopdock.actors import CommandResult, LiveEvent, Subscription
from loopdock.actors.dock import BINDING_EVENT, load_config, read_binding
from loopdock.actors.loopx import INIT_COMMAND_NAME, LoopxIntegration, LoopxSettings
from loopdock.bridge import DshAgent, DshAgentMirror, HandlerLayer, HostHandler, load_or_create_token, serve_bridge
from loopdock.bridge._console import ConsoleHandler, RuntimeView
from loopdock.bridge._dsh_agent import HostCommand
from loopdock.bridge._goalbar import GoalBarHandler, GoalBarService
from loopdock.bridge._patch import DEFAULT_OWNED_KINDS, PLUGIN_DIR, stable_plugin
from loopdock.bridge._server import DEFAULT_HOST
from loopdock.bridge._token import TOKEN_FILE
from loopdock.runtime._errors import InvalidOptionsError, LoopdockError
from loopdock.runtime._home import resolve_home
from loopdock.runtime._logging import get_logger
from loopdock.runtime.tools import ShellPolicy

from ._runtime import Runtime

if TYPE_CHECKING:
    from ._serve_cluster import ClusterFollower

log = get_logger(__name__)


def goalbar_project_for(
    rt: Runtime, project: Path, host: HostHandler | None = None, cluster: ClusterFollower | None = None
) -> Callable[[str], Path]:
    """The LoopX project of a session: the ``cwd`` of the live agent the runtime owns under
    that id (agent id == session id), else the ``cwd`` a DSH host announced for that
    session (its header's; also once its agents ended, while its mirror is kept), else the
    ``cwd`` of the cluster's live session of that id (``serve --cluster``), else
    ``project`` (``serve --project``)."""

    def project_for(session_id: str) -> Path:
        agent = rt.get_agent(session_id)
        if agent is not None and not agent.closed:
            return agent.cwd
        announced = host.cwds.get(session_id) if host is not None else None
        if announced is not None:
            return Path(announced)
        cwd = cluster.cwd_of(session_id) if cluster is not None else None
        return Path(cwd) if cwd is not None else project

    return project_for


def dsh_loopx_init(loopx: LoopxIntegration) -> HostCommand:
    """``/loopx-init`` run by a DSH user in a mirrored agent: the runtime's own sequence
    for that agent's project; its start and result messages go to the DSH agent."""

    async def run(agent: DshAgent, args: str) -> CommandResult:
        return await loopx.run_init(agent, agent.cwd, args)

    return run


@asynccontextmanager
async def goalbar_service(rt: Runtime) -> AsyncIterator[GoalBarService | None]:
    """The GoalBar service on the runtime's LoopX integration: its clients come from
    ``rt.loopx.client_for`` (the integration's environment and the CLI command start-up
    found or installed, followed after a ``/loopx-init`` repair), and it shows and controls
    the continuations of ``rt.loopx`` (the runtime's agents and the DSH agents' proxies).
    ``None`` when the runtime runs without LoopX: the handler then answers every page
    ``hidden``/``loopx-off``."""
    if rt.loopx is None:
        yield None
        return
    async with GoalBarService.open(rt.loopx.client_for, continuations=rt.loopx) as service:
        yield service


class PortInUseError(LoopdockError):
    """Raised by ``serve`` when its port is taken (another ``serve``, or any program)."""

    code = "PORT_IN_USE"


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


def runtime_view(rt: Runtime) -> Callable[[str], RuntimeView | None]:
    """The console's view of a runtime agent: binding, turns and last turn end, read from
    its session."""

    def view(agent_id: str) -> RuntimeView | None:
        agent = rt.get_agent(agent_id)
        if agent is None:
            return None
        session = agent.session
        # Only what the session keeps in memory: its bindings, its turn count, and its
        # events since the previous turn started (which hold the last turn's end). Never
        # a store read on the event loop, whatever the history's length.
        in_memory = session.events_since(session.event_count - session.in_memory)
        ends = [e.data.get("reason", {}).get("kind") for e in in_memory if e.type == "turn/end"]
        binding = read_binding(session.retained(BINDING_EVENT))
        return RuntimeView(binding, session.turn_count, str(ends[-1]) if ends else None)

    return view


def page_urls(host: str, port: int, token: str) -> list[str]:
    """The console and GoalBar pages' URLs (the token in the fragment: never sent)."""
    base = f"http://{host}:{port}"
    return [f"{base}/console#token={token}", f"{base}/goalbar?session=<session id>#token={token}"]


async def compose_handlers(
    rt: Runtime, service: GoalBarService | None, project: Path, nursery: trio.Nursery, live: Subscription[LiveEvent],
    cluster: ClusterFollower | None = None,
) -> ConsoleHandler:
    """The handler ``serve`` answers the bridge with: the console over the GoalBar over the
    DSH hosts' handler (dock selection, the mirror), each live DSH agent given a LoopX
    continuation (with LoopX on). ``live``: ``rt.subscribe_live()``, taken early.
    ``cluster``: the console also shows the cluster's agents (``serve --cluster``)."""
    hosts = HostHandler(rt.dock)
    project_for = goalbar_project_for(rt, project, hosts, cluster)
    inner: HandlerLayer = hosts
    if rt.loopx is not None:
        # Every live DSH agent gets a proxy with a continuation driver, like the
        # runtime's own agents (passive until its session invokes /loopx), and a
        # DSH user's /loopx-init (the plugin's command) runs here for its agent.
        inner = mirror = DshAgentMirror(
            hosts, rt.loopx.start_continuation, project_for, frozenset(DEFAULT_OWNED_KINDS),
            commands={INIT_COMMAND_NAME: dsh_loopx_init(rt.loopx)},
        )
        await nursery.start(mirror.run)
    goalbar = GoalBarHandler(service, project_for, nursery, inner=inner)
    console = ConsoleHandler(goalbar, runtime_view(rt))
    await nursery.start(console.watch_runtime, live, rt.subscribe_live)
    if cluster is not None:
        nursery.start_soon(cluster.run, console)
    return console


@asynccontextmanager
async def open_cluster(url: str | None, rt: Runtime) -> AsyncIterator[tuple[ClusterFollower | None, int]]:
    """With a cluster URL: the follower of its agents for the console, and how many
    workers are live; its workers must offer this serve's loops and drivers."""
    if url is None:
        yield None, 0
        return
    # Here, not at the top: the cluster needs coredis (pip install 'loopdock[cluster]').
    from ._cluster import ClusterRuntime
    from ._serve_cluster import ClusterFollower, check_registry

    async with ClusterRuntime.open(url) as cluster:
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
    agents (they would run here, outside the cluster)."""
    host = host or DEFAULT_HOST
    project_dir = Path(project if project is not None else Path.cwd()).absolute()
    if not project_dir.is_dir():
        raise InvalidOptionsError(f"--project is not a directory: {str(project_dir)[:200]}")
    dock_config = load_config(config) if config is not None else None  # a bad file: one line, now
    if cluster is not None:
        from loopdock.runtime.cluster import check_url, redact  # needs coredis, as open_cluster

        check_url(cluster)
        if dock_config is not None and dock_config.agents:
            raise InvalidOptionsError(
                "--config names agents, which would run in this serve process, outside the cluster: "
                "create them on the cluster instead (Runtime.open(cluster=...).create_agent)"
            )
    check_port(host, port)
    # The LoopX integration is on for serve: start-up initialises the CLI and the skills
    # (a failure is a safe diagnostic in rt.loopx.startup; /loopx-init repairs it).
    async with Runtime.open(
        resolve_home(home), config=dock_config, shell=shell, loopx=LoopxSettings() if loopx else None
    ) as rt:
        live = rt.subscribe_live()  # before any checkpoint: the configured agents start at the first one
        token = await trio.to_thread.run_sync(load_or_create_token, rt.home)
        # A plugin copy a dsh-patch or dsh-install made follows this loopdock's version.
        if (rt.home / PLUGIN_DIR).exists():
            await trio.to_thread.run_sync(stable_plugin, rt.home)
        async with (
            goalbar_service(rt) as service,
            open_cluster(cluster, rt) as (follower, workers),
            trio.open_nursery() as nursery,
        ):
            console = await compose_handlers(rt, service, project_dir, nursery, live, follower)
            try:
                bound = await nursery.start(functools.partial(serve_bridge, console, token=token, host=host, port=port))
            except OSError as exc:  # taken between the check and now
                raise PortInUseError(f"{host}:{port}: {exc.strerror or exc}") from None
            print(f"loopdock serve: ws://{host}:{bound} (token in {rt.home / TOKEN_FILE})", file=out, flush=True)
            console_url, goalbar_url = page_urls(host, bound, token)
            print(f"  console: {console_url}", file=out, flush=True)
            print(f"  goalbar: {goalbar_url}", file=out, flush=True)
            if cluster is not None:
                print(f"  cluster: {redact(cluster)} ({workers} live worker{'' if workers == 1 else 's'})", file=out, flush=True)
            # SIGTERM too: a supervisor stopping us should get the same clean close as ^C.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()
