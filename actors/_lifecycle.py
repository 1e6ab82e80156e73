"""Agents as virtual actors: idle agents are passivated, and come back on their next message.

An agent idle for ``passivate_after`` seconds (trio's clock) is passivated: its task,
companions (the LoopX continuation, MCP servers), scoped registrations, inbox, tools,
waterfalls and session actor are released, its session is flushed, and the
``AgentActor`` object callers hold shrinks to its id, its owner and a ``Passive`` record
(actors._passive). Nothing is written to the log: the log already holds everything the
agent is rebuilt from (docs/lifecycle.md).

Only a quiescent agent is passivated: not while a turn runs or is suspended, messages
are queued (an ``inject`` too), a reservation is pending, an approval question is open,
its session has subscribers, a command or ``keep_active()`` holds it, nor while a veto
says no (the LoopX integration's: a queued continuation, an evaluation, a hold). A
vetoed agent is looked at again ``passivate_after`` later. What a companion must not
lose is kept with the passivated agent (``keepers``: the LoopX continuation's memo), and
a timer it had armed is kept by the runtime, which wakes the agent when it is due
(actors._wakeups).

A message to a passivated agent (followup, steer, inject, reserve) is kept in the record
in arrival order and starts exactly one reactivation, a task of the supervisor's
nursery: the dock's resume path (the same one as ``Runtime.resume_agent``: binding read
from the log, LOOP_SWITCH rules, setups, companions) rebuilds the agent in place (the
``into`` of ``ResumeAgentOptions``), and only then are the waiting messages delivered to
its inbox, in order, as if they came at that moment: a person's message still displaces
automatic reservations and is taken first, and the agent's one evaluator runs them. A
failed reactivation leaves the agent passivated with its messages queued (``wait_idle``
raises AgentReactivationError; the next message or ``activate()`` tries again);
disposing it meanwhile cancels the reactivation and rolls the half-built agent back.

Under memory pressure (``Runtime.open(memory_limit=...)``, actors._pressure) idle agents
are passivated whatever ``passivate_after`` says: once per ``PRESSURE_PERIOD`` the RSS is
judged, and over the limit a round passivates the least recently active quiescent
agents (idle the longest), oldest first, until what they are estimated to hold covers
what is above the low-water mark. An agent something keeps active is skipped and keeps
its place: it is never lost, and goes first once nothing keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from loopdock.runtime import Changes, LoopdockError, get_logger, safe_message

from ._agent import AgentActor
from ._passive import Passive
from ._pressure import AGENT_BYTES, PRESSURE_PERIOD, ROUND_FRACTION, MemoryPressure, check_memory_limit, read_rss
from ._session import SessionActor
from ._store_writer import StoreWriter
from ._wakeups import Wakeups

log = get_logger(__name__)

#: ``Runtime.open(passivate_after=...)``'s default: five minutes idle.
PASSIVATE_AFTER = 300.0

#: How many agents are passivated at once (their sessions' flushes share a commit).
PASSIVATION_BATCH = 64

#: A veto: why ``agent`` must stay active now, or None.
Veto = Callable[[AgentActor], "str | None"]


@attrs.frozen
class Kept:
    """What a companion keeps across its agent's passivation (in memory, in the agent's
    ``Passive`` record under ``key``; the rebuilt companion reads it with
    ``agent.carried(key)``), and when its timer was due (trio's clock): the runtime
    reactivates the agent then (``actors._wakeups``)."""

    key: str
    value: Any
    wake_at: float | None = None


#: A keeper: what a companion of ``agent`` keeps if it is passivated now, or None.
Keeper = Callable[[AgentActor], "Kept | None"]


def check_passivate_after(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"passivate_after must be a positive number of seconds or None, got {value!r}")
    return float(value)


class LifecycleOwner(Protocol):
    """What the lifecycle uses of its supervisor (which imports this module)."""

    @property
    def agents(self) -> dict[str, AgentActor]: ...

    @property
    def sessions(self) -> dict[str, SessionActor]: ...

    @property
    def writer(self) -> StoreWriter: ...

    @property
    def nursery(self) -> trio.Nursery: ...

    @property
    def closing(self) -> bool: ...

    def announce(self, event_type: str, agent_id: str, data: Mapping[str, Any]) -> None: ...


class Lifecycle:
    """The supervisor's passivation policy and its reactivations (module docstring)."""

    def __init__(
        self, owner: LifecycleOwner, passivate_after: float | None = None, memory_limit: int | None = None
    ) -> None:
        self._owner = owner
        self.passivate_after = check_passivate_after(passivate_after)
        limit = check_memory_limit(memory_limit)
        #: The memory pressure policy's judgement (actors._pressure); None: no limit, and
        #: nothing reads the RSS.
        self.pressure = None if limit is None else MemoryPressure(limit)
        #: How the RSS is read (bytes); replaceable, e.g. by a test's.
        self.read_rss: Callable[[], int] = read_rss
        #: How an agent is resumed: the dock's ``resume`` bound to the supervisor (set by
        #: the runtime); None: nothing is passivated.
        self.resume: Callable[[Any], Awaitable[Any]] | None = None
        #: How a quiescent agent due is let go of instead of being passivated in place:
        #: None here; a cluster worker's shard host disposes it and marks its session
        #: passivated in Redis, fenced by its shard's lease (docs/cluster.md). True if it
        #: let the agent go; False: not now (an agent still idle is looked at again later).
        self.release: Callable[[AgentActor], Awaitable[bool]] | None = None
        self.vetoes: list[Veto] = []
        self.keepers: list[Keeper] = []
        self.wakeups = Wakeups(self.reactivate)
        self._idle: dict[AgentActor, float] = {}  # idle since (trio's clock), oldest first
        self._changes = Changes()
        self.closing = False
        self.passivations = 0
        self.reactivations = 0
        self.pressure_passivations = 0  # those of ``passivations`` done under memory pressure
        self._done = Changes()  # every passivation and reactivation done or given up

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, checked after every passivation and
        reactivation (for observers and tests)."""
        await self._done.wait_until(predicate)

    # -- the agents' side ----------------------------------------------------------------

    def idle(self, agent: AgentActor) -> None:
        """``agent`` went idle: a candidate from ``passivate_after`` on (at once under
        memory pressure)."""
        if self.passivate_after is None and self.pressure is None:
            return
        self._idle.pop(agent, None)
        self._idle[agent] = trio.current_time()
        if len(self._idle) == 1:
            self._changes.notify()

    def busy(self, agent: AgentActor) -> None:
        self._idle.pop(agent, None)

    @property
    def passivated(self) -> int:
        """How many of the supervisor's agents are passivated now."""
        return sum(1 for agent in self._owner.agents.values() if agent.passivated)

    # -- passivation ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Passivate agents idle for ``passivate_after``, oldest first (batches of those
        due at once run concurrently), wake passivated agents whose timers are due, and,
        with a memory limit, passivate under memory pressure."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.wakeups.run)
            if self.pressure is not None:
                nursery.start_soon(self._relieve, self.pressure, name="memory pressure")
            task_status.started()
            await self._passivate_idle()

    async def _passivate_idle(self) -> None:
        while True:
            after = self.passivate_after
            if after is None or self.closing:
                await self._changes.wait()
                continue
            if not self._idle:
                await self._changes.wait_until(lambda: bool(self._idle))
                continue
            since = next(iter(self._idle.values()))
            now = trio.current_time()
            if now < since + after:
                await trio.sleep_until(since + after)
                continue
            due = []
            for agent, since in self._idle.items():
                if since + after > now:
                    break
                due.append(agent)
            for agent in due:
                del self._idle[agent]
            # A few at once (each waits for its session's flush), not a task per agent
            # due: a thousand agents idle since the same moment need no thousand tasks.
            for start in range(0, len(due), PASSIVATION_BATCH):
                async with trio.open_nursery() as nursery:
                    for agent in due[start : start + PASSIVATION_BATCH]:
                        nursery.start_soon(self.passivate, agent)

    # -- memory pressure (actors._pressure) ----------------------------------------------

    async def _relieve(self, pressure: MemoryPressure) -> None:
        """Judge the RSS every ``PRESSURE_PERIOD``; over the limit, run a round."""
        unreadable = False
        while True:
            await trio.sleep(PRESSURE_PERIOD)
            if self.closing:
                continue
            try:
                rss = self.read_rss()
            except (OSError, ValueError) as exc:  # no /proc (not Linux): the limit cannot be enforced
                if not unreadable:
                    log.warning("memory limit not enforced: the RSS cannot be read", error=safe_message(exc))
                unreadable = True
                continue
            unreadable = False
            wanted = pressure.judge(rss, self.reactivations)
            if wanted > 0:
                await self._pressure_round(pressure, wanted)

    async def _pressure_round(self, pressure: MemoryPressure, wanted: int) -> None:
        """Passivate the least recently active quiescent agents until their estimated
        weight covers ``wanted`` bytes, at most ``ROUND_FRACTION`` of the idle agents (at
        least one batch); the agents something keeps active keep their place."""
        cap = max(PASSIVATION_BATCH, math.ceil(len(self._idle) * ROUND_FRACTION))
        chosen: list[tuple[AgentActor, float]] = []
        kept: list[tuple[str, str]] = []  # the oldest few kept active, and why
        kept_count = 0
        covered = 0
        for agent, since in list(self._idle.items()):  # least recently active first
            if covered >= wanted or len(chosen) >= cap:
                break
            if agent.passivated or agent.closed:
                continue
            why = self.why_active(agent)
            if why is not None:
                kept_count += 1
                if len(kept) < 5:
                    kept.append((agent.id, why))
                continue
            chosen.append((agent, since))
            covered += AGENT_BYTES + agent.history_weight()
        if covered < wanted and len(chosen) < cap and not pressure.warned:
            pressure.warned = True
            agents = self._owner.agents.values()
            log.warning(
                "memory over the limit and no idle agent left to passivate",
                rss=pressure.rss, limit=pressure.limit, wanted=wanted, passivating=len(chosen),
                active=sum(1 for a in agents if not a.passivated), idle=len(self._idle), kept_active=kept_count,
                oldest_kept=[{"agent_id": agent_id, "reason": why} for agent_id, why in kept],
            )
        for start in range(0, len(chosen), PASSIVATION_BATCH):
            if self.closing:
                return
            async with trio.open_nursery() as nursery:
                for agent, since in chosen[start : start + PASSIVATION_BATCH]:
                    # Active since it was chosen, or taken by the idle policy: not now.
                    if self._idle.get(agent) != since:
                        continue
                    del self._idle[agent]
                    weight = AGENT_BYTES + agent.history_weight()  # read while it is active
                    nursery.start_soon(self._passivate_under_pressure, pressure, agent, weight)

    async def _passivate_under_pressure(self, pressure: MemoryPressure, agent: AgentActor, weight: int) -> None:
        if await self.passivate(agent):
            self.pressure_passivations += 1
            pressure.released(weight)
            self._done.notify()  # for those waiting on the count just changed

    def why_active(self, agent: AgentActor) -> str | None:
        """Why ``agent`` cannot be passivated now (None: it can)."""
        if self.resume is None:
            return "no resume path"
        if not self._owner.writer.persist:
            return "the runtime persists nothing"
        why = agent._passivable()
        if why is not None:
            return why
        for veto in list(self.vetoes):
            try:
                why = veto(agent)
            except Exception as exc:  # a broken veto keeps the agent active, never loses it
                log.warning("passivation veto failed", veto=repr(veto), error=repr(exc))
                why = "a veto failed"
            if why is not None:
                return why
        return None

    async def passivate(self, agent: AgentActor) -> bool:
        """Passivate ``agent`` if nothing keeps it active; True if it was."""
        if self.closing or agent.passivated or agent.closed:
            return False
        why = self.why_active(agent)
        if why is not None:
            if agent.status == "idle" and (self.passivate_after is not None or self.pressure is not None):
                self._idle[agent] = trio.current_time()  # looked at again one period later
            agent.log.debug("agent not passivated", reason=why)
            return False
        try:
            kept = self._kept(agent)
        except Exception as exc:  # what it would lose is not known: it stays active
            agent.log.warning("agent not passivated: a keeper failed", error=repr(exc))
            if agent.status == "idle" and (self.passivate_after is not None or self.pressure is not None):
                self._idle[agent] = trio.current_time()
            return False
        if self.release is not None:  # no checkpoint since the check: still quiescent
            if kept:
                # Let go of, the agent keeps nothing in memory (a worker's shell is not
                # kept): what a companion keeps (a LoopX wait) would be lost. Not now.
                agent.log.debug("agent not released: a companion keeps state in memory")
                self._idle[agent] = trio.current_time()
                return False
            self.busy(agent)
            released = await self.release(agent)
            self.passivations += released
            if not released and not agent.closed and agent.status == "idle":
                self._idle[agent] = trio.current_time()  # not now: looked at again one period later
            self._done.notify()
            return released
        owner = self._owner
        passive = agent._begin_passivation()
        passive.kept = {k.key: k.value for k in kept} or None
        session = agent.session
        self.busy(agent)
        try:
            # Short, and never left half done: the task's end, the flush of a session
            # whose events are (nearly) all durable already.
            with trio.CancelScope(shield=True):
                await agent._halt()
                agent.dispose_scoped()
                await session.close()
        except Exception as exc:  # its last events could not be made durable
            agent.log.error("agent not passivated cleanly: retired", error=safe_message(exc))
            if owner.sessions.get(agent.id) is session:
                del owner.sessions[agent.id]
            if owner.agents.get(agent.id) is agent:
                del owner.agents[agent.id]
            agent._empty(passive)
            passive.transition = False
            self._close_record(passive, "store-failed")
            owner.announce("agent/error", agent.id, {"error": safe_message(exc)})
            return False
        if owner.sessions.get(agent.id) is session:
            del owner.sessions[agent.id]
        agent._empty(passive)
        self.passivations += 1
        wake_at = min((k.wake_at for k in kept if k.wake_at is not None), default=None)
        if wake_at is not None:
            self.wakeups.schedule(wake_at, agent, passive)
        owner.announce("agent/passivated", agent.id, {})
        passive.transition = False
        passive.notify()
        self._done.notify()
        if (passive.wanted or passive.pending) and not passive.closed:
            self.reactivate(agent)  # a message came while it passivated
        return True

    def _kept(self, agent: AgentActor) -> list[Kept]:
        """What the keepers keep of ``agent`` now (read before anything of it stops)."""
        kept = []
        for keeper in list(self.keepers):
            value = keeper(agent)
            if value is not None:
                kept.append(value)
        return kept

    # -- reactivation ----------------------------------------------------------------------

    def reactivate(self, agent: AgentActor) -> None:
        """Start ``agent``'s reactivation unless one runs, or it is passivating (then it
        starts once that is done): exactly one at a time."""
        passive = agent._passive
        if passive is None or passive.closed:
            return
        passive.wanted = True
        if passive.transition:
            return
        if self.closing or self._owner.closing:
            passive.error = LoopdockError("the runtime is shutting down")
            passive.notify()
            return
        passive.transition = True
        passive.error = None
        self._owner.nursery.start_soon(self._reactivate, agent, passive, name=f"reactivate agent {agent.id}")

    async def _reactivate(self, agent: AgentActor, passive: Passive) -> None:
        resume = self.resume
        handle: Any = None
        failure: BaseException | None = None
        try:
            with trio.CancelScope() as passive.scope:
                try:
                    if resume is None:
                        raise LoopdockError("this runtime cannot resume agents")
                    handle = await resume(attrs.evolve(passive.recipe, into=agent))
                    if handle.agent is not agent:  # a driver that does not build in place
                        await handle.dispose()
                        raise LoopdockError(f"the driver of agent {agent.id!r} cannot reactivate it in place")
                except Exception as exc:
                    failure = exc
        finally:
            passive.scope = None
            if handle is not None and failure is None and not passive.closed and agent._passive is passive:
                agent._reactivated()  # no checkpoint since the check: nothing slips between
                self.reactivations += 1
                self._owner.announce("agent/reactivated", agent.id, {})
            else:
                with trio.CancelScope(shield=True):
                    await self._undo(agent, passive)
                if failure is not None and not passive.closed:
                    passive.error = failure
                    log.warning("agent not reactivated", agent_id=agent.id, error=safe_message(failure))
                elif not passive.closed:
                    passive.error = LoopdockError("the reactivation was cancelled")
                passive.transition = False
                passive.wanted = False
                passive.notify()
            self._done.notify()

    async def _undo(self, agent: AgentActor, passive: Passive) -> None:
        """Roll a half-built reactivation back to the passivated record."""
        owner = self._owner
        state = agent.__dict__
        if "_inbox" in state:  # rebuilt (at least in part)
            session = state.get("session")
            try:
                await agent._halt()
                agent.dispose_scoped()
                if session is not None:
                    if session.published:
                        await session.close()
                    elif not session.closed:
                        session.discard()
            except Exception as exc:
                log.error("half-reactivated agent not closed cleanly", agent_id=agent.id, error=safe_message(exc))
            if session is not None and owner.sessions.get(agent.id) is session:
                del owner.sessions[agent.id]
            agent._empty(passive)
        if passive.closed:
            if owner.agents.get(agent.id) is agent:
                del owner.agents[agent.id]
        elif owner.agents.get(agent.id) is None:
            owner.agents[agent.id] = agent  # the publication's rollback took it out

    # -- disposal ---------------------------------------------------------------------------

    async def close_passive(self, agent: AgentActor, cause: str) -> None:
        """Dispose a passivated agent: what waits for it is discarded (reservations settle
        ``cancelled`` with ``cause``), a reactivation under way is cancelled and rolled
        back, a passivation under way finishes first."""
        passive = agent._passive
        assert passive is not None
        self._close_record(passive, cause)
        if passive.scope is not None:
            passive.scope.cancel()
        while passive.transition:
            await passive.changed()
        await trio.lowlevel.checkpoint()

    def close_now(self, agent: AgentActor, cause: str) -> bool:
        """Dispose a passivated agent that nothing is being done to, at once (no task:
        closing a runtime of a million of them must not start a million); False if it is
        active, or being passivated or reactivated (then ``close_passive``)."""
        passive = agent._passive
        if passive is None or passive.transition:
            return False
        self._close_record(passive, cause)
        return True

    def _close_record(self, passive: Passive, cause: str) -> None:
        passive.closed = True
        for entry in passive.take_pending():
            if entry.reservation is not None:
                entry.reservation.settle("cancelled", cause)
        passive.notify()
