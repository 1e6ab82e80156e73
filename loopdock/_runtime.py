"""Runtime: the embedded entry point.

    async with Runtime.open() as rt:          # home: $LOOPDOCK_HOME or ~/.local/share/loopdock
        handle = await rt.create_agent(session_id="a1")
        handle.agent.followup("hello")
        await handle.agent.wait_idle()
        await handle.dispose()

Closing the ``async with`` disposes every agent (their turns end ``aborted``), makes
every session durable and closes the database.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from loopdock.actors import (
    AUTOMATIC_SLOTS,
    GROUP_COMMIT_WINDOW,
    PASSIVATE_AFTER,
    WARM_HISTORY_BYTES,
    WATCHER_POLICY,
    Action,
    AdmissionGate,
    AgentActor,
    AgentHandle,
    CommandRegistry,
    CommandResult,
    CreateAgentOptions,
    Driver,
    HistoryCache,
    LiveEvent,
    ReactDriver,
    ResumeAgentOptions,
    Setup,
    StoreWriter,
    Subscription,
    Supervisor,
    UnknownAgentError,
    check_memory_limit,
    check_passivate_after,
    run_command,
    supervised,
)
from loopdock.actors.dock import (
    BUILTIN_LOOPS,
    AgentPresets,
    DockConfig,
    Loop,
    LoopDock,
    load_config,
    load_loop_packages,
    parse_config,
)
from loopdock.actors.loopx import LoopxIntegration, LoopxSettings
from loopdock.runtime import (
    AgentOptions,
    GcGovernor,
    SessionHeader,
    SessionLog,
    SessionStore,
    StoreUnusableError,
    Tracing,
    acquire_home,
    get_logger,
    governed,
    hide_environment_block,
    resolve_home,
    safe_message,
)
from loopdock.runtime.models import AdapterRegistry, ModelAdapter, default_adapters
from loopdock.runtime.skills import SkillCatalog, expand_skill_invocations, skill_tool
from loopdock.runtime.tools import ShellPolicy, Tool, ToolRegistry, builtin_tools, shell_tool

from ._bridge import Bridge, open_bridge

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = get_logger(__name__)


def dock_config_of(value: DockConfig | Mapping[str, Any] | str | os.PathLike[str] | None) -> DockConfig:
    """A dock config from what ``Runtime.open(config=...)`` takes (a bad file: DockError)."""
    if isinstance(value, DockConfig):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_config(value)
    return parse_config(value)


class Runtime:
    def __init__(
        self,
        home: Path,
        supervisor: Supervisor,
        dock: LoopDock,
        *,
        skills: SkillCatalog | None = None,
        commands: CommandRegistry | None = None,
    ) -> None:
        self.home = home
        self._supervisor = supervisor
        self.dock = dock
        self.skills = skills if skills is not None else SkillCatalog(None)
        self.commands = commands if commands is not None else CommandRegistry()
        self.loopx: LoopxIntegration | None = None  # set when opened with ``loopx=``
        #: set when this runtime governs the collector (see ``runtime._gc_governor``)
        self.gc_governor: GcGovernor | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        home: str | os.PathLike[str] | None = None,
        *,
        config: DockConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        shell: ShellPolicy | None = None,
        env: Mapping[str, str] | None = None,
        skills: SkillCatalog | None = None,
        loopx: LoopxSettings | None = None,
        gc_threshold: tuple[int, int, int] | None = None,
        hide_environment: bool = False,
        automatic_slots: int = AUTOMATIC_SLOTS,
        warm_history_bytes: int = WARM_HISTORY_BYTES,
        persist: bool = True,
        store: SessionLog | None = None,
        tracer_provider: TracerProvider | None = None,
        passivate_after: float | None = PASSIVATE_AFTER,
        memory_limit: int | None = None,
    ) -> AsyncIterator[Runtime]:
        """Open the runtime on ``home`` (else ``$LOOPDOCK_HOME``, else
        ``$XDG_DATA_HOME/loopdock``, i.e. ``~/.local/share/loopdock``).

        The file tools refuse every path inside the home, wherever it is.

        An embedded runtime changes nothing process-wide unless asked: the two options
        that do are off by default and on in ``loopdock serve`` and ``loopdock worker``,
        processes loopdock owns.
        ``hide_environment=True`` zeroes the process's initial environment block before
        anything starts (all but ``PATH``, ``HOME``, the locale and such), so that no
        program the runtime runs can read its API keys from ``/proc/<pid>/environ``;
        ``os.environ`` and ``getenv`` still work. It writes libc's memory under every
        thread of the process (see ``runtime._environ_block`` for what it cannot do).

        The runtime holds the home until it closes: opening a home another runtime holds
        (in any process) raises HomeInUseError (``HOME_IN_USE``) at once. The home is
        made private (0700, its files 0600).

        ``config`` is the loop dock's config: a DockConfig, a mapping, or a YAML file path.
        ``shell`` enables the shell tool under that policy (it is off by default).
        Model adapters: ``ping`` always, the config's ``providers`` (an OpenAI-compatible
        server, each by its name), ``deepseek`` when ``DEEPSEEK_API_KEY`` is set.
        The ``default`` driver is the ``react`` driver; the loops ``standard`` and
        ``minimal-first`` are built in; loop packages are loaded, then configured agents start.
        ``skills`` is the skill catalog (``rt.skills``); by default the DSH roots seen from
        the process's cwd and ``env`` (``DSH_HOME``, ``DSH_AGENTS_HOME``, ``HOME``). Its
        ``skill`` tool is registered and ``/name`` in a person's message injects the skill.
        Slash commands go in ``rt.commands`` and run with ``rt.execute_command``.
        ``loopx`` enables the LoopX integration (off by default in embedded use): every
        agent gets a continuation driver (``rt.loopx``), passive until its session invokes
        the ``loopx`` skill.
        ``gc_threshold``: while the runtime is open, CPython's cyclic collector runs with
        this threshold (``loopdock.GC_THRESHOLD``, ``(10_000, 10, 10)``, is what serve
        and worker use: a many-agent runtime's growing history otherwise sets off a full
        collection every ~70,000 allocations) if the process still has CPython's default;
        then, unless the process has frozen objects itself, the runtime also freezes its
        long-lived objects (``gc.freeze()``) after agents start and as the heap grows, so
        that full collections do not walk them (``rt.gc_governor``; see
        ``runtime._gc_governor``), and unfreezes them on close. ``None`` (the default)
        leaves the collector alone.
        ``automatic_slots``: how many automatic turns compute at once, runtime-wide (a
        person's turn never waits for one; see ``actors.AdmissionGate``).
        ``warm_history_bytes``: how much of idle agents' history stays in memory in all
        (default 32 MiB, estimated from the messages' text and a fixed cost per message
        and event; least recently active evicted first, read back from the store at
        their next turn; see ``actors.HistoryCache``).
        ``persist=False`` writes nothing: sessions keep their whole log in memory and
        vanish with the runtime (for measuring the runtime without its store).
        ``store`` is where sessions are kept (a ``SessionLog``): by default the home's
        SQLite store (``sessions.db``), which the runtime opens and closes; a store given
        here is the caller's, open before and after the runtime (a cluster worker passes
        its Redis store).

        ``tracer_provider``: an OpenTelemetry ``TracerProvider`` (``pip install
        'loopdock[otel]'``); the runtime's agents then make spans after the GenAI
        conventions: ``invoke_agent`` per turn, ``chat`` per model call, ``execute_tool``
        per tool call. The provider is the caller's, to configure and shut down. Without
        one (the default) nothing is traced and OpenTelemetry is not imported.

        ``passivate_after``: an agent idle this many seconds (default 300) is passivated:
        released from memory but for a few hundred bytes, the object its callers hold
        staying valid; its next message (followup, steer, inject, reserve, or
        ``await agent.activate()``) brings it back through the resume path, and is
        processed in order. Never while it is busy, has messages queued, an approval
        question open, a subscriber, a command running, or (with LoopX) an evaluation
        under way or a continuation queued (a scheduler wait does not: the runtime wakes
        the agent when it is due). ``None``: agents stay in memory until disposed.
        Nothing is passivated with ``persist=False``. See docs/lifecycle.md.

        ``memory_limit``: bytes of resident memory (RSS, read from ``/proc/self/statm``
        once a second) over which idle agents are passivated whatever ``passivate_after``
        says, least recently active first, until the process is judged back under 90% of
        the limit; an agent something keeps active (as above) is skipped, never lost.
        Freed memory that stays in the process is counted as released, so an RSS that does
        not fall does not make every agent go (see docs/lifecycle.md, "Policy"). ``None``
        (the default): no limit, and the RSS is never read. Linux only: where there is no
        ``/proc``, a warning says the limit is not enforced.

        Agents that the workers of a Redis cluster run are reached with
        ``loopdock.open_cluster(url)`` instead (docs/cluster.md).
        """
        passivate_after = check_passivate_after(passivate_after)
        memory_limit = check_memory_limit(memory_limit)
        if hide_environment:
            hide_environment_block()
        admission = AdmissionGate(automatic_slots)
        history = HistoryCache(warm_history_bytes)
        # A config file is read in a worker thread, as everything on disk is.
        dock_config = await trio.to_thread.run_sync(dock_config_of, config)
        environ = env if env is not None else os.environ
        catalog = skills if skills is not None else SkillCatalog.from_env(Path.cwd(), environ)
        path = resolve_home(home)
        tracing = None if tracer_provider is None else Tracing(tracer_provider)
        # Held until the store is closed; see runtime/_home_lock.py for why it fails at once.
        with await trio.to_thread.run_sync(acquire_home, path), governed(gc_threshold) as governor:
            async with cls._open(
                path, dock_config, environ, catalog, shell, loopx, admission, history, governor, persist, store,
                tracing, passivate_after, memory_limit,
            ) as rt:
                yield rt

    @classmethod
    @asynccontextmanager
    async def _open(
        cls,
        path: Path,
        dock_config: DockConfig,
        environ: Mapping[str, str],
        catalog: SkillCatalog,
        shell: ShellPolicy | None,
        loopx: LoopxSettings | None,
        admission: AdmissionGate,
        history: HistoryCache,
        governor: GcGovernor | None,
        persist: bool,
        given_store: SessionLog | None,
        tracing: Tracing | None,
        passivate_after: float | None = None,
        memory_limit: int | None = None,
    ) -> AsyncIterator[Runtime]:
        store: SessionLog
        if given_store is None:
            store = await trio.to_thread.run_sync(SessionStore.open, path / "sessions.db")
        else:
            store = given_store
        try:
            tools = ToolRegistry()
            for tool in builtin_tools(home=path):
                tools.register(tool)
            if shell is not None:
                tools.register(shell_tool(shell))
            tools.register(skill_tool(catalog))
            body_error: BaseException | None = None
            store_failure: list[Exception] = []
            async with trio.open_nursery() as nursery:
                # A store may ask for a longer group-commit window than the default: the
                # cluster's does (see RedisSessionStore.commit_window).
                window = getattr(store, "commit_window", GROUP_COMMIT_WINDOW)
                writer = StoreWriter(store, persist=persist, window=window)
                # While the store cannot write, automatic work waits: its events would
                # only pile up in memory (people's turns go on; see actors/_admission.py).
                writer.trouble_listeners.append(
                    lambda trouble: admission.hold(None if trouble is None else f"the session store fails: {trouble}")
                )

                async def run_writer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    # The one actor whose failure ends the runtime: without it nothing
                    # more can be made durable.
                    try:
                        await writer.run(task_status=task_status)
                    except Exception as exc:
                        store_failure.append(exc)
                        writer.fail(exc)  # no flush may wait for it any more
                        nursery.cancel_scope.cancel()

                def watcher_failed(error: Exception, action: Action) -> None:
                    log.warning("skill catalog watcher failed", error=repr(error), action=action)

                def gate_failed(error: Exception, action: Action) -> None:
                    log.warning("admission gate's stall watcher failed", error=repr(error), action=action)

                def governor_failed(error: Exception, action: Action) -> None:
                    log.warning("gc governor failed", error=repr(error), action=action)

                await nursery.start(run_writer, name="store writer")
                # Started once the catalog is scanned and watched: a model step then looks at
                # the disk (in a worker thread) only after a change. A watcher that keeps
                # failing leaves every step checking the disk.
                await nursery.start(
                    functools.partial(
                        supervised, catalog.watch, name="skill catalog watcher", policy=WATCHER_POLICY,
                        report=watcher_failed,
                    ),
                    name="skill catalog watcher",
                )
                # A stall watcher that keeps failing leaves a stalled slot counted: automatic
                # turns then wait longer, people's turns never do.
                nursery.start_soon(
                    functools.partial(
                        supervised, admission.run, name="admission gate", policy=WATCHER_POLICY,
                        report=gate_failed,
                    ),
                    name="admission gate",
                )
                supervisor = Supervisor(
                    nursery, store, writer, default_adapters(environ, dock_config.providers), tools, admission=admission, history=history,
                    tracing=tracing, passivate_after=passivate_after, memory_limit=memory_limit,
                )
                if governor is not None:
                    # A governor that keeps failing stops freezing: full collections walk
                    # the whole heap again (long pauses), nothing else changes.
                    supervisor.agent_started.append(governor.agent_started)
                    nursery.start_soon(
                        functools.partial(
                            supervised, governor.run, name="gc governor", policy=WATCHER_POLICY,
                            report=governor_failed,
                        ),
                        name="gc governor",
                    )
                supervisor.step_preparers.append(catalog.refreshed)
                supervisor.expanders.append(functools.partial(expand_skill_invocations, catalog=catalog))
                supervisor.provide("agentPresets", AgentPresets())
                dock = LoopDock(supervisor, dock_config)
                # Reactivation is a resume through the dock (same binding, same rules).
                supervisor.lifecycle.resume = functools.partial(dock.resume, supervisor)

                def lifecycle_failed(error: Exception, action: Action) -> None:
                    log.warning("agent passivation failed", error=repr(error), action=action)

                nursery.start_soon(
                    functools.partial(
                        supervised, supervisor.lifecycle.run, name="agent lifecycle", policy=WATCHER_POLICY,
                        report=lifecycle_failed,
                    ),
                    name="agent lifecycle",
                )
                rt = cls(path, supervisor, dock, skills=catalog)
                rt.gc_governor = governor
                dock.register_driver(ReactDriver())
                for loop in BUILTIN_LOOPS:
                    dock.register(loop)
                # Finding and importing loop packages reads the disk: a worker thread does it,
                # and hands each loop to the event loop's thread to register.
                def register_from_thread(loop: Loop) -> Callable[[], None]:
                    return trio.from_thread.run_sync(dock.register, loop)

                packages = await trio.to_thread.run_sync(
                    load_loop_packages, register_from_thread, dock_config.loop_packages
                )
                dock.warnings.extend(packages.warnings)
                if loopx is not None:
                    rt.loopx = LoopxIntegration(loopx)
                    await rt.loopx.start(supervisor, rt.commands, Path.cwd())
                dock.start_configured_agents()
                try:
                    yield rt
                except BaseException as exc:
                    # Re-raised below, outside the nursery, so that the caller sees its
                    # own exception rather than an ExceptionGroup around it.
                    body_error = exc
                finally:
                    with trio.CancelScope(shield=True):
                        await supervisor.aclose()
                    nursery.cancel_scope.cancel()
            if store_failure:
                raise StoreUnusableError(f"the session store failed: {safe_message(store_failure[0])}") from store_failure[0]
            if body_error is not None:
                raise body_error
        finally:
            if given_store is None:
                await trio.to_thread.run_sync(store.close)

    # -- registries ----------------------------------------------------------------------

    @property
    def adapters(self) -> AdapterRegistry:
        return self._supervisor.adapters

    @property
    def tools(self) -> ToolRegistry:
        return self._supervisor.tools

    @property
    def supervisor(self) -> Supervisor:
        """The actor tree's owner (what drivers receive as ``owner``)."""
        return self._supervisor

    def register_adapter(self, name: str, adapter: ModelAdapter) -> Callable[[], None]:
        return self.adapters.register(name, adapter)

    def register_tool(self, tool: Tool) -> Callable[[], None]:
        return self.tools.register(tool)

    def provide(self, name: str, service: Any) -> Callable[[], None]:
        """Offer a service to setups (``agent_ctx.get(name)``)."""
        return self._supervisor.provide(name, service)

    def register_driver(self, name_or_driver: str | Driver, driver: Driver | None = None) -> Callable[[], None]:
        """``register_driver(driver)`` registers ``default``; ``register_driver(name, driver)``
        a named one (see ``rt.dock``)."""
        return self.dock.register_driver(name_or_driver, driver)

    # -- agents ----------------------------------------------------------------------------

    async def create_agent(
        self,
        *,
        session_id: str,
        agent_options: AgentOptions | Mapping[str, Any] | None = None,
        setup: Setup | None = None,
        loop: str | None = None,
        driver: str | None = None,
        agent_preset: str | None = None,
        cwd: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> AgentHandle:
        """Create and start a new agent (its id is ``session_id``) on the loop and driver
        the dock selects (``loop``/``driver`` here or in ``agent_options`` win over routes).
        Nothing is left behind if it fails: no session, no agent, no binding.

        Atomic with respect to cancellation: cancelled before the agent is published,
        the creation rolls back as if it had failed; cancelled after, the agent lives on
        (dispose it with the handle)."""
        options = CreateAgentOptions(
            session_id=session_id,
            agent_options=agent_options,
            setup=setup,
            cwd=cwd,
            meta=meta,
            agent_preset=agent_preset,
            loop=loop,
            driver=driver,
        )
        return await self.dock.create_agent(self._supervisor, options)

    async def resume_agent(
        self,
        *,
        resume_session_id: str,
        agent_options: AgentOptions | Mapping[str, Any] | None = None,
        setup: Setup | None = None,
        loop: str | None = None,
        driver: str | None = None,
    ) -> AgentHandle:
        """Bring a persisted session back as a live agent on its bound loop and driver
        (asking for another one raises LOOP_SWITCH). A turn a crash left open goes on from
        its last durable step before anything queued, on a driver that can (the react
        driver; actors._step_resume): the model is not asked again for what the log holds,
        and a call that may have run asks a person unless its tool is read-only or
        idempotent. Otherwise it is closed as ``turn/end {reason: interrupted}`` (its open
        questions withdrawn). Cancellation rolls back like
        ``create_agent``: nothing of a half-resumed agent stays live."""
        options = ResumeAgentOptions(
            resume_session_id=resume_session_id, agent_options=agent_options, setup=setup, loop=loop, driver=driver
        )
        return await self.dock.resume(self._supervisor, options)

    async def fork_session(self, source_id: str, new_id: str, *, upto_seq: int | None = None) -> str:
        """Copy the longest prefix of a session that ends at a turn boundary into a new one.
        The copy is durable when this returns; cancelled before, the new session may or
        may not exist (resume or fork again to find out)."""
        return await self._supervisor.fork_session(source_id, new_id, upto_seq=upto_seq)

    async def execute_command(self, agent_id: str, line: str) -> CommandResult:
        """Run the slash command ``line`` (``"/name args"``) against a live agent.

        Withdraws the agent's unadmitted reservations first (reason ``command``), logs
        ``command/run`` and ``command/done`` on its session, and returns the command's
        result; a command that raises gives ``ok=False`` and never stops the agent.
        Cancelling the caller cancels the command (its ``command/done`` still says so);
        the command is also cancelled if the agent stops meanwhile.
        Raises UnknownCommandError (UNKNOWN_COMMAND) or UnknownAgentError (UNKNOWN_AGENT).
        """
        command, args = self.commands.parse(line)
        agent = self._supervisor.agents.get(agent_id) if isinstance(agent_id, str) else None
        if agent is None or agent.closed:
            # Other agents' ids are not listed: a command line may come from a remote client.
            raise UnknownAgentError(f"no live agent {str(agent_id)[:128]!r} in this runtime")
        await agent.activate()  # a passivated agent comes back first
        return await run_command(self._supervisor, agent, command, args)

    def get_agent(self, agent_id: str) -> AgentActor | None:
        """The agent of this id (active or passivated: the same object either way)."""
        return self._supervisor.agents.get(agent_id)

    def list_agents(self) -> list[str]:
        return sorted(self._supervisor.agents)

    async def wait_configured(self) -> dict[str, AgentHandle]:
        """Wait until every agent of the config (``Runtime.open(config=...)``) has started
        or failed to (a failure is a warning in ``rt.dock.warnings``); returns the started
        ones by configured id (``handles["flash"].agent``). Configured agents start once
        their loop and driver are registered, so register those first; bound the wait with
        a trio timeout if one may never come."""
        return await self.dock.wait_configured()

    async def list_sessions(self) -> list[SessionHeader]:
        """Every persisted session's header."""
        return await trio.to_thread.run_sync(self._supervisor.store.list_headers)

    def subscribe_live(self, max_buffer: int = 1024) -> Subscription[LiveEvent]:
        """Live agent events (``agent/created``, ``agent/status``, ``agent/inbox/*``, ...)."""
        return self._supervisor.live.subscribe(max_buffer)

    # -- DSH hosts -------------------------------------------------------------------------

    def serve_bridge(
        self, *, port: int = 0, host: str | None = None, project: str | os.PathLike[str] | None = None
    ) -> AbstractAsyncContextManager[Bridge]:
        """Serve DSH hosts, the console and the GoalBar from this runtime, exactly as
        ``loopdock serve`` does, until the ``async with`` block ends:

            async with rt.serve_bridge(port=8765) as bridge:
                async for agent in bridge.dsh_agents():
                    agent.followup("hello from the runtime")

        On ``host`` (default 127.0.0.1) and ``port`` (0: any free one; ``bridge.port``
        says which), with the token of this runtime's home (``<home>/bridge.token``, made
        on first use), which ``loopdock dsh-patch`` and ``dsh-install`` give DSH when they
        run on the same home. The dock answers the hosts' ``select``; every live DSH
        agent is mirrored as a ``DshAgent`` with, when the runtime was opened with
        ``loopx=``, its LoopX continuation and ``/loopx-init``. ``project``: the LoopX
        project of a session no agent and no host names a ``cwd`` for (default: the
        current directory). A taken port raises PortInUseError (``PORT_IN_USE``)."""
        return open_bridge(self, host=host, port=port, project=project)
