"""SessionActor + StoreWriter: the envelope, preparing vs published, batching,
durability, and subscribers (driven directly, without a Runtime)."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

import loopdock.actors._session as session_mod
from loopdock.actors import SessionActor, SessionClosedError, StoreWriter
from loopdock.runtime import KNOWN_EVENT_TYPES, SubscriberDroppedError, UnknownEventTypeError
from loopdock.runtime._events import Event, SessionHeader
from loopdock.runtime._serde import event_to_wire
from loopdock.runtime._store import SessionStore, StoreError, Write


def header(session_id: str) -> SessionHeader:
    return SessionHeader(id=session_id, created_at=1_700_000_000_000, cwd="/w")


def wire(events) -> list[dict]:
    return [event_to_wire(e) for e in events]


@asynccontextmanager
async def running_writer(tmp_path, *, start: bool = True):
    """A store on tmp_path and its StoreWriter (its ``run`` task started unless told not)."""
    path = tmp_path / "sessions.db"
    store = SessionStore.open(path)
    try:
        writer = StoreWriter(store)
        async with trio.open_nursery() as nursery:
            if start:
                await nursery.start(writer.run)
            yield path, store, writer, nursery
            await writer.drain()
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def collect(subscription, into: list) -> None:
    async for item in subscription:
        into.append(item)


# -- 1. the envelope ---------------------------------------------------------------------


async def test_seq_is_contiguous_from_zero_across_many_appends(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            s = SessionActor(header("s1"), writer)
            s.publish()
            appended = []
            for i in range(300):
                appended.append(s.append("user/message", {"i": i}))
                if i % 37 == 0:
                    await trio.testing.wait_all_tasks_blocked()  # let commits interleave
            await s.flush()
            assert [e.seq for e in appended] == list(range(300))
            assert [e.seq for e in (await s.read_events())] == list(range(300))
            assert s.committed_count == 300
            _, loaded = store.load("s1")
            assert [e.seq for e in loaded] == list(range(300))
            assert [e.data["i"] for e in loaded] == list(range(300))


async def test_time_never_decreases_when_the_wall_clock_goes_backwards(tmp_path, monkeypatch):
    clock = iter([5_000, 4_000, 6_000, 1_000, 6_000, 7_000, 2, 8_000])
    monkeypatch.setattr(session_mod, "_now_ms", lambda: next(clock))
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            s = SessionActor(header("s1"), writer)
            s.publish()
            times = [s.append("user/message", {"i": i}).time for i in range(8)]
            await s.flush()
            assert times == [5_000, 5_000, 6_000, 6_000, 6_000, 7_000, 7_000, 8_000]
            assert [e.time for e in store.load("s1")[1]] == times


async def test_time_of_a_loaded_session_continues_from_its_last_event(tmp_path, monkeypatch):
    monkeypatch.setattr(session_mod, "_now_ms", lambda: 10)
    writer = StoreWriter(None)  # type: ignore[arg-type]  (never published: no store needed)
    loaded = [Event("user/message", 0, 1_000, {}), Event("turn/start", 1, 2_000, {"turn": 1})]
    s = SessionActor(header("s1"), writer, events=loaded, persisted=True)
    e = s.append("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}})
    assert (e.seq, e.time) == (2, 2_000)
    assert s.committed_count == 2


async def test_unknown_event_type_is_refused_and_leaves_the_log_unchanged(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            s = SessionActor(header("s1"), writer)
            s.publish()
            s.append("user/message", {"a": 1})
            await s.flush()
            before = ((await s.read_events()), s.committed_count)
            for bad in ("agent/custom", "", "User/Message", "turn/start "):
                with pytest.raises(UnknownEventTypeError):
                    s.append(bad, {"x": 1})
            assert ((await s.read_events()), s.committed_count) == before
            await s.flush()
            nxt = s.append("user/message", {"a": 2})
            assert nxt.seq == 1  # no seq was burnt by the refused appends
            await s.flush()
            assert [e.type for e in store.load("s1")[1]] == ["user/message", "user/message"]


async def test_every_known_event_type_is_accepted_and_stored(tmp_path):
    types = sorted(KNOWN_EVENT_TYPES)
    assert {"turn/start", "turn/end", "system/message"} <= set(types)
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            s = SessionActor(header("s1"), writer)
            s.publish()
            for t in types:
                s.append(t, {"t": t})
            await s.flush()
            assert [e.type for e in store.load("s1")[1]] == types


# -- 2. preparing vs published -----------------------------------------------------------


async def test_unpublished_session_writes_nothing_and_discard_leaves_no_trace(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            s = SessionActor(header("s1"), writer)
            for i in range(5):
                s.append("user/message", {"i": i})
            await s.flush()  # returns at once for an unpublished session
            await writer.drain()
            await trio.testing.wait_all_tasks_blocked()
            assert store.load("s1") is None
            assert s.committed_count == 0 and not s.published

            s.discard()
            await writer.drain()
            await trio.testing.wait_all_tasks_blocked()
            assert store.load("s1") is None
            assert not store.exists("s1")
            assert store.list_headers() == []
            assert writer.commits == 0
            with pytest.raises(SessionClosedError):
                s.append("user/message", {})
            with pytest.raises(SessionClosedError):
                s.publish()


async def test_publish_writes_header_and_every_buffered_event(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            h = SessionHeader(
                id="s1", created_at=123, cwd="/x", parent_session="p", agent_preset="coder"
            )
            s = SessionActor(h, writer)
            for i in range(3):
                s.append("user/message", {"i": i, "text": "héllo 🌍"})
            assert store.load("s1") is None
            s.publish()
            s.append("assistant/message", {"nested": {"l": [1, None, True]}})
            await s.flush()
            assert s.committed_count == 4
            loaded_header, loaded_events = store.load("s1")
            assert loaded_header == h
            assert wire(loaded_events) == wire((await s.read_events()))
            assert len(loaded_events) == 4


async def test_publishing_an_empty_session_persists_its_header(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            s = SessionActor(header("empty"), writer)
            s.publish()
            await s.flush()  # waits for the header even though there is no event
            assert writer.commits == 1
            assert store.load("empty") == (header("empty"), [])


# -- 3. batching -------------------------------------------------------------------------


async def test_appends_to_many_sessions_are_committed_in_few_transactions(tmp_path):
    n_sessions, n_events = 50, 20
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, _n):
            sessions = [SessionActor(header(f"s{i}"), writer) for i in range(n_sessions)]
            # No checkpoint between these appends: the writer cannot run in between.
            for s in sessions:
                s.publish()
                for j in range(n_events):
                    s.append("user/message", {"s": s.id, "j": j})
            assert writer.commits == 0
            for s in sessions:
                await s.flush()
            assert 1 <= writer.commits <= 3, writer.commits
            assert len(store.list_headers()) == n_sessions
            for s in sessions:
                assert s.committed_count == n_events
                _, events = store.load(s.id)
                assert wire(events) == wire((await s.read_events()))


# -- 4. flush = durable across connections ----------------------------------------------


async def test_after_flush_a_separate_connection_sees_every_event(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (path, _store, writer, _n):
            s = SessionActor(header("s1"), writer)
            s.publish()
            for round_ in range(3):
                for i in range(10):
                    s.append("user/message", {"r": round_, "i": i})
                await s.flush()
                with SessionStore.open(path) as other:
                    loaded = other.load("s1")
                    assert loaded is not None
                    assert loaded[0] == header("s1")
                    assert wire(loaded[1]) == wire((await s.read_events()))
                    assert other.last_seq("s1") == 10 * (round_ + 1) - 1


# -- 5. subscribers ----------------------------------------------------------------------


async def test_subscribers_see_events_in_order_and_only_after_commit(tmp_path):
    with trio.fail_after(10):
        # The writer's run task is not started: commits happen only when we drain.
        async with running_writer(tmp_path, start=False) as (_, _store, writer, nursery):
            s = SessionActor(header("s1"), writer)
            sub = s.subscribe()
            got: list[Event] = []
            nursery.start_soon(collect, sub, got)
            for i in range(5):
                s.append("user/message", {"i": i})
            s.publish()
            s.append("user/message", {"i": 5})
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # appended and published, but not committed
            assert s.committed_count == 0

            await writer.drain()
            await trio.testing.wait_all_tasks_blocked()
            assert wire(got) == wire((await s.read_events()))
            assert [e.seq for e in got] == list(range(6))

            s.append("turn/start", {"turn": 1})
            await trio.testing.wait_all_tasks_blocked()
            assert len(got) == 6
            await writer.drain()
            await trio.testing.wait_all_tasks_blocked()
            assert [e.seq for e in got] == list(range(7))
            await s.close()


async def test_subscribing_late_sees_only_later_commits(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, _store, writer, _n):
            s = SessionActor(header("s1"), writer)
            s.publish()
            s.append("user/message", {"i": 0})
            await s.flush()
            sub = s.subscribe()
            s.append("user/message", {"i": 1})
            await s.close()
            assert [e.seq async for e in sub] == [1]


async def test_a_slow_subscriber_is_dropped_without_blocking_the_appender(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, store, writer, nursery):
            s = SessionActor(header("s1"), writer)
            slow = s.subscribe(max_buffer=2)  # never read until the end
            fast_got: list[Event] = []
            nursery.start_soon(collect, s.subscribe(), fast_got)
            buffered = s.subscribe()  # large buffer, read only at the end
            s.publish()
            with trio.fail_after(5):
                for i in range(100):
                    s.append("user/message", {"i": i})
                    if i % 10 == 0:
                        await trio.testing.wait_all_tasks_blocked()
                await s.flush()
            assert len(store.load("s1")[1]) == 100
            await trio.testing.wait_all_tasks_blocked()
            assert [e.seq for e in fast_got] == list(range(100))

            assert slow.drop_reason == "fell-behind"
            assert [(await slow.receive()).seq for _ in range(2)] == [0, 1]
            with pytest.raises(SubscriberDroppedError) as info:
                await slow.receive()
            assert info.value.reason == "fell-behind"
            assert info.value.code == "SUBSCRIBER_DROPPED"

            await s.close()
            # The other subscribers end normally, with everything, in order.
            assert [e.seq async for e in buffered] == list(range(100))
            await trio.testing.wait_all_tasks_blocked()
            assert [e.seq for e in fast_got] == list(range(100))


async def test_iterating_a_dropped_subscription_yields_the_buffer_then_raises(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, _store, writer, _n):
            s = SessionActor(header("s1"), writer)
            slow = s.subscribe(max_buffer=2)
            s.publish()
            for i in range(5):
                s.append("user/message", {"i": i})
            await s.flush()
            seen = []
            with pytest.raises(SubscriberDroppedError) as info:
                async for e in slow:
                    seen.append(e.data["i"])
            assert seen == [0, 1]
            assert info.value.reason == "fell-behind"
            await s.close()


async def test_closing_the_session_ends_subscriptions_normally(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path) as (_, _store, writer, nursery):
            s = SessionActor(header("s1"), writer)
            ended = trio.Event()
            got: list[Event] = []

            async def reader() -> None:
                async for e in s.subscribe():
                    got.append(e)
                ended.set()  # the loop ended without an exception

            nursery.start_soon(reader)
            s.publish()
            s.append("user/message", {})
            s.append("assistant/message", {})
            await s.close()  # flushes first: both events are delivered
            await ended.wait()
            assert [e.seq for e in got] == [0, 1]
            with pytest.raises(StopAsyncIteration):
                await s.subscribe().__anext__()  # subscribing after close: already ended
            with pytest.raises(SessionClosedError):
                s.append("user/message", {})


# -- 6. a session the store refuses fails alone ------------------------------------------


async def test_a_refused_session_fails_alone_and_writes_nothing_after(tmp_path):
    with trio.fail_after(10):
        async with running_writer(tmp_path, start=False) as (path, store, writer, _n):
            sessions = {sid: SessionActor(header(sid), writer) for sid in ("a", "b", "c")}
            for s in sessions.values():
                s.publish()
                s.append("user/message", {"n": 0})
            await writer.drain()
            # What a second writer of the database would do: take b's next seq.
            store.commit([Write("b", None, (Event("user/message", 1, 1, {"intruder": True}),))])
            for s in sessions.values():
                s.append("user/message", {"n": 1})
            before = writer.commits
            await writer.drain()
            assert writer.commits == before + 1  # the three sessions in one batch

            for sid in ("a", "c"):
                await sessions[sid].flush()  # durable, although b failed in the same batch
                assert sessions[sid].committed_count == 2
            with pytest.raises(StoreError, match="'b' already has an event with seq 1"):
                await sessions["b"].flush()

            # b is written no more, so its log on disk never gets a hole; a goes on.
            sessions["b"].append("user/message", {"n": 2})
            sessions["a"].append("user/message", {"n": 2})
            await writer.drain()
            await sessions["a"].flush()
            with pytest.raises(StoreError, match="seq 1"):
                await sessions["b"].flush()
            assert len((await sessions["b"].read_events())) == 3  # kept in memory

        with SessionStore.open(path) as other:
            assert [e.data for e in other.load("a")[1]] == [{"n": 0}, {"n": 1}, {"n": 2}]
            assert [e.data for e in other.load("b")[1]] == [{"n": 0}, {"intruder": True}]
            assert [e.data for e in other.load("c")[1]] == [{"n": 0}, {"n": 1}]


async def test_of_two_new_sessions_with_one_id_the_loser_writes_nothing(tmp_path):
    # The second header is refused; the loser's later events must not land in the
    # winner's log (they would, with no header of their own to be refused).
    with trio.fail_after(10):
        async with running_writer(tmp_path, start=False) as (path, _store, writer, _n):
            winner = SessionActor(header("x"), writer)
            winner.publish()
            winner.append("user/message", {"by": "winner"})
            await writer.drain()
            # Both checked that "x" did not exist before either was committed.
            loser, other = SessionActor(header("x"), writer), SessionActor(header("z"), writer)
            for s, text in ((loser, "loser"), (other, "other")):
                s.publish()
                s.append("user/message", {"by": text})
            await writer.drain()
            await other.flush()
            with pytest.raises(StoreError, match="'x' already exists"):
                await loser.flush()
            loser.append("user/message", {"by": "loser"})
            winner.append("user/message", {"by": "winner"})
            await writer.drain()
            await winner.flush()

        with SessionStore.open(path) as store:
            assert [e.data["by"] for e in store.load("x")[1]] == ["winner", "winner"]
            assert [e.data["by"] for e in store.load("z")[1]] == ["other"]


# -- concurrent drains (regression: drain() used to be re-entrant) -------------------------


class _GatedStore:
    """Delegates to a real store; the commit that creates a session (the header's) waits
    on its worker thread until the test opens the gate, so a second drain has every
    chance to start a commit of its own meanwhile (a re-entrant drain would)."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store
        self.gate = threading.Event()
        self.batches: list[list[int]] = []  # the event seqs of each commit, in commit order

    def commit(self, batch):
        if any(write.header is not None for write in batch):
            assert self.gate.wait(timeout=30), "the test never opened the gate"
        self.batches.append([e.seq for write in batch for e in write.events])
        return self._store.commit(batch)

    async def acommit(self, batch):
        return await trio.to_thread.run_sync(self.commit, batch)

    def __getattr__(self, name):
        return getattr(self._store, name)


async def test_concurrent_drains_keep_a_sessions_writes_in_order(tmp_path):
    with trio.fail_after(10):
        with SessionStore.open(tmp_path / "sessions.db") as store:
            gated = _GatedStore(store)
            writer = StoreWriter(gated)  # type: ignore[arg-type]
            threads = trio.to_thread.current_default_thread_limiter()
            s = SessionActor(header("s1"), writer)
            sub = s.subscribe()
            s.publish()
            s.append("user/message", {"i": 0})
            async with trio.open_nursery() as nursery:
                try:
                    nursery.start_soon(writer.drain)  # takes header + event 0; its commit waits at the gate
                    await trio.testing.wait_all_tasks_blocked()
                    assert threads.borrowed_tokens == 1  # that commit is on its thread
                    s.append("user/message", {"i": 1})
                    nursery.start_soon(writer.drain)  # a second drain while the first is in flight
                    await trio.testing.wait_all_tasks_blocked()
                    # The second drain waits for the first: it has not handed a commit to a
                    # thread (a re-entrant drain would have, and could land event 1 first).
                    assert threads.borrowed_tokens == 1 and gated.batches == []
                finally:
                    gated.gate.set()
            await s.close()
            assert gated.batches == [[0], [1]]
            assert wire(store.load("s1")[1]) == wire((await s.read_events()))
            assert writer.commits == 2
            assert [e.seq async for e in sub] == [0, 1]


def test_appended_events_are_ordinary_frozen_events():
    from loopdock.runtime._events import new_event

    made = new_event("step/start", 3, 17, {"turn": 1})
    assert made == Event("step/start", 3, 17, {"turn": 1})
    assert type(made) is Event and repr(made) == repr(Event("step/start", 3, 17, {"turn": 1}))
    assert hash(new_event("a", 1, 2, ())) == hash(Event("a", 1, 2, ()))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.seq = 4  # type: ignore[misc]


# -- a writer cancelled mid-commit ----------------------------------------------------------


class _TimedStore:
    """Commits nothing and takes ``duration`` (trio time) per commit; records when each
    commit started and which sessions it carried."""

    def __init__(self, duration: float) -> None:
        self.duration = duration
        self.commits: list[tuple[float, list[str]]] = []

    async def acommit(self, batch):
        self.commits.append((trio.current_time(), sorted(write.session_id for write in batch)))
        await trio.sleep(self.duration)
        return {}


async def test_a_writer_cancelled_mid_commit_still_commits_what_a_flush_waits_for(autojump_clock):
    store = _TimedStore(duration=0.005)
    writer = StoreWriter(store, window=0.001)  # type: ignore[arg-type]
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            writer_scope = trio.CancelScope()

            async def run_writer(task_status=trio.TASK_STATUS_IGNORED):
                with writer_scope:
                    await writer.run(task_status=task_status)

            await nursery.start(run_writer)
            first = SessionActor(header("first"), writer)
            first.publish()
            first.append("user/message", {"i": 0})
            await trio.sleep(0.002)  # the first commit is in flight
            waiting = SessionActor(header("waiting"), writer)
            waiting.publish()
            waiting.append("user/message", {"i": 0})
            nursery.start_soon(waiting.flush)  # waits for the batch after the first
            await trio.testing.wait_all_tasks_blocked()
            writer_scope.cancel()  # the commit in flight is shielded; the writer stops after
    assert writer.stopped and waiting.committed_count == 1
    assert [sessions for _, sessions in store.commits] == [["first"], ["waiting"]]
