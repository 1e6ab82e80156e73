"""A connection's outgoing queue (sans-IO): bounded on its own and, with the other queues of
its server, by a shared budget; event traffic batched.

Two kinds of entries: whole frames (welcome, errors, requests, replies), and event items
(already encoded ``events``/``live`` items). ``take`` hands out whole frames first (so a
verdict never waits behind a backlog of events), then the oldest run of event items of
one kind as a single frame of at most ``batch_items`` items and about ``batch_bytes``
characters (one item larger than that still goes, alone). Items keep their order.

Sizes are bytes of memory: what the queued text takes (``sys.getsizeof``), which is what a
peer that does not read costs the server, whatever its characters are.

``put_*`` never waits: it returns False when the queue would exceed ``max_items`` entries
or ``max_bytes`` bytes, and the caller drops the peer instead of blocking. With an
``OutboxBudget``, the queues of all peers together hold at most its ``max_bytes``: when a
put would pass that, the queue that would hold the most after it (the newest of those on
a tie) is the offender. If that is another queue, it is emptied and its ``on_evicted`` called (its owner
drops that peer) until the put fits; if it is the putting queue itself, the put returns
False like any full queue.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from collections.abc import Callable

from ._protocol import BatchKind, encode_batch

#: Entries (frames + items) queued for one peer before it counts as too slow.
OUTBOX_SIZE = 4096
#: Bytes queued for one peer before it counts as too slow.
OUTBOX_BYTES = 16 * 2**20
#: Bytes queued for all the peers of one server together.
OUTBOX_BUDGET = 64 * 2**20
#: At most this many items per ``events``/``live`` frame.
BATCH_ITEMS = 256
#: About this many characters of items per ``events``/``live`` frame.
BATCH_BYTES = 256 * 2**10


def _cost(text: str) -> int:
    return sys.getsizeof(text)


class OutboxBudget:
    """The bytes queued in all the outboxes that share it (one server's): ``used`` of
    ``max_bytes``."""

    def __init__(self, max_bytes: int = OUTBOX_BUDGET) -> None:
        if max_bytes < 1:
            raise ValueError("the outbox budget must be positive")
        self.max_bytes = max_bytes
        self.used = 0
        self._members: dict[Outbox, int] = {}  # outbox -> its serial: the newest has the highest
        self._serials = itertools.count()

    def __len__(self) -> int:
        """How many outboxes share the budget."""
        return len(self._members)

    def _join(self, outbox: Outbox) -> None:
        self._members[outbox] = next(self._serials)

    def _leave(self, outbox: Outbox) -> None:
        self._members.pop(outbox, None)

    def _make_room(self, requester: Outbox, cost: int) -> bool:
        def held(box: Outbox) -> tuple[int, int]:  # what it would hold after the put; newest wins a tie
            return box.size + (cost if box is requester else 0), self._members[box]

        while self.used + cost > self.max_bytes:
            offender = max(self._members, key=held)
            if offender is requester:
                return False
            offender._evict()
        return True


class Outbox:
    def __init__(
        self,
        *,
        max_items: int = OUTBOX_SIZE,
        max_bytes: int = OUTBOX_BYTES,
        batch_items: int = BATCH_ITEMS,
        batch_bytes: int = BATCH_BYTES,
        budget: OutboxBudget | None = None,
    ) -> None:
        if min(max_items, max_bytes, batch_items, batch_bytes) < 1:
            raise ValueError("outbox limits must be positive")
        self.max_items = max_items
        self.max_bytes = max_bytes
        #: Called when the shared budget emptied this outbox to make room for another's
        #: put (its peer held the most): the owner drops the peer.
        self.on_evicted: Callable[[], None] | None = None
        #: Whether the last refused put was refused by the shared budget (this outbox would
        #: have held the most), not by this outbox's own limits.
        self.refused_by_budget = False
        self._batch_items = batch_items
        self._batch_bytes = batch_bytes
        self._frames: deque[str] = deque()
        self._items: deque[tuple[BatchKind, str]] = deque()
        self._size = 0
        self._closed = False
        self._budget = budget
        if budget is not None:
            budget._join(self)

    def __len__(self) -> int:
        return len(self._frames) + len(self._items)

    @property
    def size(self) -> int:
        """Bytes queued."""
        return self._size

    def _admit(self, text: str) -> bool:
        cost = _cost(text)
        if self._closed or len(self) >= self.max_items or self._size + cost > self.max_bytes:
            return False
        if self._budget is not None:
            if not self._budget._make_room(self, cost):
                self.refused_by_budget = True
                return False
            self._budget.used += cost
        self._size += cost
        return True

    def _release(self, cost: int) -> None:
        self._size -= cost
        if self._budget is not None:
            self._budget.used -= cost

    def put_frame(self, text: str) -> bool:
        if not self._admit(text):
            return False
        self._frames.append(text)
        return True

    def put_item(self, kind: BatchKind, text: str) -> bool:
        if not self._admit(text):
            return False
        self._items.append((kind, text))
        return True

    def take(self) -> str | None:
        """The next frame to send, or None when nothing is queued."""
        if self._frames:
            text = self._frames.popleft()
            self._release(_cost(text))
            return text
        if not self._items:
            return None
        kind = self._items[0][0]
        batch: list[str] = []
        length = cost = 0
        while self._items and len(batch) < self._batch_items:
            next_kind, text = self._items[0]
            if next_kind != kind or (batch and length + len(text) > self._batch_bytes):
                break
            self._items.popleft()
            batch.append(text)
            length += len(text)
            cost += _cost(text)
        self._release(cost)
        return encode_batch(kind, batch)

    def close(self) -> None:
        """Drop everything queued and take nothing more (leaving the budget): the peer is
        gone, or dropped."""
        self._closed = True
        self._frames.clear()
        self._items.clear()
        self._release(self._size)
        if self._budget is not None:
            self._budget._leave(self)

    def _evict(self) -> None:
        self.close()
        if self.on_evicted is not None:
            self.on_evicted()
