"""AgentActor: one agent's inbox, status and its single serialized evaluation.

The agent's ``run`` task is its only evaluator: it claims one turn at a time at a turn
boundary, so two turns of one agent can never overlap, whatever the load. The driver's
turn loop (``TurnLoop``) runs *inside* that task and asks the agent for each step.

Cancellation: ``run`` lives in the supervisor's nursery under the agent's own cancel
scope; each turn has a nested scope that ``cancel()`` cancels. Disposing cancels the
outer scope, which ends the turn (``aborted``) and everything the turn started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import structlog
import trio

from runtime._cancellation import is_cancellation
from runtime._errors import AgentClosedError, LoopdockError
from runtime._events import Event
from runtime._messages import Message, ProducerSource, is_human, user_message
from runtime._serde import message_from_wire, message_to_wire
from runtime._waterfall import Waterfall
from runtime.models import ModelRequest, RetryNotice
from runtime.tools import AgentTools

from ._inbox import Entry, Inbox, Placement, Reservation
from ._session import SessionActor

if TYPE_CHECKING:
    from runtime._options import AgentOptions

    from ._supervisor import Supervisor

Status = Literal["idle", "running"]

log = structlog.get_logger(__name__)


class InvalidReservationError(LoopdockError):
    """Raised when reserving a message whose source is missing or human (humans just send)."""

    code = "INVALID_RESERVATION"


@attrs.frozen
class PreStep:
    """What ``agent/pre-step`` listeners see: the messages about to enter a model step."""

    agent_id: str
    session_id: str
    turn: int
    step: int
    messages: tuple[Message, ...]


@attrs.frozen
class Enter:
    kind: Literal["enter"] = "enter"


@attrs.frozen
class Reject:
    reason: str = "rejected"
    kind: Literal["reject"] = "reject"


Verdict = Enter | Reject
ENTER = Enter()


async def _enter(_: PreStep) -> Verdict:
    return ENTER


async def _as_is(request: ModelRequest) -> ModelRequest:
    return request


class TurnBlocked(Exception):
    """A pre-step listener rejected the step's messages: the turn ends ``blocked``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TurnLoop(Protocol):
    """A driver's turn body. Returns the turn's end reason (``completed``, ``max-tokens``...)."""

    async def run_turn(self, turn: Turn) -> str: ...


def fold_transcript(events: Sequence[Event]) -> list[Message]:
    """The model-visible conversation, rebuilt from a session's events."""
    transcript = []
    for event in events:
        if event.type in ("user/message", "assistant/message", "tool/result"):
            transcript.append(message_from_wire(event.data))
    return transcript


