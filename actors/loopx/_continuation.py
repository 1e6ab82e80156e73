"""The LoopX continuation: one actor per agent that keeps a bound agent working under
LoopX quota, in the same session.

It is passive until this exact session invoked the ``loopx`` skill: before that it makes
no CLI call, arms no timer and queues nothing, however often the agent goes idle. After
activation, at every idle checkpoint (and at a scheduler wake-up) it runs **one**
evaluation -- never two at once: requests made while one runs are served by the next --
that

1. yields to anything queued, human input first, and to a running turn;
2. stays quiet while the session is *latched* (its last turn was cancelled, failed, ran out
   of tokens or was blocked, and no person acted since: see ``_history``);
3. resolves the session's binding in LoopX (missing, ambiguous or unhealthy: stop);
4. asks ``quota should-run`` with one turn id: a fresh one, or the one of an attempt that
   is still open (a turn LoopX admitted that never entered a model step is offered again
   under its own id; an answer that owes its settlement binding is asked again with the
   same id, so idle checkpoints write no new receipts while settlement is owed);
5. on a stopped goal does nothing, on a scheduler wait follows LoopX's scheduler hint
   (below) with its one timer, on an admitted turn fetches the thin task body for that
   turn and reserves exactly one followup with a ``loopx-continuation`` source;
6. when LoopX answers ``unsettled_host_turn_recovery``: resumes the prior turn under its
   own identity if its repair is ``resume_prior_turn`` and the turn never completed a
   model turn here (it was withdrawn, vetoed, cancelled or cut off by a restart); any
   other repair, or a turn the model finished without settling, needs a person: the
   status says so, and the GoalBar's Start gives the go-ahead to offer LoopX's recovery
   turn to the model once;
7. at ``agent/pre-step`` revalidates the exact reservation, competing human input and the
   binding, and replays should-run with the same turn id; otherwise it rejects the step.
   Its own veto does not latch it: the blocked turn's idle checkpoint evaluates again.

LoopX's scheduler hint (``runtime.loopx.SchedulerHint``, from ``quota should-run
--include-detail scheduler``) decides how a wait is polled. A should-run answer that
admits nothing keeps its turn id as the open attempt, so every poll of one wait replays
one receipt (LoopX decides afresh on a replay, and upgrades that receipt in place when it
admits the turn) instead of writing one per poll. The n-th poll in a row with the same
``reset_token`` (none yet: n = 0) waits the progression's n-th interval (its last one
past its end; the recommended interval without one), capped at LoopX's maximum and at
``MAX_WAIT`` (24 h), at least ``MIN_WAIT``. Once n reaches ``unchanged_poll_limit`` that
poll was LoopX's "final quota replan check": unchanged, the continuation stops polling
(``after_limit: stop_tick_loop``; ``continue`` or no limit keeps polling at the last
interval). A new reset token, an admitted turn, a person's message or Start counts from 0
again. A hint that says ``stop`` (a stopped or finished goal), or none, arms no timer.

Passivation (docs/lifecycle.md): an agent whose continuation has nothing in flight (no
evaluation wanted or running, no continuation queued, no hold) may be passivated, a
scheduler wait included. What only this process knows -- the unchanged-poll count, the
reset token, the open attempt, the latch and its own vetoes, the status, the timer's
deadline -- is kept in memory as a ``ContinuationMemo`` (``memo``); the runtime wakes the
agent when the timer is due (``actors._wakeups``) and the rebuilt continuation goes on from
the memo: the same poll, under the same turn id, at the same moment. Brought back earlier
without a turn (``activate()``, a command), it waits out the rest of the timer.

Containment: every failure -- a CLI call that fails, an answer that breaks LoopX's
contract, an exception -- ends only that evaluation. It is recorded in the session
(``actors.record_fault``), shown in the status (and so in the GoalBar) and retried at the
next natural checkpoint. The continuation keeps no durable state: what must survive a
restart is folded from the session log (``ContinuationHistory``), the rest is LoopX's.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs
import trio

from loopdock.runtime import (
    Changes,
    Event,
    EventsTrimmedError,
    Message,
    Next,
    ProducerSource,
    TextBlock,
    Waterfall,
    get_logger,
    is_human,
    safe_message,
)
from loopdock.runtime.loopx import Activation, LoopxClient, ShouldRun, TaskBody, ThreadBinding

from .._faults import record_fault
from .._inbox import Placement, Reservation
from .._pre_step import PreStep, Reject, Verdict
from .._session import SessionActor
from ._history import CONTINUATION_KIND, ContinuationHistory

log = get_logger(__name__)

CONTINUATION_SCHEMA = "loopx_dsh_continuation_v0"
#: The actor name a continuation's faults are recorded under.
FAULT_ACTOR = "loopx-continuation"
RETRY_ACTION = "retried at the next checkpoint"
#: The longest scheduler wait, whatever LoopX's hint says (a monitor's far window can
#: be days away): the continuation asks LoopX again at least once a day.
MAX_WAIT = 24 * 60 * 60.0
#: The shortest scheduler wait: a hint of zero minutes must not become a busy loop.
MIN_WAIT = 60.0
#: Put before the task body of a turn offered again after LoopX asked to recover it.
RESUME_NOTE = (
    "LoopX: this resumes an earlier turn that was never settled. Check what it already "
    "changed before redoing work, then settle it under its own turn id."
)
RECOVERY_NOTE = (
    "LoopX: a person asked you to carry out LoopX's recovery for this agent lane. Run the "
    "guard below and follow its recovery instructions exactly; record only verified outcomes."
)

State = Literal[
    "inactive",  # this session has not invoked the loopx skill
    "armed",  # evaluates at the next idle checkpoint
    "queued",  # a continuation is reserved, not yet in a model step
    "working",  # a continuation entered a model step
    "waiting",  # LoopX's scheduler asked to wait: one timer is armed
    "quiet",  # latched: a person's message or Start re-arms it
    "paused",  # the goal is stopped in LoopX, or a Pause is in progress
    "stopped",  # LoopX (or the binding) says there is nothing to continue
    "needs-person",  # LoopX needs a recovery that only a person may start
    "failed",  # the last evaluation failed; retried at the next checkpoint
]


@attrs.frozen
class ContinuationStatus:
    """What the continuation is doing and why, in safe fixed phrases (for the GoalBar)."""

    state: State
    reason: str | None = None
    turn_id: str | None = None


@attrs.frozen(slots=True)
class ContinuationMemo:
    """What a continuation knows beyond the session log, kept across its agent's
    passivation (see the module docstring). ``events``: how many of the session's
    events it had folded (``latch`` and ``own_vetoes`` are the fold's state right after
    them); ``started``: the turns started by then; ``wake_at``: its timer's deadline
    (trio's clock), None without one; ``cwd``: the agent's (its LoopX project)."""

    events: int
    latch: str | None
    own_vetoes: frozenset[int]
    started: int
    polls: int
    poll_token: str | None
    poll_people: int
    open_turn: tuple[str, str, str] | None
    wake_at: float | None
    status: ContinuationStatus
    stopped: str | None
    last_fault: str | None
    cwd: Path


class ContinuedHeader(Protocol):
    @property
    def forked_events(self) -> int | None:
        """How many events a fork copied from its parent (history not to inherit)."""


class ContinuedSession(Protocol):
    @property
    def header(self) -> ContinuedHeader: ...

    async def read_events(self, start: int) -> Sequence[Event]: ...

    def events_since(self, index: int) -> Sequence[Event]:
        """From memory; raises EventsTrimmedError for what is only in the store."""


class ContinuedAgent(Protocol):
    """The part of an agent the continuation uses: a runtime ``AgentActor``, or a bridge
    proxy that carries it out on a DSH agent."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> ContinuedSession: ...

    @property
    def pre_step(self) -> Waterfall[PreStep, Verdict]: ...

    @property
    def cwd(self) -> Path: ...

    @property
    def closed(self) -> bool: ...

    @property
    def status(self) -> str: ...

    @property
    def status_version(self) -> int: ...

    @property
    def inbox_size(self) -> int: ...

    def has_pending_human_input(self) -> bool: ...

    async def wait_quiescent(self) -> None:
        """Idle with nothing queued that wakes it (an observer's wait: raises nothing)."""

    async def wait_status_change(self, since: int) -> None: ...

    def reserve(self, message: Message, placement: Placement = "followup") -> Reservation: ...

    def withdraw(self, reservation: Reservation, reason: str = "withdrawn") -> bool: ...

    async def start_companion(
        self, actor: Callable[..., Awaitable[Any]], *args: Any, name: str = ...
    ) -> None: ...


Offer = Literal["turn", "resume", "recovery"]

# Pre-step vetoes of a step that is not this continuation's reservation as reserved: they
# latch the continuation (see ``LoopxContinuation._veto``).
NO_RESERVATION = "no reservation is pending"
NOT_THE_RESERVATION = "not this continuation's reservation"
WRONG_ATTRIBUTION = "attribution does not match the reservation"
NOT_THIS_AGENT = "not this exact agent and session"
_SUSPECT = frozenset({NO_RESERVATION, NOT_THE_RESERVATION, WRONG_ATTRIBUTION, NOT_THIS_AGENT})


@attrs.frozen
class Pending:
    """The one automatic reservation the continuation has out, and its exact identity.
    ``offer``: a newly admitted turn, an unsettled one resumed, or LoopX's recovery turn
    offered with a person's go-ahead (the only kind admitted without its own settlement
    identity)."""

    reservation: Reservation
    goal_id: str
    agent_id: str
    turn_id: str
    offer: Offer = "turn"


def new_turn_id() -> str:
    return f"ld-{uuid.uuid4().hex}"


def continuation_message(body: str, goal_id: str, agent_id: str, turn_id: str) -> Message:
    source = ProducerSource(
        CONTINUATION_KIND,
        {"schemaVersion": CONTINUATION_SCHEMA, "goalId": goal_id, "agentId": agent_id, "turnInstanceId": turn_id},
    )
    return Message("user", (TextBlock(body),), source)


class LoopxContinuation:
    """``clients()`` gives the LoopX client for this agent's project; it is asked at every
    evaluation, so a CLI repaired by ``/loopx-init`` is used from the next one on.
    ``on_change`` is called after every status change (the GoalBar's wake-up)."""

    def __init__(
        self,
        agent: ContinuedAgent,
        clients: Callable[[], LoopxClient],
        *,
        on_change: Callable[[], None] | None = None,
        memo: ContinuationMemo | None = None,
    ) -> None:
        self.agent = agent
        self.clients = clients
        self.history = ContinuationHistory()
        # Only this exact session's own history counts: a fork skips what it copied.
        self._folded = agent.session.header.forked_events or 0
        self.pending: Pending | None = None
        self.status = ContinuationStatus("inactive")
        self.stopped: str | None = None  # why the last evaluation stopped short of a followup
        self.timer: trio.CancelScope | None = None
        self.wake_at: float | None = None  # the timer's deadline (trio's clock)
        self.admitted: list[str] = []  # turn ids admitted into a model step
        self._on_change = on_change
        self._nursery: trio.Nursery | None = None
        self._requested = 0
        self._served = 0
        self._wanted = Changes()  # every request for an evaluation
        self._checked = Changes()  # one change per evaluation done
        self._evaluating: trio.CancelScope | None = None
        # (goal, agent, turn) of an attempt still open in LoopX: asked again by id
        self._open_turn: tuple[str, str, str] | None = None
        # LoopX's unchanged-poll count: polls in a row under this reset token, with this
        # many of a person's messages in the session (a new token or a message: from 0)
        self.polls = 0
        self._poll_token: str | None = None
        self._poll_people = 0
        self._holds = 0
        self._hold_reason = "paused"
        self._go_ahead = False  # a person's Start: offer LoopX's recovery turn once
        self._last_fault: str | None = None
        self._closed = False
        self._idle_seen = -1  # the agent's status version at the last idle checkpoint evaluated
        self._revoked: tuple[str, str] | None = None  # (message id, why) of a revoked reservation
        self.log = log.bind(agent_id=agent.id, session_id=agent.id)
        # Rebuilt after a passivation: what the log cannot say, from the memo.
        self._memo = memo
        self._restored_wake: float | None = None
        self._restored_started = -1
        if memo is not None:
            self.polls, self._poll_token, self._poll_people = memo.polls, memo.poll_token, memo.poll_people
            self._open_turn = memo.open_turn
            self.status, self.stopped, self._last_fault = memo.status, memo.stopped, memo.last_fault
            self._restored_wake = memo.wake_at
            self._restored_started = memo.started
            if memo.events <= self._folded:
                self._restore_fold()

    def memo(self) -> ContinuationMemo | None:
        """What passivating the agent now must keep (None: nothing, the log says it all:
        this session never invoked LoopX). Only asked while nothing is in flight
        (``keeps_active`` said None)."""
        if self._closed or not self.activation.active:
            return None
        history = self.history
        return ContinuationMemo(
            events=self._folded, latch=history.latch, own_vetoes=history.own_vetoes, started=history.started,
            polls=self.polls, poll_token=self._poll_token, poll_people=self._poll_people, open_turn=self._open_turn,
            wake_at=self.wake_at, status=self.status, stopped=self.stopped, last_fault=self._last_fault,
            cwd=self.agent.cwd,
        )

    def _restore_fold(self) -> None:
        memo = self._memo
        assert memo is not None
        self._memo = None
        self.history.restore(memo.latch, memo.own_vetoes)

    @property
    def activation(self) -> Activation:
        """Whether this exact session invoked the ``loopx`` skill, as its log says now
        (folded on reading: a skill call in a turn that is still running, or in the last
        turn of an agent its host disposed at once, counts before any idle checkpoint).
        Only what the session holds in memory is folded here; the evaluation reads the rest."""
        self._fold_from_memory()
        return self.history.activation

    # -- the actor ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        dispose = self.agent.pre_step.add(self._pre_step, prepend=True)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._fold()
                wake = self._restored_wake
                if wake is not None and trio.current_time() < wake:
                    self._arm_at(wake)  # the rest of the wait it was passivated in
                nursery.start_soon(self._evaluator)
                task_status.started()
                while not self.agent.closed:
                    await self.agent.wait_quiescent()
                    self._changed()  # the agent's status is shown with ours
                    seen = self.agent.status_version
                    await self.checkpoint()
                    self._idle_seen = seen
                    self._checked.notify()
                    await self.agent.wait_status_change(seen)
                    self._changed()
                nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            self._checked.notify()
            dispose()
            self._invalidate("continuation stopped")

    def keeps_active(self) -> str | None:
        """Why this continuation keeps its agent active (not passivated), or None: a
        queued continuation, an evaluation wanted or running, or a hold (a Pause). A
        scheduler wait does not: its timer is kept by the runtime (``memo``)."""
        if self._closed:
            return None
        if self.pending is not None:
            return "a LoopX continuation is queued"
        if self._evaluating is not None or self._requested > self._served:
            return "a LoopX evaluation is due"
        if self._holds:
            return "the LoopX continuation is held"
        return None

    @property
    def checkpoints(self) -> int:
        """Evaluations done so far (observers wait on it)."""
        return self._checked.version

    async def wait_checkpoint(self, after: int) -> None:
        """Wait until more than ``after`` evaluations have been done."""
        await self._checked.wait_until(lambda: self.checkpoints > after)

    async def wait_quiescent(self) -> None:
        """Wait until the agent is idle and this continuation has evaluated that very idle
        checkpoint (a continuation it queued has run, too). For observers and tests."""
        while not self._closed:
            await self.agent.wait_quiescent()
            version = self.agent.status_version
            await self._checked.wait_until(functools.partial(self._evaluated, version))
            if self.agent.status_version == version and self.agent.status == "idle":
                if self.pending is None:
                    return
                await self.agent.wait_status_change(version)  # the one it queued runs first

    def _evaluated(self, status_version: int) -> bool:
        """Whether the idle checkpoint of ``status_version`` was evaluated (or this closed)."""
        return self._idle_seen >= status_version or self._closed

    def request(self) -> int:
        """Ask for an evaluation; every request made before one starts is served by it."""
        self._requested += 1
        self._wanted.notify()
        return self._requested

    async def checkpoint(self) -> None:
        """Request an evaluation and wait until one that started after this call is done.
        Before activation an evaluation is pure bookkeeping."""
        if self._nursery is None or self._closed:
            return  # not running (yet, or any more): nothing evaluates
        target = self.request()
        await self._checked.wait_until(lambda: self._served >= target or self._closed)

    async def _evaluator(self) -> None:
        while True:
            await self._wanted.wait_until(lambda: self._requested > self._served)
            target = self._requested
            scope = self._evaluating = trio.CancelScope()
            with scope:
                try:
                    await self._evaluate()
                except Exception as exc:  # contained: only this evaluation ends
                    self.log.warning("loopx continuation evaluation failed", error=repr(exc))
                    self._failed(f"the evaluation failed: {safe_message(exc)}")
            if scope.cancelled_caught:
                self.log.info("loopx continuation evaluation cancelled", reason=self._hold_reason)
            self._evaluating = None
            self._served = target
            self._checked.notify()

    def _fold_from_memory(self) -> None:
        try:
            events = self.agent.session.events_since(self._folded)
        except EventsTrimmedError:  # behind a trim: the next evaluation's fold reads the store
            return
        self._feed(events)

    async def _fold(self) -> None:
        start = self._folded
        # No checkpoint while the events are in memory; a store read (the agent ran turns
        # past a trim since the last fold) may let another fold run: feed only what it did not.
        events = await self.agent.session.read_events(start)
        self._feed(events[self._folded - start :])

    def _feed(self, events: Sequence[Event]) -> None:
        for event in events:
            self.history.feed(event)
            self._folded += 1
            if self._memo is not None and self._folded >= self._memo.events:
                self._restore_fold()  # where the passivated continuation had folded to

    # -- the person's controls (the GoalBar) --------------------------------------------

    async def start(self) -> ContinuationStatus:
        """A person's Start: re-arm a latched continuation, give the go-ahead for LoopX's
        recovery turn, skip a scheduler wait, and evaluate now. Returns the status after."""
        await self._fold()
        self.history.rearm()
        self.polls = 0
        self._go_ahead = True
        self._cancel_timer()
        try:
            await self.checkpoint()
        finally:
            self._go_ahead = False
        return self.status

    @asynccontextmanager
    async def hold(self, reason: str = "a Pause is in progress") -> AsyncIterator[None]:
        """Nothing continues while held: the queued continuation is withdrawn, the timer
        disarmed, a running evaluation cancelled (and waited for), later evaluations do
        nothing and a continuation that still reaches pre-step is rejected."""
        self._holds += 1
        self._hold_reason = reason
        try:
            self._invalidate(reason)
            if self._evaluating is not None:
                self._evaluating.cancel()
            await self._checked.wait_until(lambda: self._evaluating is None)
            self._set("paused", reason)
            yield
        finally:
            self._holds -= 1

    def paused(self, reason: str) -> None:
        """The goal was paused (verified in LoopX): say so until the next evaluation."""
        self._set("paused", reason)

    # -- one evaluation -------------------------------------------------------------------

    async def _evaluate(self) -> None:
        await self._fold()
        agent = self.agent
        if not self.history.activation.active:
            return self._set("inactive")
        if self.status.state == "inactive":
            self._set("armed")
        if self.pending is not None and self.pending.reservation.state != "pending":
            self._settled(self.pending)
        if self.pending is not None or agent.closed:
            return
        if self._holds:
            return self._set("paused", self._hold_reason)
        if agent.status != "idle" or agent.has_pending_human_input() or agent.inbox_size:
            return  # anything queued goes first; we come back at the next idle
        wake, self._restored_wake = self._restored_wake, None
        if wake is not None and self.timer is not None and trio.current_time() < wake and self._memo_started():
            return  # brought back before its wait ended, and no turn ran since: wait on
        if self.history.latch is not None:
            self._cancel_timer()
            return self._set("quiet", f"{self.history.latch}; a person's message or Start re-arms it")
        self._cancel_timer()
        client = self.clients()
        binding = await client.resolve_thread(agent.id)
        if not isinstance(binding, ThreadBinding):
            return self._failed(f"binding unavailable: {_why(binding)}")
        if binding.status != "bound":
            self._open_turn = None
            return self._stop("stopped", f"binding {binding.status}")
        goal_id, agent_id = binding.goal_id, binding.agent_id
        assert goal_id is not None and agent_id is not None
        turn_id = self._turn_for(goal_id, agent_id)
        decision = await client.should_run(goal_id, agent_id, turn_id)
        if not isinstance(decision, ShouldRun):
            return self._failed(f"should-run failed: {_why(decision)}")
        # An answer that owes its settlement binding, or that admitted nothing (a wait, a
        # stop), is asked again with the same id: one receipt, replayed (or upgraded).
        open_ = decision.settlement_owed or not decision.should_run
        self._open_turn = (goal_id, agent_id, turn_id) if open_ else None
        self._last_fault = None
        if decision.goal_stopped:
            self.polls = 0
            return self._stop("paused", "the goal is paused in LoopX")
        if not decision.should_run:
            return self._wait(decision)
        self.polls = 0
        if decision.settlement_owed:
            return await self._recover(client, goal_id, agent_id, decision)
        await self._offer(client, goal_id, agent_id, turn_id, "turn")

    def _wait(self, decision: ShouldRun) -> None:
        """LoopX admitted nothing: poll again as its scheduler hint says, or stop."""
        hint = decision.scheduler
        if hint is None or hint.stops or hint.interval_after(0) is None:
            self.polls = 0
            return self._stop("stopped", f"should-run: {decision.decision}")
        people = self.history.people
        unchanged = hint.reset_token == self._poll_token and people == self._poll_people and self.polls > 0
        polls = self.polls if unchanged else 0
        self._poll_token, self._poll_people = hint.reset_token, people
        limit = hint.unchanged_poll_limit
        if limit is not None and polls >= limit and hint.after_limit != "continue":
            self.polls = polls
            return self._stop(
                "stopped",
                f"LoopX's scheduler: unchanged after {polls} polls ({decision.decision}); "
                "a person's message or Start asks again",
            )
        minutes = hint.interval_after(polls)
        assert minutes is not None
        self.polls = polls + 1
        of = f" of {limit}" if limit is not None else ""
        self._arm_timer(min(max(minutes * 60.0, MIN_WAIT), MAX_WAIT), f"unchanged poll {self.polls}{of}")

    def _memo_started(self) -> bool:
        """No turn started since the agent was passivated with its wait."""
        return self._restored_started == self.history.started

    def _turn_for(self, goal_id: str, agent_id: str) -> str:
        if self._open_turn is not None and self._open_turn[:2] == (goal_id, agent_id):
            return self._open_turn[2]
        return new_turn_id()

    async def _recover(self, client: LoopxClient, goal_id: str, agent_id: str, decision: ShouldRun) -> None:
        """LoopX admitted a turn without a settlement identity: an earlier turn of this
        lane is unsettled (``unsettled_host_turn_recovery``), or no task is bound yet."""
        recovery = decision.recovery
        prior = recovery.prior_turn_id if recovery is not None else None
        if (
            recovery is not None
            and recovery.repair == "resume_prior_turn"
            and prior is not None
            and not self.history.completed(prior)
        ):
            replay = await client.should_run(goal_id, agent_id, prior)
            if not isinstance(replay, ShouldRun):
                return self._failed(f"should-run replay of the unsettled turn failed: {_why(replay)}")
            if replay.should_run and not replay.settlement_owed and not replay.goal_stopped:
                return await self._offer(client, goal_id, agent_id, prior, "resume")
        if self._go_ahead:
            self._go_ahead = False
            return await self._offer(client, goal_id, agent_id, decision.turn_id, "recovery")
        if recovery is None:
            why = f"LoopX admitted a turn with no task bound to it ({decision.decision}); Start lets the agent plan it"
        elif prior is not None and self.history.completed(prior):
            why = f"turn {prior} ended without being settled; Start asks the agent to carry out LoopX's recovery"
        else:
            why = f"LoopX needs an earlier turn recovered ({recovery.repair or 'unknown repair'}); Start asks the agent to do it"
        self._stop("needs-person", why, turn_id=prior or decision.turn_id)

    async def _offer(self, client: LoopxClient, goal_id: str, agent_id: str, turn_id: str, offer: Offer) -> None:
        body = await client.heartbeat_prompt(goal_id, agent_id, turn_id)
        if not isinstance(body, TaskBody):
            return self._failed(f"no valid task body: {_why(body)}")
        agent = self.agent
        if self._holds or agent.closed or agent.has_pending_human_input() or agent.inbox_size or agent.status != "idle":
            self._open_turn = (goal_id, agent_id, turn_id)  # admitted in LoopX: offer it again
            if self._holds:
                return self._stop("paused", self._hold_reason)
            return self._stop("armed", "competing input arrived")
        text = _relative_to(body.text, client.project)
        if offer != "turn":
            text = f"{RESUME_NOTE if offer == 'resume' else RECOVERY_NOTE}\n\n{text}"
        reservation = agent.reserve(continuation_message(text, goal_id, agent_id, turn_id))
        self.polls = 0
        self.pending = Pending(reservation, goal_id, agent_id, turn_id, offer)
        self.stopped = None
        self._set("queued", None, turn_id)
        assert self._nursery is not None
        self._nursery.start_soon(self._settle, self.pending)

    async def _settle(self, pending: Pending) -> None:
        await pending.reservation.wait()
        self._settled(pending)

    def _settled(self, pending: Pending) -> None:
        """Take in how ``pending`` settled, once (its watcher, or an evaluation that runs
        before the watcher did)."""
        if self.pending is not pending:
            return
        self.pending = None
        state = pending.reservation.state
        if state == "admitted":
            self.admitted.append(pending.turn_id)
            if self._open_turn is not None and self._open_turn[2] == pending.turn_id:
                self._open_turn = None
            self._set("working", None, pending.turn_id)
            return
        # Admitted in LoopX but never worked on: the next evaluation offers it again
        # under its own id instead of minting a new receipt.
        self._open_turn = (pending.goal_id, pending.agent_id, pending.turn_id)
        self.log.info("continuation not admitted", state=state, reason=pending.reservation.reason)
        if self.status.state == "queued":
            self._set("armed", f"the last continuation was {state}", pending.turn_id)

    # -- outcomes -------------------------------------------------------------------------

    def _set(self, state: State, reason: str | None = None, turn_id: str | None = None) -> None:
        status = ContinuationStatus(state, reason, turn_id)
        if status != self.status:
            self.status = status
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _stop(self, state: State, reason: str, *, turn_id: str | None = None) -> None:
        self.stopped = reason
        self._set(state, reason, turn_id)
        self.log.info("continuation stopped", reason=reason)

    def _failed(self, reason: str) -> None:
        self._stop("failed", reason)
        if reason == self._last_fault:
            return  # recorded once until an evaluation gets further again
        self._last_fault = reason
        session = self.agent.session
        if isinstance(session, SessionActor):
            record_fault(session, FAULT_ACTOR, reason, action=RETRY_ACTION)
        else:  # a DSH session: its log is DSH's; the GoalBar and this log line show it
            self.log.warning("actor failed", actor=FAULT_ACTOR, error=reason, action=RETRY_ACTION)

    def _arm_timer(self, seconds: float, note: str) -> None:
        """The one scheduler timer: arming it disarms the previous one."""
        self._cancel_timer()
        self.stopped = f"waiting {seconds:.0f}s"
        self._set("waiting", f"LoopX's scheduler asked to wait {seconds:.0f}s ({note})")
        self._arm_at(trio.current_time() + seconds)

    def _arm_at(self, deadline: float) -> None:
        self._cancel_timer()
        assert self._nursery is not None
        scope = trio.CancelScope()
        self.timer, self.wake_at = scope, deadline

        async def wake_up() -> None:
            with scope:
                await trio.sleep_until(deadline)
                if self.timer is scope:
                    self.timer = self.wake_at = None
                self.request()

        self._nursery.start_soon(wake_up)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = self.wake_at = None

    def _invalidate(self, reason: str) -> None:
        """Disarm the timer and revoke the pending reservation: withdrawn if still queued,
        and if it was already claimed (on its way through pre-step) it may not enter
        either. Its turn is offered again later under its own id.

        A reservation that settled already (admitted into a model step, or refused) is
        taken in as it settled, whether or not its watcher has run yet: an admitted turn
        is being worked on and must never be offered again."""
        self._cancel_timer()
        pending = self.pending
        if pending is not None and pending.reservation.state != "pending":
            self._settled(pending)
            pending = None
        if pending is not None:
            self.pending = None
            self._revoked = (pending.reservation.message.id, reason)
            self._open_turn = (pending.goal_id, pending.agent_id, pending.turn_id)
            self.agent.withdraw(pending.reservation, reason)

    # -- the pre-step gate ---------------------------------------------------------------

    async def _pre_step(self, pre: PreStep, next_: Next[PreStep, Verdict]) -> Verdict:
        mine = [m for m in pre.messages if m.source is not None and m.source.kind == CONTINUATION_KIND]
        if not mine:
            return await next_(pre)
        reason = self._exact(pre, mine)
        pending = self.pending
        if reason is None and pending is not None:
            try:
                reason = await self._fresh(pending)
            except Exception as exc:  # contained: the step fails closed
                self.log.warning("loopx continuation revalidation failed", error=repr(exc))
                reason = f"revalidation failed: {safe_message(exc)}"
                self._failed(reason)
                return self._veto(pre, reason, again=False)
        if reason is not None:
            return self._veto(pre, reason)
        verdict = await next_(pre)
        # Other listeners ran in between: the cheap checks once more.
        reason = self._exact(pre, mine)
        if reason is not None and getattr(verdict, "kind", None) == "enter":
            return self._veto(pre, reason)
        return verdict

    def _veto(self, pre: PreStep, reason: str, *, again: bool = True) -> Reject:
        """Reject the step for ``reason``. The turn then ends ``blocked``, which would
        latch the continuation; when the veto is one of its own ordinary checks (the
        binding changed, LoopX no longer admits the turn, human input won, a Pause) it
        must not: the next idle checkpoint evaluates again (the seed's pre-step
        revalidation). A step that is not its reservation at all (a stranger's message of
        its kind, a wrong attribution, another agent or session), or a revalidation that
        raised, still latches it until a person acts: evaluating again would only meet
        the same fault, turn after turn."""
        if again and reason not in _SUSPECT:
            self.history.vetoed(pre.turn)
        return Reject(f"loopx continuation: {reason}")

    def _exact(self, pre: PreStep, mine: list[Message]) -> str | None:
        if self._revoked is not None and any(m.id == self._revoked[0] for m in mine):
            return self._revoked[1]
        pending = self.pending
        if pending is None:
            return NO_RESERVATION
        if self._holds:
            return self._hold_reason
        if len(mine) != 1 or mine[0].id != pending.reservation.message.id:
            return NOT_THE_RESERVATION
        source = mine[0].source
        fields = source.fields if isinstance(source, ProducerSource) else {}
        if (fields.get("goalId"), fields.get("agentId"), fields.get("turnInstanceId")) != (
            pending.goal_id,
            pending.agent_id,
            pending.turn_id,
        ):
            return WRONG_ATTRIBUTION
        if not (pre.agent_id == pre.session_id == self.agent.id):
            return NOT_THIS_AGENT
        if any(m.source is not None and is_human(m.source) for m in pre.messages):
            return "human input competes in this step"
        if self.agent.has_pending_human_input():
            return "human input is waiting"
        return None

    async def _fresh(self, pending: Pending) -> str | None:
        client = self.clients()
        binding = await client.resolve_thread(self.agent.id)
        if not isinstance(binding, ThreadBinding):
            return f"binding unavailable: {_why(binding)}"
        if binding.status != "bound" or (binding.goal_id, binding.agent_id) != (pending.goal_id, pending.agent_id):
            return f"binding changed ({binding.status})"
        replay = await client.should_run(pending.goal_id, pending.agent_id, pending.turn_id)
        if not isinstance(replay, ShouldRun):
            return f"should-run replay failed: {_why(replay)}"
        if replay.goal_stopped:
            return "the goal is paused"
        if not replay.should_run:
            return "quota no longer admits this turn"
        if replay.settlement_owed and pending.offer != "recovery":
            return "quota admits this turn without a settlement identity"
        return None


def _why(failure: Any) -> str:
    """A failure's safe reason (the client builds it from fixed phrases only)."""
    return getattr(failure, "reason", None) or getattr(failure, "error_kind", None) or type(failure).__name__


def _relative_to(text: str, project: Any) -> str:
    """LoopX writes the project's absolute path into its commands; the agent's shell runs
    in the project, so the relative form is the same command without a local path."""
    prefix = str(project).rstrip("/") + "/"
    return text.replace(prefix, "")
