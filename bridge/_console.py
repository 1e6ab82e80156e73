"""The console: every agent a ``serve`` knows, live, and one log line per thing that matters.

``ConsoleHandler`` is a handler layer that watches what passes through the bridge (DSH
hosts' ``select``, live agent events and session events) and what the runtime's own
agents announce (``watch_runtime``), and keeps one ``AgentRow`` per agent: where it
comes from (``dsh`` or ``runtime``), its session, loop and driver, status, inbox size and
last turn. It

- logs at info, on the ``loopdock.serve`` logger: every session start and end, and every
  loop decision (or refusal, e.g. LOOP_SWITCH) the dock makes for a DSH host;
- pushes every row, and every change of one, to console pages: GoalBar-role connections
  whose hello names the ``console`` capability, as ``live`` items of type
  ``console/agent`` (``data`` is the row; ``data.gone`` when the agent ended). The page
  asks the GoalBar of each session itself (``goalbarWatch``);
- shows each runtime agent's open approval questions in its row (``approvals``: id,
  tool, arguments and reason, cut for display; ``approvalsOpen``: how many), read from
  ``agent.pending_approvals()`` whenever the agent announces a question asked or closed
  (live ``agent/approvals``, whichever surface answered), and answers a page's
  ``approval`` request on the agent (``answer_approval``): exactly once, so of two pages
  answering one question, the second gets ``APPROVAL_CLOSED``;
- shows a DSH agent's open questions the same way: those DSH's own approval service
  asked (``dsh_approvals(agent_id)``, e.g. ``DshAgent.pending_approvals``), read again
  whenever the host's log says a question was asked or decided (``approval/asked``,
  ``approval/decided``, whichever surface answered: DSH's web panel or ACP client, a
  page, the API); ``answer_approval`` answers them through the host.

Rows of ended agents are dropped (the session logs are the record: ``loopdock sessions``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from loopdock.actors import LiveEvent, Subscription
from loopdock.actors.dock import Route
from loopdock.runtime import InvalidSessionIdError, LoopdockError, SubscriberDroppedError, check_session_id, get_logger

from ._dock_select import MAX_BINDINGS
from ._dsh_binding import BINDING_RECORD, dsh_binding
from ._errors import NotServedError
from ._handler import BridgeHandler, Disconnect, HandlerLayer, Peer
from ._messages import AnswerApproval, ApprovalDone, Select, Selection, SessionEvent

#: The logger of the lines ``loopdock serve`` shows at info.
SERVE_LOGGER = "loopdock.serve"
log = get_logger(SERVE_LOGGER)

CONSOLE_CAPABILITY = "console"
ROW_TYPE = "console/agent"
#: Selects remembered until their agent is created (a host may select and never create):
#: as many as the dock's own memory of its decisions.
MAX_DECIDED = MAX_BINDINGS
# How much of a text a peer chose (a preset, an agent's source, an error quoting what it
# sent) goes into a log line.
_LOGGED_TEXT = 200


#: How many of an agent's open questions its row carries (``approvalsOpen`` counts all),
#: and how much of a question's arguments (as JSON) and reason.
MAX_SHOWN_APPROVALS = 20
MAX_SHOWN_ARGUMENTS = 400
MAX_SHOWN_REASON = 300
#: The live events after which a runtime agent's row is read again from its session.
_VIEWED = ("agent/created", "agent/status", "agent/approvals")
#: The events of a DSH agent's log after which its row's questions are read again.
_DSH_QUESTION_EVENTS = ("approval/asked", "approval/decided")


def _logged(value: object) -> object:
    return value[:_LOGGED_TEXT] if isinstance(value, str) else value


def _cut(text: str, longest: int) -> str:
    return text if len(text) <= longest else text[: longest - 1] + "…"


class OpenQuestion(Protocol):
    """What the console shows of an open approval question (``loopdock.Approval``)."""

    @property
    def id(self) -> str: ...

    @property
    def tool(self) -> str: ...

    @property
    def arguments(self) -> Mapping[str, Any]: ...

    @property
    def reason(self) -> str: ...


@attrs.frozen
class ApprovalView:
    """One open question as a console row carries it: ``arguments`` is their JSON text,
    cut to ``MAX_SHOWN_ARGUMENTS`` characters (``reason`` to ``MAX_SHOWN_REASON``)."""

    id: str
    tool: str
    arguments: str
    reason: str

    @classmethod
    def of(cls, question: OpenQuestion) -> ApprovalView:
        try:
            arguments = json.dumps(dict(question.arguments), ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError):
            arguments = repr(question.arguments)[:MAX_SHOWN_ARGUMENTS]
        return cls(question.id, _cut(question.tool, 200), _cut(arguments, MAX_SHOWN_ARGUMENTS),
                   _cut(question.reason, MAX_SHOWN_REASON))

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "arguments": self.arguments, "reason": self.reason}


def approval_views(questions: Sequence[OpenQuestion]) -> tuple[tuple[ApprovalView, ...], int]:
    """The questions a row shows (the oldest ``MAX_SHOWN_APPROVALS``), and how many are open."""
    return tuple(ApprovalView.of(q) for q in questions[:MAX_SHOWN_APPROVALS]), len(questions)


@attrs.frozen
class RuntimeView:
    """What a runtime agent's session says: its binding, turns, how the last one ended,
    and its open approval questions (``approvals_open`` of them; the first ones shown)."""

    binding: Route | None
    turns: int
    last_turn: str | None
    approvals: tuple[ApprovalView, ...] = ()
    approvals_open: int = 0


#: Answers the open question ``approval_id`` of the agent ``agent_id`` (the runtime's, or
#: a DSH host's) with ``decision`` and ``reason`` (raises UNKNOWN_AGENT, APPROVAL_CLOSED, ...).
AnswerApprovalFn = Callable[[str, str, str, str | None], Awaitable[None]]


def _route(binding: Route | None) -> tuple[str | None, str | None]:
    return (binding.loop, binding.driver) if binding is not None else (None, None)


@attrs.define
class AgentRow:
    """One agent as the console shows it."""

    id: str
    origin: str  # "dsh" or "runtime"
    session_id: str
    loop: str | None = None
    driver: str | None = None
    status: str | None = None
    inbox: int = 0
    turns: int = 0
    last_turn: str | None = None  # how the last turn ended
    cwd: str | None = None
    approvals: tuple[ApprovalView, ...] = ()  # open questions (runtime agents)
    approvals_open: int = 0

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id, "origin": self.origin, "sessionId": self.session_id, "loop": self.loop,
            "driver": self.driver, "status": self.status, "inbox": self.inbox, "turns": self.turns,
            "lastTurn": self.last_turn, "cwd": self.cwd, "approvals": [a.wire() for a in self.approvals],
            "approvalsOpen": self.approvals_open,
        }


class ConsoleHandler(HandlerLayer):
    """See the module docstring. ``runtime_view(agent_id)`` reads a runtime agent's
    binding, turn count, last turn end and open questions from its session (None once it
    is gone); ``answer_approval`` answers one of its questions (None: pages cannot)."""

    def __init__(
        self,
        inner: BridgeHandler | None = None,
        runtime_view: Callable[[str], RuntimeView | None] | None = None,
        answer_approval: AnswerApprovalFn | None = None,
        dsh_approvals: Callable[[str], Sequence[OpenQuestion]] | None = None,
    ) -> None:
        super().__init__(inner)
        self._dsh_approvals = dsh_approvals
        self.rows: dict[str, AgentRow] = {}
        self._runtime_view = runtime_view or (lambda agent_id: None)
        self._answer_approval = answer_approval
        # session id -> the dock's answer to its select, until its agent is created (the
        # newest MAX_DECIDED)
        self._decided: dict[str, Route] = {}
        self._inboxes: dict[str, set[str]] = {}
        self._pages: set[Peer] = set()
        self._hosts: dict[str, str] = {}  # DSH agent id -> the connection that announced it

    # -- console pages ---------------------------------------------------------------------

    @staticmethod
    def _is_page(conn: Peer) -> bool:
        hello = getattr(conn, "hello", None)
        return conn.role == "goalbar" and hello is not None and CONSOLE_CAPABILITY in hello.capabilities

    def connected(self, conn: Peer) -> None:
        super().connected(conn)
        if self._is_page(conn):
            self._pages.add(conn)
            for row in list(self.rows.values()):
                conn.publish_live(LiveEvent(ROW_TYPE, row.id, row.wire()))

    def disconnected(self, conn: Peer, reason: Disconnect) -> None:
        self._pages.discard(conn)
        if conn.role == "dsh-host":
            # A DSH process that exits (dsh headless does, after its task) says nothing more
            # of its agents: they ended with it. A host that only reconnects gets its rows
            # back from its next live events.
            for agent_id in [a for a, c in self._hosts.items() if c == conn.id]:
                row = self.rows.get(agent_id)
                if row is not None:
                    self._end(row, reason=f"host {reason.kind}")
        super().disconnected(conn, reason)

    def _publish(self, row: AgentRow, *, gone: bool = False) -> None:
        item = LiveEvent(ROW_TYPE, row.id, {**row.wire(), **({"gone": True} if gone else {})})
        for page in list(self._pages):
            if not page.publish_live(item):
                self._pages.discard(page)

    async def on_approval(self, conn: Peer, request: AnswerApproval) -> ApprovalDone:
        """A console page's answer to a runtime agent's question; the rows follow from the
        agent's ``agent/approvals`` (on every page, whoever answered)."""
        if not self._is_page(conn):
            raise NotServedError("approvals are answered from a console page (a hello with the console capability)")
        if self._answer_approval is None:
            raise NotServedError("this console answers no approvals")
        reason = request.reason or None
        try:
            await self._answer_approval(request.agent_id, request.approval_id, request.decision, reason)
        except LoopdockError as exc:
            log.info("approval answer refused", session_id=request.agent_id, approval_id=_logged(request.approval_id),
                     code=_logged(exc.code))
            raise
        log.info("approval answered", session_id=request.agent_id, approval_id=request.approval_id,
                 decision=request.decision, surface="console")
        return ApprovalDone(request.agent_id, request.approval_id, request.decision)

    # -- what DSH hosts send -----------------------------------------------------------------

    async def on_select(self, conn: Peer, request: Select) -> Selection:
        try:
            selection = await super().on_select(conn, request)
        except LoopdockError as exc:
            log.info("loop refused", session_id=request.session_id, op=request.op, code=_logged(exc.code),
                     reason=_logged(str(exc)))
            raise
        self._decided.pop(request.session_id, None)
        self._decided[request.session_id] = Route(selection.loop, selection.driver)
        if len(self._decided) > MAX_DECIDED:  # selects whose agent never came: the oldest go
            del self._decided[next(iter(self._decided))]
        log.info("loop decision", session_id=request.session_id, op=request.op, loop=selection.loop,
                 driver=selection.driver, preset=_logged(request.agent_preset))
        for row in self.rows.values():
            if row.session_id == request.session_id:
                row.loop, row.driver = selection.loop, selection.driver
                self._publish(row)
        return selection

    async def on_live(self, conn: Peer, items: Sequence[LiveEvent]) -> None:
        await super().on_live(conn, items)
        for item in items:
            if item.type != "agent/disposed":
                if item.type != "agent/created" and item.agent_id not in self.rows:
                    # announced before a reconnection (the plugin does not say it again)
                    self.rows[item.agent_id] = AgentRow(item.agent_id, "dsh", item.agent_id)
                self._hosts[item.agent_id] = conn.id
            self.apply_live("dsh", item)

    async def on_events(self, conn: Peer, items: Sequence[SessionEvent]) -> None:
        await super().on_events(conn, items)
        asked_or_decided: set[str] = set()
        for item in items:
            self._apply_event(item.session_id, item.event.type, item.event.data)
            if item.event.type in _DSH_QUESTION_EVENTS:
                asked_or_decided.add(item.session_id)
        if asked_or_decided and self._dsh_approvals is not None:
            for row in list(self.rows.values()):
                if row.origin == "dsh" and row.session_id in asked_or_decided:
                    try:
                        row.approvals, row.approvals_open = approval_views(self._dsh_approvals(row.id))
                    except Exception as exc:  # contained: the row may be stale, the console goes on
                        log.warning("console could not read a DSH agent's questions", agent_id=row.id, error=repr(exc))
                        continue
                    self._publish(row)

    # -- the runtime's own agents --------------------------------------------------------------

    async def watch_runtime(
        self,
        subscription: Subscription[LiveEvent],
        resubscribe: Callable[[], Subscription[LiveEvent]],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Follow the runtime's live agent events (``rt.subscribe_live()``, taken before
        the runtime's first checkpoint so that no configured agent is missed) until
        cancelled or the runtime closes. Nothing here ends ``serve``: an event this fails
        to show is logged and skipped, and a subscription dropped for falling behind (a
        burst of thousands of agents) is replaced by ``resubscribe()`` (rows then catch up
        at each agent's next event)."""
        task_status.started()
        while True:
            try:
                with subscription:
                    async for item in subscription:
                        self._apply_runtime_item(item)
                return  # the runtime closed its live stream
            except SubscriberDroppedError:
                log.warning("console fell behind the runtime's live events; following them again")
                subscription = resubscribe()

    def _apply_runtime_item(self, item: LiveEvent) -> None:
        try:
            missed = item.agent_id not in self.rows and item.type not in ("agent/created", "agent/disposed")
            wanted = missed or item.type in _VIEWED
            view = self._runtime_view(item.agent_id) if wanted else None
            if missed:  # its creation was missed (a dropped subscription): its row starts now
                self.apply_live("runtime", LiveEvent("agent/created", item.agent_id, {"sessionId": item.agent_id}), view)
            self.apply_live("runtime", item, view if item.type in _VIEWED else None)
        except Exception as exc:  # contained: one row may be stale, the console goes on
            log.warning("console could not show an event", agent_id=item.agent_id, type=item.type, error=repr(exc))

    # -- the rows ------------------------------------------------------------------------------

    def apply_live(self, origin: str, item: LiveEvent, view: RuntimeView | None = None) -> None:
        """One live agent event; ``view``: what the agent's session says now (runtime agents)."""
        data: Mapping[str, Any] = item.data
        row = self.rows.get(item.agent_id)
        if view is not None and row is not None:  # the turn just ended shows with the status
            (row.loop, row.driver), row.turns = _route(view.binding), view.turns
            row.last_turn = view.last_turn or row.last_turn  # None: out of memory, not changed
            row.approvals, row.approvals_open = view.approvals, view.approvals_open
        if item.type == "agent/created":
            # as the host handler takes it: an id the runtime's API refuses is not kept
            try:
                session_id = check_session_id(data.get("sessionId"))
            except InvalidSessionIdError:
                session_id = item.agent_id
            decided = self._decided.pop(session_id, None)
            cwd = data.get("cwd")
            row = self.rows[item.agent_id] = AgentRow(
                item.agent_id, origin, session_id, decided.loop if decided else None,
                decided.driver if decided else None, cwd=cwd if isinstance(cwd, str) else None,
            )
            if view is not None:
                (row.loop, row.driver), row.turns, row.last_turn = _route(view.binding), view.turns, view.last_turn
                row.approvals, row.approvals_open = view.approvals, view.approvals_open
            self._inboxes[item.agent_id] = set()
            log.info("session start", origin=origin, session_id=session_id, source=_logged(data.get("source")),
                     loop=row.loop, driver=row.driver)
            self._publish(row)
            return
        known = self.rows.get(item.agent_id)
        if known is None:
            return
        row = known
        if item.type == "agent/disposed":
            self._end(row, reason="disposed")
            return
        if item.type == "agent/status" and isinstance(data.get("status"), str):
            row.status = data["status"]
        elif item.type == "agent/approvals":
            if view is None:  # only a runtime agent's view says which questions are open
                return
        elif item.type.startswith("agent/inbox/"):
            # DSH sends the message, the runtime its id
            message = data.get("message")
            message_id = message.get("id") if isinstance(message, Mapping) else data.get("messageId")
            inbox = self._inboxes.setdefault(item.agent_id, set())
            if isinstance(message_id, str):
                if item.type == "agent/inbox/inserted":
                    inbox.add(message_id)
                else:
                    inbox.discard(message_id)
            row.inbox = len(inbox)
        else:
            return
        self._publish(row)

    def _end(self, row: AgentRow, *, reason: str) -> None:
        self.rows.pop(row.id, None)
        self._inboxes.pop(row.id, None)
        self._hosts.pop(row.id, None)
        log.info("session end", origin=row.origin, session_id=row.session_id, reason=reason, turns=row.turns,
                 last_turn=_logged(row.last_turn))
        self._publish(row, gone=True)

    def _apply_event(self, session_id: str, kind: str, data: Mapping[str, Any]) -> None:
        if kind not in ("turn/start", "turn/end", BINDING_RECORD):
            return
        for row in self.rows.values():
            if row.session_id != session_id:
                continue
            if kind == "turn/start":
                row.turns += 1
            elif kind == "turn/end":
                reason = data.get("reason")
                row.last_turn = str(reason.get("kind")) if isinstance(reason, Mapping) else None
            else:
                binding = dsh_binding([{"type": kind, "data": data}])
                if binding is not None:
                    row.loop, row.driver = binding.loop, binding.driver
            self._publish(row)
