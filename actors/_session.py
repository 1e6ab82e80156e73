"""SessionActor: one append-only session log, its persistence and its subscribers.

Appending is synchronous and never blocks (an agent must not wait on disk mid-step):
the event goes to memory and to the pending batch, and the runtime's StoreWriter commits
pending batches of many sessions in one SQLite transaction. Subscribers see an event only
once it is committed, in order. ``flush()`` is the checkpoint that waits for durability.

Lifecycle: *preparing* (appends buffered, nothing written: a rolled-back creation leaves
no trace) -> ``publish()`` -> *published* -> ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from runtime._changes import Changes
from runtime._errors import LoopdockError
from runtime._events import (
    KNOWN_EVENT_TYPES,
    Event,
    SessionHeader,
    check_event_type,
    new_event,
)
from runtime._store import Write

from ._fanout import SUBSCRIBER_BUFFER, Fanout, Subscription
from ._store_writer import StoreWriter

log = structlog.get_logger(__name__)


class SessionClosedError(LoopdockError):
    """Raised when appending to a session that was closed or discarded."""

    code = "SESSION_CLOSED"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class SessionActor:
    def __init__(
        self,
        header: SessionHeader,
        writer: StoreWriter,
        *,
        events: Sequence[Event] = (),
        persisted: bool = False,
    ) -> None:
        self.header = header
        self._writer = writer
        self._events: list[Event] = list(events)
        # Loaded sessions are durable; a new session's header is not, yet.
        self._header_sent = persisted  # handed to the writer
        self._durable = persisted  # the header is committed
        # A forked session starts with copied events that are not durable yet.
        self._committed = len(self._events) if persisted else 0  # number of durable events
        self._pending: list[Event] = [] if persisted else list(self._events)
        self._scheduled = False
        self._published = False
        self._closed = False
        self._last_time = self._events[-1].time if self._events else 0
        self._commits = Changes()  # every commit, done or failed
        self._store_error: BaseException | None = None
        self._fanout: Fanout[Event] = Fanout(f"session {header.id}")

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event appended so far (committed or pending), in seq order."""
        return tuple(self._events)

    def events_since(self, index: int) -> list[Event]:
        """The events from position ``index`` on (for incremental folds)."""
        return self._events[index:]

    @property
    def committed_count(self) -> int:
        return self._committed

    @property
    def published(self) -> bool:
        return self._published

    @property
    def closed(self) -> bool:
        """True once closed or discarded: appends raise SessionClosedError."""
        return self._closed

    def append(self, event_type: str, data: Mapping[str, Any]) -> Event:
        """Append one event; atomic, never a checkpoint. Raises UnknownEventTypeError."""
        if event_type not in KNOWN_EVENT_TYPES:
            check_event_type(event_type)  # raises
        if self._closed:
            raise SessionClosedError(f"session {self.id} is closed")
        now = _now_ms()
        if now > self._last_time:
            self._last_time = now
        event = new_event(event_type, len(self._events), self._last_time, data)
        self._events.append(event)
        self._pending.append(event)
        if self._published and not self._scheduled:  # _schedule(), inlined
            self._scheduled = True
            self._writer.schedule(self)
        return event

    def subscribe(self, max_buffer: int = SUBSCRIBER_BUFFER) -> Subscription[Event]:
        """Committed events from now on, in order. A slow subscriber is dropped, not waited for."""
        return self._fanout.subscribe(max_buffer)

    def publish(self) -> None:
        """Make the session durable: its header (if new) and buffered events go to the store."""
        if self._closed:
            raise SessionClosedError(f"session {self.id} is closed")
        self._published = True
        self._schedule(force=not self._header_sent)

    def discard(self) -> None:
        """Roll back a session that was never published: nothing of it is written."""
        assert not self._published, "a published session cannot be discarded"
        self._closed = True
        self._pending.clear()
        self._fanout.close()

    async def flush(self) -> None:
        """Wait until every event appended before this call is durable.

        Raises the store's error if the commit failed. Returns at once for an unpublished
        session (nothing of it is meant to be durable yet).
        """
        target = len(self._events)
        while self._published and (not self._durable or self._committed < target):
            if self._store_error is not None:
                raise self._store_error
            if self._writer.stopped:
                # The writer was cancelled along with everything else (an outer cancel
                # scope, Ctrl-C) before this session's last events: a shielded close
                # still makes them durable, instead of waiting forever.
                await self._writer.drain()
                continue
            self._writer.expedite()  # someone waits: no group-commit delay
            await self._commits.wait()
        if self._store_error is not None:
            raise self._store_error

    async def close(self) -> None:
        """Flush, then end every subscription. Further appends raise SessionClosedError."""
        try:
            await self.flush()
        finally:
            self._closed = True
            self._fanout.close()

    # -- the StoreWriter's side --------------------------------------------------------

    def _schedule(self, *, force: bool = False) -> None:
        if self._published and not self._scheduled and (self._pending or force):
            self._scheduled = True
            self._writer.schedule(self)

    def take_write(self) -> Write:
        self._scheduled = False
        events = tuple(self._pending)
        self._pending.clear()
        header = None if self._header_sent else self.header
        self._header_sent = True
        return Write(self.id, header, events)

    def commit_done(self, write: Write, error: BaseException | None) -> None:
        if error is not None:
            self._store_error = error
            log.error("session commit failed", session_id=self.id, error=repr(error))
        else:
            self._durable = True
            self._committed += len(write.events)
            if self._fanout.subscriber_count:
                for event in write.events:
                    self._fanout.publish(event)
        self._commits.notify()
