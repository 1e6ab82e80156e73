"""The session log's event envelope ``{type, seq, time, data}`` and its known types.

DSH refuses to load a log that holds an event type it does not know, so the set of
types is closed: new meaning travels inside known events (message source kinds,
``agent-preset/selected`` data), never as a new type. The exceptions are the pair of
approval events (``approval/requested``, ``approval/answered``): a person's word on a
tool call must be its own durable record, and ``tool/started`` (a call's tool is about
to run: what a resumed turn needs to know that it may have run). They are only ever
written to the runtime's own store, never to a log DSH loads (a DSH agent's approvals
and tools are DSH's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._errors import UnknownEventTypeError

#: Types the runtime itself writes.
CORE_EVENT_TYPES = frozenset(
    {
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "user/message",
        "assistant/message",
        "tool/call",
        "tool/result",
        "request/header",
        "request/context",
        "agent/inbox/spliced",
        "agent-preset/selected",
        "command/run",
        "command/done",
        "goal/change",
        "llm/retry",
        "session/title",
        # A person's word on a tool call (actors._approvals): the question, its answer.
        "approval/requested",
        "approval/answered",
        # A tool call is about to run (actors._step_resume): ``{turn, step, callId}``.
        "tool/started",
    }
)

#: Further types a real DSH 0.2.1 session writes; a mirror of a DSH session accepts them.
DSH_EVENT_TYPES = frozenset(
    {
        "permission/preset",
        "sandbox/mode",
        "approval/policy",
        "system/message",
        "session/title-llm-request",
    }
)

KNOWN_EVENT_TYPES = CORE_EVENT_TYPES | DSH_EVENT_TYPES

#: Why a turn ended (``turn/end`` ``data.reason.kind``).
TURN_END_REASONS = frozenset(
    {"completed", "aborted", "blocked", "error", "max-tokens", "interrupted"}
)


def check_event_type(event_type: str) -> str:
    if event_type not in KNOWN_EVENT_TYPES:
        raise UnknownEventTypeError(
            f"unknown event type {event_type!r}: a session log only holds known types "
            "(carry new meaning in message sources or agent-preset/selected data)"
        )
    return event_type


@attrs.frozen
class Event:
    """One committed-or-pending entry of a session log. ``data`` is wire-shaped JSON."""

    type: str
    seq: int
    time: int  # milliseconds since the epoch, never decreasing within a session
    data: Mapping[str, Any]


def _event_factory() -> Callable[[str, int, int, Mapping[str, Any]], Event]:
    # Sessions build one Event per append (~8 per agent step): filling the slots through
    # their descriptors costs about a third of attrs' frozen ``__init__`` (which goes
    # through ``object.__setattr__`` per field). Same object, no validation skipped
    # (Event has no validators or converters); the fields are checked here so a new one
    # cannot be left unset.
    names = tuple(field.name for field in attrs.fields(Event))
    assert names == ("type", "seq", "time", "data"), names
    new = object.__new__
    set_type, set_seq, set_time, set_data = (Event.__dict__[name].__set__ for name in names)

    def new_event(type: str, seq: int, time: int, data: Mapping[str, Any]) -> Event:
        event = new(Event)
        set_type(event, type)
        set_seq(event, seq)
        set_time(event, time)
        set_data(event, data)
        return event

    return new_event


#: ``Event(type, seq, time, data)``, faster (see ``_event_factory``).
new_event = _event_factory()


SESSION_FORMAT_VERSION = 1


@attrs.frozen
class SessionHeader:
    id: str
    created_at: int
    cwd: str
    version: int = SESSION_FORMAT_VERSION
    parent_session: str | None = None
    agent_preset: str | None = None
    # A fork's first ``forked_events`` events are copies of its parent's: history that
    # per-session state (such as LoopX activation) must not inherit.
    forked_events: int | None = None
