"""Ownership: what a worker holds right now, shared by its lease keeper (which changes
it) and its session store (which fences every write with it).

``tokens`` and ``pending`` change only through the methods below, each of which notifies
``changes``: whoever must see what the worker holds (a test, an observer) waits on it
instead of looking again and again.
"""

from __future__ import annotations

import attrs

from .._changes import Changes
from .keys import shard_of


@attrs.define
class Pending:
    """An inbox entry handed to an agent, acknowledged once its effect is durable."""

    shard: int
    lane: str
    entry_id: str


@attrs.define(eq=False)
class Ownership:
    worker: str
    shards: int
    #: shard -> lease token (``<worker>/<epoch>``) of every shard this worker owns.
    tokens: dict[int, str] = attrs.field(factory=dict)
    #: message id -> its inbox entry, for messages whose ``user/message`` (or discard)
    #: is not durable yet; the commit that makes it durable acknowledges the entry.
    pending: dict[str, Pending] = attrs.field(factory=dict)
    #: While the shard host handles a batch of entries: the ids of the messages this
    #: worker made durable since it asked Redis which of the batch were done already
    #: (their answer may predate it). None between batches.
    settled_since: set[str] | None = None
    #: session -> the lease token its live agent was activated under. Appends are fenced
    #: with it, not with the shard's current token: an activation that is being stopped
    #: after its shard was lost must not write under the lease this worker took again.
    active: dict[str, str] = attrs.field(factory=dict)
    #: shard -> the (trio) time until which this worker trusts its lease: set by the
    #: lease keeper from its renewals, checked before every message is handled.
    valid_until: dict[int, float] = attrs.field(factory=dict)
    #: Notified after every change of ``tokens`` or ``pending``.
    changes: Changes = attrs.field(factory=Changes, repr=False)

    def add_token(self, shard: int, token: str) -> None:
        """The lease of ``shard`` is this worker's now, as ``token``."""
        self.tokens[shard] = token
        self.changes.notify()

    def drop_token(self, shard: int) -> str | None:
        """The lease of ``shard`` is no longer this worker's: its token, None if it had none."""
        token = self.tokens.pop(shard, None)
        if token is not None:
            self.changes.notify()
        return token

    def add_pending(self, message_id: str, pending: Pending) -> None:
        """``message_id`` was handed to its agent; ``pending`` is acknowledged by the commit
        that makes its effect durable."""
        self.pending[message_id] = pending
        self.changes.notify()

    def drop_pending(self, message_id: str) -> None:
        """``message_id`` is pending no more (its entry was acknowledged, or it was never
        handed over after all)."""
        if self.pending.pop(message_id, None) is not None:
            self.changes.notify()

    def shard(self, session_id: str) -> int:
        return shard_of(session_id, self.shards)

    def token(self, session_id: str) -> str | None:
        return self.tokens.get(self.shard(session_id))

    def forget(self, shard: int) -> None:
        """Forget the shard's messages handed to agents (the shard is gone: its next
        owner gets them again, and so may this worker, later)."""
        gone = [m for m, p in self.pending.items() if p.shard == shard]
        for message_id in gone:
            del self.pending[message_id]
        if gone:
            self.changes.notify()

    def settled(self, message_id: str) -> None:
        """``message_id``'s effect is durable now (it is in its session's done set)."""
        if self.settled_since is not None:
            self.settled_since.add(message_id)

    def holds(self, shard: int, now: float) -> str | None:
        """The shard's token if this worker holds it and still trusts its lease at ``now``."""
        token = self.tokens.get(shard)
        return token if token is not None and now < self.valid_until.get(shard, 0.0) else None
