"""SessionActor: one append-only session log, its persistence and its subscribers.

Appending is synchronous and never blocks (an agent must not wait on disk mid-step):
the event goes to memory and to the pending batch, and the runtime's StoreWriter commits
pending batches of many sessions in one SQLite transaction. Subscribers see an event only
once it is committed, in order. ``flush()`` is the checkpoint that waits for durability.

Lifecycle: *preparing* (appends buffered, nothing written: a rolled-back creation leaves
no trace) -> ``publish()`` -> *published* -> ``close()``.

History stays in the store, not on the heap: a session keeps in memory the events that
are not durable yet, the events from its last ``trim`` on (its agent trims at every turn
start to the start of the previous turn, and to nothing when its idle history is
evicted), and every event of the few ``RETAINED_TYPES`` that durable state is read from
on every request. ``await read_events()`` and ``await read_history()`` stay exact: what
was trimmed is read back from the store in a worker thread. Nothing synchronous reads the
store: ``events_since`` answers from memory only and says so when it cannot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import trio

from loopdock.runtime import (
    KNOWN_EVENT_TYPES,
    Changes,
    Event,
    EventsTrimmedError,
    LoopdockError,
    Message,
    SessionHeader,
    Write,
    check_event_type,
    get_logger,
    message_from_wire,
    new_event,
)

from ._fanout import SUBSCRIBER_BUFFER, Fanout, Subscription
from ._step_resume import SuspendedTurn
from ._store_writer import StoreWriter

log = get_logger(__name__)
T = TypeVar("T")


class SessionClosedError(LoopdockError):
    """Raised when appending to a session that was closed or discarded."""

    code = "SESSION_CLOSED"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


#: Event types a session keeps in memory whatever it trims: the loop binding and preset
#: (``agent-preset/selected``) are read on every model request, and there are few; the
#: approval questions and answers are what ``pending_approvals()`` is folded from.
RETAINED_TYPES = frozenset({"agent-preset/selected", "approval/requested", "approval/answered"})


class SessionActor:
    def __init__(
        self,
        header: SessionHeader,
        writer: StoreWriter,
        *,
        events: Sequence[Event] = (),
        persisted: bool = False,
        base: int = 0,
        last_time: int = 0,
        retained: Iterable[Event] = (),
        turns: int = 0,
    ) -> None:
        """``events`` are the session's events from seq ``base`` on (a loaded session
        may bring none: ``base`` is then its length, ``last_time`` its last event's time,
        ``retained`` its events of ``RETAINED_TYPES`` and ``turns`` its turn count)."""
        self.header = header
        self._writer = writer
        self._base = base  # seq of _events[0]: what lies before is durable, in the store only
        self._events: list[Event] = list(events)
        # Loaded sessions are durable; a new session's header is not, yet.
        self._header_sent = persisted  # handed to the writer
        self._durable = persisted  # the header is committed
        # A forked session starts with copied events that are not durable yet.
        self._committed = base + len(self._events) if persisted else 0  # durable events
        self._pending: list[Event] = [] if persisted else list(self._events)
        self._scheduled = False
        self._published = False
        self._closed = False
        self._last_time = self._events[-1].time if self._events else last_time
        self._retained = [*retained, *(e for e in self._events if e.type in RETAINED_TYPES)]
        # Set by the supervisor on load: an open turn that waits for a person's answer
        # (actors._step_resume.SuspendedTurn), for the resumed agent to continue.
        self.suspended_turn: SuspendedTurn | None = None
        #: ``turn/start`` events in the whole log
        self.turn_count = turns + sum(1 for e in self._events if e.type == "turn/start")
        self._commits = Changes()  # every commit, done or failed
        self._store_error: BaseException | None = None
        self._fanout: Fanout[Event] = Fanout(f"session {header.id}")

    @property
    def id(self) -> str:
        return self.header.id

    async def read_events(self, start: int = 0) -> list[Event]:
        """Every event from position ``start`` on (committed or pending), in seq order.
        What was trimmed from memory is read back from the store in a worker thread; when
        nothing was, this returns without a checkpoint."""
        older, base = await self._read_back(self._read, start)
        return [*older, *self.events_since(base)]

    async def read_history(self, types: Collection[str]) -> list[Event]:
        """Every event of the given types, in seq order (what was trimmed from memory is
        read in a worker thread)."""
        older, base = await self._read_back(lambda a, b: self._read(a, b, types), 0)
        return [*older, *(e for e in self.events_since(base) if e.type in types)]

    async def read_messages(self, types: Collection[str]) -> list[Message]:
        """The messages of every event of ``types`` (message events), in seq order: what
        was trimmed from memory is read from the store in a worker thread, decoded
        straight into messages."""
        store = self._writer.store
        older, base = await self._read_back(lambda a, b: store.load_messages(self.id, a, b, types), 0)
        older.extend(message_from_wire(e.data) for e in self.events_since(base) if e.type in types)
        return older

    async def _read_back(self, read: Callable[[int, int], list[T]], start: int) -> tuple[list[T], int]:
        """``read(start, stop)`` in a worker thread for what was trimmed from ``start`` on,
        again for what was trimmed while it read (an eviction or a turn's start may trim
        meanwhile); returns what it read and the seq from which memory holds the rest,
        with no checkpoint after the last check."""
        items: list[T] = []
        while start < self._base:
            stop = self._base
            items += await trio.to_thread.run_sync(read, start, stop, limiter=self._writer.readers)
            start = stop
        return items, start

    def events_since(self, index: int) -> list[Event]:
        """The events from position ``index`` on, from memory (for incremental folds that
        keep up). Raises EventsTrimmedError if some of them are only in the store:
        ``await read_events(index)`` reads those."""
        base = self._base
        if index < base:
            raise EventsTrimmedError(
                f"session {self.id}: events {index}..{base - 1} are in the store only; use await read_events()"
            )
        return self._events[index - base :]

    @property
    def memory_start(self) -> int:
        """The seq of the first event held in memory (``event_count`` if none is)."""
        return self._base

    def retained(self, event_type: str) -> tuple[Event, ...]:
        """Every event of ``event_type`` (one of ``RETAINED_TYPES``), in seq order; never
        reads the store."""
        if event_type not in RETAINED_TYPES:
            raise ValueError(f"{event_type!r} is not kept in memory; retained: {sorted(RETAINED_TYPES)}")
        return tuple(e for e in self._retained if e.type == event_type)

    @property
    def event_count(self) -> int:
        """How many events the log holds (the next event's seq)."""
        return self._base + len(self._events)

    @property
    def in_memory(self) -> int:
        """How many events are held in memory (pending, not yet trimmed)."""
        return len(self._events)

    def trim(self, upto: int | None = None) -> int:
        """Drop durable events before seq ``upto`` (every durable one by default) from
        memory; they stay readable from the store. Returns how many were dropped."""
        if not self._writer.persist:  # the log is only here
            return 0
        cut = self._committed if upto is None else min(upto, self._committed)
        dropped = cut - self._base
        if dropped <= 0:
            return 0
        del self._events[:dropped]
        self._base = cut
        return dropped

    def _read(self, start: int, stop: int, types: Collection[str] | None = None) -> list[Event]:
        return self._writer.store.load_events(self.id, start, stop, types)

    @property
    def committed_count(self) -> int:
        return self._committed

    @property
    def store_error(self) -> BaseException | None:
        """Why nothing more of this session is written (a commit failed for good), or None."""
        return self._store_error

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
        event = new_event(event_type, self._base + len(self._events), self._last_time, data)
        self._events.append(event)
        self._pending.append(event)
        if event_type in RETAINED_TYPES:
            self._retained.append(event)
        elif event_type == "turn/start":
            self.turn_count += 1
        if self._published and not self._scheduled and self._store_error is None:  # _schedule(), inlined
            self._scheduled = True
            self._writer.schedule(self)
        return event

    def subscribe(self, max_buffer: int = SUBSCRIBER_BUFFER) -> Subscription[Event]:
        """Committed events from now on, in order. A slow subscriber is dropped, not waited for."""
        return self._fanout.subscribe(max_buffer)

    @property
    def subscriber_count(self) -> int:
        """How many subscriptions are open (a subscribed session's agent stays active)."""
        return self._fanout.subscriber_count

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

        Raises the store's error if a commit of this session failed (then none of its
        later events is written either). Returns at once for an unpublished
        session (nothing of it is meant to be durable yet).
        """
        target = self.event_count
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

    def requeue(self, write: Write) -> None:
        self._pending[:0] = write.events
        if write.header is not None:
            self._header_sent = False
        self._schedule(force=write.header is not None)

    def _schedule(self, *, force: bool = False) -> None:
        if self._published and not self._scheduled and self._store_error is None and (self._pending or force):
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
            # From now on nothing of this session is written: a later write would leave
            # a hole in its log where this one's events belong (or, for a refused header,
            # land in another session of the same id). The log on disk stays a whole
            # prefix; memory keeps the rest, and flush() and close() raise this error.
            self._store_error = error
            log.error("session commit failed", session_id=self.id, error=repr(error))
        else:
            self._durable = True
            self._committed += len(write.events)
            if self._fanout.subscriber_count:
                for event in write.events:
                    self._fanout.publish(event)
        self._commits.notify()
