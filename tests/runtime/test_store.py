"""SessionStore: SQLite persistence of session headers and event logs."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from loopdock.runtime._errors import LoopdockError
from loopdock.runtime._events import Event, SessionHeader
from loopdock.runtime._store import SCHEMA_VERSION, SessionStore, StoreError, Write


def header(session_id: str, created_at: int = 1_700_000_000_000, **kw: object) -> SessionHeader:
    return SessionHeader(id=session_id, created_at=created_at, cwd="/w", **kw)  # type: ignore[arg-type]


def event(seq: int, data: dict | None = None, type_: str = "user/message") -> Event:
    return Event(type=type_, seq=seq, time=1_700_000_000_000 + seq, data=data or {"n": seq})


def refusals(store: SessionStore, batch: list[Write]) -> dict[str, str]:
    """Commit ``batch``; the refused sessions with their messages (each a StoreError)."""
    refused = store.commit(batch)
    for error in refused.values():
        assert isinstance(error, StoreError) and isinstance(error, LoopdockError)
        assert error.code == "STORE_ERROR"
    return {session_id: str(error) for session_id, error in refused.items()}


@pytest.fixture
def store(tmp_path):
    with SessionStore.open(tmp_path / "db" / "sessions.sqlite") as s:
        yield s


def test_round_trip_header_and_events_with_unicode_and_nesting(store):
    h = header("s1", parent_session="p0", agent_preset="coder")
    data = {
        "text": "héllo wörld — 你好 🌍",
        "nested": {"list": [1, 2.5, None, True, {"deep": ["ß", {"x": []}]}], "empty": {}},
        "lone surrogate": "\udc80",  # stored escaped, read back exactly
    }
    events = (event(0, data), event(1, {"k": "v"}, "assistant/message"))
    store.commit([Write("s1", h, events)])

    loaded = store.load("s1")
    assert loaded == (h, list(events))
    assert store.exists("s1")
    assert store.last_seq("s1") == 1


def test_data_is_stored_as_compact_unescaped_json(tmp_path):
    path = tmp_path / "s.sqlite"
    with SessionStore.open(path) as s:
        s.commit([Write("s1", header("s1"), (event(0, {"a": [1, 2], "t": "é"}),))])
    raw = sqlite3.connect(path)
    (data,) = raw.execute("SELECT data FROM events").fetchone()
    raw.close()
    assert data == '{"a":[1,2],"t":"é"}'


def test_events_load_in_seq_order_whatever_the_commit_order(store):
    store.commit([Write("s1", header("s1"), (event(2), event(0)))])
    store.commit([Write("s1", None, (event(1), event(3)))])
    _, events = store.load("s1")
    assert [e.seq for e in events] == [0, 1, 2, 3]


def test_unknown_session(store):
    assert store.load("nope") is None
    assert not store.exists("nope")
    assert store.last_seq("nope") is None


def test_last_seq_is_none_for_a_session_without_events(store):
    store.commit([Write("s1", header("s1"), ())])
    assert store.exists("s1")
    assert store.last_seq("s1") is None
    assert store.load("s1") == (header("s1"), [])


def test_a_duplicate_seq_refuses_that_session_alone(store):
    store.commit([Write("old", header("old"), (event(0),))])
    batch = [
        Write("a", header("a"), (event(0), event(1))),
        Write("b", header("b"), (event(0),)),
        Write("a", None, (event(1, {"dup": True}),)),  # repeats (a, 1)
        Write("old", None, (event(1),)),
    ]
    assert refusals(store, batch) == {"a": "session 'a' already has an event with seq 1"}

    # Nothing of "a" (its header included); every other session's part is there.
    assert not store.exists("a") and store.load("a") is None
    assert store.load("b") == (header("b"), [event(0)])
    assert store.load("old") == (header("old"), [event(0), event(1)])
    # The store still takes writes, "a" included.
    assert store.commit([Write("a", header("a"), (event(0),))]) == {}
    assert store.load("a") == (header("a"), [event(0)])


def test_duplicate_seq_against_committed_events_is_refused(store):
    store.commit([Write("s1", header("s1"), (event(0),))])
    assert refusals(store, [Write("s1", None, (event(1), event(0, {"other": 1})))]) == {
        "s1": "session 's1' already has an event with seq 0"
    }
    assert store.load("s1") == (header("s1"), [event(0)])


def test_a_duplicate_header_refuses_that_session_alone(store):
    store.commit([Write("a", header("a", created_at=1), (event(0),))])
    batch = [
        Write("b", header("b"), (event(0),)),
        Write("a", header("a", created_at=5), (event(1),)),
    ]
    assert refusals(store, batch) == {"a": "session 'a' already exists"}
    assert store.load("b") == (header("b"), [event(0)])
    assert store.load("a") == (header("a", created_at=1), [event(0)])


def test_same_header_twice_in_one_batch_is_refused(store):
    batch = [Write("a", header("a"), ()), Write("a", header("a"), ()), Write("b", header("b"), ())]
    assert refusals(store, batch) == {"a": "session 'a' already exists"}
    assert not store.exists("a") and store.exists("b")


def test_events_for_a_session_without_header_are_refused(store):
    batch = [Write("ghost", None, (event(0),)), Write("real", header("real"), (event(0),))]
    assert "does not exist" in refusals(store, batch)["ghost"]
    assert store.last_seq("ghost") is None
    assert store.load("real") == (header("real"), [event(0)])


def test_a_database_failure_raises_and_writes_nothing(store):
    # Not one session's fault (here: the events table is gone): the whole batch fails.
    store.commit([Write("a", header("a"), (event(0),))])
    store._conn.execute("ALTER TABLE events RENAME TO events_gone")
    with pytest.raises(StoreError, match="commit failed.*no such table") as info:
        store.commit([Write("b", header("b"), ()), Write("a", None, (event(1),))])
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    store._conn.execute("ALTER TABLE events_gone RENAME TO events")
    assert not store.exists("b") and store.last_seq("a") == 0


def test_header_and_events_of_a_new_session_may_come_in_separate_writes(store):
    store.commit([Write("a", header("a"), ()), Write("a", None, (event(0),))])
    assert store.load("a") == (header("a"), [event(0)])


def test_header_id_must_match_the_write(store):
    assert "carries the header of session 'b'" in refusals(store, [Write("a", header("b"), ())])["a"]
    assert not store.exists("a") and not store.exists("b")


def test_non_json_data_refuses_that_session_alone(store):
    batch = [
        Write("a", header("a"), (event(0),)),
        Write("b", header("b"), (event(0),)),
        Write("b", None, (event(1, {"x": float("nan")}),)),  # its first Write is refused too
        Write("c", header("c"), (event(0, {"x": object()}),)),
    ]
    messages = refusals(store, batch)
    assert sorted(messages) == ["b", "c"]
    assert all("not JSON" in message for message in messages.values())
    assert [h.id for h in store.list_headers()] == ["a"]


def test_list_headers_sorted_by_created_at_then_id(store):
    store.commit(
        [
            Write("c", header("c", 10), ()),
            Write("b", header("b", 20), ()),
            Write("a", header("a", 20), ()),
            Write("d", header("d", 5), ()),
        ]
    )
    assert [h.id for h in store.list_headers()] == ["d", "c", "a", "b"]


def test_reopen_after_close_keeps_everything(tmp_path):
    path = tmp_path / "nested" / "dir" / "sessions.sqlite"
    h = header("s1", agent_preset="x")
    with SessionStore.open(path) as first:
        first.commit([Write("s1", h, (event(0), event(1)))])
        first.commit([Write("s1", None, (event(2),)), Write("s2", header("s2", 1), ())])

    with SessionStore.open(path) as second:
        assert second.load("s1") == (h, [event(0), event(1), event(2)])
        assert second.last_seq("s1") == 2
        assert [x.id for x in second.list_headers()] == ["s2", "s1"]


def test_wal_mode_is_on_and_synchronous_is_normal(tmp_path):
    path = tmp_path / "s.sqlite"
    with SessionStore.open(path) as s:
        # journal_mode=WAL is persistent in the file, so a separate connection sees it.
        other = sqlite3.connect(path)
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        other.close()
        # synchronous is per connection: 1 == NORMAL.
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_schema_version_is_recorded(tmp_path):
    path = tmp_path / "s.sqlite"
    SessionStore.open(path).close()
    raw = sqlite3.connect(path)
    row = raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    raw.close()
    assert row == (SCHEMA_VERSION,)


def test_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    with SessionStore.open(path) as s:
        s.commit([Write("a", header("a"), ())])
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    raw.close()

    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer") as info:
        SessionStore.open(path)
    assert info.value.code == "STORE_ERROR"


@pytest.mark.parametrize(
    "tamper",
    [
        "UPDATE meta SET value = 0 WHERE key = 'schema_version'",
        "DELETE FROM meta WHERE key = 'schema_version'",
    ],
)
def test_unknown_or_missing_schema_version_is_refused(tmp_path, tamper):
    path = tmp_path / "s.sqlite"
    SessionStore.open(path).close()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute(tamper)
    raw.close()
    with pytest.raises(StoreError, match="unknown schema version"):
        SessionStore.open(path)


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        SessionStore.open(path)


def test_closed_store_refuses_operations(tmp_path):
    s = SessionStore.open(tmp_path / "s.sqlite")
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="is closed"):
        s.exists("a")
    with pytest.raises(StoreError, match="is closed"):
        s.commit([Write("a", header("a"), ())])


def test_write_is_frozen_and_holds_a_tuple_of_events():
    w = Write("a", None, [event(0)])  # type: ignore[arg-type]
    assert w.events == (event(0),)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        w.session_id = "b"  # type: ignore[misc]


async def test_concurrent_commits_and_loads_from_worker_threads(store):
    writers, batches, per_batch = 20, 5, 3
    seen_partial: list[str] = []

    async def writer(i: int) -> None:
        sid = f"s{i}"
        for b in range(batches):
            events = tuple(event(b * per_batch + k) for k in range(per_batch))
            write = Write(sid, header(sid, i) if b == 0 else None, events)
            await trio.to_thread.run_sync(store.commit, [write])

    async def reader(i: int) -> None:
        for _ in range(batches):
            loaded = await trio.to_thread.run_sync(store.load, f"s{i}")
            await trio.to_thread.run_sync(store.list_headers)
            if loaded is not None:
                seqs = [e.seq for e in loaded[1]]
                # Batches are atomic: a reader sees whole batches, contiguous from 0.
                if len(seqs) % per_batch or seqs != list(range(len(seqs))):
                    seen_partial.append(f"s{i}: {seqs}")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(writers):
                nursery.start_soon(writer, i)
                nursery.start_soon(reader, i)

    assert seen_partial == []
    assert [h.id for h in store.list_headers()] == [f"s{i}" for i in range(writers)]
    for i in range(writers):
        h, events = store.load(f"s{i}")
        assert h == header(f"s{i}", i)
        assert [e.seq for e in events] == list(range(batches * per_batch))


# --- property: any sequence of valid batches, then load == what was committed ---

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)
event_data = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
session_ids = st.sampled_from(["a", "b", "c", "d"])


@given(st.data())
def test_property_committed_batches_load_back_in_seq_order(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("prop") / "s.sqlite"
    # The model: what the store must hold. Seqs are handed out in a shuffled order so
    # load's ordering is really exercised.
    model: dict[str, tuple[SessionHeader, dict[int, Event]]] = {}
    free_seqs: dict[str, list[int]] = {}

    with SessionStore.open(path) as s:
        for _ in range(data.draw(st.integers(1, 6), label="batches")):
            batch: list[Write] = []
            staged: dict[str, tuple[SessionHeader, dict[int, Event]]] = {}
            for sid in data.draw(st.lists(session_ids, min_size=1, max_size=4), label="ids"):
                is_new = sid not in model and sid not in staged
                h = header(sid, data.draw(st.integers(0, 3))) if is_new else None
                if sid not in free_seqs:
                    free_seqs[sid] = data.draw(st.permutations(range(40)))
                pool = free_seqs[sid]
                n = data.draw(st.integers(0, min(3, len(pool))))
                events = tuple(
                    Event(
                        type=data.draw(st.sampled_from(["user/message", "tool/result"])),
                        seq=pool.pop(),
                        time=data.draw(st.integers(0, 2**62)),
                        data=data.draw(event_data),
                    )
                    for _ in range(n)
                )
                batch.append(Write(sid, h, events))
                hdr, evs = staged.get(sid) or model.get(sid) or (h, {})
                staged[sid] = (hdr, {**evs, **{e.seq: e for e in events}})

            s.commit(batch)
            model.update(staged)

        for sid in ["a", "b", "c", "d"]:
            if sid not in model:
                assert s.load(sid) is None
                continue
            hdr, evs = model[sid]
            assert s.load(sid) == (hdr, [evs[seq] for seq in sorted(evs)])
            assert s.last_seq(sid) == (max(evs) if evs else None)
        expected = sorted((hdr for hdr, _ in model.values()), key=lambda h: (h.created_at, h.id))
        assert s.list_headers() == expected


@given(st.data())
def test_property_a_refused_session_never_costs_another_its_write(tmp_path_factory, data):
    # Batches over a few sessions where some parts repeat a seq (already committed or
    # earlier in the batch) or name a session that does not exist: exactly those
    # sessions are refused, whole, and every other part is committed.
    path = tmp_path_factory.mktemp("prop") / "s.sqlite"
    committed: dict[str, list[int]] = {}
    with SessionStore.open(path) as s:
        for _ in range(data.draw(st.integers(1, 5), label="batches")):
            batch: list[Write] = []
            seqs: dict[str, list[int]] = {}
            created: set[str] = set()  # by a header in this batch
            bad: set[str] = set()
            for sid in data.draw(st.lists(session_ids, min_size=1, max_size=6), label="ids"):
                exists = sid in committed or sid in created
                with_header = not exists and data.draw(st.booleans(), label="header")
                if with_header:
                    created.add(sid)
                taken = committed.get(sid, []) + seqs.get(sid, [])
                fresh = max(taken, default=-1) + 1
                news = list(range(fresh, fresh + data.draw(st.integers(0, 3))))
                if taken and data.draw(st.booleans(), label="repeat"):
                    news.append(data.draw(st.sampled_from(taken)))
                    bad.add(sid)
                batch.append(Write(sid, header(sid) if with_header else None, tuple(event(n) for n in news)))
                seqs.setdefault(sid, []).extend(news)
            # Events for a session nobody created (a header anywhere in the batch counts).
            bad |= {sid for sid, news in seqs.items() if news and sid not in committed and sid not in created}
            refused = s.commit(batch)
            assert set(refused) == bad
            for sid, news in seqs.items():
                if sid not in bad and (sid in committed or sid in created):
                    committed.setdefault(sid, []).extend(news)
            for sid in "abcd":
                loaded = s.load(sid)
                assert (loaded is not None) == (sid in committed)
                if loaded is not None:
                    assert [e.seq for e in loaded[1]] == sorted(committed[sid])


# --- schema version 2 and the migration from version 1 ---

# The version 1 tables exactly as loopdock created them (frozen here: the module only
# knows how to migrate them).
V1_DDL = (
    "CREATE TABLE IF NOT EXISTS meta("
    "key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS sessions(id TEXT PRIMARY KEY, header TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events("
    "session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, "
    "time INTEGER NOT NULL, data TEXT NOT NULL, "
    "PRIMARY KEY(session_id, seq)) WITHOUT ROWID",
)


def make_v1_home(path, sessions: dict[str, tuple[SessionHeader, list[Event]]]) -> None:
    """A version 1 database written the way version 1 loopdock wrote it (WAL, rows
    inserted interleaved across sessions and out of seq order)."""
    import json

    from loopdock.runtime._serde import header_to_wire

    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    for statement in V1_DDL:
        raw.execute(statement)
    raw.execute("INSERT INTO meta(key, value) VALUES ('schema_version', 1)")
    raw.execute("COMMIT")
    assert raw.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    raw.execute("BEGIN IMMEDIATE")
    for sid, (h, _) in sessions.items():
        raw.execute(
            "INSERT INTO sessions(id, header) VALUES (?, ?)",
            (sid, json.dumps(header_to_wire(h), separators=(",", ":"))),
        )
    rows = [
        (sid, e.seq, e.type, e.time, json.dumps(e.data, separators=(",", ":")))
        for sid, (_, events) in sessions.items()
        for e in events
    ]
    rows.sort(key=lambda r: (-r[1], r[0]))  # newest seq first, sessions interleaved
    raw.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows)
    raw.execute("COMMIT")
    raw.close()


def v1_sessions() -> dict[str, tuple[SessionHeader, list[Event]]]:
    return {
        "a": (header("a", 2, agent_preset="coder"), [event(i, {"i": i, "t": "é🌍"}) for i in range(30)]),
        "b": (header("b", 1), [event(i, type_="tool/result") for i in range(7)]),
        "empty": (header("empty", 3), []),
    }


def schema_of(path) -> tuple[int, str, list[str]]:
    raw = sqlite3.connect(path)
    try:
        (version,) = raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        (events_sql,) = raw.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'"
        ).fetchone()
        indexes = [
            name
            for (name,) in raw.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events'"
            )
        ]
    finally:
        raw.close()
    return version, events_sql, indexes


def test_a_new_store_has_rowid_events_and_a_session_index(tmp_path):
    path = tmp_path / "s.sqlite"
    SessionStore.open(path).close()
    version, events_sql, indexes = schema_of(path)
    assert version == SCHEMA_VERSION == 2
    assert "WITHOUT ROWID" not in events_sql and "id INTEGER PRIMARY KEY" in events_sql
    assert indexes == ["events_by_session"]


def test_reads_by_session_use_the_index_in_seq_order(store):
    conn = store._conn
    plans = {
        query: " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", ("s",)))
        for query in (
            "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq",
            "SELECT MAX(seq) FROM events WHERE session_id = ?",
        )
    }
    for query, plan in plans.items():
        assert "SEARCH events USING" in plan and "INDEX events_by_session (session_id=?)" in plan, (
            query, plan,
        )
        assert "TEMP B-TREE" not in plan, (query, plan)  # no sort: the index is the order


def test_a_version_1_home_is_migrated_with_every_event_in_order(tmp_path):
    path = tmp_path / "sessions.db"
    sessions = v1_sessions()
    make_v1_home(path, sessions)
    assert schema_of(path)[0] == 1

    with SessionStore.open(path) as s:
        for sid, (h, events) in sessions.items():
            assert s.load(sid) == (h, events)
            assert s.last_seq(sid) == (events[-1].seq if events else None)
        assert [h.id for h in s.list_headers()] == ["b", "a", "empty"]
        # It takes more writes, and still refuses a seq the old table held.
        s.commit([Write("a", None, (event(30),)), Write("empty", None, (event(0),))])
        s.commit([Write("c", header("c", 4), (event(0), event(1)))])
        assert refusals(s, [Write("b", None, (event(7), event(6)))]) == {
            "b": "session 'b' already has an event with seq 6"
        }
    version, events_sql, indexes = schema_of(path)
    assert (version, indexes) == (2, ["events_by_session"])
    assert "WITHOUT ROWID" not in events_sql

    # Opening again is a no-op (the migration ran once) and everything is still there.
    with SessionStore.open(path) as s:
        assert s.load("a") == (sessions["a"][0], [*sessions["a"][1], event(30)])
        assert s.load("b") == sessions["b"]
        assert s.load("empty") == (sessions["empty"][0], [event(0)])
        assert s.load("c") == (header("c", 4), [event(0), event(1)])
        assert [h.id for h in s.list_headers()] == ["b", "a", "empty", "c"]
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT COUNT(*) FROM events").fetchone() == (30 + 1 + 7 + 1 + 2,)
    assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    raw.close()


def test_a_failed_migration_leaves_version_1_untouched(tmp_path, monkeypatch):
    from loopdock.runtime import _store

    path = tmp_path / "sessions.db"
    sessions = v1_sessions()
    make_v1_home(path, sessions)
    before = schema_of(path)
    # The migration's last statement fails: everything before it must be rolled back.
    broken = (*_store._MIGRATIONS[1], "INSERT INTO no_such_table VALUES (1)")
    monkeypatch.setitem(_store._MIGRATIONS, 1, broken)
    with pytest.raises(StoreError, match="cannot open.*no_such_table"):
        SessionStore.open(path)
    assert schema_of(path) == before
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT COUNT(*) FROM events").fetchone() == (37,)
    assert raw.execute(
        "SELECT name FROM sqlite_master WHERE name = 'events_v2'"
    ).fetchone() is None
    raw.close()

    monkeypatch.undo()
    with SessionStore.open(path) as s:
        for sid, (h, events) in sessions.items():
            assert s.load(sid) == (h, events)
    assert schema_of(path)[0] == 2


async def test_two_stores_opening_a_version_1_home_at_once_migrate_it_once(tmp_path):
    path = tmp_path / "sessions.db"
    sessions = v1_sessions()
    make_v1_home(path, sessions)
    stores: list[SessionStore] = []

    async def open_one() -> None:
        stores.append(await trio.to_thread.run_sync(SessionStore.open, path))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(open_one)
    try:
        for s in stores:
            for sid, (h, events) in sessions.items():
                assert s.load(sid) == (h, events)
    finally:
        for s in stores:
            s.close()
    assert schema_of(path)[0] == 2


@pytest.mark.parametrize("host_parameters", [None, 99])
def test_large_batches_are_written_whole_and_a_late_duplicate_is_named(store, host_parameters):
    # 2,203 rows = 1,024 + 1,024 + 128 + 16 + 8 + 2 + 1 rows per INSERT; an SQLite that
    # allows 99 host parameters gets INSERTs of 16 rows at most.
    if host_parameters is not None:
        store._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, host_parameters)
    sizes = {"a": 1500, "b": 700, "c": 3}
    batch = [
        Write(sid, header(sid), tuple(event(i, {"sid": sid, "i": i, "t": "ü" * (i % 3)}) for i in range(n)))
        for sid, n in sizes.items()
    ]
    store.commit(batch)
    for sid, n in sizes.items():
        assert store.load(sid) == (header(sid), [event(i, {"sid": sid, "i": i, "t": "ü" * (i % 3)}) for i in range(n)])

    # A repeated seq at row 152 of 190: named, and nothing of its session is written.
    late = [Write("d", header("d"), tuple(event(i) for i in range(150))), Write("a", None, (event(1500), event(5)))]
    late.append(Write("e", header("e"), tuple(event(i) for i in range(38))))
    assert refusals(store, late) == {"a": "session 'a' already has an event with seq 5"}
    assert store.last_seq("a") == 1499
    assert store.last_seq("d") == 149 and store.last_seq("e") == 37


def test_a_missing_session_among_hundreds_of_existing_ones_is_named(store):
    # The existence check counts 500 sessions at a time and names only when a count is short.
    store.commit([Write(f"s{i}", header(f"s{i}"), ()) for i in range(700)])
    batch = [Write(f"s{i}", None, (event(0),)) for i in range(700)]
    batch.insert(600, Write("ghost", None, (event(0),)))
    assert list(refusals(store, batch)) == ["ghost"]
    assert all(store.last_seq(f"s{i}") == 0 for i in (0, 499, 500, 699))


# --- who may read the database ---


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o277])
def test_the_database_and_its_wal_and_shm_are_0600_whatever_the_umask(tmp_path, mask):
    path = tmp_path / "home" / "sessions.db"
    with umask(mask), SessionStore.open(path) as s:
        s.commit([Write("a", header("a"), (event(0),))])  # the WAL files exist while open
        assert mode(path) == 0o600
        assert mode(path.with_name("sessions.db-wal")) == 0o600
        assert mode(path.with_name("sessions.db-shm")) == 0o600
        assert mode(path.parent) == 0o700


def test_an_existing_database_others_may_read_is_made_private(tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore.open(path) as s:
        s.commit([Write("a", header("a"), (event(0),))])
        # An older loopdock left them readable while its store was open (WAL files exist).
        for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
            (tmp_path / name).chmod(0o644)
        with SessionStore.open(path) as again:
            assert again.load("a") == (header("a"), [event(0)])
            for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
                assert mode(tmp_path / name) == 0o600, name
