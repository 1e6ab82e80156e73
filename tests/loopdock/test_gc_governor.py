"""The runtime's gc governor: it freezes long-lived objects while the runtime is open,
thaws them on close, leaves a collector it does not own alone, and loses no memory:
a disposed agent is freed by reference counting alone, frozen or not, because the
runtime's agents make no reference cycles (checked here with the collector off)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from loopdock import Runtime
from loopdock.runtime._gc import CPYTHON_DEFAULT_THRESHOLD, GC_THRESHOLD
from loopdock.runtime._gc_governor import GcGovernor, backed_off
from loopdock.runtime.tools import Tool

TIMEOUT = 60
WAVES = 6  # of five agents each


@pytest.fixture(autouse=True)
def collector_untouched() -> Iterator[None]:
    """Every test starts from CPython's defaults, nothing frozen, and ends the same."""
    saved = gc.get_threshold()
    gc.set_threshold(*CPYTHON_DEFAULT_THRESHOLD)
    assert gc.get_freeze_count() == 0
    yield
    gc.enable()
    gc.unfreeze()
    gc.set_threshold(*saved)


async def _boom(arguments: Any, ctx: Any) -> str:
    raise ValueError("boom")


async def _slow(arguments: Any, ctx: Any) -> str:
    await trio.sleep(3600)
    return "never"


def _register_tools(rt: Runtime) -> None:
    rt.register_tool(Tool("boom", "Fails.", {"type": "object"}, _boom))
    rt.register_tool(Tool("slow", "Waits an hour.", {"type": "object"}, _slow))


async def _run_agents(rt: Runtime, prefix: str, setup: Any = None) -> list[weakref.ref[Any]]:
    """One agent per way a turn can end (answered, a tool fails, cancelled mid-tool,
    steered mid-tool, disposed mid-tool), each disposed; weak references to what they
    held."""
    refs: list[weakref.ref[Any]] = []
    for way in ("answered", "tool fails", "cancelled", "steered", "disposed running"):
        handle = await rt.create_agent(session_id=f"{prefix}-{len(refs)}", setup=setup)
        agent = handle.agent
        if way == "answered":
            agent.followup("hello")
            await agent.wait_idle()
        elif way == "tool fails":
            agent.followup("call: boom {}")
            await agent.wait_idle()
        else:
            agent.followup("call: slow {}")
            await trio.testing.wait_all_tasks_blocked()
            if way == "cancelled":
                agent.cancel()
                await agent.wait_idle()
            elif way == "steered":
                agent.steer("stop that")
                await trio.testing.wait_all_tasks_blocked()
        refs += [weakref.ref(agent), weakref.ref(agent.session)]
        await handle.dispose()
        del handle, agent
    return refs


def _tracked() -> int:
    """Every object the collector tracks, frozen ones included."""
    return len(gc.get_objects()) + gc.get_freeze_count()


async def test_the_governor_freezes_after_agents_start_and_thaws_on_close(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD) as rt:
            governor = rt.gc_governor
            assert governor is not None
            await trio.testing.wait_all_tasks_blocked()
            freezes = governor.freezes
            handles = [await rt.create_agent(session_id=f"a{i}") for i in range(5)]
            assert governor.started == 5
            await trio.testing.wait_all_tasks_blocked()
            assert governor.freezes > freezes
            assert gc.get_freeze_count() > 0
            for handle in handles:
                await handle.dispose()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == CPYTHON_DEFAULT_THRESHOLD


async def test_a_collection_in_another_thread_is_frozen_and_thawed_on_close(tmp_path):
    # The store's writer thread collects too: the callback freezes there as well, and
    # closing the runtime still leaves nothing frozen.
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD) as rt:
            governor = rt.gc_governor
            assert governor is not None
            await trio.testing.wait_all_tasks_blocked()
            freezes = governor.freezes
            survivors = [[] for _ in range(1000)]
            frozen = gc.get_freeze_count()
            await trio.to_thread.run_sync(gc.collect, 0)
            assert governor.freezes > freezes
            assert gc.get_freeze_count() >= frozen + len(survivors)
    assert gc.get_freeze_count() == 0


