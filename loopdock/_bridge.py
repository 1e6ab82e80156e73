"""The bridge an embedded runtime serves: exactly what ``loopdock serve`` serves.

    async with Runtime.open(loopx=LoopxSettings()) as rt:
        async with rt.serve_bridge(port=8765) as bridge:
            async for agent in bridge.dsh_agents():
                agent.followup("hello from the runtime")

One composition for both (``open_bridge``): the DSH hosts' handler (the dock answers their
``select``, their agents and sessions are mirrored), a ``DshAgent`` proxy for every live
DSH agent with the runtime's LoopX continuation as its companion (with LoopX on) and
``/loopx-init`` for its user, the GoalBar and the console (pages and websocket), on one
port, with the token and the DSH plugin copy of the runtime home (what ``loopdock
dsh-patch`` and ``dsh-install`` point DSH at).
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol, final

import trio

from loopdock.actors import AgentActor, CommandResult, LiveEvent, Subscription, UnknownAgentError
from loopdock.actors.dock import BINDING_EVENT, LoopDock, read_binding
from loopdock.actors.loopx import INIT_COMMAND_NAME, LoopxIntegration
from loopdock.bridge import (
    DEFAULT_HOST,
    DEFAULT_OWNED_KINDS,
    PLUGIN_DIR,
    AnswerApprovalFn,
    ConsoleHandler,
    DshAgent,
    DshAgentMirror,
    DshApproval,
    GoalBarHandler,
    GoalBarService,
    HostCommand,
    HostHandler,
    RuntimeView,
    approval_views,
    load_or_create_token,
    serve_bridge,
    stable_plugin,
)
from loopdock.runtime import ApprovalClosedError, Changes, PortInUseError

from ._project import checked_project


class ServedRuntime(Protocol):
    """What the bridge uses of a ``Runtime`` (which serves it: ``Runtime.serve_bridge``)."""

    @property
    def home(self) -> Path: ...

    @property
    def dock(self) -> LoopDock: ...

    @property
    def loopx(self) -> LoopxIntegration | None: ...

    def get_agent(self, agent_id: str) -> AgentActor | None: ...

    def list_agents(self) -> list[str]: ...

    def subscribe_live(self, max_buffer: int = ...) -> Subscription[LiveEvent]: ...


class ClusterFollower(Protocol):
    """What the bridge uses of ``serve --cluster``'s follower of the cluster's agents."""

    def cwd_of(self, session_id: str) -> str | None: ...

    async def run(self, console: ConsoleHandler) -> None: ...



def goalbar_project_for(
    rt: ServedRuntime, project: Path, host: HostHandler | None = None, cluster: ClusterFollower | None = None
) -> Callable[[str], Path]:
    """The LoopX project of a session: the ``cwd`` of the live agent the runtime owns under
    that id (agent id == session id), else the ``cwd`` a DSH host announced for that
    session (its header's; also once its agents ended, while its mirror is kept), else the
    ``cwd`` of the cluster's live session of that id (``serve --cluster``), else
    ``project`` (``serve --project``)."""

    def project_for(session_id: str) -> Path:
        agent = rt.get_agent(session_id)
        if agent is not None and not agent.closed:
            if not agent.passivated:
                return agent.cwd
            # Its cwd is not in memory; a LoopX agent's is kept with its continuation's memo.
            kept = rt.loopx.project_of(session_id) if rt.loopx is not None else None
            if kept is not None:
                return kept
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
async def goalbar_service(rt: ServedRuntime) -> AsyncIterator[GoalBarService | None]:
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


def runtime_view(rt: ServedRuntime) -> Callable[[str], RuntimeView | None]:
    """The console's view of a runtime agent: binding, turns and last turn end, read from
    its session, and its open approval questions (``pending_approvals()``)."""

    def view(agent_id: str) -> RuntimeView | None:
        agent = rt.get_agent(agent_id)
        if agent is None or agent.passivated:  # nothing in memory to show: the row stays as it was
            return None
        session = agent.session
        # Only what the session keeps in memory: its bindings, its turn count, and its
        # events since the previous turn started (which hold the last turn's end). Never
        # a store read on the event loop, whatever the history's length.
        in_memory = session.events_since(session.event_count - session.in_memory)
        ends = [e.data.get("reason", {}).get("kind") for e in in_memory if e.type == "turn/end"]
        binding = read_binding(session.retained(BINDING_EVENT))
        approvals, approvals_open = approval_views(agent.pending_approvals())
        return RuntimeView(binding, session.turn_count, str(ends[-1]) if ends else None, approvals, approvals_open)

    return view


def approval_answerer(rt: ServedRuntime, mirror: DshAgentMirror | None = None) -> AnswerApprovalFn:
    """How a console page answers an approval question: a runtime agent's on the agent, as
    ``approval.answer`` does; a DSH agent's (one DSH's approval service asked) through
    its proxy in ``mirror``, on the host. Exactly once either way: APPROVAL_CLOSED for a
    closed or unknown one."""

    async def answer(agent_id: str, approval_id: str, decision: str, reason: str | None) -> None:
        agent = rt.get_agent(agent_id)
        if agent is not None and not agent.closed:
            if agent.passivated:  # an agent with an open question is never passivated
                raise ApprovalClosedError(f"no open approval question {approval_id[:128]!r}")
            await agent.approvals.answer(approval_id, decision, reason=reason)
            return
        proxy = mirror.proxies.get(agent_id) if mirror is not None else None
        if proxy is None or proxy.closed:
            raise UnknownAgentError(f"no agent {agent_id!r} runs in this runtime or on a connected DSH host")
        await proxy.answer_approval(approval_id, decision, reason=reason)

    return answer


def dsh_approvals(mirror: DshAgentMirror) -> Callable[[str], Sequence[DshApproval]]:
    """The console's view of a DSH agent's open questions (its proxy's)."""

    def view(agent_id: str) -> Sequence[DshApproval]:
        proxy = mirror.proxies.get(agent_id)
        return proxy.pending_approvals() if proxy is not None else ()

    return view


def page_urls(host: str, port: int, token: str) -> list[str]:
    """The console and GoalBar pages' URLs (the token in the fragment: never sent)."""
    base = f"http://{host}:{port}"
    return [f"{base}/console#token={token}", f"{base}/goalbar?session=<session id>#token={token}"]


async def compose_handlers(
    rt: ServedRuntime, service: GoalBarService | None, project: Path, nursery: trio.Nursery, live: Subscription[LiveEvent],
    cluster: ClusterFollower | None = None, *, hosts: HostHandler | None = None,
    on_agent: Callable[[DshAgent], Awaitable[None]] | None = None, existing: Sequence[str] = (),
) -> ConsoleHandler:
    """The handler the bridge answers with: the console over the GoalBar over the DSH
    agents' mirror over the DSH hosts' handler (dock selection). Every live DSH agent
    gets a ``DshAgent`` proxy; with LoopX on, the proxy gets a LoopX continuation (like
    the runtime's own agents: passive until its session invokes /loopx) and its DSH user
    ``/loopx-init``; then ``on_agent(proxy)`` is awaited. ``live``: ``rt.subscribe_live()``,
    taken early; ``existing``: the runtime agents live when it was taken (shown at once).
    ``cluster``: the console also shows the cluster's agents (``serve --cluster``).
    ``hosts``: the hosts' handler to build on (default: a new one on ``rt.dock``)."""
    hosts = hosts if hosts is not None else HostHandler(rt.dock)
    project_for = goalbar_project_for(rt, project, hosts, cluster)
    loopx = rt.loopx
    commands: dict[str, HostCommand] = {}
    if loopx is not None:
        commands[INIT_COMMAND_NAME] = dsh_loopx_init(loopx)

    async def start_proxy(proxy: DshAgent) -> None:
        if loopx is not None:
            await loopx.start_continuation(proxy)
        if on_agent is not None:
            await on_agent(proxy)

    # The mirror is the layer in front of the hosts' handler: it settles reservations DSH
    # discards and runs the DSH users' commands; serving the hosts' handler alone skips both.
    mirror = DshAgentMirror(hosts, start_proxy, project_for, frozenset(DEFAULT_OWNED_KINDS), commands=commands)
    await nursery.start(mirror.run)
    goalbar = GoalBarHandler(service, project_for, nursery, inner=mirror)
    console = ConsoleHandler(goalbar, runtime_view(rt), approval_answerer(rt, mirror), dsh_approvals(mirror))
    for agent_id in existing:
        console.apply_live("runtime", LiveEvent("agent/created", agent_id, {"sessionId": agent_id}), runtime_view(rt)(agent_id))
    await nursery.start(console.watch_runtime, live, rt.subscribe_live)
    if cluster is not None:
        nursery.start_soon(cluster.run, console)
    return console


@final
class Bridge:
    """The bridge an embedded runtime serves (``Runtime.serve_bridge``): DSH hosts connect
    to ``url`` with the token of the runtime home (``loopdock dsh-patch`` and ``dsh-install``
    write it into their config), browsers open the console and the GoalBar on the same port.

    ``hosts`` is the DSH hosts' side: their live agents, the mirror of their sessions, and
    ``followup``/``wake``/``cancel`` for any live DSH agent. ``dsh_agents()`` gives the
    runtime's proxy of each live DSH agent (``DshAgent``)."""

    def __init__(self, host: str, token: str, hosts: HostHandler) -> None:
        self.host = host
        self.port = 0  # set once the server listens
        self.token = token
        self.hosts = hosts
        self._ready: list[tuple[int, DshAgent]] = []  # (serial, proxy): companions started
        self._serial = 0
        self._changes = Changes()

    @property
    def url(self) -> str:
        """Where DSH hosts connect (``loopdock dsh-patch --url`` / ``dsh-install --url``)."""
        return f"ws://{self.host}:{self.port}"

    async def _announce(self, proxy: DshAgent) -> None:
        self._ready = [(serial, p) for serial, p in self._ready if not p.closed]
        self._serial += 1
        self._ready.append((self._serial, proxy))
        self._changes.notify()

    def _announced_after(self, serial: int) -> bool:
        return any(announced > serial for announced, _ in self._ready)

    async def dsh_agents(self) -> AsyncIterator[DshAgent]:
        """Every live DSH agent, as the runtime's proxy: those live now, then each one a
        DSH host starts (or resumes), once its companions run (its LoopX continuation:
        ``rt.loopx.continuation(agent.id)``). An agent that ended before its turn came is
        left out. Runs until cancelled."""
        after = 0
        while True:
            await self._changes.wait_until(functools.partial(self._announced_after, after))
            for serial, proxy in list(self._ready):
                if serial > after:
                    after = serial
                    if not proxy.closed:
                        yield proxy


def _refresh_plugin_copy(home: Path) -> None:
    """A plugin copy a dsh-patch or dsh-install made follows this loopdock's version."""
    if (home / PLUGIN_DIR).exists():
        stable_plugin(home)


@asynccontextmanager
async def open_bridge(
    rt: ServedRuntime,
    *,
    host: str | None = None,
    port: int = 0,
    project: str | os.PathLike[str] | None = None,
    live: Subscription[LiveEvent] | None = None,
    cluster: ClusterFollower | None = None,
) -> AsyncIterator[Bridge]:
    """Serve the bridge for ``rt`` (see the module docstring) on ``host`` (default
    loopback) and ``port`` (0: any free one) until the block ends. ``project``: the LoopX
    project of sessions the runtime does not own and no DSH host announced a ``cwd`` for
    (default: the current directory). ``live``: the runtime's live events, subscribed
    earlier (``serve`` takes them before the configured agents start); by default
    subscribed now, with the runtime's agents live now shown at once. ``cluster``:
    ``serve --cluster``'s follower. A taken port raises PortInUseError."""
    host = host or DEFAULT_HOST
    project_dir = await trio.to_thread.run_sync(checked_project, project, "the bridge's LoopX project")
    existing: list[str] = []
    if live is None:  # both at once (no checkpoint between): each agent shows exactly once
        live, existing = rt.subscribe_live(), rt.list_agents()
    with live:
        token = await trio.to_thread.run_sync(load_or_create_token, rt.home)
        await trio.to_thread.run_sync(_refresh_plugin_copy, rt.home)
        refused: PortInUseError | None = None
        body_error: BaseException | None = None
        async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
            bridge = Bridge(host, token, HostHandler(rt.dock))
            console = await compose_handlers(
                rt, service, project_dir, nursery, live, cluster,
                hosts=bridge.hosts, on_agent=bridge._announce, existing=existing,
            )
            try:
                bridge.port = await nursery.start(functools.partial(serve_bridge, console, token=token, host=host, port=port))
            except* OSError as failed:  # e.g. EADDRINUSE (from the server's own nursery: in a group)
                exc = failed.exceptions[0]
                refused = PortInUseError(f"{host}:{port}: {getattr(exc, 'strerror', None) or exc}")
                nursery.cancel_scope.cancel()
            if refused is None:
                try:
                    yield bridge
                except BaseException as exc:
                    # Re-raised below, outside the nursery: the caller sees its own
                    # exception, not an exception group around it.
                    body_error = exc
                finally:
                    nursery.cancel_scope.cancel()
        if refused is not None:
            raise refused
        if body_error is not None:
            raise body_error
