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
says no (the LoopX integration's: an armed scheduler timer, a queued continuation, an
evaluation). A vetoed agent is looked at again ``passivate_after`` later.

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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from loopdock.runtime import Changes, LoopdockError, get_logger, safe_message

from ._agent import AgentActor
from ._passive import Passive
from ._session import SessionActor
from ._store_writer import StoreWriter

log = get_logger(__name__)

#: ``Runtime.open(passivate_after=...)``'s default: five minutes idle.
PASSIVATE_AFTER = 300.0

#: How many agents are passivated at once (their sessions' flushes share a commit).
PASSIVATION_BATCH = 64

#: A veto: why ``agent`` must stay active now, or None.
Veto = Callable[[AgentActor], "str | None"]


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

    def __init__(self, owner: LifecycleOwner, passivate_after: float | None = None) -> None:
        self._owner = owner
        self.passivate_after = check_passivate_after(passivate_after)
        #: How an agent is resumed: the dock's ``resume`` bound to the supervisor (set by
        #: the runtime); None: nothing is passivated.
        self.resume: Callable[[Any], Awaitable[Any]] | None = None
        #: How a quiescent agent due is let go of instead of being passivated in place:
        #: None here; a cluster worker's shard host disposes it and marks its session
        #: passivated in Redis, fenced by its shard's lease (docs/cluster.md). True if it
        #: let the agent go; False: not now (an agent still idle is looked at again later).
        self.release: Callable[[AgentActor], Awaitable[bool]] | None = None
        self.vetoes: list[Veto] = []
        self._idle: dict[AgentActor, float] = {}  # idle since (trio's clock), oldest first
        self._changes = Changes()
        self.closing = False
        self.passivations = 0
        self.reactivations = 0
        self._done = Changes()  # every passivation and reactivation done or given up

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, checked after every passivation and
        reactivation (for observers and tests)."""
        await self._done.wait_until(predicate)

    # -- the agents' side ----------------------------------------------------------------

    def idle(self, agent: AgentActor) -> None:
        """``agent`` went idle: a candidate from ``passivate_after`` on."""
        if self.passivate_after is None:
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
        due at once run concurrently)."""
        task_status.started()
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
            if agent.status == "idle" and self.passivate_after is not None:
                self._idle[agent] = trio.current_time()  # looked at again one period later
            agent.log.debug("agent not passivated", reason=why)
            return False
        if self.release is not None:  # no checkpoint since the check: still quiescent
            self.busy(agent)
            released = await self.release(agent)
            self.passivations += released
            if not released and not agent.closed and agent.status == "idle":
                self._idle[agent] = trio.current_time()  # not now: looked at again one period later
            self._done.notify()
            return released
        owner = self._owner
        passive = agent._begin_passivation()
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
        owner.announce("agent/passivated", agent.id, {})
        passive.transition = False
        passive.notify()
        self._done.notify()
        if (passive.wanted or passive.pending) and not passive.closed:
            self.reactivate(agent)  # a message came while it passivated
        return True

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
