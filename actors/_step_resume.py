"""Continuing a turn that a crash (or a stop) left waiting for a person's answer.

Only this case, for now: the turn's last durable step ends with an assistant message
whose tool calls have no results yet, and at least one of them has an approval question
in the log. Resuming runs that step's calls (each as its answer says, or once it is
answered), logs their results, and the turn goes on to its next model step: the model is
not asked again for what the log already holds. Any other open turn is closed
``interrupted``, as before.

Calls that may have run already: one of that step with no question (it ran unasked when
the process died) is not run again, and its result says so. An approved call whose
result is missing runs on resume: the log cannot tell whether it had started (no event
marks a tool's start yet), and the person's answer is the last word recorded about it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from loopdock.runtime import Event, ToolCallBlock, message_from_wire

from ._approval_answer import Answer


@attrs.frozen
class SuspendedTurn:
    """An open turn of a loaded log that has an open approval question."""

    number: int
    start_seq: int  # its ``turn/start``'s seq


@attrs.frozen
class ResumePoint:
    step: int  # the number of the step being finished
    calls: tuple[ToolCallBlock, ...]  # the step's calls without a result, in order
    questions: dict[str, str]  # call id -> open approval id
    answers: dict[str, Answer]  # call id -> the answer given before the stop
    unasked: frozenset[str]  # call ids with no question: they may have run


def suspended_turn(events: Sequence[Event], open_turn: int | None) -> SuspendedTurn | None:
    """``open_turn`` (of an outline's ``events``), if a question was asked in it and not
    withdrawn: still open, or answered when the process stopped (perhaps before the
    call could start, or before its result was written)."""
    if open_turn is None:
        return None
    start = None
    withdrawn = {e.data.get("id") for e in events if e.type == "approval/answered" and e.data.get("decision") == "withdrawn"}
    asked = False
    for event in events:
        if event.type == "turn/start" and event.data.get("turn") == open_turn:
            start = event.seq
        elif event.type == "approval/requested" and start is not None and event.seq > start:
            asked = asked or event.data.get("id") not in withdrawn
    if start is None or not asked:
        return None
    return SuspendedTurn(open_turn, start)


def resume_point(events: Sequence[Event]) -> ResumePoint | None:
    """Where a suspended turn (``events``: from its ``turn/start`` on) goes on, or None
    when it is not the one case this continues."""
    last = max((i for i, e in enumerate(events) if e.type == "assistant/message"), default=None)
    if last is None:
        return None
    calls = message_from_wire(events[last].data).tool_calls
    after = events[last + 1 :]
    done = {b["callId"] for e in after if e.type == "tool/result" for b in e.data.get("content", ())}
    remaining = tuple(c for c in calls if c.call_id not in done)
    asked = {e.data["id"]: e.data["callId"] for e in after if e.type == "approval/requested"}
    answers: dict[str, Answer] = {}
    for event in after:
        if event.type == "approval/answered" and event.data.get("id") in asked:
            data = event.data
            answers[asked[data["id"]]] = Answer(data["decision"], data.get("reason"), data.get("arguments"))
    if not remaining or not asked or any(a.decision == "withdrawn" for a in answers.values()):
        return None
    step = max((e.data.get("step", 0) for e in events if e.type == "step/start"), default=0)
    questions = {call: approval for approval, call in asked.items() if call not in answers}
    unasked = frozenset(c.call_id for c in remaining if c.call_id not in asked.values())
    return ResumePoint(step, remaining, questions, answers, unasked)
