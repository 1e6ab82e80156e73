"""Faults: how an actor's failure is recorded where a person will see it.

A failure that an actor's owner contains (a companion, a subscriber, a listener, a LoopX
call) is written into the session it concerns as a ``system/message`` event -- a type
every DSH log already has, since an unknown type would make the log unloadable -- whose
message carries a producer-owned source ``loopdock-fault`` naming the actor. The model
never sees it (a transcript holds user, assistant and tool messages only); logs, the
console and the GoalBar do.

    record_fault(agent.session, "loopx-continuation", exc)
"""

from __future__ import annotations

from loopdock.runtime import Message, ProducerSource, TextBlock, get_logger, message_to_wire, safe_message

from ._session import SessionActor, SessionClosedError

log = get_logger(__name__)

FAULT_KIND = "loopdock-fault"
FAULT_EVENT = "system/message"


def fault_message(actor: str, error: BaseException | str, *, action: str = "") -> Message:
    """The message that records ``actor``'s failure: ``error`` as a safe one-liner (an
    exception's code and message if it is ours, else only its type), and ``action``,
    what happens next (``restarted``, ``stopped``, ``retried at the next checkpoint``...)."""
    what = error if isinstance(error, str) else safe_message(error)
    fields = {"actor": actor, "error": what[:500]}
    if action:
        fields["action"] = action
    text = f"{actor} failed: {what}" + (f"; {action}" if action else "")
    return Message("system", (TextBlock(text[:1000]),), ProducerSource(FAULT_KIND, fields))


def record_fault(session: SessionActor, actor: str, error: BaseException | str, *, action: str = "") -> None:
    """Append the fault to ``session`` and log it as a warning (never raises: a closed
    session is only logged)."""
    what = error if isinstance(error, str) else safe_message(error)
    log.warning("actor failed", session_id=session.id, actor=actor, error=what, action=action or None)
    try:
        session.append(FAULT_EVENT, message_to_wire(fault_message(actor, what, action=action)))
    except SessionClosedError:
        pass


def is_fault(data: object) -> bool:
    """True for the data of a ``system/message`` event that records a fault."""
    if not isinstance(data, dict):
        return False
    source = data.get("source")
    return isinstance(source, dict) and source.get("kind") == FAULT_KIND

