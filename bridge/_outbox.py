"""A connection's outgoing queue (sans-IO): bounded, with event traffic batched.

Two kinds of entries: whole frames (welcome, errors, requests, replies), and event items
(already encoded ``events``/``live`` items). ``take`` hands out whole frames first (so a
verdict never waits behind a backlog of events), then the oldest run of event items of
one kind as a single frame of at most ``batch_items`` items and about ``batch_bytes``
characters (one item larger than that still goes, alone). Items keep their order.

``put_*`` never waits: it returns False when the queue would exceed ``max_items`` entries
or ``max_bytes`` characters, and the caller drops the peer instead of blocking.
"""

from __future__ import annotations

from collections import deque

from ._protocol import BatchKind, encode_batch

#: Entries (frames + items) queued for one peer before it counts as too slow.
OUTBOX_SIZE = 4096
#: Characters queued for one peer before it counts as too slow.
OUTBOX_BYTES = 16 * 2**20
#: At most this many items per ``events``/``live`` frame.
BATCH_ITEMS = 256
#: About this many characters of items per ``events``/``live`` frame.
BATCH_BYTES = 256 * 2**10


class Outbox:
    def __init__(
        self,
        *,
        max_items: int = OUTBOX_SIZE,
        max_bytes: int = OUTBOX_BYTES,
        batch_items: int = BATCH_ITEMS,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        if min(max_items, max_bytes, batch_items, batch_bytes) < 1:
            raise ValueError("outbox limits must be positive")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._batch_items = batch_items
        self._batch_bytes = batch_bytes
        self._frames: deque[str] = deque()
        self._items: deque[tuple[BatchKind, str]] = deque()
        self._size = 0

    def __len__(self) -> int:
        return len(self._frames) + len(self._items)

    @property
    def size(self) -> int:
        """Characters queued."""
        return self._size

    def _fits(self, text: str) -> bool:
        return len(self) < self.max_items and self._size + len(text) <= self.max_bytes

    def put_frame(self, text: str) -> bool:
        if not self._fits(text):
            return False
        self._frames.append(text)
        self._size += len(text)
        return True

    def put_item(self, kind: BatchKind, text: str) -> bool:
        if not self._fits(text):
            return False
        self._items.append((kind, text))
        self._size += len(text)
        return True

    def take(self) -> str | None:
        """The next frame to send, or None when nothing is queued."""
        if self._frames:
            text = self._frames.popleft()
            self._size -= len(text)
            return text
        if not self._items:
            return None
        kind = self._items[0][0]
        batch: list[str] = []
        length = 0
        while self._items and len(batch) < self._batch_items:
            next_kind, text = self._items[0]
            if next_kind != kind or (batch and length + len(text) > self._batch_bytes):
                break
            self._items.popleft()
            batch.append(text)
            length += len(text)
        self._size -= length
        return encode_batch(kind, batch)
