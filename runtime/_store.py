"""The synchronous session store: session headers and their event logs in SQLite.

Trio actors call every method through ``trio.to_thread.run_sync``, so calls arrive from
arbitrary worker threads and may overlap (one task committing while another loads).
One connection is shared (``check_same_thread=False``) and every operation holds a
``threading.Lock``: SQLite serialises writers anyway, and a single lock also keeps two
threads from interleaving statements inside one transaction.

The interface is deliberately small (open/close, exists, load, commit, list_headers,
last_seq) so that another backend (Redis) can take the same shape.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import trio

from ._errors import LoopdockError
from ._events import Event, SessionHeader
from ._logging import get_logger
from ._messages import Message
from ._private import private_dir, private_file
from ._serde import event_from_wire, header_from_wire, header_to_wire, message_from_wire

log = get_logger(__name__)

#: Bumped whenever the tables change shape; a store never opens a newer one, and
#: migrates an older one in place when it opens it (see ``_MIGRATIONS``).
SCHEMA_VERSION = 2

# Version 2: events live in a rowid table (appended in commit order, so a batch's rows
# share a few pages at the table's end) with a unique (session_id, seq) index for reads
# by session and for refusing a repeated seq. Version 1 clustered the rows themselves by
# (session_id, seq), so with many live sessions every row of a batch landed on its own
# page: in a plain-sqlite reproduction (10,000 sessions, 1.4 million rows) ~5.1 us of CPU
# per row and growing with the table, against ~3.5 us for this layout (see
# benchmarks/PROFILE.md; in the benchmark's own runs the difference is within noise).
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta("
    "key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS sessions(id TEXT PRIMARY KEY, header TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events("
    "id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "type TEXT NOT NULL, time INTEGER NOT NULL, data TEXT NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS events_by_session ON events(session_id, seq)",
)

# From version N (the key) to N + 1: statements run inside the one transaction that
# also checks and bumps the version, so a migration happens whole or not at all (a
# crash or error leaves version N as it was), and a second opener waiting on the write
# lock finds the new version and skips it.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        # Copied session by session in seq order, so the new table starts clustered.
        "CREATE TABLE events_v2("
        "id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "type TEXT NOT NULL, time INTEGER NOT NULL, data TEXT NOT NULL)",
        "INSERT INTO events_v2(session_id, seq, type, time, data) "
        "SELECT session_id, seq, type, time, data FROM events ORDER BY session_id, seq",
        "DROP TABLE events",
        "ALTER TABLE events_v2 RENAME TO events",
        "CREATE UNIQUE INDEX events_by_session ON events(session_id, seq)",
    ),
}


class StoreError(LoopdockError):
    """Raised when the session store refuses an operation or its database fails.

    Cases: the database has a newer (or unknown) schema version, the store is closed,
    or SQLite itself fails (chained as ``__cause__``): then a batch wrote nothing. A
    session's part of a batch that would re-create an existing session, repeat an event
    seq, add events to a session that does not exist, or store data that is not JSON is
    refused with one too, returned by ``commit`` for that session alone.

    ``transient`` is True when the database failed in a way that can clear by itself (a
    full disk, a lock another process held too long, an I/O error): the same batch may
    succeed when tried again. A refusal, a closed store or a corrupt file is not.
    """

    code = "STORE_ERROR"

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


#: SQLite result codes (``sqlite3.Error.sqlite_errorname``, extended codes included by
#: prefix) of failures that can clear by themselves.
_TRANSIENT_CODES = ("SQLITE_FULL", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_PROTOCOL")


def _is_transient(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", None) or ""
    return name.startswith(_TRANSIENT_CODES)


def _events(value: Iterable[Event]) -> tuple[Event, ...]:
    return tuple(value)


@attrs.frozen
class Write:
    """One session's part of a commit batch; ``header`` only when the session is new."""

    session_id: str
    header: SessionHeader | None
    events: tuple[Event, ...] = attrs.field(converter=_events)


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder(ensure_ascii: bool) -> Any:
    # The C encoder that ``json.dumps`` builds on every call, built once: compact
    # separators, and allow_nan=False (NaN/Infinity are not JSON and other readers, DSH
    # among them, reject them). No circular-reference bookkeeping: a cycle is a
    # RecursionError, refused like any other value that is not JSON.
    # c_make_encoder is CPython's C accelerator, absent from the stubs.
    return json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None,
        _not_json,
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring,
        None, ":", ",", False, False, False,
    )


