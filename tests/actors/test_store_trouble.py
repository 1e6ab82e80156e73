"""A session store that fails for a while loses nothing and stops nothing for good.

The failure is SQLite's own: a full disk (``SQLITE_FULL``), made by capping the store
connection's database at the pages it has (``PRAGMA max_page_count``) and lifting the cap
again. While it lasts the writer hands every batch back to its sessions and tries again,
flushes wait, subscribers see nothing new, people's turns go on and automatic ones wait;
afterwards every event is on disk once, in order. Closing the runtime while the disk is
still full fails the last events at once instead of waiting for the disk.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import trio
import trio.testing

import loopdock.actors._store_writer as writer_mod
from loopdock import Message, ProducerSource, Runtime, TextBlock
from loopdock.actors import SessionActor, StoreWriter
from loopdock.runtime._changes import Changes
from loopdock.runtime._events import Event, SessionHeader
from loopdock.runtime._store import SessionStore, StoreError, Write

#: Data that needs new pages whatever room the last ones have left.
BIG = "x" * 20_000


def header(session_id: str) -> SessionHeader:
    return SessionHeader(id=session_id, created_at=1_700_000_000_000, cwd="/w")


def fill(store: SessionStore) -> None:
    """The disk is full: the database may not grow past the pages it has."""
    with store._use("fill the disk") as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages}")


def unfill(store: SessionStore) -> None:
    with store._use("free the disk") as conn:
        conn.execute("PRAGMA max_page_count=1073741823")


class Attempts:
    """Counts the store's commit attempts (the real store does the work)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.done = Changes()  # its version: attempts ended

    @property
    def count(self) -> int:
        return self.done.version

    async def acommit(self, batch: Any) -> Any:
        try:
            return await self.store.acommit(batch)
        finally:
            self.done.notify()

    async def wait_for(self, count: int) -> None:
        await self.done.wait_until(lambda: self.count >= count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def on_disk(path, session_id: str) -> list[tuple[int, Any]]:
    with SessionStore.open(path) as store:
        loaded = store.load(session_id)
    return [] if loaded is None else [(e.seq, e.data.get("n")) for e in loaded[1]]


async def collect(subscription, into: list, ended: trio.Event) -> None:
    async for event in subscription:
        into.append(event.seq)
    ended.set()


def test_a_full_disk_is_a_transient_store_error_and_the_store_goes_on_after_it(tmp_path):
    with SessionStore.open(tmp_path / "s.db") as store:
        store.commit([Write("a", header("a"), (Event("user/message", 0, 1, {"n": 0}),))])
        fill(store)
        with pytest.raises(StoreError, match="full") as info:
            store.commit([Write("a", None, (Event("user/message", 1, 1, {"n": 1, "pad": BIG}),))])
        assert info.value.transient
        assert store.last_seq("a") == 0  # the batch wrote nothing
        unfill(store)
        assert store.commit([Write("a", None, (Event("user/message", 1, 1, {"n": 1, "pad": BIG}),))]) == {}
        assert store.last_seq("a") == 1
        refused = store.commit([Write("a", None, (Event("user/message", 1, 1, {}),))])
        assert not refused["a"].transient  # a refusal is for good

        # Another process holds the write lock longer than the store waits for it.
        with store._use("wait less") as conn:
            conn.execute("PRAGMA busy_timeout=50")
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="locked") as locked:
            store.commit([Write("a", None, (Event("user/message", 2, 1, {}),))])
        assert locked.value.transient
        other.execute("ROLLBACK")
        other.close()
        assert store.commit([Write("a", None, (Event("user/message", 2, 1, {}),))]) == {}
    with pytest.raises(StoreError, match="closed") as closed:
        store.commit([Write("a", None, (Event("user/message", 2, 1, {}),))])
    assert not closed.value.transient