async def test_the_governor_freezes_after_agents_start_and_after_collections():
    gc.disable()  # no collection of its own may happen in between
    governor = GcGovernor(trio.lowlevel.current_trio_token())
    gc.callbacks.append(governor.collected)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(governor.run)
            await trio.testing.wait_all_tasks_blocked()
            assert governor.freezes == 0
            for _ in range(3):  # a burst, frozen once the scheduler gets to the governor
                await governor.agent_started(object())
            await trio.testing.wait_all_tasks_blocked()
            assert (governor.started, governor.freezes) == (3, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert governor.freezes == 1  # nothing new: nothing to freeze
            gc.collect(0)  # its survivors are frozen
            await trio.testing.wait_all_tasks_blocked()
            assert governor.freezes == 2
            assert gc.get_freeze_count() > 0
            nursery.cancel_scope.cancel()
    finally:
        gc.callbacks.remove(governor.collected)
    governor.thaw()
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("how", ["none", "tuned", "frozen"])
async def test_a_collector_the_runtime_does_not_own_is_left_alone(tmp_path, how):
    if how == "tuned":
        gc.set_threshold(1234, 5, 6)
    elif how == "frozen":
        gc.freeze()  # the application froze its own objects (say, before forking)
    frozen = gc.get_freeze_count()
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=None if how == "none" else (10_000, 10, 10)) as rt:
            assert rt.gc_governor is None
            handle = await rt.create_agent(session_id="a1")
            handle.agent.followup("hi")
            await handle.agent.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert gc.get_freeze_count() <= frozen  # frozen objects die, none are added
            await handle.dispose()
    assert gc.get_freeze_count() <= frozen


async def test_a_second_runtime_leaves_the_collector_to_the_first(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD) as first:
            async with Runtime.open(tmp_path / "b", gc_threshold=GC_THRESHOLD) as second:
                assert first.gc_governor is not None and second.gc_governor is None
            await first.create_agent(session_id="a1")
            await trio.testing.wait_all_tasks_blocked()
            assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


async def test_disposed_agents_are_freed_without_the_collector(tmp_path):
    # What makes freezing safe: no cycle, so nothing a disposed agent held waits for a
    # collection that frozen objects never get.
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=None) as rt:
            _register_tools(rt)
            await _run_agents(rt, "warm")  # first-use caches (imports, compiled patterns)
            gc.collect()
            gc.disable()
            refs = await _run_agents(rt, "a")
            await trio.testing.wait_all_tasks_blocked()
            assert [r() for r in refs if r() is not None] == []
            assert gc.collect() == 0  # no cyclic garbage was made at all


def _cyclic_setup(ctx: Any) -> None:
    # A setup that ties its agent into a cycle that outlives disposal: the agent holds a
    # box (and a megabyte) that holds the agent.
    ctx.agent.box = (ctx.agent, bytearray(2**20))


@pytest.mark.parametrize("setup", [None, _cyclic_setup], ids=["runtime's own agents", "a setup that makes cycles"])
async def test_churning_agents_while_frozen_keeps_memory_bounded(tmp_path, setup):
    # Agents are frozen while alive, then disposed, wave after wave. The runtime's own
    # leave nothing behind; the control (a setup whose agents make a cycle) shows that
    # the measurement sees what freezing keeps: its agents stay until the runtime closes.
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD) as rt:
            governor = rt.gc_governor
            assert governor is not None
            _register_tools(rt)
            await _run_agents(rt, "warm")
            await trio.testing.wait_all_tasks_blocked()
            before, refs = _tracked(), []
            for wave in range(WAVES):
                freezes = governor.freezes
                refs += await _run_agents(rt, f"w{wave}", setup)
                await trio.testing.wait_all_tasks_blocked()
                assert governor.freezes > freezes
            per_agent = (_tracked() - before) / (len(refs) / 2)
            alive = len([r for r in refs if r() is not None])
            if setup is None:
                # What is left is the store's and the logger's caches, not agents: a
                # leaked agent and its session are about 80 objects.
                assert alive == 0
                assert per_agent < 10, f"{per_agent:.1f} more objects per agent that came and went"
            else:
                assert alive == len(refs)
                assert per_agent > 40
        gc.collect()  # thawed on close: now the collector frees them
        assert [r for r in refs if r() is not None] == []


