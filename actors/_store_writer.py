"""StoreWriter: the one task that makes sessions durable.

Sessions schedule themselves when they have pending events; the writer takes everything
scheduled, commits it in one SQLite transaction on a worker thread, then tells each
session. Batching falls out naturally: whatever arrives while a commit is in flight goes
into the next one, so the cost per event shrinks as load grows.

Group commit: at low load that would mean one transaction (and one thread round trip,
~80 us of CPU) for every few events, so after the first pending write the writer waits
up to ``window`` seconds for more before committing. A ``flush()`` (a caller waiting for
durability) cuts the wait short, and ``drain()`` never waits.

A failing database: a batch that fails in a way that can clear by itself (a full disk, a
lock held too long: ``StoreError.transient``) wrote nothing, so every session takes its
write back, in front of what it appended since, and the running writer tries again after
a pause that doubles up to ``RETRY_MAX`` seconds, for as long as it runs. Meanwhile
nothing is lost and nothing is out of order: flushes wait, subscribers see nothing new,
and ``trouble`` holds the error (the runtime holds back automatic turns while it is set,
so memory grows only with what people send). Any other failure, or one in a ``drain``
after the writer stopped (at shutdown), is final for the sessions of the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from loopdock.runtime import SessionLog, StoreError, Write, get_logger

log = get_logger(__name__)


#: How long the writer gathers writes before committing them (see the module doc).
GROUP_COMMIT_WINDOW = 0.001

#: How many worker threads read history back from the store at once (``readers``). The
#: store has one connection, and decoding what it reads holds the GIL: more readers add
#: nothing but take the GIL from the trio thread and the commits. With trio's default
#: (40), a round of cold turns read histories back faster than their turns could run
#: and end, and the histories read and waiting set the heap's high-water mark.
READ_THREADS = 2
#: The first pause before a failed batch is tried again, and the longest (seconds).
RETRY_FIRST = 0.05
RETRY_MAX = 2.0


class Durable(Protocol):
    """What the writer needs of a session (``SessionActor`` is one)."""

    def take_write(self) -> Write:
        """Hand over everything pending; the session is no longer scheduled."""

    def commit_done(self, write: Write, error: BaseException | None) -> None:
        """``write`` is durable (``error`` None), or failed with ``error`` (the batch's,
        or this session's own refusal)."""

    def requeue(self, write: Write) -> None:
        """``write`` was not written and will be tried again: take it back, in front of
        anything appended since (the session is no longer scheduled)."""


class StoreWriter:
    def __init__(self, store: SessionLog, *, window: float = GROUP_COMMIT_WINDOW, persist: bool = True) -> None:
        self.store = store
        self.window = window
        #: False: batches are acknowledged without being written (sessions then keep their
        #: whole log in memory; see ``Runtime.open(persist=False)``).
        self.persist = persist
        self._scheduled: list[Durable] = []
        self._wakeup = trio.Event()
        self._urgent = trio.Event()  # set by expedite(): someone waits for durability
        self.commits = 0  # transactions committed (for statistics and tests)
        #: Set by ``fail``: the writer is gone and nothing more is committed.
        self.failure: BaseException | None = None
        # One commit at a time: two overlapping drains could land a session's later
        # batch before its earlier one.
        self._lock = trio.Lock()
        #: Set once ``run`` has ended (cancelled, e.g. with its runtime by Ctrl-C): a
        #: ``flush`` then drains itself instead of waiting for a task that is gone.
        self.stopped = False
        #: The error of the last batch while the database fails transiently (the writer
        #: retries); None while commits succeed.
        self.trouble: StoreError | None = None
        #: Called with ``trouble`` whenever it changes (set, or back to None).
        self.trouble_listeners: list[Callable[[StoreError | None], None]] = []
        self.retries = 0  # batches tried again (statistics and tests)
        self._closing = trio.Event()  # set by closing(): no more retries
        #: What every read of a session's history in a worker thread passes (``READ_THREADS``).
        self.readers = trio.CapacityLimiter(READ_THREADS)

    def schedule(self, session: Durable) -> None:
        if self.failure is not None:  # nobody will commit it: say so at once
            session.commit_done(session.take_write(), self.failure)
            return
        self._scheduled.append(session)
        self._wakeup.set()

    def fail(self, error: BaseException) -> None:
        """The writer stopped for good (``error``): every write scheduled now or later
        fails with it at once, so that no ``flush`` waits for a commit that never comes."""
        self.failure = error
        scheduled, self._scheduled = self._scheduled, []
        for session in scheduled:
            session.commit_done(session.take_write(), error)

    def closing(self) -> None:
        """The runtime is closing: a batch that fails is tried once more, at once, and
        then fails for its sessions, so that closing cannot wait for a disk to recover."""
        self._closing.set()
        self._urgent.set()

    def expedite(self) -> None:
        """Commit what is scheduled without waiting out the group-commit window."""
        self._urgent.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit scheduled sessions until cancelled; cancel only after a final ``drain``
        (if it is cancelled first, with everything around it, it tries what is scheduled
        once more on its way out, and later flushes drain)."""
        task_status.started()
        pause = RETRY_FIRST
        try:
            while True:
                await self._wakeup.wait()
                if self.window > 0 and self.trouble is None:
                    with trio.move_on_after(self.window):
                        await self._urgent.wait()
                if self.failure is not None:
                    self.fail(self.failure)
                    continue
                async with self._lock:
                    await self._drain_locked(retry=not self._closing.is_set())
                if self.trouble is None:
                    pause = RETRY_FIRST
                else:  # the batch was handed back: wait before trying again
                    if self.retries & (self.retries - 1) == 0:  # the 1st, 2nd, 4th, 8th, ... time
                        log.warning(
                            "store commit failed; retrying", error=str(self.trouble), retry_in=pause, retries=self.retries
                        )
                    with trio.move_on_after(pause):
                        await self._closing.wait()
                    pause = min(pause * 2, RETRY_MAX)
        finally:
            self.stopped = True
            if self._scheduled and self.failure is None:
                # Cancelled with writes handed back or not yet taken: a flush may already
                # wait for them, and only a commit (done or failed) wakes it. Try once.
                with trio.CancelScope(shield=True):
                    await self.drain()

    async def drain(self) -> None:
        """Commit everything scheduled so far (and what arrives meanwhile)."""
        if self.failure is not None:
            self.fail(self.failure)
            return
        async with self._lock:
            await self._drain_locked(retry=False)

    async def _drain_locked(self, *, retry: bool) -> None:
        """Commit batches until nothing is scheduled; with ``retry``, a transient failure
        hands the batch back and returns (``trouble`` set) instead of failing it."""
        while self._scheduled:
            sessions, self._scheduled = self._scheduled, []
            self._wakeup = trio.Event()
            self._urgent = trio.Event()
            writes = [session.take_write() for session in sessions]
            refused: dict[str, StoreError] = {}
            error: BaseException | None = None
            try:
                # Shielded: a commit that has started must finish so memory and disk agree.
                with trio.CancelScope(shield=True):
                    if self.persist:
                        refused = await self.store.acommit(writes)
                self.commits += 1
            except StoreError as exc:
                if retry and exc.transient:  # nothing was written: all of it again, later
                    self.retries += 1
                    for session, write in zip(sessions, writes, strict=True):
                        session.requeue(write)  # schedules it again
                    self._set_trouble(exc)
                    return
                error = exc
            except Exception as exc:  # a disk or schema failure: report it to the sessions
                error = exc
            if error is not None:
                log.error("store commit failed", sessions=len(writes), error=repr(error))
            elif self.trouble is not None:
                log.warning("store commits succeed again", retries=self.retries)
                self._set_trouble(None)
            # A session whose part was refused fails alone; the rest of the batch is durable.
            for session, write in zip(sessions, writes, strict=True):
                session.commit_done(write, error if error is not None else refused.get(write.session_id))

    def _set_trouble(self, trouble: StoreError | None) -> None:
        changed = (trouble is None) != (self.trouble is None)
        self.trouble = trouble
        if changed:
            for listener in self.trouble_listeners:
                listener(trouble)