async def test_writes_wait_out_a_full_disk_and_land_whole_and_in_order(tmp_path):
    path = tmp_path / "sessions.db"
    with trio.fail_after(20), SessionStore.open(path) as real:
        store = Attempts(real)
        writer = StoreWriter(store)  # type: ignore[arg-type]
        troubles: list[StoreError | None] = []
        writer.trouble_listeners.append(troubles.append)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            old = SessionActor(header("old"), writer)
            seen: list[int] = []
            ended = trio.Event()
            nursery.start_soon(collect, old.subscribe(), seen, ended)
            old.publish()
            old.append("user/message", {"n": 0})
            await old.flush()
            await trio.testing.wait_all_tasks_blocked()  # the subscriber has it

            fill(real)
            new = SessionActor(header("new"), writer)  # its header waits with its events
            new.publish()
            for n in (1, 2, 3):
                old.append("user/message", {"n": n, "pad": BIG})
            new.append("user/message", {"n": 0, "pad": BIG})
            flushed = trio.Event()

            async def flush_both() -> None:
                await old.flush()
                await new.flush()
                flushed.set()

            nursery.start_soon(flush_both)
            before = store.count
            await store.wait_for(before + 3)  # tried, paused, tried again, ...
            old.append("user/message", {"n": 4})  # appended while the disk is full
            await store.wait_for(store.count + 1)

            assert len(troubles) == 1 and troubles[0] is not None and troubles[0].transient
            assert writer.trouble is not None and writer.trouble.transient and writer.retries >= 4
            assert not flushed.is_set() and old.committed_count == 1
            assert seen == [0]  # subscribers see only what is durable
            assert on_disk(path, "old") == [(0, 0)] and on_disk(path, "new") == []

            unfill(real)
            await flushed.wait()
            assert troubles[1:] == [None] and writer.trouble is None
            assert on_disk(path, "old") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
            assert on_disk(path, "new") == [(0, 0)]
            await old.close()
            await ended.wait()
            assert seen == [0, 1, 2, 3, 4]
            nursery.cancel_scope.cancel()


async def test_closing_on_a_full_disk_fails_the_last_events_at_once(tmp_path, monkeypatch):
    # A pause of an hour between tries: only closing() can end the wait within the test.
    monkeypatch.setattr(writer_mod, "RETRY_FIRST", 3600.0)
    path = tmp_path / "sessions.db"
    with trio.fail_after(20), SessionStore.open(path) as store:
        writer = StoreWriter(store)
        failed = trio.Event()
        writer.trouble_listeners.append(lambda trouble: failed.set())
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            s = SessionActor(header("s"), writer)
            s.publish()
            s.append("user/message", {"n": 0})
            await s.flush()
            fill(store)
            s.append("user/message", {"n": 1, "pad": BIG})
            await failed.wait()
            writer.closing()
            with pytest.raises(StoreError, match="full"):
                await s.flush()
            # The log on disk stays a whole prefix: nothing after the lost event is written.
            unfill(store)
            s.append("user/message", {"n": 2})
            with pytest.raises(StoreError, match="full"):
                await s.flush()
            nursery.cancel_scope.cancel()
    assert on_disk(path, "s") == [(0, 0)]


async def test_a_writer_cancelled_while_a_full_disk_holds_a_flush_still_ends_it(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_mod, "RETRY_FIRST", 3600.0)  # cancelled in its pause
    path = tmp_path / "sessions.db"
    with trio.fail_after(20), SessionStore.open(path) as store:
        writer = StoreWriter(store)
        failed = trio.Event()
        writer.trouble_listeners.append(lambda trouble: failed.set())
        async with trio.open_nursery() as nursery:
            writer_scope = trio.CancelScope()

            async def run_writer(task_status=trio.TASK_STATUS_IGNORED):
                with writer_scope:
                    await writer.run(task_status=task_status)

            await nursery.start(run_writer)
            s = SessionActor(header("s"), writer)
            s.publish()
            s.append("user/message", {"n": 0})
            await s.flush()
            fill(store)
            s.append("user/message", {"n": 1, "pad": BIG})
            outcome: list[BaseException | None] = []

            async def shielded_flush() -> None:  # as a closing agent's flush is
                with trio.CancelScope(shield=True), trio.fail_after(10):  # a deadline of its own
                    try:
                        await s.flush()
                        outcome.append(None)
                    except StoreError as exc:
                        outcome.append(exc)

            nursery.start_soon(shielded_flush)
            await failed.wait()
            await trio.testing.wait_all_tasks_blocked()  # the flush waits for a commit
            writer_scope.cancel()
        assert writer.stopped and len(outcome) == 1
        assert isinstance(outcome[0], StoreError) and outcome[0].transient  # told, not left waiting
    assert on_disk(path, "s") == [(0, 0)]


def automatic(text: str) -> Message:
    return Message("user", (TextBlock(text),), ProducerSource("test-driver"))


