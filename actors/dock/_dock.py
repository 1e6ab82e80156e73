"""LoopDock: register -> select -> bind -> delegate.

The dock is the runtime's one agent factory. It holds the loop registry and the named
driver registry, picks a loop and a driver for every create and resume, records the
choice durably in the session log, and delegates to the driver. It contains no loop
algorithm of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeGuard

import attrs
import trio

from loopdock.runtime import AgentOptions, Changes, Event, Next, get_logger
from loopdock.runtime.models import ModelRequest

from .._agent import AgentActor
from .._agent_context import AgentContext
from .._driver import AgentHandle, CreateAgentOptions, Driver, ResumeAgentOptions, Setup
from .._publication import compose_setups
from .._supervisor import Outline, Supervisor
from ._config import AgentEntry, DockConfig, Route
from ._errors import DockError, available
from ._loops import (
    DriverLoop,
    Loop,
    LoopInfo,
    StrategyLoop,
    check_driver_name,
    check_loop_id,
)
from ._presets import AgentPresets
from ._selection import (
    BINDING_EVENT,
    Decision,
    Selection,
    binding_data,
    newest_selected_preset,
    read_binding,
    resolve_create,
    resolve_resume,
)

log = get_logger(__name__)

DEFAULT_DRIVER = "default"


@attrs.frozen
class StrategyDriver:
    """A strategy loop bound to a driver: the driver runs, the strategy's setup composes."""

    strategy: StrategyLoop
    driver: Driver

    async def create_agent(self, owner: Supervisor, options: CreateAgentOptions) -> AgentHandle:
        setup = compose_setups([options.setup, self.strategy.setup])
        return await self.driver.create_agent(owner, attrs.evolve(options, setup=setup))

    async def resume(self, owner: Supervisor, options: ResumeAgentOptions) -> AgentHandle:
        setup = compose_setups([options.setup, self.strategy.setup])
        return await self.driver.resume(owner, attrs.evolve(options, setup=setup))


@attrs.frozen
class DockChoice:
    """What ``LoopDock.decide`` chose, for a host that runs the agent itself (DSH through
    the bridge): the binding, the pin of the loop (None: not pinned) and the agent options
    as the driver would get them (pinned: the caller's reasoning effort dropped)."""

    loop: str
    driver: str | None
    provider: str | None
    model: str | None
    agent_options: AgentOptions


def _pin(options: AgentOptions, loop: Loop) -> AgentOptions:
    """A loop's pinned provider/model owns the whole route: the caller's reasoning effort
    goes (another model may not support it); every other option stays."""
    if loop.provider is None and loop.model is None:
        return options
    return options.evolve(
        provider=loop.provider or options.provider,
        model=loop.model or options.model,
        reasoning_effort=None,
    )


