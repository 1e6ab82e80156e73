"""AgentActor: one agent's inbox, status and its single serialized evaluation.

The agent's ``run`` task is its only evaluator: it claims one turn at a time at a turn
boundary, so two turns of one agent can never overlap, whatever the load. The driver's
turn body (``TurnBody``) runs *inside* that task and asks the agent for each step.

Cancellation: ``run`` lives in the supervisor's nursery under the agent's own cancel
scope; each turn has a nested scope that ``cancel()`` cancels. Disposing cancels the
outer scope, which ends the turn (``aborted``) and everything the turn started.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio

from loopdock.runtime import (
    AgentClosedError,
    AgentOptions,
    AgentReactivationError,
    Changes,
    Event,
    Message,
    ProducerSource,
    Transcript,
    TranscriptNotInMemoryError,
    Waterfall,
    get_logger,
    message_from_wire,
    safe_message,
    split_cancellation,
    user_message,
)
from loopdock.runtime.models import ModelRequest
from loopdock.runtime.tools import AgentTools

from ._admission import Slot
from ._approvals import Approval, Approvals
from ._contract import AgentReservation
from ._faults import record_fault
from ._history_cache import ITEM_BYTES
from ._inbox import Entry, Inbox, InvalidReservationError, Placement, Reservation
from ._owner import AgentOwner
from ._passive import Passive, PassiveSession, passivated
from ._pre_step import PreStep, Verdict
from ._session import SessionActor
from ._supervision import COMPANION_POLICY, Action, Policy, supervised
from ._turn import Turn, TurnBlocked, TurnBody

Status = Literal["idle", "running"]

log = get_logger(__name__)


#: The events a transcript is folded from.
MESSAGE_TYPES = frozenset({"user/message", "assistant/message", "tool/result"})


def fold_transcript(events: Sequence[Event]) -> list[Message]:
    """The model-visible conversation, rebuilt from a session's events."""
    transcript = []
    for event in events:
        if event.type in MESSAGE_TYPES:
            transcript.append(message_from_wire(event.data))
    return transcript


def _announce_approvals(owner: AgentOwner, agent_id: str, approval_id: str, change: str, open_: int) -> None:
    """Live ``agent/approvals``: a question was asked or closed (observers read what is
    open from ``pending_approvals()``). A function of the owner, not a method: the
    agent's approvals hold it, and an agent that held itself would wait for a collection."""
    if owner.live.subscriber_count:
        owner.announce("agent/approvals", agent_id, {"approvalId": approval_id, "change": change, "open": open_})