async def test_a_runtime_on_a_full_disk_serves_people_holds_automatic_work_and_loses_nothing(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with Runtime.open(home) as rt:
            person = (await rt.create_agent(session_id="person")).agent
            worker = (await rt.create_agent(session_id="worker")).agent
            person.followup("before")
            await person.wait_idle()
            writer = rt.supervisor.writer
            gate = rt.supervisor.admission
            failing = trio.Event()
            writer.trouble_listeners.append(lambda trouble: failing.set())

            fill(writer.store)
            person.followup("on a full disk " + BIG)
            await person.wait_idle()  # a person's turn runs whatever the disk
            await failing.wait()
            assert gate.held is not None and "full" in gate.held
            reservation = worker.reserve(automatic("background work"))
            person.followup("still served")
            await person.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert reservation.state == "pending" and worker.status == "idle"  # held back
            assert person.session.committed_count < person.session.event_count

            unfill(writer.store)
            assert await reservation.wait() == "admitted"
            await worker.wait_idle()
            await person.session.flush()
            await worker.session.flush()
            assert gate.held is None and writer.trouble is None

        async with Runtime.open(home) as rt:
            resumed = await rt.resume_agent(resume_session_id="person")
            users = [m.text for m in (await resumed.agent.read_transcript()) if m.role == "user"]
            assert users == ["before", "on a full disk " + BIG, "still served"]
            assert len((await resumed.agent.read_transcript())) == 6  # each answered
            worker_again = await rt.resume_agent(resume_session_id="worker")
            assert [m.text for m in (await worker_again.agent.read_transcript()) if m.role == "user"] == ["background work"]


async def test_a_runtime_closed_on_a_full_disk_closes_at_once_and_resumes_from_what_was_written(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(writer_mod, "RETRY_FIRST", 3600.0)  # only closing can end the wait
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with Runtime.open(home) as rt:
            agent = (await rt.create_agent(session_id="a")).agent
            agent.followup("kept")
            await agent.wait_idle()
            await agent.session.flush()
            durable = agent.session.committed_count
            failing = trio.Event()
            rt.supervisor.writer.trouble_listeners.append(lambda trouble: failing.set())
            fill(rt.supervisor.writer.store)
            agent.followup("lost with the disk " + BIG)
            await agent.wait_idle()
            await failing.wait()
        assert "agent not closed cleanly" in caplog.text

        async with Runtime.open(home) as rt:
            resumed = (await rt.resume_agent(resume_session_id="a")).agent
            assert resumed.session.event_count == durable  # the whole prefix, nothing of the lost turn
            assert [m.text for m in (await resumed.read_transcript()) if m.role == "user"] == ["kept"]
            resumed.followup("after")
            await resumed.wait_idle()
            await resumed.session.flush()
            assert [m.text for m in (await resumed.read_transcript()) if m.role == "user"] == ["kept", "after"]


async def test_an_agent_whose_session_is_refused_for_good_is_retired_at_its_next_turn(tmp_path):
    async with Runtime.open(tmp_path / "home") as rt:
        live = rt.subscribe_live()
        a = (await rt.create_agent(session_id="a")).agent
        b = (await rt.create_agent(session_id="b")).agent
        a.followup("one")
        await a.wait_idle()
        await a.session.flush()
        # What a second writer of the database would do: take a's next seq.
        store = rt.supervisor.writer.store
        await trio.to_thread.run_sync(
            store.commit, [Write("a", None, (Event("user/message", a.session.event_count, 1, {}),))]
        )
        a.followup("two")  # its events are refused: nothing more of "a" is written
        await a.wait_idle()
        with pytest.raises(StoreError, match="already has an event"):
            await a.session.flush()
        a.followup("three")  # a turn no one would keep: the agent is retired instead
        seen = []
        with trio.fail_after(10):
            async for item in live:
                if item.agent_id == "a" and item.type in ("agent/error", "agent/disposed"):
                    seen.append(item.type)
                    if item.type == "agent/disposed":
                        break
        assert seen == ["agent/error", "agent/disposed"]
        assert a.closed and rt.list_agents() == ["b"]
        assert [m.text for m in (await a.read_transcript()) if m.role == "user"] == ["one", "two"]  # "three" never ran
        b.followup("hello")
        await b.wait_idle()
        await b.session.flush()