class LoopDock:
    def __init__(self, owner: Supervisor, config: DockConfig | None = None) -> None:
        self._owner = owner
        self.config = config or DockConfig()
        self._loops: dict[str, Loop] = {}
        self._loops_version = 0  # counts changes of ``_loops`` (see ``_pinned``)
        self._pins: tuple[DockConfig, int, frozenset[tuple[str, str]]] | None = None
        self._drivers: dict[str, Driver] = {}
        self._default_driver: str | None = None  # the live setting; None: the config's
        self._registry = Changes()  # wakes configured agents waiting for a loop
        self._warned: set[str] = set()
        self.warnings: list[str] = []
        self.configured: dict[str, AgentHandle] = {}  # configured agent id -> handle
        self.starting: set[str] = set()  # configured agents waiting for a loop or starting
        self._unsettled: set[str] = set()  # configured agents not yet started, nor failed
        self._settled = Changes()

    # -- loop registry ---------------------------------------------------------------

    def register(self, loop: Loop) -> Callable[[], None]:
        """Register a loop; returns an idempotent disposer removing only this loop."""
        if not isinstance(loop, (StrategyLoop, DriverLoop)):
            raise DockError(
                "INVALID_LOOP_DEFINITION",
                f"register() takes a StrategyLoop or a DriverLoop, got {type(loop).__name__}",
            )
        if loop.id in self._loops:
            raise DockError(
                "DUPLICATE_LOOP", f"loop {loop.id!r} is already registered (as a {self._loops[loop.id].kind} loop)"
            )
        self._loops[loop.id] = loop
        self._loops_version += 1
        self._registry.notify()

        def dispose() -> None:
            if self._loops.get(loop.id) is loop:
                del self._loops[loop.id]
                self._loops_version += 1

        return dispose

    def unregister(self, loop_id: str) -> bool:
        removed = self._loops.pop(check_loop_id(loop_id), None) is not None
        self._loops_version += removed
        return removed

    def has(self, loop_id: str) -> bool:
        return check_loop_id(loop_id) in self._loops

    def get(self, loop_id: str) -> Loop | None:
        return self._loops.get(check_loop_id(loop_id))

    def require(self, loop_id: str) -> Loop:
        loop = self.get(loop_id)
        if loop is None:
            raise DockError("UNKNOWN_LOOP", f"unknown loop {loop_id!r}; registered loops: {available(self._loops)}")
        return loop

    def list_loops(self) -> list[LoopInfo]:
        return [LoopInfo(l.id, l.kind, l.label, l.description) for _, l in sorted(self._loops.items())]

    # -- driver registry ---------------------------------------------------------------

    def register_driver(self, name_or_driver: str | Driver, driver: Driver | None = None) -> Callable[[], None]:
        """``register_driver(driver)`` registers ``default``; ``register_driver(name, driver)``
        a named driver. Returns an idempotent disposer removing only that driver."""
        chosen: object
        if driver is None:
            name, chosen = DEFAULT_DRIVER, name_or_driver
        else:
            name, chosen = check_driver_name(name_or_driver), driver
        if not _is_driver(chosen):
            raise DockError("INVALID_DRIVER", f"driver {name!r} must have create_agent(owner, options) and resume(owner, options)")
        if name in self._drivers:
            raise DockError("DUPLICATE_DRIVER", f"driver {name!r} is already registered")
        self._drivers[name] = chosen
        self._registry.notify()

        def dispose() -> None:
            if self._drivers.get(name) is chosen:
                del self._drivers[name]

        return dispose

    def list_drivers(self) -> list[str]:
        return sorted(self._drivers)

    def has_driver(self, name: str) -> bool:
        return check_driver_name(name) in self._drivers

    @property
    def default_driver(self) -> str:
        """The driver new strategy agents use when nothing else picks one (live setting)."""
        return self._default_driver or self.config.default_driver

    @default_driver.setter
    def default_driver(self, name: str | None) -> None:
        self._default_driver = None if name is None else check_driver_name(name)

    # -- the factory -------------------------------------------------------------------

    async def create_agent(self, owner: Supervisor, options: CreateAgentOptions) -> AgentHandle:
        decision = resolve_create(_explicit(options), options.session_id, options.agent_preset, self.config)
        loop, binding, provider = self._materialize(decision)
        decorated = attrs.evolve(
            options,
            loop=binding.loop,
            driver=binding.driver,
            agent_options=self._options_for(options.agent_options, loop, binding),
            setup=self._setup_for(options.setup, binding),
        )
        handle = await provider.create_agent(owner, decorated)
        _remember(handle, ResumeAgentOptions(
            resume_session_id=options.session_id, agent_options=options.agent_options, setup=options.setup,
            loop=options.loop, driver=options.driver,
        ))
        return handle

    async def resume(self, owner: Supervisor, options: ResumeAgentOptions) -> AgentHandle:
        persisted, preset, outline = await self._inspect(options.resume_session_id)
        decision = resolve_resume(_explicit(options), options.resume_session_id, persisted, preset, self.config)
        loop, binding, provider = self._materialize(decision)
        decorated = attrs.evolve(
            options,
            loop=binding.loop,
            driver=binding.driver,
            agent_options=self._options_for(options.agent_options, loop, binding),
            setup=self._setup_for(options.setup, binding),
            outline=outline,  # read once: the driver's load_session uses it
        )
        handle = await provider.resume(owner, decorated)
        if options.into is None:  # a reactivation keeps the recipe it came with
            _remember(handle, options)
        return handle

    def decide(
        self,
        op: Literal["create", "resume"],
        session_id: str,
        agent_options: AgentOptions | Mapping[str, Any] | None = None,
        agent_preset: str | None = None,
        persisted: Route | None = None,
    ) -> DockChoice:
        """The choice ``create_agent``/``resume`` would make, without delegating: same
        rules, same errors (LOOP_SWITCH against ``persisted``, the stored binding, on a
        resume; ``agent_preset`` is then the session's effective preset)."""
        options = AgentOptions.from_value(agent_options)
        explicit = Selection(options.loop, options.driver)
        if op == "create":
            decision = resolve_create(explicit, session_id, agent_preset, self.config)
        elif op == "resume":
            decision = resolve_resume(explicit, session_id, persisted, agent_preset, self.config)
        else:
            raise ValueError(f"op must be 'create' or 'resume', got {op!r}")
        loop, binding, _ = self._materialize(decision)
        return DockChoice(
            binding.loop, binding.driver, loop.provider, loop.model, self._options_for(options, loop, binding)
        )

    def _materialize(self, decision: Decision) -> tuple[Loop, Route, Driver]:
        loop = self.require(decision.loop)
        if isinstance(loop, DriverLoop):
            if decision.driver is not None:
                raise DockError(
                    "INVALID_CONFIG",
                    f"driver selection ({decision.driver!r}) is only valid for strategy loops; "
                    f"{loop.id!r} is a driver loop",
                )
            return loop, Route(loop.id), loop
        name = decision.driver or loop.driver or self.default_driver
        driver = self._drivers.get(name)
        if driver is None:
            raise DockError(
                "MISSING_DRIVER",
                f"strategy loop {loop.id!r} needs driver {name!r}, which is not registered; "
                f"registered drivers: {available(self._drivers)}",
            )
        return loop, Route(loop.id, name), StrategyDriver(loop, driver)

    def _options_for(self, options: AgentOptions, loop: Loop, binding: Route) -> AgentOptions:
        # Drivers that only read agent options still see the selection.
        return _pin(options, loop).evolve(loop=binding.loop, driver=binding.driver)

    def _setup_for(self, caller: Setup | None, binding: Route) -> Setup | None:
        return compose_setups([caller, self._durable_binding_setup(binding), self._route_follow_setup()])

    async def _inspect(self, session_id: str) -> tuple[Route | None, str | None, Outline | None]:
        """The stored binding and the effective preset of a session about to be resumed,
        and its outline if it was read from the store (the resume then reads it once)."""
        live = self._owner.sessions.get(session_id)
        events: Sequence[Event]  # only the binding events: nothing else is read here
        if live is not None:
            events, header = live.retained(BINDING_EVENT), live.header
            outline = None
        else:
            outline = await self._owner.read_outline(session_id)
            if outline is None:
                return None, None, None  # the driver reports SESSION_NOT_FOUND
            header, events = outline[0], [e for e in outline[3] if e.type == BINDING_EVENT]
        return read_binding(events), newest_selected_preset(events) or header.agent_preset, outline

    # -- setups the dock adds to every agent ---------------------------------------------

    def _durable_binding_setup(self, binding: Route) -> Setup:
        """Records the binding once (on the known ``agent-preset/selected`` event),
        keeping the session's effective preset; an existing binding is never overwritten."""

        def record_binding(ctx: AgentContext) -> None:
            if read_binding(ctx.session.retained(BINDING_EVENT)) is not None:
                return
            ctx.session.append(BINDING_EVENT, binding_data(binding, _effective_preset(ctx)))

        return record_binding

    def _route_follow_setup(self) -> Setup:
        """The outermost ``agent/request`` listener: re-applies the pin of the loop mapped
        to the session's *current* preset on every request, and releases a stale pin."""
        dock = self

        def route_follow(ctx: AgentContext) -> None:
            async def follow(request: ModelRequest, next_: Next[ModelRequest, ModelRequest]) -> ModelRequest:
                resolved = await next_(request)
                preset = _effective_preset(ctx)
                route = dock.config.preset_loops.get(preset) if preset else None
                loop = dock._loops.get(route.loop) if route else None
                if loop is not None and (loop.provider or loop.model):
                    return attrs.evolve(
                        resolved,
                        provider=loop.provider or resolved.provider,
                        model=loop.model or resolved.model,
                        reasoning_effort=None,
                    )
                if dock._is_someone_elses_pin(resolved):
                    own = ctx.agent.options
                    return attrs.evolve(resolved, provider=own.provider, model=own.model, reasoning_effort=None)
                return resolved

            ctx.on("agent/request", follow, prepend=True)

        return route_follow

    def _is_someone_elses_pin(self, request: ModelRequest) -> bool:
        return (request.provider, request.model) in self._pinned()

    def _pinned(self) -> frozenset[tuple[str, str]]:
        """The (provider, model) of every loop a preset maps to that pins both. Asked on
        every model request, so it is computed once per config and registry change."""
        config, version = self.config, self._loops_version
        if self._pins is None or self._pins[0] is not config or self._pins[1] != version:
            pins = frozenset(
                (loop.provider, loop.model)
                for route in config.preset_loops.values()
                if (loop := self._loops.get(route.loop)) is not None and loop.provider and loop.model
            )
            self._pins = (config, version, pins)
        return self._pins[2]

    # -- configured agents ---------------------------------------------------------------

    def start_configured_agents(self) -> None:
        """Start the config's agents; each waits until its loop and driver are registered."""
        self._unsettled.update(entry.id for entry in self.config.agents)
        for entry in self.config.agents:
            self._owner.nursery.start_soon(self._start_configured, entry, name=f"configured agent {entry.id}")

    def _ready(self, decision: Decision) -> bool:
        loop = self._loops.get(decision.loop)
        if loop is None:
            return False
        if isinstance(loop, DriverLoop):
            return True
        return (decision.driver or loop.driver or self.default_driver) in self._drivers

    async def _start_configured(self, entry: AgentEntry) -> None:
        explicit = Selection(entry.loop, entry.driver)
        options: dict[str, Any] = entry.agent_options()
        self.starting.add(entry.id)
        try:
            # no session named: the agent's own id (agent id == session id, as everywhere)
            session_id = entry.resume_session_id or entry.session_id or entry.id
            resume = entry.resume_session_id is not None or await trio.to_thread.run_sync(
                self._owner.store.exists, session_id
            )
            while True:  # the same decision the factory will make, so we wait for the right loop
                if resume:
                    persisted, preset, _ = await self._inspect(session_id)
                    decision = resolve_resume(explicit, session_id, persisted, preset, self.config)
                else:
                    decision = resolve_create(explicit, session_id, None, self.config)
                if self._ready(decision):
                    break
                await self._registry.wait()
            if resume:
                handle = await self.resume(
                    self._owner,
                    ResumeAgentOptions(
                        resume_session_id=session_id, agent_options=options, loop=entry.loop, driver=entry.driver
                    ),
                )
            else:
                handle = await self.create_agent(
                    self._owner,
                    CreateAgentOptions(
                        session_id=session_id, agent_options=options, cwd=entry.cwd, loop=entry.loop, driver=entry.driver
                    ),
                )
            self.configured[entry.id] = handle
        except Exception as exc:  # a configured agent must never take the runtime down
            self._warn(f"configured agent {entry.id!r} failed to start: {exc}")
        finally:
            self.starting.discard(entry.id)
            self._unsettled.discard(entry.id)
            self._settled.notify()

    async def wait_configured(self) -> dict[str, AgentHandle]:
        """Wait until every configured agent has started or failed (its warning is then in
        ``warnings``); the started ones by configured id. An agent whose loop or driver is
        never registered keeps this waiting: bound it with a trio timeout."""
        await self._settled.wait_until(lambda: not self._unsettled)
        return dict(self.configured)

    def _warn(self, message: str) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        self.warnings.append(message)
        log.warning("loop dock", problem=message)


def _is_driver(value: object) -> TypeGuard[Driver]:
    return callable(getattr(value, "create_agent", None)) and callable(getattr(value, "resume", None))


def _remember(handle: AgentHandle, options: ResumeAgentOptions) -> None:
    """How to reactivate the agent once passivated: the dock's resume with its caller's
    options (the caller's setup runs again, as on any resume). Only for agents the
    driver can rebuild in place (``AgentActor.revivable``)."""
    agent = handle.agent
    if isinstance(agent, AgentActor) and agent.revivable:
        agent.reactivation = options


def _explicit(options: CreateAgentOptions | ResumeAgentOptions) -> Selection:
    """The caller's choice: the option itself, else the same key in the agent options.
    An empty string is a choice too (and an invalid one), never "not given"."""
    loop = options.loop if options.loop is not None else options.agent_options.loop
    driver = options.driver if options.driver is not None else options.agent_options.driver
    return Selection(loop, driver)


def _effective_preset(ctx: AgentContext) -> str | None:
    presets = ctx.owner.services.get("agentPresets")
    if isinstance(presets, AgentPresets):
        return presets.composed_preset(ctx)
    return newest_selected_preset(ctx.session.retained(BINDING_EVENT)) or ctx.session.header.agent_preset
