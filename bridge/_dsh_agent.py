"""A proxy actor for each live DSH agent, so runtime drivers run against DSH agents unchanged.

``DshAgent`` keeps the ``Agent`` contract (``loopdock.Agent``) and the part of
``actors.AgentActor`` a driver uses (the LoopX continuation driver in particular), and
carries them out on the real agent over the bridge:

- ``id``, ``cwd``, ``session`` (``events_since``, ``header.forked_events``): the session
  events the host mirrored into ``HostHandler.sessions``;
- ``status``, ``status_version``, ``wait_quiescent``, ``wait_status_change``, ``closed``:
  the host's ``agent/status`` and ``agent/disposed``;
- ``has_pending_human_input``, ``inbox_size``: the host's live inbox (plus reservations
  sent and not yet settled). On DSH every input a person *or a plugin* writes into the
  inbox (any kind but an owned one and DSH's own context, ``DSH_CONTEXT_KINDS``) ranks as
  a person's: an automatic message yields to it, as it yields to a person's on the
  runtime's own agents;
- ``followup``, ``steer``, ``inject``: an ordinary message (a ``str`` is a person's) sent
  with the host's ``followup`` command at that placement, no reservation (e.g. the
  ``/loopx-init`` start and result messages). A message the host refuses (it answers an
  error, or no host is connected) is recorded: the proxy's next ``wait_idle`` raises
  MessageRefusedError. ``wait_idle`` also waits for every command still unanswered;
- ``cancel``: the host's ``cancel`` command, with its cause (a refusal is logged); what
  it kept in the inbox goes on once the cancelled turn has ended (DSH would leave it
  stalled until a wake, as after a reject);
- ``reserve``: a ``followup`` command with the message's producer-owned source. At DSH's
  ``agent/pre-step`` the proxy answers the host's verdict request with its own
  ``pre_step`` waterfall: a reject settles it ``rejected``; after an enter the rest of
  DSH's waterfall still decides (the plugin checks what it answers and fails closed), so
  the reservation settles by DSH's log: ``admitted`` once its message is logged (it
  entered a model step), ``rejected`` once the turn that claimed it ended without it
  (``cancelled`` if a cancel ended it). A command the host refuses settles it
  ``cancelled``;
- ``withdraw``: settles a pending reservation ``cancelled``; if its message still reaches
  a pre-step it is rejected there (it never enters a model step); DSH discarding the
  message from the agent's inbox (a cancel that drops the inbox, a replaced session, input
  that competes with it) settles it ``cancelled`` too (``discarded``), so its driver goes
  on; so does competing input arriving while it is queued (``competing_input``), and a
  DSH command starting in the agent (its ``command/run`` in the log: a command is a
  fence no automatic message is admitted across, as on the runtime's own agents);
- ``pre_step``: a waterfall like the agent's; a verdict request for messages of an owned
  kind that are not this proxy's pending reservations, or that competing input comes
  with or waits behind, or while a DSH command runs in the agent (its ``command/run``
  logged, its ``command/done`` not yet), is rejected before it runs; one whose
  reservation was settled while the waterfall ran is rejected after it;
- ``start_companion``: an actor that lives exactly as long as the proxy;
- ``pending_approvals``, ``wait_approvals``, ``answer_approval``: the open questions DSH's
  own approval service asked of the agent (``approval/asked`` without its
  ``approval/decided`` in the mirrored log; ``DshApproval``, with the fields of
  ``loopdock.Approval``), answered through the host (``HostHandler.answer_approval``):
  ``approve`` or ``refuse``, exactly once across every surface (DSH's web panel or ACP
  client, the console, the API): the host's plugin lets the first answer through and
  the later ones get ApprovalClosedError.

The plugin acknowledges a command only after it sent the live items the command caused
(a message inserted into the inbox), so once a command is answered the proxy's view of
the inbox shows its effect. DSH does not say which list an inbox message is in: a
message this proxy injected (or reserved to inject) is known not to wake the agent.

After a reject DSH leaves the agent idle with its inbox stalled: the proxy wakes it once
the blocked turn has ended, if anything is still queued. Nothing here is durable: DSH's session log is the record, and
a proxy's state dies with it (a resume announces a new agent: a new proxy).

``DshAgentMirror`` starts a proxy for every agent the host announces and hands it to
``on_agent`` (e.g. ``rt.loopx.start_continuation``); a proxy stops when its agent is disposed or
announced again. It is also the handler layer in front of the ``HostHandler`` that tells
proxies about discarded messages and runs the commands a DSH user starts in an agent on
the runtime's behalf (``command``: ``/loopx-init``, which the plugin registers in DSH).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from loopdock.actors import (
    COMPANION_POLICY,
    Action,
    AgentReservation,
    CommandResult,
    Enter,
    InvalidReservationError,
    LiveEvent,
    Placement,
    PreStep,
    Reject,
    Reservation,
    ReservationState,
    Verdict,
    enter,
    supervised,
)
from loopdock.runtime import (
    AgentClosedError,
    ApprovalClosedError,
    Changes,
    Event,
    InvalidMessageError,
    LoopdockError,
    Message,
    MessageRefusedError,
    ProducerSource,
    Waterfall,
    get_logger,
    message_from_wire,
    message_to_wire,
    safe_message,
    user_message,
)

from . import _messages as wire
from ._errors import NotServedError
from ._handler import HandlerLayer, Peer
from ._host_handler import HostAgent, HostHandler

log = get_logger(__name__)


@attrs.frozen
class MirroredHeader:
    """What a driver reads of a session header: ``forked_events`` is how many of a seeded
    session's events DSH copied from its parent (history a driver must not inherit)."""

    id: str
    cwd: str
    forked_events: int | None = None


