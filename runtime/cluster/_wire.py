"""Inbox messages on the wire: one stream entry per message, ``{id, kind, session, body}``.

The id is the producer's, stable across redelivery: the owner records the ids it has
processed in the session (``done``) and drops a message it sees again. Human input and
control travel on the ``human`` lane, which the owner drains first; automatic input
(``inject``, ``reserve``, and any message from a producer source) on the ``auto`` lane, and
so does ``withdraw``: behind the reservation it withdraws, never ahead of it. ``answer``
(a person's answer to an approval question, ``{approval, decision, reason?, arguments?}``)
is a request, as create/resume/fork/dispose are: its worker answers on its reply key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, cast, get_args

import attrs

from .._errors import LoopdockError

Kind = Literal[
    "create", "resume", "fork", "followup", "steer", "inject", "reserve", "withdraw", "cancel", "dispose", "answer"
]
KINDS: frozenset[str] = frozenset(get_args(Kind))
MAX_BODY = 4 * 1024 * 1024


class BadInboxMessageError(LoopdockError):
    """An inbox entry that is not a loopdock message (it is acknowledged and dropped)."""

    code = "BAD_INBOX_MESSAGE"


@attrs.frozen
class InboxMessage:
    id: str
    kind: Kind
    session: str
    body: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``auto`` for a program's input (an inject, or a message from a producer source),
    #: drained after ``human`` (people's input and control); the sender decides.
    lane: str = "human"

    def to_fields(self) -> dict[str, str]:
        return {"id": self.id, "kind": self.kind, "session": self.session, "body": json.dumps(self.body)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> InboxMessage:
        try:
            message_id, kind, session, body = fields["id"], fields["kind"], fields["session"], fields["body"]
        except KeyError as exc:
            raise BadInboxMessageError(f"inbox entry lacks {exc.args[0]!r}") from None
        if kind not in KINDS:
            raise BadInboxMessageError(f"unknown inbox message kind {kind[:40]!r}")
        if len(body) > MAX_BODY:
            raise BadInboxMessageError(f"inbox message body is {len(body)} bytes; at most {MAX_BODY}")
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadInboxMessageError(f"inbox message body is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise BadInboxMessageError("inbox message body is not a JSON object")
        return cls(message_id, cast(Kind, kind), session, parsed)