class AgentActor:
    """An agent of this process (``Runtime.create_agent``); it keeps the ``Agent``
    contract (actors._contract), and does everything at once: nothing it is sent is
    refused later.

    Idle long enough, it is passivated (docs/lifecycle.md): this same object stays, with
    only its id, its owner and a ``Passive`` record; a message sent to it brings it back
    through the resume path (``actors._lifecycle``), and is delivered, in order, once it
    runs again."""

    #: Set while passivated (and while passivating or reactivating): see ``actors._passive``.
    _passive: Passive | None = None
    #: How the dock resumes this agent when it is reactivated (its caller's options);
    #: None: it was not made through the dock, and is never passivated.
    reactivation: Any = None
    #: True when built by ``create_with_body``/``resume_with_body``, which can rebuild it
    #: in place: only then does the dock give it a ``reactivation`` recipe.
    revivable = False

    def __init__(
        self,
        owner: AgentOwner,
        session: SessionActor,
        options: AgentOptions,
        body: TurnBody,
    ) -> None:
        self.id = session.id  # agent id == session id
        self.session = session
        self.options = options
        self._cwd_of: AgentOptions | None = None  # the options self._cwd was built from
        self._cwd = Path()
        self.owner = owner
        self.body = body
        self.tools = AgentTools(owner.tools, options.tools)
        self.pre_step: Waterfall[PreStep, Verdict] = Waterfall("agent/pre-step")
        self.request: Waterfall[ModelRequest, ModelRequest] = Waterfall("agent/request")
        self.prompt_sections: dict[str, str] = {}
        # None while the history is only in the store (a resumed or evicted agent): read
        # back before the next turn, or by ``read_transcript``.
        self._transcript: Transcript | None = (
            Transcript(fold_transcript(session.events_since(0))) if session.event_count == session.in_memory else None
        )
        self.turns = session.turn_count
        self.log = log.bind(agent_id=self.id, session_id=self.id)
        self._inbox = Inbox()
        self._status: Status = "idle"
        self._wake = trio.Event()
        self._changes = Changes()  # every status or inbox change
        self._scope: trio.CancelScope | None = None
        # One cancel scope serves turn after turn until ``cancel`` uses it (see ``run``).
        self._turns_scope: trio.CancelScope | None = None
        self._in_turn = False
        self._cancel_cause: str | None = None
        self._stopped = trio.Event()
        self._closed = False
        self._scoped: list[Callable[[], None]] = []  # undone on rollback and dispose
        self._companions: trio.Nursery | None = None
        self._status_version = 0  # counts status changes, for observers that must not miss one
        self._holds = 0  # ``keep_active`` holds: never passivated while one is held
        self.approvals = Approvals(session, functools.partial(_announce_approvals, owner, self.id))
        self._stopping = False
        # A suspended turn (actors._step_resume) between the agent's start and its
        # running: ``cancel`` then ends it where it would have gone on.
        self._resuming = session.suspended_turn is not None
        self._cancel_resumed = False
        # The body can continue a turn from its last durable step (actors._step_resume):
        # its turns then mark each call's start (``tool/started``) before it runs.
        self._resumes_steps = bool(getattr(body, "resumes_steps", False))

    if not TYPE_CHECKING:  # hidden from the type check: it would type every unknown name

        def __getattr__(self, name: str) -> Any:
            # Reached only for what the instance does not hold: a passivated agent's.
            passive = self.__dict__.get("_passive")
            if passive is None or name.startswith("__"):
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            if name == "session":  # its readers work: they read the store
                return PassiveSession(self.id, self.owner.writer)
            raise passivated(self.id, name)

    # -- public ----------------------------------------------------------------------

    @property
    def status(self) -> Status:
        if self._passive is not None:
            return "idle"
        return self._status

    @property
    def status_version(self) -> int:
        """Counts status changes, for observers that must not miss one (passivating counts
        one: it wakes whoever waits for a change)."""
        passive = self._passive
        return self._status_version if passive is None else passive.status_version

    @property
    def closed(self) -> bool:
        passive = self._passive
        return self._closed if passive is None else passive.closed

    @property
    def passivated(self) -> bool:
        """True while the agent is passivated (from the moment it starts passivating until
        it runs again: messages sent meanwhile wait for it in arrival order)."""
        return self._passive is not None

    async def activate(self) -> None:
        """Bring a passivated agent back now (returns at once for an active one). Raises
        AgentReactivationError if that fails (messages sent to it stay queued, and the
        next message or call tries again), AgentClosedError if it was disposed."""
        passive = self._passive
        if passive is not None:
            if passive.closed:
                raise AgentClosedError(f"agent {self.id} is disposed")
            passive.error = None  # a fresh attempt
            passive.wanted = True
            self.owner.lifecycle.reactivate(self)
        while (passive := self._passive) is not None:
            if passive.closed:
                raise AgentClosedError(f"agent {self.id} is disposed")
            if not passive.transition and passive.error is not None:
                raise AgentReactivationError(
                    f"agent {self.id} could not be reactivated: {safe_message(passive.error)}"
                ) from passive.error
            await passive.changed()
        await trio.lowlevel.checkpoint()

    def carried(self, key: str) -> Any:
        """What a companion kept under ``key`` across the passivation this agent is being
        reactivated from (``Lifecycle.keepers``), for the companion's rebuilt self; None
        for an agent not coming back from one."""
        passive = self.__dict__.get("_passive")
        return None if passive is None or passive.kept is None else passive.kept.get(key)

    @contextlib.contextmanager
    def keep_active(self) -> Iterator[None]:
        """While held, the agent is not passivated (a command running against it, a
        caller reading its in-memory state across checkpoints). The agent must be active."""
        if self._passive is not None:
            raise passivated(self.id, "keep_active()")
        self._holds += 1
        try:
            yield
        finally:
            if self._passive is None:
                self._holds -= 1

    @property
    def cwd(self) -> Path:
        # Every tool call asks; built again only when a setup replaced the options.
        options = self.options
        if self._cwd_of is not options:
            self._cwd = Path(options.cwd or self.session.header.cwd)
            self._cwd_of = options
        return self._cwd

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def cancel_cause(self) -> str | None:
        return self._cancel_cause

    def pending_approvals(self) -> list[Approval]:
        """The approval questions open now, oldest first (``await a.answer(...)`` each).

        While a question is open its turn waits: ``cancel`` withdraws it and ends the
        turn; a person's followup waits for the turn's end, a steer for its next step.
        A passivated agent has none (an agent with an open question is not passivated)."""
        if self._passive is not None:
            return []
        return self.approvals.pending()

    async def wait_approvals(self) -> list[Approval]:
        """Wait until an approval question is open; the open ones, oldest first."""
        await self.activate()
        with self.keep_active():
            return await self.approvals.wait_pending()

    @property
    def inbox_size(self) -> int:
        passive = self._passive
        if passive is not None:
            return len(passive.pending or ())
        return len(self._inbox)

    @property
    def transcript(self) -> Transcript:
        """The model-visible conversation, as a turn sees it: always in memory while a turn
        runs (turn bodies, pre-step and request listeners). Between turns an idle agent's
        history may have been evicted to the store: then this raises
        TranscriptNotInMemoryError, and ``await read_transcript()`` reads it back."""
        if self._passive is not None:
            raise TranscriptNotInMemoryError(
                f"agent {self.id} is passivated: its history is in the store only; use await agent.read_transcript()"
            )
        if self._transcript is not None:
            return self._transcript
        if self.session.memory_start == 0:  # evicted, but the whole log is in memory (persist=False)
            return Transcript(fold_transcript(self.session.events_since(0)))
        raise TranscriptNotInMemoryError(
            f"agent {self.id}: its history is in the store only; use await agent.read_transcript()"
        )

    async def read_transcript(self) -> Transcript:
        """The model-visible conversation. An evicted history is read back from the store
        in a worker thread, for this call only: reading does not make the agent warm (nor
        a passivated one active)."""
        if self._passive is not None:
            return Transcript(await self.session.read_messages(MESSAGE_TYPES))
        if self._transcript is not None:
            return self._transcript
        return Transcript(await self.session.read_messages(MESSAGE_TYPES))

    def followup(self, message: str | Message) -> Message:
        """Queue for the next turn and wake the agent."""
        return self._queue(message, "followup")

    def steer(self, message: str | Message) -> Message:
        """Queue for the next step and wake the agent."""
        return self._queue(message, "steer")

    def inject(self, message: str | Message) -> Message:
        """Queue for the next step without waking an idle agent."""
        return self._queue(message, "inject")

    def reserve(self, message: Message, placement: Placement = "followup") -> Reservation:
        """Queue an automatic message and return its reservation.

        The reservation is admitted when the message enters a model step, and cancelled
        if human input arrives first. Only producer-owned sources may reserve.
        """
        if not isinstance(message.source, ProducerSource):
            raise InvalidReservationError(
                f"only producer-owned sources reserve; got {message.source!r}"
            )
        reservation = Reservation(message, placement)
        self._queue(message, placement, reservation)
        return reservation

    def withdraw(self, reservation: AgentReservation | str, reason: str = "withdrawn") -> bool:
        """Cancel a reservation that has not been admitted (given as itself, or as its
        message's id); True if it was still queued."""
        passive = self._passive
        if passive is not None:  # never logged as inserted: nothing to log
            for entry in passive.pending or ():
                if entry.reservation is not None and (
                    entry.reservation is reservation or entry.message.id == reservation
                ):
                    assert passive.pending is not None
                    passive.pending.remove(entry)
                    entry.reservation.settle("cancelled", reason)
                    passive.notify()
                    return True
            return False
        for entry in self._inbox.entries():
            if entry.reservation is None:
                continue
            if entry.reservation is reservation or entry.message.id == reservation:
                self._inbox.remove(entry)
                self._discarded(entry, reason)
                self._notify()
                return True
        return False

    def withdraw_reservations(self, reason: str = "withdrawn") -> int:
        """Withdraw every queued, unadmitted reservation (e.g. before a command runs);
        returns how many were withdrawn. Each one settles ``cancelled`` with ``reason``."""
        passive = self._passive
        if passive is not None:
            taken = [e for e in passive.pending or () if e.reservation is not None]
            for entry in taken:
                assert passive.pending is not None and entry.reservation is not None
                passive.pending.remove(entry)
                entry.reservation.settle("cancelled", reason)
            passive.notify()
            return len(taken)
        withdrawn = self._inbox.remove_reserved()  # one pass: there may be thousands
        for entry in withdrawn:
            self._discarded(entry, reason)
        if withdrawn:
            self._notify()
        return len(withdrawn)

    async def wait_stopped(self) -> None:
        """Wait until the agent's task has ended (it was disposed or its runtime closed;
        not when it is passivated: it is not gone)."""
        while True:
            passive = self._passive
            if passive is None:
                stopped = self._stopped
                await stopped.wait()
                if self._passive is None or self.closed:
                    return  # disposed; else it was passivated meanwhile: go on waiting
            elif passive.closed:
                await trio.lowlevel.checkpoint()
                return
            else:
                await passive.changed()

    def cancel(self, cause: str = "cancelled", *, keep_inbox: bool = True) -> None:
        """End the current turn ``aborted``; with ``keep_inbox=False`` drop queued messages too."""
        passive = self._passive
        if passive is not None:  # nothing runs; what waits for it was never logged
            if not keep_inbox:
                for entry in passive.take_pending():
                    if entry.reservation is not None:
                        entry.reservation.settle("cancelled", cause)
                passive.notify()
            return
        if self._in_turn and self._turns_scope is not None:
            self._cancel_cause = cause
            self._turns_scope.cancel()
        elif self._resuming:
            self._cancel_cause = cause
            self._cancel_resumed = True
        if not keep_inbox:
            for entry in self._inbox.clear():
                self._discarded(entry, cause)
        self._notify()

    async def wait_idle(self) -> None:
        """Wait until the agent is idle with nothing queued that would wake it (or it is
        disposed). Always a checkpoint, as trio's conventions ask. A passivated agent
        with nothing sent to it is idle; one being reactivated is waited for (a failed
        reactivation raises AgentReactivationError: the messages stay queued)."""
        await self._wait_passive_quiescent()

    async def wait_quiescent(self) -> None:
        """``wait_idle`` for an observer (a driver watching for idle checkpoints). The
        same here: nothing sent to an agent of this process is on its way or refused
        later, as it may be for a remote one (``DshAgent.wait_quiescent``)."""
        await self._wait_passive_quiescent()

    async def _wait_passive_quiescent(self) -> None:
        while True:
            passive = self._passive
            if passive is None:
                changes = self._changes
                await changes.wait_until(self._quiescent)
                if self._passive is None or self._quiet_passive():
                    return
                continue  # passivating since: wait on its record
            if passive.closed or (not passive.transition and not passive.pending):
                await trio.lowlevel.checkpoint()
                return
            if not passive.transition and passive.error is not None:
                raise AgentReactivationError(
                    f"agent {self.id} could not be reactivated: {safe_message(passive.error)}; "
                    f"its {len(passive.pending or ())} message(s) stay queued"
                ) from passive.error
            await passive.changed()

    def _quiet_passive(self) -> bool:
        passive = self._passive
        return passive is not None and (passive.closed or (not passive.transition and not passive.pending))

    def has_pending_human_input(self) -> bool:
        passive = self._passive
        if passive is not None:
            return passive.has_human()
        return self._inbox.has_human()

    # -- the running turn's side -------------------------------------------------------

    def claim_step(self, held: Sequence[Entry] = ()) -> list[Entry]:
        """Claim ``held`` (the message that opened the turn) and every message queued for
        the next step (human first): log the claims and return them."""
        entries = [*held, *self._inbox.take_step()]
        for entry in entries:
            self._splice("claim", entry)
            self._live("agent/inbox/claimed", messageId=entry.message.id)
        return entries

    def has_step_input(self) -> bool:
        """True when messages wait for the next step (steer/inject)."""
        return self._inbox.has_step_input()

    async def acquire_slot(self) -> Slot | None:
        """An admission slot for the running automatic turn to compute again (after it
        waited outside); None, at once, when a person's message is queued: the turn then
        goes on without one, since a person's message enters its next step."""
        gate = self.owner.admission
        slot = gate.try_acquire()
        if slot is not None or self._inbox.has_human():
            return slot
        waiter = gate.enqueue(self._notify)
        try:
            await self._changes.wait_until(lambda: waiter.slot is not None or self._inbox.has_human())
        except BaseException:
            gate.dequeue(waiter)
            raise
        if waiter.slot is None:  # a person came first: leave the queue
            gate.dequeue(waiter)
        return waiter.slot

    # -- the history cache's side ------------------------------------------------------

    def history_weight(self) -> int:
        items, chars = self.session.in_memory, 0
        if self._transcript is not None:
            items += len(self._transcript)
            chars = self._transcript.content_chars
        return items * ITEM_BYTES + chars

    def evict_history(self) -> None:
        """Drop the transcript and the session's durable events from memory."""
        self._transcript = None
        self.session.trim()

    # -- lifecycle (the supervisor's side) -----------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as self._companions:
                    task_status.started()
                    while True:
                        # Not a scope per turn: entering and leaving one was about 4% of
                        # a short turn's CPU. ``cancel`` cancels this one only while a
                        # turn runs, and ``_serve`` returns after such a turn, so each
                        # cancelled turn still has a scope of its own.
                        with trio.CancelScope() as self._turns_scope:
                            await self._serve(self._turns_scope)
        finally:
            self.owner.history.busy(self)
            self.owner.lifecycle.busy(self)
            self._set_status("idle")
            self._stopped.set()

    async def _serve(self, scope: trio.CancelScope) -> None:
        """Run turns until one is cancelled (its Cancelled ends this at ``scope``) or
        ``scope`` was cancelled during a turn that ended before it noticed."""
        if self.session.suspended_turn is not None:
            await self._resume_suspended()
        while not scope.cancel_called:
            if not self._inbox.has_wakeable():
                self._set_status("idle")
                self.owner.history.idle(self)
                self.owner.lifecycle.idle(self)
                self._wake = trio.Event()
                await self._wake.wait()
                self.owner.history.busy(self)
                self.owner.lifecycle.busy(self)
                continue
            if self.session.store_error is not None:
                # Nothing more of this session can be written: a turn would do work that
                # is never kept or seen. Retire (the supervisor records and announces why).
                raise self.session.store_error
            if self._transcript is None:  # outside any slot: this waits on the store
                await self._load_transcript()
            slot = None
            if not self._inbox.has_human():
                slot = await self._admit()
                if slot is None:  # a person's message came first, or nothing is left
                    continue
            await self._run_turn(slot)

    async def start_companion(
        self,
        actor: Callable[..., Awaitable[Any]],
        *args: Any,
        name: str = "companion",
        policy: Policy = COMPANION_POLICY,
    ) -> None:
        """Start an actor that lives exactly as long as this agent (``nursery.start``
        semantics: returns once it called ``task_status.started()``). Its failures are
        contained: each is recorded in the session as a fault of ``name``, and the actor is
        restarted or stopped as ``policy`` says; the agent goes on either way."""
        if self._companions is None:
            raise AgentClosedError(f"agent {self.id} is not running")

        def report(error: Exception, action: Action) -> None:
            record_fault(self.session, name, error, action=action)

        await self._companions.start(
            functools.partial(supervised, actor, *args, name=name, policy=policy, report=report)
        )

    async def wait_status_change(self, since: int) -> None:
        """Wait until the status changed after version ``since`` (see ``status_version``),
        or the agent is disposed. Always a checkpoint."""
        while True:
            passive = self._passive
            if passive is not None:
                if passive.status_version > since or passive.closed:
                    await trio.lowlevel.checkpoint()
                    return
                await passive.changed()
                continue
            changes = self._changes
            await changes.wait_until(lambda: self.status_version > since or self.closed)
            return

    async def stop(self, cause: str = "disposed") -> None:
        """Cancel everything the agent owns and wait for its task to end."""
        passive = self._passive
        if passive is not None:
            await self.owner.lifecycle.close_passive(self, cause)
            return
        self._closed = True
        self._stopping = True
        for entry in self._inbox.clear():
            self._discarded(entry, cause)
        self._cancel_cause = cause
        if self._scope is None:  # never started (rolled back before start)
            return
        self._scope.cancel()
        await self._stopped.wait()

    def add_scoped(self, disposer: Callable[[], None]) -> Callable[[], None]:
        """Remember a scoped registration's disposer; it runs on rollback or dispose."""
        self._scoped.append(disposer)
        return disposer

    def dispose_scoped(self) -> None:
        """Undo every scoped registration, newest first (idempotent)."""
        if "_scoped" not in self.__dict__:  # passivated: undone when it was
            return
        while self._scoped:
            try:
                self._scoped.pop()()
            except Exception as exc:  # one broken disposer must not keep the rest alive
                self.log.warning("scoped disposer failed", error=repr(exc))
        self.tools.dispose_scoped()

    # -- internals -------------------------------------------------------------------

    def _queue(
        self, message: str | Message, placement: Placement, reservation: Reservation | None = None
    ) -> Message:
        if self.closed:
            raise AgentClosedError(f"agent {self.id} is disposed")
        if isinstance(message, str):
            message = user_message(message)
        entry = Entry(message, placement, reservation)
        passive = self._passive
        if passive is not None:
            # Kept in arrival order and delivered (and logged) once the agent runs again:
            # whatever comes meanwhile, a person's message included, queues behind it.
            passive.queue(entry)
            self.owner.lifecycle.reactivate(self)
            passive.notify()
            return message
        self._enqueue(entry)
        return message

    def _enqueue(self, entry: Entry) -> None:
        message, placement = entry.message, entry.placement
        for displaced in self._inbox.add(entry):
            self._discarded(displaced, "human-input")
        self._splice("insert", entry)
        self._live("agent/inbox/inserted", messageId=message.id, placement=placement)
        if placement != "inject":
            self._wake.set()
        self._notify()

    # -- passivation (actors._lifecycle's side) ---------------------------------------

    def _passivable(self) -> str | None:
        """Why this agent cannot be passivated now, or None if it can."""
        if self.reactivation is None:
            return "not made through the dock"
        if self._closed or self._stopping or self._scope is None:
            return "not running"
        if self._status != "idle" or self._in_turn or self._resuming or self.session.suspended_turn is not None:
            return "busy"
        if len(self._inbox):
            return "messages queued"
        if self._holds:
            return "held active"
        if self.approvals.pending():
            return "an approval question is open"
        if self.session.subscriber_count:
            return "its session has subscribers"
        if self.session.store_error is not None:
            return "its store failed"
        return None

    def _begin_passivation(self) -> Passive:
        """From now on, messages wait in the record; the status counts one change."""
        self._status_version += 1
        passive = Passive(self.reactivation, self._status_version)
        passive.transition = True
        self._passive = passive
        self._notify()  # status observers wake, and find the record
        return passive

    async def _halt(self) -> None:
        """End the agent's task (and its companions) without disposing it."""
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()

    def _empty(self, passive: Passive) -> None:
        """Release everything but the id, the owner and ``passive``."""
        agent_id, owner = self.id, self.owner
        self.__dict__.clear()
        self.id, self.owner, self._passive = agent_id, owner, passive

    def _revive(self, owner: AgentOwner, session: SessionActor, options: AgentOptions, body: TurnBody) -> None:
        """Rebuild this passivated object in place, as a new agent would be built; the
        record stays (messages still wait in it) until ``_reactivated``."""
        passive = self._passive
        assert passive is not None
        AgentActor.__init__(self, owner, session, options, body)
        self._passive = passive
        self._status_version = passive.status_version
        self.reactivation = passive.recipe

    def _reactivated(self) -> None:
        """Running again: deliver what waited, in arrival order, as if it came now."""
        passive = self._passive
        assert passive is not None
        del self._passive
        self._status_version += 1
        for entry in passive.take_pending():
            self._enqueue(entry)
        self._notify()
        passive.transition = False
        passive.notify()

    def _splice(self, op: str, entry: Entry, reason: str | None = None) -> None:
        data: dict[str, Any] = {
            "op": op,
            "list": "nextTurn" if entry.placement == "followup" else "nextStep",
            "placement": entry.placement,
            "messageId": entry.message.id,
        }
        if reason is not None:
            data["reason"] = reason
        if not self.session.closed:
            self.session.append("agent/inbox/spliced", data)

    def _discarded(self, entry: Entry, reason: str) -> None:
        if entry.reservation is not None:
            entry.reservation.settle("cancelled", reason)
        self._splice("discard", entry, reason)
        self._live("agent/inbox/discarded", messageId=entry.message.id, reason=reason)

    def _live(self, event_type: str, **data: Any) -> None:
        if self.owner.live.subscriber_count:  # nobody listening: nothing to build
            self.owner.announce(event_type, self.id, data)

    def _set_status(self, status: Status) -> None:
        if status != self._status:
            self._status = status
            self._status_version += 1
            self._live("agent/status", status=status)
            self._notify()

    def _notify(self) -> None:
        self._changes.notify()

    def _quiescent(self) -> bool:
        if self._passive is not None:
            return True  # the waiter goes on with the record (``_wait_passive_quiescent``)
        # A suspended turn (actors._step_resume) runs before anything queued: not idle yet.
        return self._closed or (
            self._status == "idle" and not self._inbox.has_wakeable() and self.session.suspended_turn is None
        )

    def _automatic_next(self) -> bool:
        """The next turn would be automatic: something wakes the agent, nobody human."""
        return self._inbox.has_wakeable() and not self._inbox.has_human()

    async def _admit(self) -> Slot | None:
        """Wait for an admission slot for an automatic turn; None (and no slot) as soon
        as a person's message is queued or nothing is left to run."""
        gate = self.owner.admission
        slot = gate.try_acquire()
        if slot is not None:
            return slot
        waiter = gate.enqueue(self._notify)
        try:
            await self._changes.wait_until(lambda: waiter.slot is not None or not self._automatic_next())
        except BaseException:
            gate.dequeue(waiter)
            raise
        if waiter.slot is not None and self._automatic_next():
            return waiter.slot
        gate.dequeue(waiter)  # hands a slot granted meanwhile on
        return None

    async def _load_transcript(self) -> None:
        messages = await self.session.read_messages(MESSAGE_TYPES)
        if self._transcript is None:
            self._transcript = Transcript(messages)

    async def _run_turn(self, slot: Slot | None) -> None:
        first = self._inbox.take_turn()
        self.turns += 1
        turn = Turn(self, self.turns, [first] if first else [], slot)
        turn.marks_starts = self._resumes_steps
        tracing = self.owner.tracing
        if tracing is not None:  # off: this check is all tracing costs a turn
            options = self.options
            turn.span = tracing.start_turn(self.id, options.loop, options.driver, turn.number)
        try:
            await self._run_turn_in(turn)
        finally:
            turn.release_slot()

    async def _resume_suspended(self) -> None:
        """Continue the turn a stop left open (actors._step_resume), or, if this driver's
        body cannot (the log then has a question open in it), close it ``interrupted``
        and withdraw its questions."""
        self._set_status("running")  # first: ``wait_idle`` must not see an idle gap
        suspended, self.session.suspended_turn = self.session.suspended_turn, None
        assert suspended is not None
        try:
            point = suspended.point if self._resumes_steps else None
            if point is not None and self._transcript is None:
                await self._load_transcript()
        finally:
            self._resuming = False
        if point is None or self._cancel_resumed:
            cause = (self._cancel_cause or "cancelled") if self._cancel_resumed else "interrupted"
            for approval in self.approvals.pending():
                if approval.turn == suspended.number:
                    self.approvals.withdraw(approval.id, cause)
            reason = {"kind": "aborted", "cause": cause} if self._cancel_resumed else {"kind": "interrupted"}
            self.session.append("turn/end", {"turn": suspended.number, "reason": reason})
            return
        # It runs before anything queued, without an admission slot, as a person's turn.
        turn = Turn(self, suspended.number, [])
        turn.step = point.step
        turn.resumed = point
        turn.marks_starts = True
        self.log.info("turn resumed", turn=turn.number, step=turn.step, calls=len(point.calls), asks_again=not point.answered)
        await self._run_turn_in(turn, resumed=True)

    async def _run_turn_in(self, turn: Turn, *, resumed: bool = False) -> None:
        self._set_status("running")
        # What is durable is in the store: keep the heap flat. (Observers that fold the
        # log, such as the LoopX continuation, read what they missed from the store.)
        self.session.trim()
        if not resumed:  # a resumed turn's ``turn/start`` is in the log already
            self.session.append("turn/start", {"turn": turn.number})
        reason: dict[str, Any]
        self._cancel_cause = None
        self._in_turn = True
        try:
            reason = {"kind": await self.body.run_turn(turn)}
        except TurnBlocked as blocked:
            reason = {"kind": "blocked", "reason": blocked.reason}
            if blocked.message_ids:  # a step with no new message (a turn's later step) names none
                reason["messageIds"] = blocked.message_ids
        except Exception as exc:
            self.log.warning("turn failed", turn=turn.number, error=repr(exc))
            reason = {"kind": "error", "message": safe_message(exc)}
        except BaseException as exc:
            # Cancelled by ``cancel`` (``run`` catches it) or with the agent: the turn ends.
            cancelled, failed = split_cancellation(exc)
            try:
                if cancelled is None:  # KeyboardInterrupt and the like
                    raise
                if self._stopping and self.approvals.pending():
                    # Stopped while a person's answer is awaited: the turn stays open in
                    # the log, as after a crash, so that the resumed agent continues it.
                    turn.settle_unadmitted(self._cancel_cause or "cancelled")
                else:
                    self._end_turn(turn, {"kind": "aborted", "cause": self._cancel_cause or "cancelled"})
                if failed is None:
                    raise
                # Something failed as the turn was cancelled: it must not end the agent too.
                self.log.warning("turn failed as it was cancelled", turn=turn.number, error=repr(failed))
                raise cancelled from failed
            finally:
                del cancelled, failed  # the traceback holds this frame: no cycle through it
        finally:
            self._in_turn = False
            turn.release_slot()
        self._end_turn(turn, reason)

    def _end_turn(self, turn: Turn, reason: dict[str, Any]) -> None:
        turn.settle_unadmitted(reason.get("cause") or reason["kind"])
        self.session.append("turn/end", {"turn": turn.number, "reason": reason})
        if turn.span is not None:
            tracing = self.owner.tracing
            assert tracing is not None  # the span came from it
            tracing.end_turn(turn.span, reason)


