"""The LoopX integration switch: ``Runtime.open(loopx=LoopxSettings(...))``.

When enabled, every agent gets a LoopX continuation as a companion actor (passive
until its own session invokes the ``loopx`` skill), ``/loopx-init`` is registered as a
repair command, and the runtime initialises the CLI and the workflow skills once at
start-up, before it reports ready, without any model call.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from loopdock.runtime import Changes, get_logger
from loopdock.runtime.loopx import LoopxClient

from .._agent import AgentActor
from .._commands import CommandContext, CommandRegistry, CommandResult
from .._lifecycle import Kept
from .._supervisor import Supervisor
from ._continuation import ContinuationMemo, ContinuationStatus, ContinuedAgent, LoopxContinuation
from ._init import InitOutcome, InitSettings, InitTarget, loopx_init_command, run_loopx_init, startup_initialize

log = get_logger(__name__)

#: Under which key a passivated agent keeps its continuation's memo (``Passive.kept``).
KEPT_KEY = "loopx"


@attrs.frozen
class LoopxSettings:
    """``env``: the environment of every loopx call (PATH must reach Node >= 22.22.3);
    ``None`` means this process's. ``command``: the argv prefix that starts the CLI
    (default ``loopx`` on that PATH, or the managed launcher that start-up installed).
    ``timeout``: seconds per CLI attempt. ``initialize``: run the start-up initialisation."""

    env: Mapping[str, str] | None = None
    command: tuple[str, ...] = ("loopx",)
    timeout: float = 60.0
    initialize: bool = True


class LoopxIntegration:
    """Owns the continuations of one runtime (``rt.loopx``)."""

    def __init__(self, settings: LoopxSettings) -> None:
        self.settings = settings
        self.env: Mapping[str, str] = dict(os.environ if settings.env is None else settings.env)
        self.command: tuple[str, ...] = settings.command
        self.startup: InitOutcome | None = None
        self.continuations: dict[str, LoopxContinuation] = {}  # agent id -> its live one
        self._agents: Mapping[str, AgentActor] = {}  # the supervisor's (set by ``start``)
        #: one change per continuation status change, and when one starts or stops
        self.changes = Changes()

    def client_for(self, project: Path) -> LoopxClient:
        """A client on the CLI as it is now: every caller asks again for each use, so a
        repair (``/loopx-init``) reaches continuations that started before it."""
        return LoopxClient(self.command, project=project, env=self.env, timeout=self.settings.timeout)

    def continuation(self, session_id: str) -> LoopxContinuation | None:
        """The live continuation of the agent with this id (agent id == session id)."""
        return self.continuations.get(session_id)

    def init_settings(self, project: Path) -> InitSettings:
        return InitSettings.from_env(self.env, project, timeout=self.settings.timeout)

    def adopt(self, outcome: InitOutcome) -> None:
        """Use the CLI an initialisation found or installed for every later call."""
        if outcome.ok and outcome.command:
            self.command = tuple(outcome.command)

    async def run_init(self, target: InitTarget, project: Path, args: str = "") -> CommandResult:
        """``/loopx-init`` for an agent that is not the runtime's own (a DSH agent's proxy,
        when a DSH user runs the command through the plugin): the same sequence, adopted
        the same way."""
        return await run_loopx_init(target, args, lambda: self.init_settings(project), on_success=self.adopt)

    async def start(self, supervisor: Supervisor, commands: CommandRegistry, project: Path) -> None:
        """Attach the continuations, register ``/loopx-init``, and (if asked) initialise once,
        before the runtime reports ready. A failure is kept as a safe stage/kind in
        ``startup``; the runtime stays up and ``/loopx-init`` stays available to repair."""

        def settings_for(ctx: CommandContext) -> InitSettings:
            return self.init_settings(ctx.agent.cwd)

        commands.register(loopx_init_command(settings_for, on_success=self.adopt))
        supervisor.agent_started.append(self.start_continuation)
        supervisor.lifecycle.vetoes.append(self.keeps_active)
        supervisor.lifecycle.keepers.append(self.keep)
        self._agents = supervisor.agents
        if self.settings.initialize:
            self.startup = await startup_initialize(self.init_settings(project))
            self.adopt(self.startup)
            log.info("loopx start-up initialisation", ok=self.startup.ok, stage=self.startup.stage, kind=self.startup.kind)

    def keeps_active(self, agent: AgentActor) -> str | None:
        """The passivation veto: a continuation with a timer or work under way keeps its
        agent in memory."""
        continuation = self.continuations.get(agent.id)
        return None if continuation is None else continuation.keeps_active()

    def keep(self, agent: AgentActor) -> Kept | None:
        """The passivation keeper: the continuation's memo, and when its timer is due."""
        continuation = self.continuations.get(agent.id)
        memo = None if continuation is None else continuation.memo()
        return None if memo is None else Kept(KEPT_KEY, memo, memo.wake_at)

    def status(self, session_id: str) -> ContinuationStatus | None:
        """The continuation's status: the live one's, or what a passivated agent's kept."""
        continuation = self.continuations.get(session_id)
        if continuation is not None:
            return continuation.status
        memo = self._kept(session_id)
        return None if memo is None else memo.status

    def project_of(self, session_id: str) -> Path | None:
        """The LoopX project (the agent's ``cwd``) of a session with a continuation: the
        live one's, or what a passivated agent kept; None otherwise."""
        continuation = self.continuations.get(session_id)
        if continuation is not None:
            return continuation.agent.cwd
        memo = self._kept(session_id)
        return None if memo is None else memo.cwd

    def _kept(self, session_id: str) -> ContinuationMemo | None:
        """What a passivated agent's continuation kept (None for any other)."""
        agent = self._agents.get(session_id)
        memo = agent.carried(KEPT_KEY) if agent is not None else None
        return memo if isinstance(memo, ContinuationMemo) else None

    @asynccontextmanager
    async def live(self, session_id: str) -> AsyncIterator[LoopxContinuation | None]:
        """The session's live continuation, its agent brought back first if it is
        passivated and kept active meanwhile (a GoalBar Start/Pause); None for a
        session this runtime does not run (a DSH agent's proxy is always live).
        Raises AgentReactivationError if the agent cannot be brought back."""
        agent = self._agents.get(session_id)
        if agent is None or agent.closed:
            yield self.continuations.get(session_id)
            return
        while agent.passivated:
            await agent.activate()
        with agent.keep_active():
            yield self.continuations.get(session_id)

    async def start_continuation(self, agent: ContinuedAgent) -> None:
        """Attach a continuation to ``agent`` as its companion: every runtime agent gets
        one at start; a bridge proxy of a DSH agent (``bridge.DshAgent``, the same
        interface) gets one the same way."""
        # Coming back from a passivation: what it knew then (actors._lifecycle.Kept).
        memo = agent.carried(KEPT_KEY) if isinstance(agent, AgentActor) else None
        continuation = LoopxContinuation(
            agent, lambda: self.client_for(agent.cwd), on_change=self.changes.notify,
            memo=memo if isinstance(memo, ContinuationMemo) else None,
        )
        self.continuations[agent.id] = continuation
        self.changes.notify()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                await continuation.run(task_status=task_status)
            except Exception as exc:  # contained: it must never take its agent down
                log.warning("loopx continuation ended by a failure", agent_id=agent.id, error=repr(exc))
            finally:
                if self.continuations.get(agent.id) is continuation:
                    del self.continuations[agent.id]
                self.changes.notify()

        await agent.start_companion(run, name="loopx-continuation")