if getattr(json.encoder, "c_make_encoder", None) is not None:
    _JSON, _JSON_ASCII = _json_encoder(False), _json_encoder(True)

    def _dumps(value: Any, ensure_ascii: bool) -> str:
        return "".join((_JSON_ASCII if ensure_ascii else _JSON)(value, 0))

else:  # no C accelerator (other interpreters): the pure-Python encoder

    def _dumps(value: Any, ensure_ascii: bool) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)


def _encode(value: Any) -> str:
    return _utf8_safe(_dumps(value, False), value)


#: How the store writes a value as JSON text (compact, no NaN, valid UTF-8); the cluster's
#: Redis store writes the same text.
encode_json = _encode


def _utf8_safe(text: str, value: Any) -> str:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (e.g. from surrogateescape-decoded tool output) cannot be
            # stored as UTF-8 text; escaping it keeps the value exact instead of failing.
            text = _dumps(value, True)
    return text


_Row = tuple[str, int, str, int, str]

if getattr(json.encoder, "c_make_encoder", None) is not None:

    def _event_rows(session_id: str, events: Sequence[Event]) -> list[_Row]:
        # _encode inlined: this runs for every event, holding the GIL the trio thread wants.
        join, encode = "".join, _JSON
        rows = []
        for event in events:
            data = event.data
            text = join(encode(data, 0))
            if not text.isascii():
                text = _utf8_safe(text, data)
            rows.append((session_id, event.seq, event.type, event.time, text))
        return rows

else:

    def _event_rows(session_id: str, events: Sequence[Event]) -> list[_Row]:
        return [(session_id, e.seq, e.type, e.time, _encode(e.data)) for e in events]


class _Prepared:
    __slots__ = ("session_id", "header", "events")

    def __init__(self, session_id: str, header: str | None, events: list[_Row]) -> None:
        self.session_id = session_id
        self.header = header
        self.events = events


def _prepare(write: Write) -> _Prepared:
    # Validate and encode before touching the database, so a bad value never opens
    # (let alone half-fills) a transaction.
    session_id = write.session_id
    if write.header is not None and write.header.id != session_id:
        raise StoreError(
            f"write for session {session_id!r} carries the header of "
            f"session {write.header.id!r}"
        )
    try:
        header = None if write.header is None else _encode(header_to_wire(write.header))
        events = _event_rows(session_id, write.events)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StoreError(f"session {session_id!r}: value is not JSON: {exc}") from exc
    return _Prepared(session_id, header, events)