class MirroredSession:
    """A read-only view of one DSH session's events as the host mirrored them."""

    def __init__(self, handler: HostHandler, session_id: str, cwd: Path, forked_events: int | None) -> None:
        self.id = session_id
        self.header = MirroredHeader(session_id, str(cwd), forked_events)
        self._handler = handler

    @property
    def events(self) -> list[Event]:
        return self._handler.sessions.get(self.id, [])

    def events_since(self, index: int) -> list[Event]:
        """The mirrored events from position ``index`` on (the mirror only grows)."""
        return self.events[index:]

    async def read_events(self, start: int = 0) -> list[Event]:
        """As ``events_since``: the mirror is all in memory (the runtime's sessions' API)."""
        return self.events[start:]


def _message(raw: Mapping[str, Any]) -> Message:
    """A DSH message as a runtime ``Message``. DSH's own built-in kinds that the runtime
    has no type for (``runtime-context``, ...) keep their id and role and lose content and
    source: no listener judges them, and human kinds always convert."""
    try:
        return message_from_wire(dict(raw))
    except InvalidMessageError:
        role = raw.get("role")
        return Message(role if role in ("user", "assistant", "tool", "system") else "user", (), None, str(raw.get("id")))


#: DSH's own context messages, which are not input (the plugin's ``CONTEXT_KINDS``).
DSH_CONTEXT_KINDS = frozenset({"runtime-context", "skill-catalog", "agent-instructions", "model-selection"})
#: Why a queued reservation settles ``cancelled`` when competing input arrives.
COMPETING = "input a person or a plugin wrote came first"
#: Why a pending reservation settles ``cancelled`` when a DSH command starts in its agent.
COMMAND_RAN = "a command ran in the agent"


def _kind(message: Mapping[str, Any]) -> object:
    source = message.get("source")
    return source.get("kind") if isinstance(source, Mapping) else None


@attrs.frozen
class DshApproval:
    """An open question DSH's approval service asked of a DSH agent (its
    ``approval/asked``): the fields of ``loopdock.Approval``. ``id`` is DSH's;
    ``arguments`` are those of the tool call ``call_id`` as DSH logged it (empty if the
    mirror does not show it); ``reason`` is DSH's (e.g. a sandbox escalation's)."""

    id: str
    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    reason: str
    turn: int | None
    _owner: DshAgent = attrs.field(repr=False, eq=False)

    async def answer(
        self, decision: str, *, reason: str | None = None, arguments: Mapping[str, Any] | None = None
    ) -> None:
        """``approval.answer`` for a DSH question (see ``DshAgent.answer_approval``)."""
        await self._owner.answer_approval(self.id, decision, reason=reason, arguments=arguments)


