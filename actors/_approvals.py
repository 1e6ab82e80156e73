"""An agent's approval questions: asked by its turn, answered by a person, exactly once.

A question is two events of the session log, and nothing else: ``approval/requested``
``{id, callId, tool, arguments, reason, turn}`` when a tool call needs a person's word,
``approval/answered`` ``{id, decision, reason?, arguments?, requestId?}`` when it got one
(``requestId``: the cluster request that carried the answer, if one did). Both are
retained in memory (``RETAINED_TYPES``), so the open questions are known without reading
the store, and a resumed agent knows them from its log alone.

Decisions: ``approve`` (the call runs), ``refuse`` (the model reads ``reason`` as the
call's error result), ``edit`` (the call runs with ``arguments``, recorded in the
answer), and ``withdrawn``, which no person gives: the agent's turn was cancelled while
the question was open, so nothing waits for an answer any more.

Exactly once: the check that a question is open and the append of its answer happen with
no checkpoint between them, so of two answers racing (from any task) the first wins and
the other raises ApprovalClosedError, as an answer to an unknown or closed question does.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Literal

import trio

from loopdock.runtime import ApprovalClosedError, Changes, get_logger

from ._approval_answer import Answer
from ._session import SessionActor

Decision = Literal["approve", "refuse", "edit"]
DECISIONS = ("approve", "refuse", "edit")

log = get_logger(__name__)


def check_answer(decision: str, reason: str | None, arguments: Mapping[str, Any] | None) -> None:
    """Raise ValueError unless ``decision``, ``reason`` and ``arguments`` make an answer
    (``arguments`` only for an edit, and JSON: they go into the log)."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    if decision == "edit":
        if not isinstance(arguments, Mapping):
            raise ValueError("an edit gives the call's new arguments (a mapping)")
        try:  # they go into the log: a value that is not JSON would fail its commit
            json.dumps(arguments, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"an edit's arguments must be JSON: {exc}") from None
    elif arguments is not None:
        raise ValueError(f"only an edit gives arguments, not {decision!r}")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"reason must be a string, got {reason!r}")


class Approval:
    """One open question, as ``agent.pending_approvals()`` lists it."""

    __slots__ = ("id", "call_id", "tool", "arguments", "reason", "turn", "_owner", "_answered", "answer_given")

    def __init__(
        self, owner: Approvals, id: str, call_id: str, tool: str, arguments: Mapping[str, Any], reason: str, turn: int | None
    ) -> None:
        self.id = id
        self.call_id = call_id
        self.tool = tool
        self.arguments = arguments
        self.reason = reason  # why the policy asks
        self.turn = turn
        self._owner = owner
        self._answered = trio.Event()
        self.answer_given: Answer | None = None

    def __repr__(self) -> str:
        return f"Approval(id={self.id!r}, tool={self.tool!r}, call_id={self.call_id!r})"

    async def answer(
        self, decision: Decision, *, reason: str | None = None, arguments: Mapping[str, Any] | None = None
    ) -> None:
        """Answer the question; returns once the answer is durable. Raises
        ApprovalClosedError if it is not open (another answer won, or it was withdrawn)."""
        await self._owner.answer(self.id, decision, reason=reason, arguments=arguments)

    async def wait(self) -> Answer:
        await self._answered.wait()
        assert self.answer_given is not None
        return self.answer_given


