"""Continuing a turn that a crash (or a stop) left open: from its last durable step.

A driver whose turn body says ``resumes_steps = True`` (the react driver's) gets back
every open turn of a resumed session whose log holds enough to go on; the model is not
asked again for what the log already holds. Where the turn's last step (its last
``step/start``) stands decides what happens:

- its assistant message is in the log and every call of it has a result: the step is
  closed (``step/end``) if it was not, and the turn goes on to its next model step (a
  message without calls ends the turn ``completed`` unless a steer waits);
- some calls have no result: each runs as the log says. A call asked about runs as its
  answer says (or once it is answered). A call that had started (its ``tool/started`` is
  in the log, after its last answer if it was asked about) may have run: it runs again
  unasked only if its tool is declared ``read_only`` or ``idempotent``; otherwise it
  becomes an approval question ("may have run; run it again?"). A call that had not
  started runs as a new call would (the approval policy decides). Then the turn goes on;
- its assistant message is not in the log (the model's reply was cut mid-stream): the
  model is asked again for that step, with the transcript the log holds.

Nothing is continued, and the turn is closed ``interrupted`` as before, when the turn
holds no message yet (the person's message was not durable), when a question of its last
step was withdrawn (a cancel was under way), and for drivers that cannot resume a step
(their open turns with an open question keep being shown and withdrawn).

``tool/started`` ``{turn, step, callId}`` is written (and made durable) just before a
call of a tool that is neither read-only nor idempotent starts: without it a crash could
not tell a call that had started from one that had not.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from loopdock.runtime import Event, ToolCallBlock, message_from_wire

from ._approval_answer import Answer

MESSAGE_TYPES = ("user/message", "assistant/message", "tool/result")


@attrs.frozen
class ResumePoint:
    """Where a resumed turn goes on (see the module's doc)."""

    step: int  # the number of the turn's last step (its ``step/start`` is in the log)
    #: The step's assistant message is in the log. False: the model is asked again.
    answered: bool = True
    step_ended: bool = False  # its ``step/end`` is in the log
    more: bool = False  # the message called tools: the turn asks the model again after it
    calls: tuple[ToolCallBlock, ...] = ()  # the step's calls without a result, in order
    questions: dict[str, str] = attrs.field(factory=dict)  # call id -> open approval id
    answers: dict[str, Answer] = attrs.field(factory=dict)  # call id -> its last answer, if it did not start after it
    started: frozenset[str] = frozenset()  # call ids that may have run (started, no result)


@attrs.frozen
class SuspendedTurn:
    """An open turn of a loaded log that its agent continues (``point``), or, without a
    point, one whose open questions its agent withdraws before closing it."""

    number: int
    start_seq: int  # its ``turn/start``'s seq
    point: ResumePoint | None = None


def open_question(events: Sequence[Event], start_seq: int) -> bool:
    """True when a question asked after ``start_seq`` (an outline's ``events``) is open."""
    answered = {e.data.get("id") for e in events if e.type == "approval/answered"}
    return any(
        e.type == "approval/requested" and e.seq > start_seq and e.data.get("id") not in answered for e in events
    )


def resume_point(events: Sequence[Event]) -> ResumePoint | None:
    """Where an open turn (``events``: from its ``turn/start`` on) goes on, or None when
    it cannot (see the module's doc)."""
    starts = [i for i, e in enumerate(events) if e.type == "step/start"]
    if not starts or not any(e.type in MESSAGE_TYPES for e in events):
        return None
    first = starts[-1]
    step = int(events[first].data.get("step", 0))
    in_step = events[first:]
    ended = any(e.type == "step/end" and e.data.get("step") == step for e in in_step)
    last = max((i for i, e in enumerate(in_step) if e.type == "assistant/message"), default=None)
    if last is None:  # cut before the reply was durable: ask again
        return ResumePoint(step, answered=False, step_ended=ended)
    calls = message_from_wire(in_step[last].data).tool_calls
    after = in_step[last + 1 :]
    done = {b["callId"] for e in after if e.type == "tool/result" for b in e.data.get("content", ())}
    remaining = tuple(c for c in calls if c.call_id not in done)
    if not remaining:
        return ResumePoint(step, step_ended=ended, more=bool(calls))
    wanted = {c.call_id for c in remaining}
    asked: dict[str, str] = {}  # approval id -> call id
    last_question: dict[str, str] = {}  # call id -> its last question's id
    answers: dict[str, Answer] = {}
    started: set[str] = set()
    for event in after:
        data = event.data
        if event.type == "approval/requested" and data.get("callId") in wanted:
            asked[data["id"]] = data["callId"]
            last_question[data["callId"]] = data["id"]
            answers.pop(data["callId"], None)
            started.discard(data["callId"])
        elif event.type == "approval/answered" and data.get("id") in asked:
            call = asked[data["id"]]
            if last_question.get(call) == data["id"]:
                answers[call] = Answer(data["decision"], data.get("reason"), data.get("arguments"))
        elif event.type == "tool/started" and data.get("callId") in wanted:
            started.add(data["callId"])
    for call in started:  # what a person said was before this start: it may have run
        answers.pop(call, None)
    if any(a.decision == "withdrawn" for a in answers.values()):
        return None
    questions = {call: approval for call, approval in last_question.items() if call not in answers and call not in started}
    return ResumePoint(
        step, step_ended=ended, more=True, calls=remaining, questions=questions, answers=answers,
        started=frozenset(started),
    )
