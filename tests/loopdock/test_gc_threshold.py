"""The runtime's collector threshold, when asked for (serve and worker ask): set while
open (only over CPython's default), put back on close, and left alone when the
application tuned it or asked for ``None`` (the default)."""

from __future__ import annotations

import gc

import pytest
import trio

from loopdock import Runtime
from loopdock.runtime._gc import CPYTHON_DEFAULT_THRESHOLD, GC_THRESHOLD

TIMEOUT = 20


@pytest.fixture(autouse=True)
def default_threshold():
    saved = gc.get_threshold()
    gc.set_threshold(*CPYTHON_DEFAULT_THRESHOLD)
    yield
    gc.set_threshold(*saved)


async def test_the_runtime_tunes_the_collector_while_open_and_restores_it(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD) as rt:
            assert gc.get_threshold() == GC_THRESHOLD
            # A second runtime in the same process finds it tuned and leaves it to the first.
            async with Runtime.open(tmp_path / "b", gc_threshold=GC_THRESHOLD):
                assert gc.get_threshold() == GC_THRESHOLD
            assert gc.get_threshold() == GC_THRESHOLD
            handle = await rt.create_agent(session_id="a1")
            handle.agent.followup("hi")
            await handle.agent.wait_idle()
    assert gc.get_threshold() == CPYTHON_DEFAULT_THRESHOLD


async def test_a_threshold_the_application_chose_is_kept(tmp_path):
    gc.set_threshold(1234, 5, 6)
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD):
            assert gc.get_threshold() == (1234, 5, 6)
    assert gc.get_threshold() == (1234, 5, 6)


async def test_none_leaves_the_collector_alone_and_a_custom_one_is_applied(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=None):
            assert gc.get_threshold() == CPYTHON_DEFAULT_THRESHOLD
        async with Runtime.open(tmp_path / "b", gc_threshold=(5000, 20, 20)):
            assert gc.get_threshold() == (5000, 20, 20)
    assert gc.get_threshold() == CPYTHON_DEFAULT_THRESHOLD


async def test_a_change_made_while_open_is_not_undone_and_errors_still_restore(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD):
            gc.set_threshold(900, 10, 10)  # the application retunes meanwhile
        assert gc.get_threshold() == (900, 10, 10)
        gc.set_threshold(*CPYTHON_DEFAULT_THRESHOLD)
        with pytest.raises(ValueError, match="boom"):
            async with Runtime.open(tmp_path / "b", gc_threshold=GC_THRESHOLD):
                raise ValueError("boom")
    assert gc.get_threshold() == CPYTHON_DEFAULT_THRESHOLD