class AgentActor:
    def __init__(
        self,
        owner: Supervisor,
        session: SessionActor,
        options: AgentOptions,
        loop: TurnLoop,
    ) -> None:
        self.id = session.id  # agent id == session id
        self.session = session
        self.options = options
        self.owner = owner
        self.loop = loop
        self.tools = AgentTools(owner.tools, options.tools)
        self.pre_step: Waterfall[PreStep, Verdict] = Waterfall("agent/pre-step")
        self.request: Waterfall[ModelRequest, ModelRequest] = Waterfall("agent/request")
        self.prompt_sections: dict[str, str] = {}
        self.transcript = fold_transcript(session.events)
        self.turns = sum(1 for e in session.events if e.type == "turn/start")
        self.log = log.bind(agent_id=self.id, session_id=self.id)
        self._inbox = Inbox()
        self._status: Status = "idle"
        self._wake = trio.Event()
        self._changed = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._turn_scope: trio.CancelScope | None = None
        self._cancel_cause: str | None = None
        self._stopped = trio.Event()
        self._closed = False
        self._scoped: list[Callable[[], None]] = []  # undone on rollback and dispose
        self._companions: trio.Nursery | None = None
        self.status_version = 0  # counts status changes, for observers that must not miss one

    # -- public ----------------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self._status

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def cwd(self) -> Path:
        return Path(self.options.cwd or self.session.header.cwd)

    @property
    def inbox_size(self) -> int:
        return len(self._inbox)

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

    def withdraw(self, reservation: Reservation, reason: str = "withdrawn") -> bool:
        """Cancel a reservation that has not been admitted; True if it was still queued."""
        for entry in self._inbox.entries():
            if entry.reservation is reservation:
                self._inbox.remove(entry)
                self._discarded(entry, reason)
                self._notify()
                return True
        return False

    def withdraw_reservations(self, reason: str = "withdrawn") -> int:
        """Withdraw every queued, unadmitted reservation (e.g. before a command runs);
        returns how many were withdrawn. Each one settles ``cancelled`` with ``reason``."""
        withdrawn = self._inbox.remove_reserved()  # one pass: there may be thousands
        for entry in withdrawn:
            self._discarded(entry, reason)
        if withdrawn:
            self._notify()
        return len(withdrawn)

    async def wait_stopped(self) -> None:
        """Wait until the agent's task has ended (it was disposed or its runtime closed)."""
        await self._stopped.wait()

    def cancel(self, cause: str = "cancelled", *, keep_inbox: bool = True) -> None:
        """End the current turn ``aborted``; with ``keep_inbox=False`` drop queued messages too."""
        if self._turn_scope is not None:
            self._cancel_cause = cause
            self._turn_scope.cancel()
        if not keep_inbox:
            for entry in self._inbox.clear():
                self._discarded(entry, cause)
        self._notify()

    async def wait_idle(self) -> None:
        """Wait until the agent is idle with nothing queued that would wake it (or it is
        disposed). Always a checkpoint, as trio's conventions ask."""
        await trio.lowlevel.checkpoint()
        while not self._quiescent():
            await self._changed.wait()

    def has_pending_human_input(self) -> bool:
        return self._inbox.has_human()

    # -- lifecycle (the supervisor's side) -----------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as self._companions:
                    task_status.started()
                    while True:
                        if not self._inbox.has_wakeable():
                            self._set_status("idle")
                            self._wake = trio.Event()
                            await self._wake.wait()
                            continue
                        await self._run_turn()
        finally:
            self._set_status("idle")
            self._stopped.set()

    async def start_companion(self, actor: Callable[..., Any], *args: Any) -> None:
        """Start an actor that lives exactly as long as this agent (``nursery.start``
        semantics: returns once it called ``task_status.started()``)."""
        if self._companions is None:
            raise AgentClosedError(f"agent {self.id} is not running")
        await self._companions.start(actor, *args)

    async def wait_status_change(self, since: int) -> None:
        """Wait until the status changed after version ``since`` (see ``status_version``),
        or the agent is disposed. Always a checkpoint."""
        await trio.lowlevel.checkpoint()
        while self.status_version <= since and not self._closed:
            await self._changed.wait()

    async def stop(self, cause: str = "disposed") -> None:
        """Cancel everything the agent owns and wait for its task to end."""
        self._closed = True
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
        if self._closed:
            raise AgentClosedError(f"agent {self.id} is disposed")
        if isinstance(message, str):
            message = user_message(message)
        entry = Entry(message, placement, reservation)
        for displaced in self._inbox.add(entry):
            self._discarded(displaced, "human-input")
        self._splice("insert", entry)
        self._live("agent/inbox/inserted", messageId=message.id, placement=placement)
        if placement != "inject":
            self._wake.set()
        self._notify()
        return message

    def _splice(self, op: str, entry: Entry, reason: str | None = None) -> None:
        data: dict[str, Any] = {
            "op": op,
            "list": "nextTurn" if entry.placement == "followup" else "nextStep",
            "placement": entry.placement,
            "messageId": entry.message.id,
        }
        if reason is not None:
            data["reason"] = reason
        if not self.session._closed:
            self.session.append("agent/inbox/spliced", data)

    def _discarded(self, entry: Entry, reason: str) -> None:
        if entry.reservation is not None:
            entry.reservation._settle("cancelled", reason)
        self._splice("discard", entry, reason)
        self._live("agent/inbox/discarded", messageId=entry.message.id, reason=reason)

    def _live(self, event_type: str, **data: Any) -> None:
        if self.owner.live.subscriber_count:  # nobody listening: nothing to build
            self.owner.announce(event_type, self.id, data)

    def _set_status(self, status: Status) -> None:
        if status != self._status:
            self._status = status
            self.status_version += 1
            self._live("agent/status", status=status)
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _quiescent(self) -> bool:
        return self._closed or (self._status == "idle" and not self._inbox.has_wakeable())

    async def _run_turn(self) -> None:
        first = self._inbox.take_turn()
        self.turns += 1
        turn = Turn(self, self.turns, [first] if first else [])
        self._set_status("running")
        self.session.append("turn/start", {"turn": turn.number})
        reason: dict[str, Any]
        self._cancel_cause = None
        try:
            with trio.CancelScope() as self._turn_scope:
                reason = {"kind": await self.loop.run_turn(turn)}
            if self._turn_scope.cancelled_caught:
                reason = {"kind": "aborted", "cause": self._cancel_cause or "cancelled"}
        except TurnBlocked as blocked:
            reason = {"kind": "blocked", "reason": blocked.reason}
        except Exception as exc:
            self.log.warning("turn failed", turn=turn.number, error=repr(exc))
            reason = {"kind": "error", "message": _safe_error(exc)}
        except BaseException as exc:
            if is_cancellation(exc):  # the agent itself is going away: the turn still ends
                self._end_turn(turn, {"kind": "aborted", "cause": self._cancel_cause or "cancelled"})
            raise
        finally:
            self._turn_scope = None
        self._end_turn(turn, reason)

    def _end_turn(self, turn: Turn, reason: dict[str, Any]) -> None:
        turn.settle_unadmitted(reason.get("cause") or reason["kind"])
        self.session.append("turn/end", {"turn": turn.number, "reason": reason})


