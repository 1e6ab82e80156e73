"""One runtime per home, and a home only its owner can read.

Rules: real child processes (``home_child.py``) where another process matters; every
wait bounded by ``trio.fail_after``; a child is waited for through its own output
("ready") and its exit, never a sleep.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio

from loopdock import LoopdockError, Runtime
from loopdock.runtime._home_lock import LOCK_FILE, HomeInUseError, acquire_home
from loopdock.runtime._store import StoreError

TIMEOUT = 60  # child processes import loopdock; generous for a loaded 2-core machine


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- one runtime per home ----------------------------------------------------------------


async def test_a_second_runtime_in_the_same_process_is_refused_at_once(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(home) as rt:
            handle = await rt.create_agent(session_id="a1")
            with pytest.raises(HomeInUseError) as info:
                async with Runtime.open(home):
                    pass
            error = info.value
            assert isinstance(error, LoopdockError) and error.code == "HOME_IN_USE"
            assert (error.home, error.pid) == (home, os.getpid())
            assert str(home) in str(error) and "in this process" in str(error)
            # The refused opener touched nothing: the first runtime goes on.
            handle.agent.followup("still mine")
            await handle.agent.wait_idle()
            await handle.dispose()
        # Closed: the home is free again.
        async with Runtime.open(home) as rt:
            assert [h.id for h in await rt.list_sessions()] == ["a1"]


async def test_a_home_held_by_another_process_is_refused_then_free_after_kill_9(tmp_path, children):
    home = tmp_path / "home"
    with trio.fail_after(TIMEOUT):
        child = await children.start("hold", str(home))
        try:
            assert await child.line() == "ready", f"see {child.stderr}"
            with pytest.raises(HomeInUseError) as info:
                async with Runtime.open(home):
                    pass
            assert (info.value.home, info.value.pid) == (home, child.pid)
            assert f"pid {child.pid}" in str(info.value)
            # Also while a runtime of this process holds another home.
            async with Runtime.open(tmp_path / "other"):
                with pytest.raises(HomeInUseError):
                    async with Runtime.open(home):
                        pass
        finally:
            await child.kill_9()
        # The OS dropped the dead holder's lock: no stale lock to clear, no wait.
        async with Runtime.open(home) as rt:
            await rt.create_agent(session_id="after")
    assert (home / LOCK_FILE).read_text().strip() == str(os.getpid())


async def test_a_failed_open_lets_go_of_the_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "sessions.db").write_bytes(b"not a database" * 100)
    with trio.fail_after(TIMEOUT):
        for _ in range(2):  # the second attempt fails the same way, not with HOME_IN_USE
            with pytest.raises(StoreError, match="cannot open"):
                async with Runtime.open(home):
                    pass


async def test_a_store_given_to_open_keeps_the_sessions_and_stays_the_callers(tmp_path):
    from loopdock import SessionLog
    from loopdock.runtime._store import SessionStore

    home = tmp_path / "home"
    store = await trio.to_thread.run_sync(SessionStore.open, tmp_path / "elsewhere.db")
    try:
        given: SessionLog = store
        with trio.fail_after(TIMEOUT):
            async with Runtime.open(home, store=given) as rt:
                handle = await rt.create_agent(session_id="s1")
                handle.agent.followup("kept elsewhere")
                await handle.agent.wait_idle()
        # still open once the runtime closed: the caller's to close
        events = await trio.to_thread.run_sync(store.load_events, "s1")
    finally:
        store.close()
    assert [e.type for e in events].count("turn/end") == 1
    assert not (home / "sessions.db").exists()


def test_the_lock_is_released_once_and_names_an_unknown_holder_without_a_pid(tmp_path):
    home = tmp_path / "home"
    lock = acquire_home(home)
    assert lock.held
    (home / LOCK_FILE).write_text("")  # e.g. read between the holder's truncate and write
    with pytest.raises(HomeInUseError) as info:
        acquire_home(home)
    assert info.value.pid is None and "pid" not in str(info.value)
    lock.release()
    lock.release()
    assert not lock.held
    with acquire_home(home) as again:
        assert again.held
    assert not again.held


# -- who may read the home ---------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o000, 0o022])
async def test_the_home_is_0700_and_everything_in_it_0600(tmp_path, mask):
    home = tmp_path / "home"
    old = os.umask(mask)
    try:
        with trio.fail_after(TIMEOUT):
            async with Runtime.open(home) as rt:
                handle = await rt.create_agent(session_id="a1")
                handle.agent.followup("hello")
                await handle.agent.wait_idle()
                await handle.agent.session.flush()
                assert mode(home) == 0o700
                names = {p.name for p in home.iterdir()}
                assert {"sessions.db", "sessions.db-wal", "sessions.db-shm", LOCK_FILE} <= names
                for name in names:
                    assert mode(home / name) == 0o600, name
                await handle.dispose()
    finally:
        os.umask(old)


async def test_a_home_others_could_read_is_tightened(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(home) as rt:
            await rt.create_agent(session_id="a1")
    # As an older loopdock left it.
    home.chmod(0o755)
    (home / "sessions.db").chmod(0o644)
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(home) as rt:
            assert [h.id for h in await rt.list_sessions()] == ["a1"]
            assert mode(home) == 0o700
            assert mode(home / "sessions.db") == 0o600
