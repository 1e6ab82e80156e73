"""``loopdock serve``: the runtime and its bridge server, until interrupted."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO

import trio

from actors import CommandResult
from actors.loopx import INIT_COMMAND_NAME, LoopxIntegration, LoopxSettings
from bridge import DshAgent, DshAgentMirror, HandlerLayer, HostHandler, load_or_create_token, serve_bridge
from bridge._dsh_agent import HostCommand
from bridge._goalbar import GoalBarHandler, GoalBarService
from bridge._patch import DEFAULT_OWNED_KINDS
from bridge._server import DEFAULT_HOST
from bridge._token import TOKEN_FILE
from runtime._errors import InvalidOptionsError
from runtime._home import resolve_home

from ._runtime import Runtime


def goalbar_project_for(rt: Runtime, project: Path, host: HostHandler | None = None) -> Callable[[str], Path]:
    """The LoopX project of a session: the ``cwd`` of the live agent the runtime owns under
    that id (agent id == session id), else the ``cwd`` a DSH host announced for that
    session (its header's), else ``project`` (``serve --project``)."""

    def project_for(session_id: str) -> Path:
        agent = rt.get_agent(session_id)
        if agent is not None and not agent.closed:
            return agent.cwd
        if host is not None:
            for live in list(host.agents.values()):
                if live.session_id == session_id and live.cwd is not None:
                    return Path(live.cwd)
        return project

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


async def serve_command(
    home: str | None,
    host: str | None,
    port: int,
    out: TextIO,
    loopx: bool = True,
    project: str | os.PathLike[str] | None = None,
) -> None:
    """Open the runtime on ``home``, serve the bridge on ``host`` (default loopback) and
    ``port`` (0: any free port), print one readiness line on ``out``, and run until SIGINT
    or SIGTERM; then close everything (sessions made durable).

    The bridge answers DSH hosts' loop selection from the runtime's dock, mirrors every
    live DSH agent as a ``DshAgent`` with a LoopX continuation driver (with ``loopx``),
    and serves the GoalBar (page and ``/goalbar`` endpoint). ``loopx``: enable the LoopX integration
    (continuation drivers, /loopx-init, start-up initialisation, the GoalBar's reads).
    ``project``: the LoopX project of sessions the runtime does not own and no DSH host
    announced a ``cwd`` for (default: the current directory); a session of a live runtime
    agent uses that agent's ``cwd``, a DSH session its header's."""
    host = host or DEFAULT_HOST
    project_dir = Path(project if project is not None else Path.cwd()).absolute()
    if not project_dir.is_dir():
        raise InvalidOptionsError(f"--project is not a directory: {str(project_dir)[:200]}")
    # The LoopX integration is on for serve: start-up initialises the CLI and the skills
    # (a failure is a safe diagnostic in rt.loopx.startup; /loopx-init repairs it).
    async with Runtime.open(resolve_home(home), loopx=LoopxSettings() if loopx else None) as rt:
        token = await trio.to_thread.run_sync(load_or_create_token, rt.home)
        async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
            hosts = HostHandler(rt.dock)
            project_for = goalbar_project_for(rt, project_dir, hosts)
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
            handler = GoalBarHandler(service, project_for, nursery, inner=inner)
            bound = await nursery.start(functools.partial(serve_bridge, handler, token=token, host=host, port=port))
            print(f"loopdock serve: ws://{host}:{bound} (token in {rt.home / TOKEN_FILE})", file=out, flush=True)
            # SIGTERM too: a supervisor stopping us should get the same clean close as ^C.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()