def _tool_arguments(events: Sequence[Event], call_id: str) -> Mapping[str, Any]:
    """The arguments of the tool call ``call_id`` as DSH logged them (its assistant
    message's tool-call block), newest first; empty if not found or not a JSON object."""
    for event in reversed(events):
        if event.type != "assistant/message":
            continue
        message = event.data.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, Mapping) and block.get("type") == "tool-call" and block.get("id") == call_id:
                raw = block.get("arguments")
                try:
                    parsed = json.loads(raw) if isinstance(raw, str) else raw
                except ValueError:
                    return {"arguments": raw}
                return dict(parsed) if isinstance(parsed, Mapping) else {"arguments": parsed}
    return {}


class DshAgent:
    """The runtime-side proxy of one live DSH agent (see the module docstring)."""

    def __init__(self, handler: HostHandler, live: HostAgent, cwd: Path, owned_kinds: frozenset[str]) -> None:
        self.id = live.id
        self.live = live
        self.session = MirroredSession(handler, live.session_id, cwd, live.inherited_events)
        self.pre_step: Waterfall[PreStep, Verdict] = Waterfall("agent/pre-step")
        self.log = log.bind(agent_id=self.id)
        self._cwd = cwd
        self._handler = handler
        self._owned = owned_kinds
        self._reservations: dict[str, Reservation] = {}  # message id -> pending reservation
        # message id -> a reservation the runtime let enter, not yet settled by DSH's log:
        # (it, the turn that claimed it, the status version then)
        self._entering: dict[str, tuple[Reservation, int, int]] = {}
        # The session events taken in so far: up to this seq (see ``_fold``).
        self._folded_seq = events[-1].seq if (events := self.session.events) else -1
        # DSH's approval questions still open (approval id -> it), and the turn running
        self._questions: dict[str, DshApproval] = {}
        self._question_changes = Changes()  # one change per question asked or decided
        self._turn: int | None = None
        for event in events:  # the questions asked before the proxy started are open too
            self._take_question(event, events)
        # ids of the DSH commands running in the agent (``command/run`` folded, no
        # ``command/done`` yet)
        self._running_commands: set[str] = set()
        self._unanswered: set[str] = set()  # ids of messages whose command is not answered yet
        self._cancels = 0  # cancel commands not answered yet
        self._injected: set[str] = set()  # ids of messages this proxy queued not to wake the agent
        self._refused: list[MessageRefusedError] = []  # not raised yet, oldest first
        # Commands go out one at a time, in the order they were made (see ``_sender``).
        self._commands, self._queued = trio.open_memory_channel[Callable[[], Awaitable[None]]](math.inf)
        self._nursery: trio.Nursery | None = None
        self._stopped = False

    # -- what a driver reads ---------------------------------------------------------------

    @property
    def cwd(self) -> Path:
        return self._cwd

    @property
    def closed(self) -> bool:
        return self._stopped or self._handler.agents.get(self.id) is not self.live

    @property
    def running(self) -> bool:
        """The proxy's actor runs (it can send and reserve) and its agent is live."""
        return self._nursery is not None and not self.closed

    @property
    def status(self) -> str:
        return self.live.status or "idle"

    @property
    def status_version(self) -> int:
        return self.live.status_version

    @property
    def inbox_size(self) -> int:
        unseen = [m for m in self._reservations if m not in self.live.inbox]
        return len(self.live.inbox) + len(unseen)

    def has_pending_human_input(self) -> bool:
        """Input a person or a plugin wrote waits in the agent's inbox (see the module
        docstring: on DSH a plugin's input ranks as a person's)."""
        return any(self._competes(m) for m in self.live.inbox.values())

    def _competes(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` is input that an automatic message yields to: a person's
        (``HUMAN_SOURCE_KINDS``) or a plugin's, i.e. any kind but an owned one and DSH's
        context."""
        kind = _kind(message)
        return kind not in self._owned and kind not in DSH_CONTEXT_KINDS

    async def wait_idle(self) -> None:
        """Wait until every command sent through this proxy has been answered and the
        agent is idle with nothing queued that would wake it (or it is gone); then raise
        MessageRefusedError for the oldest message the host refused that was not raised
        yet. Always a checkpoint."""
        await trio.lowlevel.checkpoint()
        await self._handler.wait_until(lambda: self.closed or (
            not self._unanswered and not self._cancels and self._quiescent()))
        if self._refused:
            raise self._refused.pop(0)

    async def wait_quiescent(self) -> None:
        """Wait until the agent is idle with nothing queued that would wake it (or it is
        gone), whatever is still on its way to it, and raise nothing: an observer's wait
        (the continuation driver's idle checkpoint). Always a checkpoint."""
        await trio.lowlevel.checkpoint()
        await self._handler.wait_until(lambda: self.closed or self._quiescent())

    def _quiescent(self) -> bool:
        return self.status == "idle" and all(m in self._injected for m in self.live.inbox)

    async def wait_status_change(self, since: int) -> None:
        """Wait until the status changed after version ``since``, or the agent is gone."""
        await trio.lowlevel.checkpoint()
        await self._handler.wait_until(lambda: self.closed or self.status_version > since)

    async def wait_closed(self) -> None:
        """Wait until the agent is gone: its host disposed it or unloaded the plugin (as
        ``dsh headless`` does once its task is done), or the mirror let go of it. Always
        a checkpoint."""
        await trio.lowlevel.checkpoint()
        await self._handler.wait_until(lambda: self.closed)

    # -- what a driver does ----------------------------------------------------------------

    def reserve(self, message: Message, placement: Placement = "followup") -> Reservation:
        """Send an automatic message to the live agent and return its reservation (see the
        module docstring for how it settles)."""
        if not isinstance(message.source, ProducerSource):
            raise InvalidReservationError(f"only producer-owned sources reserve; got {message.source!r}")
        if message.source.kind not in self._owned:
            # DSH would let it enter without asking us: the reservation could never settle.
            raise InvalidReservationError(f"source kind {message.source.kind!r} is not one the bridge owns")
        if self.closed or self._nursery is None:
            raise DshAgentClosedError(f"DSH agent {self.id} is not live")
        reservation = Reservation(message, placement)
        self._reservations[message.id] = reservation
        self._sending(message, placement)
        self._commands.send_nowait(functools.partial(self._send, reservation))
        return reservation

    def withdraw(self, reservation: AgentReservation, reason: str = "withdrawn") -> bool:
        """Settle a pending reservation ``cancelled``; True if it was pending. One the
        runtime let enter at pre-step is past withdrawing: DSH's log settles it."""
        if self._reservations.get(reservation.message.id) is not reservation:
            return False
        del self._reservations[reservation.message.id]
        return reservation.settle("cancelled", reason)

    def discarded(self, message_id: str) -> bool:
        """DSH discarded ``message_id`` from the agent's inbox: a reservation for it can
        never enter a model step, so it settles ``cancelled``. True if one was pending."""
        reservation = self._reservations.get(message_id)
        if reservation is None:
            return False
        self._settle(reservation, "cancelled", "discarded by the host")
        return True

    def competing_input(self, message: Mapping[str, Any]) -> int:
        """The host put ``message`` into the agent's inbox: if it is input a person or a
        plugin wrote, it comes first, and every reservation still queued settles
        ``cancelled`` (the plugin takes their messages out of DSH's inbox). Returns how
        many were."""
        if not self._competes(message):
            return 0
        queued = list(self._reservations.values())
        for reservation in queued:
            self._settle(reservation, "cancelled", COMPETING)
        return len(queued)

    def followup(self, message: str | Message) -> Message:
        """Queue ``message`` for the agent's next turn on the host and wake it (see
        ``_post``)."""
        return self._post(message, "followup")

    def steer(self, message: str | Message) -> Message:
        """Queue ``message`` for the agent's next step on the host and wake it."""
        return self._post(message, "steer")

    def inject(self, message: str | Message) -> Message:
        """Queue ``message`` for the agent's next step on the host without waking it."""
        return self._post(message, "inject")

    def cancel(self, cause: str = "cancelled", *, keep_inbox: bool = True) -> None:
        """End the agent's running turn ``aborted`` with ``cause`` (DSH logs it as a
        hook's cause); with ``keep_inbox=False`` DSH also discards what is queued (its
        reservations settle ``cancelled``). Sent in the background; a proxy whose agent
        is gone does nothing, and a host that refuses it is logged."""
        if self.closed or self._nursery is None:
            return
        self._cancels += 1
        # The turn it ends, if one runs: DSH leaves what it kept stalled after it.
        running = self.status_version if self.status == "running" else None
        self._commands.send_nowait(functools.partial(self._send_cancel, cause, keep_inbox, running))

    def _post(self, message: str | Message, placement: Placement) -> Message:
        """Send an ordinary message (not a reservation: its source kind must be one the
        bridge does not own, or DSH would ask for a verdict nobody can give; a ``str`` is
        a person's message) in the background. A host that refuses it is recorded for
        ``wait_idle``, never retried."""
        if isinstance(message, str):
            message = user_message(message)
        if isinstance(message.source, ProducerSource) and message.source.kind in self._owned:
            raise InvalidReservationError(f"source kind {message.source.kind!r} is owned: reserve it")
        if self.closed or self._nursery is None:
            raise DshAgentClosedError(f"DSH agent {self.id} is not live")
        self._sending(message, placement)
        self._commands.send_nowait(functools.partial(self._send_plain, message, placement))
        return message

    def _sending(self, message: Message, placement: Placement) -> None:
        self._unanswered.add(message.id)
        if placement == "inject":
            # Only what the host still has (or is yet to get) stays known.
            self._injected = {m for m in self._injected if m in self.live.inbox or m in self._unanswered}
            self._injected.add(message.id)

    async def start_companion(
        self, actor: Callable[..., Awaitable[Any]], *args: Any, name: str = "companion"
    ) -> None:
        """Start an actor that lives exactly as long as this proxy (``nursery.start``),
        under the companion policy: a failure is logged (DSH's session log is DSH's to
        write) and the actor restarted, at most so often, then stopped."""
        if self._nursery is None or self.closed:
            raise DshAgentClosedError(f"DSH agent {self.id} is not live")

        def report(error: Exception, action: Action) -> None:
            self.log.warning("companion failed", companion=name, error=safe_message(error), action=action)

        await self._nursery.start(
            functools.partial(supervised, actor, *args, name=name, policy=COMPANION_POLICY, report=report)
        )

    # -- DSH's approval questions ----------------------------------------------------------

    def _take_question(self, event: Event, events: Sequence[Event]) -> None:
        if event.type == "turn/start":
            turn = event.data.get("turn")
            self._turn = turn if isinstance(turn, int) else None
        elif event.type == "approval/asked":
            data = event.data
            approval_id, call_id = data.get("id"), data.get("callId")
            if isinstance(approval_id, str):
                call = call_id if isinstance(call_id, str) else ""
                self._questions[approval_id] = DshApproval(
                    approval_id, call, str(data.get("toolName", "")), _tool_arguments(events, call) if call else {},
                    str(data.get("reason", "")), self._turn, self,
                )
                self._question_changes.notify()
        elif event.type == "approval/decided":
            if self._questions.pop(str(event.data.get("id")), None) is not None:
                self._question_changes.notify()

    def pending_approvals(self) -> list[DshApproval]:
        """The questions DSH's approval service asked of the agent that are not decided
        (as the mirror shows them), oldest first."""
        self._fold()
        return list(self._questions.values())

    async def wait_approvals(self) -> list[DshApproval]:
        """Wait until a question is open (or the agent is gone); the open ones. Always a
        checkpoint."""
        self._fold()
        await self._question_changes.wait_until(lambda: self._stopped or bool(self._questions))
        return self.pending_approvals()

    async def answer_approval(
        self,
        approval_id: str,
        decision: str,
        *,
        reason: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Answer DSH's open question ``approval_id``: ``approve`` (DSH's outcome
        ``allowed-once``: the call runs) or ``refuse`` (``rejected``: the tool tells the
        model the user rejected it; DSH keeps no reason). DSH has no edit. Returns once
        the mirror shows DSH's ``approval/decided``; ApprovalClosedError if the question
        is not open: answered already on any surface (DSH's web panel or ACP client
        included: the host lets only the first answer through), its turn cancelled, or
        never asked. ValueError for an edit or an unknown decision."""
        if decision == "edit" or arguments is not None:
            raise ValueError("DSH's approval outcomes are allowed-once and rejected: a DSH question has no edit")
        if decision not in ("approve", "refuse"):
            raise ValueError(f"decision must be approve or refuse, got {decision!r}")
        if approval_id not in {q.id for q in self.pending_approvals()}:
            raise ApprovalClosedError(
                f"approval {approval_id!r} of DSH agent {self.id} is not open: answered or cancelled already, "
                "or never asked"
            )
        await self._handler.answer_approval(self.id, approval_id, decision, reason)
        self.log.info("dsh approval answered", approval_id=approval_id, decision=decision)
        # The host replies once DSH's decision was sent: the mirror shows it
        self._fold()
        await self._question_changes.wait_until(lambda: self._stopped or approval_id not in self._questions)

    # -- the actor -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        ungate = self._handler.gate(self.id, self._verdict)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._sender)
                nursery.start_soon(self._follow_log)
                task_status.started()
                await self._handler.wait_until(lambda: self.closed)
                nursery.cancel_scope.cancel()
        finally:
            self._stopped = True
            self._question_changes.notify()
            ungate()
            for reservation in [*self._reservations.values(), *(e[0] for e in self._entering.values())]:
                reservation.settle("cancelled", "agent gone")
            self._reservations.clear()
            self._entering.clear()

    async def _follow_log(self) -> None:
        """Take in the session's events as the host mirrors them (``_fold``)."""
        while True:
            await self._handler.wait_until(self._unfolded)
            self._fold()

    def _unfolded(self) -> bool:
        events = self.session.events
        return bool(events) and events[-1].seq > self._folded_seq

    def _fold(self) -> None:
        """Take in the events mirrored since the last fold (those the proxy found when it
        started are history), in seq order."""
        events = self.session.events
        start = len(events)
        while start > 0 and events[start - 1].seq > self._folded_seq:
            start -= 1
        for event in events[start:]:
            self._folded_seq = event.seq
            self._take(event)

    def _take(self, event: Event) -> None:
        self._take_question(event, self.session.events)
        if event.type == "command/run":
            # DSH logs it before the command's handler runs: nothing reserved before it
            # is admitted after it (the plugin takes the messages out of DSH's inbox).
            self._running_commands.add(str(event.data.get("commandId")))
            for reservation in list(self._reservations.values()):
                self._settle(reservation, "cancelled", COMMAND_RAN)
        elif event.type == "command/done":
            self._running_commands.discard(str(event.data.get("commandId")))
        elif event.type == "user/message" and self._entering:
            # DSH logs a message as it enters a model step (its data is the message).
            entering = self._entering.pop(str(event.data.get("id")), None)
            if entering is not None:
                entering[0].settle("admitted")
        elif event.type == "turn/end" and self._entering:
            turn = event.data.get("turn")
            reason = event.data.get("reason")
            kind = reason.get("kind") if isinstance(reason, Mapping) else None
            ended = [mid for mid, (_, claimed, _) in self._entering.items() if claimed == turn]
            for mid in ended:
                reservation, _, seen = self._entering.pop(mid)
                why = f"the turn ended {kind} before the message entered a model step"
                reservation.settle("cancelled" if kind == "aborted" else "rejected", why)
                if kind != "aborted":  # (a cancel wakes after itself)
                    self._wake_later(seen)

    async def _sender(self) -> None:
        """Send the commands in order, each once the one before was answered: the host
        then carries them out in the order they were made (a followup before the steer
        made after it), as an agent of this process would."""
        async for command in self._queued:
            await command()

    async def _send(self, reservation: Reservation) -> None:
        message = reservation.message
        try:
            await self._handler.followup(self.id, message_to_wire(message), reservation.placement)
        except LoopdockError as exc:
            self._settle(reservation, "cancelled", f"the host did not take it: {exc.code}")
            self.log.info("reservation not sent", code=exc.code)
        finally:
            self._answered(message.id)

    async def _send_plain(self, message: Message, placement: Placement) -> None:
        try:
            await self._handler.followup(self.id, message_to_wire(message), placement)
        except LoopdockError as exc:
            self._refused.append(MessageRefusedError(message.id, exc.code, str(exc)))
            self.log.info("message not taken by the host", placement=placement, code=exc.code)
        finally:
            self._answered(message.id)

    async def _send_cancel(self, cause: str, keep_inbox: bool, running: int | None) -> None:
        try:
            await self._handler.cancel(self.id, cause, keep_inbox=keep_inbox)
            if keep_inbox and running is not None:
                self._wake_later(running)
        except LoopdockError as exc:
            self.log.info("cancel not taken by the host", code=exc.code)
        finally:
            self._cancels -= 1
            self._handler.poke()

    def _answered(self, message_id: str) -> None:
        self._unanswered.discard(message_id)
        self._handler.poke()  # wait_idle looks again

    def _settle(self, reservation: Reservation, state: ReservationState, reason: str | None = None) -> None:
        if self._reservations.get(reservation.message.id) is reservation:
            del self._reservations[reservation.message.id]
        reservation.settle(state, reason)

    async def _verdict(self, request: wire.PreStep) -> wire.Verdict:
        self._fold()
        owned = [m for m in request.messages if (m.get("source") or {}).get("kind") in self._owned]
        found = [self._reservations.get(str(m.get("id"))) for m in owned]
        mine = [reservation for reservation in found if reservation is not None]
        batch = {str(m.get("id")) for m in request.messages}
        reason = None
        if not owned or len(mine) < len(found):
            # Not a pending reservation of ours (withdrawn, or someone else's): never enters.
            # DSH drops every owned message of a rejected batch: ours in it are rejected too.
            reason = "not a pending reservation of this runtime"
        elif any(self._competes(m) for m in request.messages):
            reason = "input a person or a plugin wrote is in this step"
        elif any(self._competes(m) for mid, m in self.live.inbox.items() if mid not in batch):
            reason = "input a person or a plugin wrote is waiting"
        elif self._running_commands:
            reason = "a command is running in the agent"
        if reason is not None:
            for reservation in mine:
                self._settle(reservation, "rejected", reason)
            self._wake_later()
            return wire.Verdict("reject", reason)
        try:
            pre = PreStep(
                request.agent_id,
                request.session_id,
                request.turn,
                request.step,
                tuple(_message(m) for m in request.messages),
            )
            verdict: Enter | Reject = await self.pre_step.run(pre, enter)
        except BaseException:
            for reservation in mine:
                self._settle(reservation, "rejected", "pre-step failed")
            self._wake_later()  # the host fails closed: a reject like any other
            raise
        if isinstance(verdict, Enter) and any(r.state != "pending" for r in mine):
            # settled while the waterfall ran (withdrawn, a command started, ...): never enters
            verdict = Reject(next(r.reason for r in mine if r.state != "pending") or "no longer pending")
        if isinstance(verdict, Enter):
            # Not admitted yet: DSH's log says whether it entered (``_take``).
            for reservation in mine:
                if self._reservations.pop(reservation.message.id, None) is reservation and reservation.state == "pending":
                    self._entering[reservation.message.id] = (reservation, request.turn, self.status_version)
            return wire.Verdict("enter")
        for reservation in mine:
            self._settle(reservation, "rejected", verdict.reason)
        self._wake_later()
        return wire.Verdict("reject", verdict.reason)

    def _wake_later(self, seen: int | None = None) -> None:
        """After any reject (ours, or the host failing closed), and after a cancel that
        kept the inbox, the inbox stalls: wake the agent once the turn running at version
        ``seen`` (default: now) has ended."""
        if self._nursery is not None and not self.closed:
            self._nursery.start_soon(self._wake_after_turn, self.status_version if seen is None else seen)

    async def _wake_after_turn(self, seen: int) -> None:
        """DSH ends a turn it blocked or that was cancelled and leaves the rest of the
        inbox stalled: wake the agent once it is idle again so that the queue goes on."""
        await self._handler.wait_until(lambda: self.closed or (self.status_version > seen and self.status == "idle"))
        if self.closed or self._quiescent():
            return  # nothing stalled that would wake it (a wake would open an empty turn)
        try:
            await self._handler.wake(self.id)
        except LoopdockError as exc:
            self.log.info("re-wake after a reject failed", code=exc.code)




class DshAgentClosedError(AgentClosedError):
    """Raised when sending to, reserving on, or starting a companion of, a DSH agent that
    is gone (an AgentClosedError, as for an agent of this process)."""


#: How long a command waits for the proxy of an agent the host just announced.
PROXY_WAIT = 5.0
#: A command a DSH user runs in an agent that the runtime carries out for its proxy.
HostCommand = Callable[[DshAgent, str], Awaitable[CommandResult]]


class DshAgentMirror(HandlerLayer):
    """Starts a ``DshAgent`` for every live agent ``handler`` learns about and passes it to
    ``on_agent`` (awaited inside the proxy's life, e.g. to start a driver as its
    companion). An agent's working directory (its LoopX project) is the one its session
    header names (the plugin sends it), else ``cwd_for(session_id)``; ``owned_kinds`` are
    the source kinds the plugin asks the runtime about.

    As a handler layer in front of ``handler`` (serve the mirror, not the host handler):
    a live ``agent/inbox/discarded`` settles the proxy's reservation for that message, a
    live ``agent/inbox/inserted`` of competing input its queued ones (``competing_input``),
    and
    a ``command`` request runs ``commands[name](proxy, args)`` (a command it does not know
    is answered ``NOT_SERVED``; one that raises is a failed ``commandDone``)."""

    def __init__(
        self,
        handler: HostHandler,
        on_agent: Callable[[DshAgent], Awaitable[None]],
        cwd_for: Callable[[str], Path],
        owned_kinds: frozenset[str],
        commands: Mapping[str, HostCommand] | None = None,
    ) -> None:
        super().__init__(handler)
        self.handler = handler
        self.on_agent = on_agent
        self.cwd_for = cwd_for
        self.owned_kinds = owned_kinds
        self.commands = dict(commands or {})
        #: agent id -> its live proxy
        self.proxies: dict[str, DshAgent] = {}
        self._started = Changes()  # one change per proxy started

    async def on_live(self, conn: Peer, items: Sequence[LiveEvent]) -> None:
        await super().on_live(conn, items)
        for item in items:
            if item.type not in ("agent/inbox/discarded", "agent/inbox/inserted"):
                continue
            message = item.data.get("message")
            proxy = self.proxies.get(item.agent_id)
            if proxy is None or not isinstance(message, Mapping):
                continue
            if item.type == "agent/inbox/inserted":
                proxy.competing_input(message)
            elif isinstance(message_id := message.get("id"), str):
                proxy.discarded(message_id)

    async def _proxy_for(self, agent_id: str) -> DshAgent | None:
        """The live proxy of ``agent_id``; a command may arrive just before the proxy of an
        agent the host announced a moment ago is started, so it waits for it, briefly."""
        with trio.move_on_after(PROXY_WAIT):
            await self._started.wait_until(
                lambda: (proxy := self.proxies.get(agent_id)) is not None and proxy.running
                or agent_id not in self.handler.agents
            )
        proxy = self.proxies.get(agent_id)
        return proxy if proxy is not None and proxy.running else None

    async def on_command(self, conn: Peer, request: wire.RunCommand) -> wire.CommandDone:
        command = self.commands.get(request.name)
        if command is None:
            raise NotServedError(f"this runtime runs no /{request.name[:64]} for DSH hosts")
        proxy = await self._proxy_for(request.agent_id)
        if proxy is None:
            raise DshAgentClosedError(f"no live DSH agent {request.agent_id[:128]!r} is mirrored")
        try:
            result = await command(proxy, request.args)
        except Exception as exc:  # contained: the command fails, the mirror goes on
            proxy.log.warning("host command failed", command=request.name, error=repr(exc))
            return wire.CommandDone(False, f"/{request.name} failed: {safe_message(exc)}")
        return wire.CommandDone(result.ok, result.message, dict(result.data))

    def _unmirrored(self) -> list[HostAgent]:
        return [
            live for agent_id, live in self.handler.agents.items()
            if (proxy := self.proxies.get(agent_id)) is None or proxy.live is not live
        ]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                await self.handler.wait_until(lambda: bool(self._unmirrored()))
                for live in self._unmirrored():
                    cwd = Path(live.cwd) if live.cwd is not None else self.cwd_for(live.session_id)
                    proxy = DshAgent(self.handler, live, cwd, self.owned_kinds)
                    self.proxies[live.id] = proxy
                    nursery.start_soon(self._run_proxy, proxy)

    async def _run_proxy(self, proxy: DshAgent) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.run)
                self._started.notify()
                try:
                    await self.on_agent(proxy)
                except Exception as exc:  # one agent's driver must not take the mirror down
                    proxy.log.warning("starting the agent's companions failed", error=repr(exc))
        finally:
            if self.proxies.get(proxy.id) is proxy:
                del self.proxies[proxy.id]
