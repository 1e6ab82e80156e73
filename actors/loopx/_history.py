"""What one session's own log says about its LoopX continuation.

Everything the continuation must remember across a restart is folded from the session
log (the runtime's or DSH's, which differ only in details handled here), never stored
elsewhere:

- **activation** (``runtime.loopx.Activation``): did this session invoke the loopx skill;
- **the latch**: after a turn that ends ``aborted`` (a cancel; not a disposal, which is the
  runtime or the host going away), ``error``, ``max-tokens`` or ``blocked``, the
  continuation stays quiet until a person acts. A person's message (source ``user`` or
  ``skill-invocation``) re-arms it, and so does a continuation message that entered a
  model step: it can only have entered because a person re-armed the continuation (the
  GoalBar's Start) after the latching turn. ``interrupted`` (a crash, repaired on resume)
  never latches: a restart is not a person's decision. Nor does a turn ``blocked`` by
  the continuation's *own* pre-step check (the binding changed, quota no longer admits
  the turn, human input won, ...): the continuation says which turns it vetoed
  (``vetoed``), and the next idle checkpoint evaluates again. That is process-local:
  neither log format says who vetoed a step, so after a restart such a turn latches
  (a passivation keeps it: the continuation's memo, ``restore``);
- **people**: how many messages a person sent (the continuation starts LoopX's
  unchanged-poll count again when a person speaks);
- **continuation turns**: for each LoopX turn id whose continuation message entered a
  model step in this session, how the last turn it entered ended (``completed``,
  ``aborted``, ...; ``open`` while it runs). A turn LoopX reports unsettled is resumed
  automatically only if it never completed here: a model that finished a turn without
  settling it would only do so again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from loopdock.runtime import HUMAN_SOURCE_KINDS, Event
from loopdock.runtime.loopx import Activation

CONTINUATION_KIND = "loopx-continuation"

#: Why the continuation is quiet, by the turn end that latched it (safe, fixed phrases).
LATCH_REASONS = {
    "aborted": "the last turn was cancelled",
    "error": "the last turn ended with an error",
    "max-tokens": "the last turn ran out of output tokens",
    "blocked": "the last turn was blocked before the model ran",
}


def _source(data: Mapping[str, Any]) -> Mapping[str, Any]:
    # A user/message's data is the message itself, in both logs.
    source = data.get("source")
    return source if isinstance(source, Mapping) else {}


def _disposal(reason: Mapping[str, Any]) -> bool:
    """An abort because the agent went away: the runtime's ``cause: disposed`` or DSH's
    ``reason: {kind: disposed}``."""
    inner = reason.get("reason")
    return reason.get("cause") == "disposed" or (isinstance(inner, Mapping) and inner.get("kind") == "disposed")


@attrs.define
class ContinuationHistory:
    """An incremental fold of one session's events (see the module docstring)."""

    activation: Activation = attrs.field(factory=Activation)
    #: why the continuation is quiet; None while it is armed
    latch: str | None = None
    #: continuation turn id -> how the last turn it entered ended (``open`` while running)
    turns: dict[str, str] = attrs.field(factory=dict)
    #: how many messages a person sent in this session
    people: int = 0
    #: how many turns started in this session
    started: int = 0
    _in_turn: list[str] = attrs.field(factory=list)
    _own_vetoes: set[int] = attrs.field(factory=set)

    def feed(self, event: Event) -> None:
        self.activation.feed(event)
        data = event.data
        if event.type == "turn/start":
            self.started += 1
            self._in_turn = []
        elif event.type == "user/message":
            source = _source(data)
            kind = source.get("kind")
            if kind in HUMAN_SOURCE_KINDS:
                self.latch = None
                self.people += 1
            elif kind == CONTINUATION_KIND and isinstance(source.get("turnInstanceId"), str):
                turn_id = source["turnInstanceId"]
                self.latch = None
                self.turns[turn_id] = "open"
                self._in_turn.append(turn_id)
        elif event.type == "turn/end":
            reason = data.get("reason")
            reason = reason if isinstance(reason, Mapping) else {}
            kind = reason.get("kind")
            ended = kind if isinstance(kind, str) else "unknown"
            for turn_id in self._in_turn:
                self.turns[turn_id] = ended
            self._in_turn = []
            number = data.get("turn")
            own_veto = False
            if isinstance(number, int) and number in self._own_vetoes:
                self._own_vetoes.discard(number)
                own_veto = ended == "blocked"
            if ended in LATCH_REASONS and not (ended == "aborted" and _disposal(reason)) and not own_veto:
                self.latch = LATCH_REASONS[ended]

    def vetoed(self, turn: int) -> None:
        """The continuation's own pre-step check vetoed a step of turn number ``turn``
        (its ``turn/end`` is still to come): that turn ending ``blocked`` does not latch."""
        self._own_vetoes.add(turn)

    @property
    def own_vetoes(self) -> frozenset[int]:
        """The turns the continuation vetoed whose ends are still to be fed."""
        return frozenset(self._own_vetoes)

    def restore(self, latch: str | None, own_vetoes: frozenset[int]) -> None:
        """Back to what a fold of the same events said in the process (a passivated
        agent's continuation rebuilt: the log does not say who vetoed a step, nor that
        a person's Start re-armed it)."""
        self.latch = latch
        self._own_vetoes = set(own_vetoes)

    def rearm(self) -> None:
        """A person re-armed the continuation (the GoalBar's Start): process-local until a
        continuation it admits enters a model step, which the log then shows."""
        self.latch = None

    def completed(self, turn_id: str) -> bool:
        """True when a continuation of ``turn_id`` entered a model step here and its last
        turn ended ``completed``."""
        return self.turns.get(turn_id) == "completed"
