"""Whether a session has activated the LoopX continuation driver, folded from its log.

Activation is intent, never authority, and only this exact session's history counts:

- a ``user/message`` whose source is exactly ``{kind: skill-invocation, name: loopx,
  form: instructions}`` (a person typed ``/loopx ...``); or
- a ``tool/call`` named exactly ``skill`` whose arguments parse to a JSON object (not an
  array) with exactly ``name: loopx``, followed by a successful ``tool/result`` paired by
  the same call id.

Everything else fails closed: prose, a call without a result, a failed or unmatched
result, other skills, init-command or continuation input, files on disk, bindings. A
result pairs only with the call its id names *last*: a later ``tool/call`` that reuses
the id (a shell call, another tool, another skill) supersedes the ``loopx`` call, and
its result activates nothing. A result counts only in its exact shape: a ``tool``
source naming the call, one content block, no error in either log format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._events import Event

SKILL_NAME = "loopx"


def _is_loopx_invocation(data: Mapping[str, Any]) -> bool:
    source = data.get("source")
    return (
        isinstance(source, Mapping)
        and source.get("kind") == "skill-invocation"
        and source.get("name") == SKILL_NAME
        and source.get("form") == "instructions"
    )


def _is_loopx_skill_call(data: Mapping[str, Any]) -> bool:
    if data.get("name") != "skill" or not isinstance(data.get("arguments"), str):
        return False
    try:
        arguments = json.loads(data["arguments"])
    except ValueError:
        return False
    return isinstance(arguments, dict) and arguments.get("name") == SKILL_NAME


def _tool_source(message: Mapping[str, Any], call_id: str) -> bool:
    """The message is a tool's result for ``call_id``: role ``tool`` and exactly the
    source ``{kind: tool, callId}`` (not a plugin's or anyone else's source kind)."""
    source = message.get("source")
    return (
        message.get("role") == "tool"
        and isinstance(source, Mapping)
        and source.get("kind") == "tool"
        and source.get("callId") == call_id
    )


def _one_block(content: object) -> Mapping[str, Any] | None:
    """The single content block of a result; None when there are none or several."""
    if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], Mapping):
        return None
    return content[0]


def _tool_result(data: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(call id, succeeded) of a tool result in either log format; (None, False) when
    malformed. Succeeded means: the exact shape below, one content block, no error.

    - DSH 0.2.1 logs ``{turn, step, message: {role: tool, source: {kind: tool, callId},
      toolCallId, content: [one text block], isError}, error?}`` (seen on the real
      ``dsh``: ``isError: false`` and no ``error`` on success; a failed ``skill`` call has
      ``isError: true``);
    - this runtime logs the message itself: ``{role: tool, content: [{type: tool-result,
      callId, isError}], source: {kind: tool, callId}}``, with no ``error``.
    """
    message = data.get("message")
    if isinstance(message, Mapping):
        call_id = message.get("toolCallId")
        if not isinstance(call_id, str) or not _tool_source(message, call_id):
            return None, False
        block = _one_block(message.get("content"))
        succeeded = (
            block is not None
            and block.get("type") == "text"
            and message.get("isError") is not True
            and data.get("error") is None
        )
        return call_id, succeeded
    block = _one_block(data.get("content"))
    if block is None:
        return None, False
    call_id = block.get("callId")
    if block.get("type") != "tool-result" or not isinstance(call_id, str) or not _tool_source(data, call_id):
        return None, False
    return call_id, block.get("isError") is False and data.get("error") is None


@attrs.define
class Activation:
    """An incremental fold: feed events in order; ``active`` never goes back to False."""

    active: bool = False
    _pending_calls: set[str] = attrs.field(factory=set)

    def feed(self, event: Event) -> bool:
        """Fold one event; True when this event activated the session."""
        if self.active:
            return False
        if event.type == "user/message" and _is_loopx_invocation(event.data):
            self.active = True
        elif event.type == "tool/call":
            call_id = event.data.get("callId")
            if isinstance(call_id, str):
                # The last call under an id is the one its result answers.
                if _is_loopx_skill_call(event.data):
                    self._pending_calls.add(call_id)
                else:
                    self._pending_calls.discard(call_id)
        elif event.type == "tool/result":
            call_id, succeeded = _tool_result(event.data)
            if succeeded and call_id in self._pending_calls:
                self.active = True
            self._pending_calls.discard(call_id)  # a failed result settles the call too
        return self.active

    @classmethod
    def fold(cls, events: Iterable[Event]) -> Activation:
        activation = cls()
        for event in events:
            activation.feed(event)
        return activation