class Approvals:
    """The questions of one agent: folded from its log, then kept up to date by it."""

    def __init__(self, session: SessionActor, on_change: Callable[[str, str, int], None] | None = None) -> None:
        self._session = session
        # Told ``(approval id, "requested" | "answered", questions open)`` after each
        # question asked or closed here (not for those found open in the log): the agent
        # announces it live.
        self._on_change = on_change
        self._open: dict[str, Approval] = {}
        self._changes = Changes()  # every question asked or closed
        answered = {e.data["id"]: e for e in session.retained("approval/answered")}
        for event in session.retained("approval/requested"):
            data = event.data
            if data["id"] not in answered:
                self._add(data)
        # The answers to the questions found open in the log: a resumed turn that looks
        # for one after it was given (while the turn was still being set up) finds it.
        self._from_log = set(self._open)
        self._resumed_answers: dict[str, Answer] = {}

    def pending(self) -> list[Approval]:
        """The open questions, oldest first."""
        return list(self._open.values())

    async def wait_pending(self) -> list[Approval]:
        """Wait until a question is open; the open ones. Always a checkpoint."""
        await self._changes.wait_until(lambda: bool(self._open))
        return self.pending()

    def asked(self, call_id: str, turn: int) -> bool:
        """True when a question about the call ``call_id`` of ``turn`` is open."""
        return any(a.call_id == call_id and a.turn == turn for a in self._open.values())

    def resumed_answer(self, approval_id: str) -> Answer | None:
        """The answer given to a question this agent found open in its log, if any."""
        return self._resumed_answers.get(approval_id)

    def get(self, approval_id: str) -> Approval | None:
        return self._open.get(approval_id)

    def ask(self, call_id: str, tool: str, arguments: Mapping[str, Any], reason: str, turn: int) -> Approval:
        """Log a new question and return it (``await approval.wait()`` for the answer)."""
        data = {
            "id": f"ap-{secrets.token_hex(8)}",
            "callId": call_id,
            "tool": tool,
            "arguments": dict(arguments),
            "reason": reason,
            "turn": turn,
        }
        self._session.append("approval/requested", data)
        log.info("approval.requested", session_id=self._session.id, approval_id=data["id"], tool=tool)
        approval = self._add(data)
        self._changed(approval.id, "requested")
        return approval

    async def answer(
        self,
        approval_id: str,
        decision: str,
        *,
        reason: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> None:
        """Answer an open question (ApprovalClosedError if it is not open); returns once
        the answer is durable. ``request_id`` names the request that carried the answer
        (a cluster client's), recorded in the answer as ``requestId``: a worker that gets
        the same request again knows from the log that it was this one's."""
        check_answer(decision, reason, arguments)
        # From here to the append: no checkpoint, so one answer of any race wins.
        answer = Answer(decision, reason, None if arguments is None else dict(arguments))
        self._close(approval_id, answer, request_id)
        await self._session.flush()

    def answered_by(self, approval_id: str) -> str | None:
        """The ``requestId`` the logged answer to ``approval_id`` names (the cluster
        request that gave it), if it was answered with one."""
        for event in self._session.retained("approval/answered"):
            if event.data.get("id") == approval_id:
                request_id = event.data.get("requestId")
                return request_id if isinstance(request_id, str) else None
        return None

    def withdraw(self, approval_id: str, reason: str) -> None:
        """Close a question nobody waits for any more (its turn was cancelled)."""
        if approval_id in self._open:
            self._close(approval_id, Answer("withdrawn", reason))

    def _close(self, approval_id: str, answer: Answer, request_id: str | None = None) -> None:
        approval = None if self._session.closed else self._open.pop(approval_id, None)
        if approval is None:
            raise ApprovalClosedError(
                f"approval {approval_id!r} of agent {self._session.id} is not open: "
                "it was answered or withdrawn already, never asked, or its agent is closed"
            )
        data: dict[str, Any] = {"id": approval_id, "decision": answer.decision}
        if answer.reason is not None:
            data["reason"] = answer.reason
        if answer.arguments is not None:
            data["arguments"] = answer.arguments
        if request_id is not None:
            data["requestId"] = request_id
        self._session.append("approval/answered", data)
        log.info("approval.answered", session_id=self._session.id, approval_id=approval_id, decision=answer.decision)
        approval.answer_given = answer
        approval._answered.set()
        if approval_id in self._from_log:
            self._resumed_answers[approval_id] = answer
        self._changes.notify()
        self._changed(approval_id, "answered")

    def _changed(self, approval_id: str, change: str) -> None:
        if self._on_change is not None:
            self._on_change(approval_id, change, len(self._open))

    def _add(self, data: Mapping[str, Any]) -> Approval:
        approval = Approval(
            self, data["id"], data["callId"], data["tool"], data.get("arguments") or {}, data.get("reason", ""),
            data.get("turn"),
        )
        self._open[approval.id] = approval
        self._changes.notify()
        return approval