class SessionStore:
    """Session headers and event logs in one SQLite database (see the module doc)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> SessionStore:
        """Open (creating if need be) the database at ``path``, readable by its owner only.

        Its directory is made 0700 and the file 0600 before SQLite opens it: SQLite
        gives the ``-wal`` and ``-shm`` files it creates the database file's mode, so
        they are private too. Ones left by an older loopdock are tightened here.
        """
        path = Path(path)
        try:
            private_dir(path.parent)
            private_file(path, create=True)
            for suffix in ("-wal", "-shm"):
                private_file(path.with_name(path.name + suffix), create=False)
        except OSError as exc:
            raise StoreError(f"cannot open session store {str(path)!r}: {exc}") from exc
        try:
            # isolation_level=None: no implicit transactions; we BEGIN/COMMIT ourselves
            # so a batch is exactly one transaction. timeout: wait for another
            # process's write lock instead of failing at once.
            conn = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=5.0
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open session store {str(path)!r}: {exc}") from exc
        try:
            # The version check runs before anything else changes the file, so a
            # database from a newer loopdock is refused untouched.
            _ensure_schema(conn, path)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"session store {str(path)!r} cannot use WAL (got {mode!r})")
            # WAL + synchronous=NORMAL: a returned commit survives an application
            # crash (it is in the WAL file); only an OS crash or power loss may drop the
            # most recent commits, and never corrupts the database.
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open session store {str(path)!r}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        log.debug("store.opened", path=str(path), schema_version=SCHEMA_VERSION)
        return cls(path, conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def exists(self, session_id: str) -> bool:
        with self._use("check a session") as conn:
            row = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return row is not None

    def load(self, session_id: str) -> tuple[SessionHeader, list[Event]] | None:
        """The session's header and all its events in seq order, or None if unknown."""
        with self._use("load a session") as conn, _transaction(conn, "BEGIN"):
            # One read transaction: the header and events come from the same snapshot
            # even if another process commits in between.
            row = conn.execute(
                "SELECT header FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return None
            rows = conn.execute(
                "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq",
                (session_id,),
            ).fetchall()
        header = header_from_wire(json.loads(row[0]))
        events = [
            event_from_wire({"seq": seq, "type": type_, "time": time, "data": json.loads(data)})
            for seq, type_, time, data in rows
        ]
        return header, events

    def load_events(
        self, session_id: str, start: int = 0, stop: int | None = None, types: Collection[str] | None = None
    ) -> list[Event]:
        """The session's events with ``start <= seq < stop`` (all from ``start`` when
        ``stop`` is None), only those of ``types`` if given, in seq order."""
        sql = "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ?"
        params: list[Any] = [session_id, start]
        if stop is not None:
            sql += " AND seq < ?"
            params.append(stop)
        if types is not None:
            wanted = sorted(types)
            sql += f" AND type IN ({','.join('?' * len(wanted))})"
            params.extend(wanted)
        with self._use("load events") as conn:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [_event_from_row(row) for row in rows]

    def load_messages(self, session_id: str, start: int, stop: int, types: Collection[str]) -> list[Message]:
        """The messages of the session's events of ``types`` (message events) with
        ``start <= seq < stop``, in seq order: what a turn reads back when its history was evicted.
        Each row is decoded straight into its message, never into an event, so a long
        conversation is held about once while it is read, not as rows, events and
        their dicts besides (their peak set the heap's high-water mark)."""
        wanted = sorted(types)
        sql = (
            "SELECT data FROM events WHERE session_id = ? AND seq >= ? AND seq < ? "
            f"AND type IN ({','.join('?' * len(wanted))}) ORDER BY seq"
        )
        with self._use("load messages") as conn:
            rows = conn.execute(sql, [session_id, start, stop, *wanted]).fetchall()
        loads = json.loads
        return [message_from_wire(loads(text)) for (text,) in rows]

    def load_outline(
        self, session_id: str, types: Collection[str]
    ) -> tuple[SessionHeader, int, int, list[Event]] | None:
        """What resuming a session needs without its whole log, from one snapshot: the
        header, the number of events, the last event's time, and the events of
        ``types``; None if the session is unknown."""
        wanted = sorted(types)
        with self._use("load a session outline") as conn, _transaction(conn, "BEGIN"):
            row = conn.execute("SELECT header FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                return None
            last = conn.execute(
                "SELECT seq, time FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 1", (session_id,)
            ).fetchone()
            rows = conn.execute(
                "SELECT seq, type, time, data FROM events WHERE session_id = ? "
                f"AND type IN ({','.join('?' * len(wanted))}) ORDER BY seq",
                [session_id, *wanted],
            ).fetchall()
        count, last_time = (0, 0) if last is None else (last[0] + 1, last[1])
        return header_from_wire(json.loads(row[0])), count, last_time, [_event_from_row(r) for r in rows]

    def commit(self, batch: Sequence[Write]) -> dict[str, StoreError]:
        """Write the batch in one transaction; returns the sessions whose part it refused.

        A session's part (every Write of that session in the batch) is refused whole, and
        the other sessions' parts committed all the same, when it would re-create an
        existing session, repeat a seq, add events to a session that does not exist, or
        holds a value that is not JSON. A failure of the database itself (I/O, a full
        disk, a closed store) raises StoreError and writes nothing of the batch.
        """
        refused: dict[str, StoreError] = {}
        prepared: list[_Prepared] = []
        for write in batch:
            try:
                prepared.append(_prepare(write))
            except StoreError as exc:
                refused.setdefault(write.session_id, exc)
        if refused:
            prepared = [p for p in prepared if p.session_id not in refused]
        if prepared:
            with self._use("commit") as conn, _transaction(conn, "BEGIN IMMEDIATE"):
                refused.update(_apply_isolated(conn, prepared))
        return refused

    async def acommit(self, batch: Sequence[Write]) -> dict[str, StoreError]:
        """``commit`` in a worker thread."""
        return await trio.to_thread.run_sync(self.commit, batch)

    def list_headers(self) -> list[SessionHeader]:
        """Every session's header, oldest first (ties broken by id)."""
        with self._use("list sessions") as conn:
            rows = conn.execute("SELECT header FROM sessions").fetchall()
        headers = [header_from_wire(json.loads(header)) for (header,) in rows]
        return sorted(headers, key=lambda h: (h.created_at, h.id))

    def last_seq(self, session_id: str) -> int | None:
        """The highest committed seq of the session; None if it has no events (or is unknown)."""
        with self._use("read the last seq") as conn:
            row: tuple[int | None] = conn.execute(
                "SELECT MAX(seq) FROM events WHERE session_id = ?", (session_id,)
            ).fetchone()
        return row[0]

    @contextmanager
    def _use(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"cannot {what}: session store {str(self._path)!r} is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise StoreError(f"{what} failed on {str(self._path)!r}: {exc}", transient=_is_transient(exc)) from exc


def _event_from_row(row: tuple[int, str, int, str]) -> Event:
    seq, type_, time, data = row
    return event_from_wire({"seq": seq, "type": type_, "time": time, "data": json.loads(data)})


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        # Also reached when COMMIT itself fails; only roll back what is still open.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


_INSERT_EVENT = "INSERT INTO events(session_id, seq, type, time, data) VALUES (?, ?, ?, ?, ?)"
# Host parameters in one existence check; well below SQLite's limit.
_MAX_PARAMS = 500
# Event rows go in multi-row INSERTs of up to _ROWS_PER_INSERT rows (the rest in
# power-of-two pieces, so that few distinct statements share the connection's statement
# cache). Each statement is one sqlite3_step, and pysqlite releases and re-takes the GIL
# around every step: while the trio thread is busy, each re-take waits for it to hand
# the GIL over (up to the switch interval, 5 ms). With 64 rows per statement a
# saturated runtime's batch of 89,000 events took 2.4 s to commit, for 0.9 s of CPU,
# and a flush waited through it. SQLite's limit on host parameters (32,766 by default
# since 3.32) allows 1,024 rows of 5; an SQLite built with a lower one gets fewer.
_ROWS_PER_INSERT = 1024
_INSERT_EVENTS = {
    n: "INSERT INTO events(session_id, seq, type, time, data) VALUES "
    + ",".join(["(?,?,?,?,?)"] * n)
    for n in (1 << i for i in range(_ROWS_PER_INSERT.bit_length()))
}


def _insert_rows(conn: sqlite3.Connection, rows: list[tuple[str, int, str, int, str]]) -> None:
    most = _ROWS_PER_INSERT
    while most > 1 and 5 * most > conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER):
        most >>= 1
    start, total = 0, len(rows)
    while start < total:
        n = most
        while n > total - start:
            n >>= 1
        conn.execute(_INSERT_EVENTS[n], list(chain.from_iterable(rows[start : start + n])))
        start += n


# What one session's part of a batch can cause; anything else is the database failing.
_REFUSALS = (sqlite3.IntegrityError, StoreError)


def _apply_isolated(conn: sqlite3.Connection, batch: Sequence[_Prepared]) -> dict[str, StoreError]:
    """Apply ``batch`` inside the caller's transaction; a session whose part is refused
    leaves no row behind and does not stop the others. Returns the refused sessions.

    The whole batch goes first (a few statements, the common case); only if some part
    is refused is it undone and replayed session by session, each in its own savepoint.
    """
    # No ``finally`` around the savepoints: after a failure of the database itself
    # SQLite may have rolled back the whole transaction, and the caller rolls back.
    conn.execute("SAVEPOINT batch")
    try:
        _apply(conn, batch)
    except _REFUSALS:
        conn.execute("ROLLBACK TO batch")
        conn.execute("RELEASE batch")  # ROLLBACK TO leaves the savepoint open
    else:
        conn.execute("RELEASE batch")
        return {}
    by_session: dict[str, list[_Prepared]] = {}
    for write in batch:
        by_session.setdefault(write.session_id, []).append(write)
    refused: dict[str, StoreError] = {}
    for session_id, writes in by_session.items():
        conn.execute("SAVEPOINT session")
        try:
            _apply(conn, writes)
        except _REFUSALS as exc:
            conn.execute("ROLLBACK TO session")
            refused[session_id] = (
                exc if isinstance(exc, StoreError) else StoreError(f"session {session_id!r}: {exc}")
            )
        conn.execute("RELEASE session")
    return refused


def _apply(conn: sqlite3.Connection, batch: Sequence[_Prepared]) -> None:
    """A few statements per batch, whatever its size: the headers, one existence check
    for the sessions written without one, then the event rows in multi-row INSERTs."""
    for write in batch:
        if write.header is not None:
            try:
                conn.execute(
                    "INSERT INTO sessions(id, header) VALUES (?, ?)", (write.session_id, write.header)
                )
            except sqlite3.IntegrityError as exc:
                raise StoreError(f"session {write.session_id!r} already exists") from exc
    # Sees the sessions inserted just above: same transaction.
    _check_sessions_exist(conn, [w.session_id for w in batch if w.header is None and w.events])
    rows = [row for write in batch for row in write.events]
    if not rows:
        return
    conn.execute("SAVEPOINT event_rows")
    try:
        _insert_rows(conn, rows)
    except sqlite3.IntegrityError:
        # Name the offending row: undo the partial insert and replay row by row (the
        # caller rolls back the rows that went in).
        conn.execute("ROLLBACK TO event_rows")
        for row in rows:
            try:
                conn.execute(_INSERT_EVENT, row)
            except sqlite3.IntegrityError as exc:
                raise StoreError(
                    f"session {row[0]!r} already has an event with seq {row[1]}"
                ) from exc
        raise
    conn.execute("RELEASE event_rows")


def _check_sessions_exist(conn: sqlite3.Connection, session_ids: Sequence[str]) -> None:
    wanted = list(dict.fromkeys(session_ids))
    for start in range(0, len(wanted), _MAX_PARAMS):
        chunk = wanted[start : start + _MAX_PARAMS]
        where = f"WHERE id IN ({','.join('?' * len(chunk))})"
        # A count is one step (one GIL hand-off, see _ROWS_PER_INSERT); the rows, one per
        # session, only when some session is missing.
        (count,) = conn.execute(f"SELECT count(*) FROM sessions {where}", chunk).fetchone()
        if count == len(chunk):
            continue
        found = {row[0] for row in conn.execute(f"SELECT id FROM sessions {where}", chunk)}
        for session_id in chunk:
            if session_id not in found:
                raise StoreError(
                    f"events for session {session_id!r}, which does not exist "
                    "(a new session's first write must carry its header)"
                )


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    # IMMEDIATE: two processes opening a fresh (or older) file at once cannot both
    # create (or migrate) it; the second one waits and then finds the current version.
    with _transaction(conn, "BEGIN IMMEDIATE"):
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
            )
            return
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = None if row is None else row[0]
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise StoreError(
                f"session store {str(path)!r} has schema version {version}, newer than "
                f"the {SCHEMA_VERSION} this loopdock reads; upgrade loopdock to open it"
            )
        if not (isinstance(version, int) and (version == SCHEMA_VERSION or version in _MIGRATIONS)):
            raise StoreError(
                f"session store {str(path)!r} has unknown schema version {version!r} "
                f"(expected {SCHEMA_VERSION} or one of the older {sorted(_MIGRATIONS)})"
            )
        if version == SCHEMA_VERSION:
            return
        log.info("store.migrating", path=str(path), from_version=version, to_version=SCHEMA_VERSION)
        while version < SCHEMA_VERSION:
            for statement in _MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
