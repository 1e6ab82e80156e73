"""Whether one tool call may run: the agent's approval policy, and a person if it asks.

Called by the react driver for each call, inside ``turn.outside()``: an automatic turn
waits for the person without its admission slot, and without a thread (the wait is a
``trio.Event``). A turn cancelled while it waits withdraws its question (``withdrawn``);
an agent stopped while it waits (disposed, or its runtime closing) leaves the question
open in the log, as a crash would, for the resumed agent to ask again.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from loopdock.runtime import ToolCallBlock
from loopdock.runtime.tools import Tool

from ._approval_answer import Answer
from ._approvals import Approval
from ._turn import Turn

#: Why a resumed turn asks about a call that had started when its process stopped.
MAY_HAVE_RUN = "this call may have run before the runtime stopped (it had started, its result is not in the log); run it again?"


@attrs.frozen
class Permit:
    """``arguments`` to run the call with, or ``refusal``: the error the model reads."""

    arguments: Mapping[str, Any] | None
    refusal: str | None = None


async def permit(turn: Turn, call: ToolCallBlock, tool: Tool, arguments: Mapping[str, Any]) -> Permit:
    agent = turn.agent
    waiting = None
    resumed = turn.resumed
    if resumed is not None:  # the step a stop left open (actors._step_resume)
        if call.call_id in resumed.started and not (tool.read_only or tool.idempotent):
            # It may have run: a person says whether it runs again.
            waiting = agent.approvals.ask(call.call_id, call.name, arguments, MAY_HAVE_RUN, turn.number)
        elif call.call_id in resumed.questions or call.call_id in resumed.answers:  # asked before the stop
            approval_id = resumed.questions.get(call.call_id, "")
            answered = resumed.answers.get(call.call_id) or agent.approvals.resumed_answer(approval_id)
            if answered is not None:  # before the stop, or while the turn was set up again
                if answered.decision == "withdrawn":
                    return Permit(None, f"not run: its question was withdrawn ({answered.reason})")
                return _permit(call, arguments, answered)
            waiting = agent.approvals.get(approval_id)
        # Otherwise it had not started, or may run again unasked: as a new call would.
    if waiting is None:
        policy = agent.options.approvals
        if policy is None:
            return Permit(arguments)
        decide = functools.partial(policy.decide, call.name, arguments, read_only=tool.read_only, cwd=agent.cwd)
        if policy.reads_files and call.name == "write_file":
            # Resolving the path stats the filesystem: in the tools' pool, as the tool would.
            verdict = await trio.to_thread.run_sync(decide, limiter=agent.tools.threads, abandon_on_cancel=True)
        else:
            verdict = decide()
        if verdict.rule == "always":
            return Permit(arguments)
        if verdict.rule == "never":
            return Permit(None, f"refused: the approval policy does not let {call.name} run ({verdict.reason})")
        waiting = agent.approvals.ask(call.call_id, call.name, arguments, verdict.reason, turn.number)
    return _permit(call, arguments, await _wait(turn, waiting))


async def _wait(turn: Turn, approval: Approval) -> Answer:
    try:
        answer = await approval.wait()
        # Durable before the call starts: a crash after it ran must not find the
        # question open and ask (and run) again.
        await turn.session.flush()
        return answer
    except trio.Cancelled:
        if not turn.agent.stopping:  # cancelled by ``cancel``: nobody waits for an answer
            turn.agent.approvals.withdraw(approval.id, turn.agent.cancel_cause or "cancelled")
        raise


def _permit(call: ToolCallBlock, arguments: Mapping[str, Any], answer: Answer) -> Permit:
    if answer.decision == "approve":
        return Permit(arguments)
    if answer.decision == "edit" and answer.arguments is not None:
        return Permit(answer.arguments)
    reason = answer.reason or "no reason given"
    return Permit(None, f"refused by a person: {reason}")