def _safe_error(exc: BaseException) -> str:
    """A short error text for the log: the type, and the message if it is one of ours."""
    if isinstance(exc, LoopdockError):
        return f"{exc.code}: {exc}"[:500]
    return type(exc).__name__


class Turn:
    """One turn of one agent, as its TurnLoop sees it."""

    def __init__(self, agent: AgentActor, number: int, first: list[Entry]) -> None:
        self.agent = agent
        self.number = number
        self.step = 0
        self._entries = first  # claimed but not yet through pre-step

    @property
    def session(self) -> SessionActor:
        return self.agent.session

    def log(self, event_type: str, data: Mapping[str, Any]) -> Event:
        return self.agent.session.append(event_type, data)

    def has_step_input(self) -> bool:
        """True when messages wait for the next step (steer/inject): the turn goes on."""
        return self.agent._inbox.has_step_input()

    async def begin_step(self) -> tuple[Message, ...]:
        """Claim the step's inbox messages, run ``agent/pre-step``, then open the step.

        Each admitted message is passed through the owner's expanders (``/name`` skill
        invocations, ...) and what they return is recorded; returns the recorded messages.
        Raises TurnBlocked when a listener rejects (the claimed messages are consumed).
        """
        agent = self.agent
        entries = self._entries + agent._inbox.take_step()
        self._entries = entries
        for entry in entries:
            agent._splice("claim", entry)
            agent._live("agent/inbox/claimed", messageId=entry.message.id)
        messages = tuple(e.message for e in entries)
        pre = PreStep(agent.id, agent.id, self.number, self.step + 1, messages)
        try:
            verdict = await agent.pre_step.run(pre, _enter)
        except Exception as exc:  # a broken gate fails closed
            agent.log.warning("pre-step listener failed", error=repr(exc))
            verdict = Reject("pre-step listener failed")
        if isinstance(verdict, Reject):
            self._settle(entries, "rejected", verdict.reason)
            self._entries = []
            raise TurnBlocked(verdict.reason)
        self._settle(entries, "admitted", None)
        self._entries = []
        self.step += 1
        self.log("step/start", {"turn": self.number, "step": self.step})
        # Expanded only after admission: listeners judge what the person sent, and a
        # vetoed message must not leave an injected skill body behind.
        recorded = tuple(m for message in messages for m in agent.owner.expand(message))
        for message in recorded:
            self.record("user/message", message)
        return recorded

    def end_step(self) -> None:
        self.log("step/end", {"turn": self.number, "step": self.step})

    def record(self, event_type: str, message: Message) -> Event:
        """Log a message event and add the message to the model-visible transcript."""
        self.agent.transcript.append(message)
        return self.log(event_type, message_to_wire(message))

    def model_request(self) -> ModelRequest:
        agent, options = self.agent, self.agent.options

        async def on_retry(notice: RetryNotice) -> None:
            self.log(
                "llm/retry",
                {"turn": self.number, "attempt": notice.attempt, "delay": notice.delay, "error": notice.error},
            )

        system = "\n\n".join(
            part for part in [options.system_prompt, *agent.prompt_sections.values()] if part
        )
        return ModelRequest(
            provider=options.provider,
            model=options.model,
            system=system,
            messages=tuple(agent.transcript),
            tools=agent.tools.specs(),
            max_tokens=options.max_tokens,
            reasoning_effort=options.reasoning_effort,
            on_retry=on_retry,
        )

    def settle_unadmitted(self, reason: str) -> None:
        self._settle(self._entries, "cancelled", reason)
        self._entries = []

    @staticmethod
    def _settle(entries: list[Entry], state: Any, reason: str | None) -> None:
        for entry in entries:
            if entry.reservation is not None:
                entry.reservation._settle(state, reason)