async def test_a_failing_governor_is_restarted_and_agents_go_on(tmp_path, monkeypatch, autojump_clock):
    runs = 0
    restarted = trio.Event()
    real = GcGovernor.run

    async def failing_once(self: GcGovernor, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            task_status.started()
            raise ValueError("governor broke")
        restarted.set()
        await real(self, task_status=task_status)

    monkeypatch.setattr(GcGovernor, "run", failing_once)
    with capture_logs() as logs:
        async with Runtime.open(tmp_path / "a", gc_threshold=GC_THRESHOLD) as rt:
            governor = rt.gc_governor
            assert governor is not None
            with trio.fail_after(30):
                await restarted.wait()
            handle = await rt.create_agent(session_id="a")
            handle.agent.followup("hello")
            await handle.agent.wait_idle()
            assert (await handle.agent.session.read_events())[-1].data["reason"]["kind"] == "completed"
            await trio.testing.wait_all_tasks_blocked()
            assert governor.freezes > 0  # the restarted governor does its job
            await handle.dispose()
    failed = [(e["event"], e["action"]) for e in logs if e["event"] == "gc governor failed"]
    assert failed == [("gc governor failed", "restarted")]


class _Token:
    """Stands in for the trio token: records the wake-ups asked of it."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def run_sync_soon(self, fn: Any, *args: Any) -> None:
        self.asked.append(fn)


async def test_a_collection_is_frozen_in_its_callback_and_wakes_the_task_only_when_due():
    # Waking the task writes to trio's wake-up socket, which gives the GIL up in the
    # middle of the pause; the callback freezes by itself, and wakes the task only for
    # the full-collection check, at most once per tenth of full_interval.
    token = _Token()
    governor = GcGovernor(token, full_interval=3600.0)  # type: ignore[arg-type]
    gc.disable()
    gc.callbacks.append(governor.collected)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(governor.run)
            gc.collect(0)  # the first one: the check is due (no baseline measured yet)
            assert governor.freezes == 1 and gc.get_freeze_count() > 0
            assert token.asked == [governor._wake]
            governor.freeze()  # the task's own freeze measures the baseline; next check later
            token.asked.clear()
            keep = [[] for _ in range(100)]
            frozen = gc.get_freeze_count()
            for _ in range(5):
                gc.collect(0)
            assert governor.freezes == 7
            assert gc.get_freeze_count() >= frozen + len(keep)  # survivors frozen at once
            assert token.asked == []  # and no wake-up written
            governor._next_check = 0.0  # the check is due again
            gc.collect(0)
            assert token.asked == [governor._wake]
            nursery.cancel_scope.cancel()
        # A governor whose task has ended (stopped for good after failures) freezes
        # nothing more: frozen garbage would otherwise never meet a full collection.
        governor.thaw()
        gc.collect(0)
        assert governor.freezes == 8 and gc.get_freeze_count() == 0 and token.asked == [governor._wake]
    finally:
        gc.callbacks.remove(governor.collected)
        gc.enable()
        governor.thaw()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_frozen_garbage_is_collected_once_the_frozen_heap_has_grown_enough():
    # Objects alive at a freeze that later become unreachable cycles: without the full
    # collection they would stay frozen (leaked) for as long as the runtime is open.
    governor = GcGovernor(trio.lowlevel.current_trio_token(), full_factor=2.0, full_interval=0.0)
    governor.freeze()
    baseline = gc.get_freeze_count()
    doomed = [_Cycle() for _ in range(10)]
    alive = weakref.ref(doomed[0])
    governor.freeze()  # frozen while alive
    del doomed
    gc.collect()
    assert alive() is not None and governor.full_collections == 0  # frozen: nobody collects it
    keep = []
    for _ in range(4):  # live growth, frozen, until the frozen heap has doubled
        keep.append([[] for _ in range(baseline)])
        governor.freeze()
        if governor.full_collections:
            break
    assert governor.full_collections == 1
    assert alive() is None
    assert gc.get_freeze_count() >= len(keep) * baseline  # the live growth is frozen again


def test_the_full_collection_backs_off_while_it_finds_almost_nothing():
    assert backed_off(4.0, 4.0, found=0, walked=1_000_000) == 8.0
    assert backed_off(8.0, 4.0, found=9_999, walked=1_000_000) == 16.0  # under 1%
    assert backed_off(16.0, 4.0, found=10_000, walked=1_000_000) == 4.0  # cycles: back to the start


async def test_a_full_collection_that_found_nothing_makes_the_next_wait_for_twice_the_growth():
    governor = GcGovernor(trio.lowlevel.current_trio_token(), full_factor=2.0, full_interval=0.0)
    governor.freeze()
    step = gc.get_freeze_count() // 4
    keep = []
    while governor.full_collections == 0:  # live growth, frozen, until the frozen heap doubled
        keep.append([[] for _ in range(step)])
        governor.freeze()
    assert governor.factor == 4.0  # it found nothing to free: the next one waits for 4x
    after = gc.get_freeze_count()
    while gc.get_freeze_count() < 3 * after:  # 3x: a full collection before would be at 2x
        keep.append([[] for _ in range(step)])
        governor.freeze()
    assert governor.full_collections == 1 and keep


async def test_the_full_collection_waits_for_its_interval():
    governor = GcGovernor(trio.lowlevel.current_trio_token(), full_factor=1.0, full_interval=3600.0)
    governor.freeze()
    keep = [[] for _ in range(1000)]
    governor.freeze()
    governor.freeze()
    assert governor.full_collections == 0 and keep


async def test_freezing_often_does_not_walk_the_frozen_heap_each_time(monkeypatch):
    # gc.get_freeze_count() is O(frozen objects): reading it on every freeze (after every
    # collection) made a 10,000-agent runtime spend its time there.
    counted = []
    real = gc.get_freeze_count
    monkeypatch.setattr(gc, "get_freeze_count", lambda: counted.append(1) or real())
    governor = GcGovernor(trio.lowlevel.current_trio_token(), full_interval=3600.0)
    for _ in range(1000):
        governor.freeze()
    assert governor.freezes == 1000
    assert len(counted) == 1  # the baseline, at the first freeze
