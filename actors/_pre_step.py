"""The ``agent/pre-step`` gate: what listeners see and what they answer."""

from __future__ import annotations

from typing import Literal

import attrs

from loopdock.runtime import Message


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


async def enter(_: PreStep) -> Verdict:
    """The end of every pre-step waterfall: when no listener rejects, the step enters."""
    return ENTER
