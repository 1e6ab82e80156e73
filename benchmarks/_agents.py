"""loopdock's own workloads: many agents on several loops, and human priority under load.

Both run a real ``Runtime`` on a home on disk (SQLite persistence on) with the offline
``ping`` model. Times come from ``trio.current_time()``:

- *admission*: from just before ``agent.followup(...)`` to the moment the first step of
  that turn is admitted, seen by an ``agent/pre-step`` listener that the bench adds
  through a setup as the outermost one (it reads the clock after ``await next_(pre)``,
  i.e. right before ``step/start`` is logged);
- *turn*: from the same instant until ``agent.wait_idle()`` returns (the turn is over).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from actors import FakeDriver, ReactDriver
from loopdock import DriverLoop, Message, ProducerSource, Runtime, TextBlock
from runtime.tools import Tool

from ._common import (
    Progress,
    peak_rss_bytes,
    percentile,
    rss_bytes,
    settled_rss,
    summary_ms,
)

TOOL_NAME = "bench_echo"
# One tool call per turn: the ping model calls the tool named on a `call:` line, then
# answers the tool's result with `pong: ...` (two steps per turn on the react driver).
TASK = 'call: bench_echo {"text": "hi"}'
HUMAN_TEXT = "a person asks: how is it going?"
PRODUCER = "bench-driver"

#: (loop, driver) by agent index modulo its length: three loops on two drivers of the
#: react kind plus a driver loop of its own.
MIX: tuple[tuple[str, str | None], ...] = (
    ("standard", None),          # react driver (the default one)
    ("minimal-first", None),     # react driver, a minimal toolset until the first call
    ("standard", "react-b"),     # a second, named react driver
    ("bench-fake", None),        # DriverLoop from actors.FakeDriver: no model, one step a turn
)


async def _echo(arguments: Mapping[str, Any], ctx: Any) -> str:
    return f"echo: {arguments.get('text', '')}"


ECHO_TOOL = Tool(
    TOOL_NAME,
    "Echo the text back (a cheap in-memory tool for benchmarks).",
    {"type": "object", "properties": {"text": {"type": "string"}}},
    _echo,
)


class Recorder:
    """Times followups and admissions through an outermost ``agent/pre-step`` listener."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}  # agent id -> when its pending followup was sent
        self.admission: list[float] = []
        self.admitted: dict[str, trio.Event] = {}
        self.recording = True

    def setup(self, ctx: Any) -> None:
        ctx.on("agent/pre-step", self._listener, prepend=True)

    async def _listener(self, pre: Any, next_: Any) -> Any:
        verdict = await next_(pre)
        if pre.step == 1:
            t0 = self.sent.pop(pre.agent_id, None)
            if t0 is not None:
                if self.recording:
                    self.admission.append(trio.current_time() - t0)
                event = self.admitted.pop(pre.agent_id, None)
                if event is not None:
                    event.set()
        return verdict


class GcPauses:
    """CPython's cyclic-GC pauses while active (the usual cause of latency tails)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self.active = False
        self._started = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.active:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def summary(self) -> dict[str, Any]:
        return {
            "collections": len(self.pauses),
            "over_1ms": sum(1 for _, p in self.pauses if p > 1e-3),
            "max_ms": max((p for _, p in self.pauses), default=0.0) * 1e3,
            "max_ms_by_generation": {
                str(g): max((p for gen, p in self.pauses if gen == g), default=0.0) * 1e3 for g in (0, 1, 2)
            },
        }


class _Home:
    """A real runtime home on disk, removed afterwards."""

    def __init__(self, parent: str | None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="loopdock-bench-", dir=parent))
        self.work = self.path / "work"
        self.work.mkdir()
        (self.work / "README.md").write_text("bench\n")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _prepare(rt: Runtime) -> None:
    rt.register_tool(ECHO_TOOL)
    rt.register_driver("react-b", ReactDriver())
    rt.dock.register(DriverLoop.from_driver("bench-fake", FakeDriver("bench-fake")))


async def _create(
    rt: Runtime, home: _Home, recorder: Recorder, session_id: str, loop: str, driver: str | None
) -> Any:
    return await rt.create_agent(
        session_id=session_id,
        loop=loop,
        driver=driver,
        setup=recorder.setup,
        agent_options={"provider": "ping", "model": "ping-1", "cwd": str(home.work)},
    )


async def _create_many(
    rt: Runtime, home: _Home, recorder: Recorder, prefix: str, n: int, progress: Progress | None = None
) -> list[Any]:
    handles = []
    for i in range(n):
        loop, driver = MIX[i % len(MIX)]
        handles.append(await _create(rt, home, recorder, f"{prefix}-{i}", loop, driver))
        if progress is not None and i % 64 == 0:
            progress(i / n, f"creating {n} agents")
    for handle in handles:
        await handle.agent.session.flush()
    return handles


async def _dispose(handles: list[Any]) -> None:
    async with trio.open_nursery() as nursery:
        for handle in handles:
            nursery.start_soon(handle.dispose)


# -- workload 1: many agents -------------------------------------------------------------


async def run_many(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``n``, ``k``, ``waves``, ``tracemalloc_agents``, optional ``home_parent``."""
    n, k, waves = params["n"], params["k"], params["waves"]
    home = _Home(params.get("home_parent"))
    recorder = Recorder()
    turn_latency: list[float] = []
    total_turns = n * k * waves
    done = 0
    try:
        async with Runtime.open(home.path / "home") as rt:
            _prepare(rt)
            # Warm-up: one agent of every loop runs a turn, so lazy set-up is not counted.
            warm = [await _create(rt, home, recorder, f"warm-{i}", *MIX[i]) for i in range(len(MIX))]
            for handle in warm:
                handle.agent.followup(TASK)
                await handle.agent.wait_idle()
            await _dispose(warm)
            recorder.admission.clear()

            # Memory per idle agent: RSS before and after creating n idle agents.
            before = settled_rss()
            handles = await _create_many(rt, home, recorder, "w0", n, lambda f, t: progress(0.15 * f, t))
            idle_rss = settled_rss() - before

            seconds = cpu = 0.0
            steps = events = 0
            wave_step_us: list[float] = []  # per wave: its seconds / its steps
            for wave in range(waves):
                if wave:
                    handles = await _create_many(rt, home, recorder, f"w{wave}", n)

                async def drive(agent: Any) -> None:
                    nonlocal done
                    for _ in range(k):
                        t0 = trio.current_time()
                        recorder.sent[agent.id] = t0
                        agent.followup(TASK)
                        await agent.wait_idle()
                        turn_latency.append(trio.current_time() - t0)
                        done += 1
                        if done % 256 == 0:
                            progress(0.15 + 0.8 * done / total_turns, f"N={n}: {done}/{total_turns} turns")

                started, cpu_started = time.perf_counter(), time.process_time()
                async with trio.open_nursery() as nursery:
                    for handle in handles:
                        nursery.start_soon(drive, handle.agent)
                for handle in handles:  # persisted: the last event of every agent is durable
                    await handle.agent.session.flush()
                wave_seconds = time.perf_counter() - started
                cpu += time.process_time() - cpu_started
                seconds += wave_seconds
                wave_steps = 0
                for handle in handles:
                    session_events = handle.agent.session.events
                    events += len(session_events)
                    wave_steps += sum(1 for e in session_events if e.type == "step/start")
                steps += wave_steps
                wave_step_us.append(wave_seconds / wave_steps * 1e6)
                progress(0.15 + 0.8 * done / total_turns, f"N={n}: {done}/{total_turns} turns")
                if wave < waves - 1:
                    await _dispose(handles)
            peak = peak_rss_bytes()
            rss_after = rss_bytes()
            commits = rt.supervisor.writer.commits
            loops = sorted({f"{loop}@{driver or 'default'}" for loop, driver in MIX[: min(n, len(MIX))]})

            # Cross-check with tracemalloc (Python allocations only) on a smaller set.
            traced_agents = min(n, params["tracemalloc_agents"])
            tracemalloc.start()
            try:
                traced_before = tracemalloc.get_traced_memory()[0]
                extra = await _create_many(rt, home, recorder, "traced", traced_agents)
                settled_rss()
                traced = tracemalloc.get_traced_memory()[0] - traced_before
            finally:
                tracemalloc.stop()
            progress(1.0, f"N={n}: closing")
            await _dispose(extra)
    finally:
        home.remove()
    return {
        "n": n,
        "k": k,
        "waves": waves,
        "loops": loops,
        "turns": total_turns,
        "steps": steps,
        "events": events,
        "commits": commits,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "turns_per_s": total_turns / seconds,
        # Median over waves of each wave's time per step (robust on a shared machine).
        "us_per_step": percentile(wave_step_us, 50),
        # CPU time of the whole process (both threads) per step: robust to neighbours.
        "cpu_us_per_step": cpu / steps * 1e6,
        "admission": summary_ms(recorder.admission),
        "turn": summary_ms(turn_latency),
        "mem_per_idle_agent_kb": idle_rss / n / 1024,
        "tracemalloc_per_agent_kb": traced / traced_agents / 1024,
        "tracemalloc_agents": traced_agents,
        "peak_rss_mb": peak / 2**20,
        "rss_after_run_mb": rss_after / 2**20,
    }


# -- workload 2: human priority under load -----------------------------------------------


def _automatic(text: str) -> Message:
    return Message("user", (TextBlock(text),), source=ProducerSource(PRODUCER))


async def _priority_scenario(
    name: str,
    agents: int,
    pending: int,
    humans: int,
    busy: int,
    busy_interval: float,
    parent: str | None,
    progress: Progress,
) -> dict[str, Any]:
    """``agents`` idle agents hold ``pending`` automatic reservations between them (placed
    ``inject``: queued for the agent's next step, so they stay pending instead of waking
    it). Meanwhile ``busy`` other agents each run an automatic turn (a reservation of the
    tool-call task) every ``busy_interval`` seconds: background load below saturation. A
    person then follows up on one holder after another; the followup cancels that agent's
    reservations (human input first) and is timed to its admission. The producer tops the
    agent up again afterwards, so the count stays at ``pending``."""
    home = _Home(parent)
    recorder = Recorder()
    per_agent = pending // agents
    busy_turns = 0
    gc_pauses = GcPauses()
    try:
        async with Runtime.open(home.path / "home") as rt:
            _prepare(rt)
            holders = [
                await _create(rt, home, recorder, f"{name}-{i}", "standard", None) for i in range(agents)
            ]
            workers = [
                await _create(rt, home, recorder, f"{name}-busy-{i}", "standard", None) for i in range(busy)
            ]
            for handle in holders:
                for j in range(per_agent):
                    handle.agent.reserve(_automatic(f"automatic context {j}"), "inject")
            pending_at_start = sum(h.agent.inbox_size for h in holders)

            async def keep_busy(agent: Any, index: int) -> None:
                nonlocal busy_turns
                await trio.sleep(busy_interval * index / max(busy, 1))  # staggered
                while True:
                    started = trio.current_time()
                    agent.reserve(_automatic(TASK))
                    await agent.wait_idle()
                    busy_turns += 1
                    await trio.sleep(max(0.0, busy_interval - (trio.current_time() - started)))

            with gc_pauses:
                async with trio.open_nursery() as nursery:
                    for index, handle in enumerate(workers):
                        nursery.start_soon(keep_busy, handle.agent, index)
                    if busy:
                        await trio.sleep(busy_interval)  # the load is on before the first person
                    warmup = 5
                    measured_from = trio.current_time()
                    busy_from = busy_turns
                    for i in range(warmup + humans):
                        recorder.recording = i >= warmup
                        if i == warmup:
                            measured_from, busy_from = trio.current_time(), busy_turns
                            gc_pauses.active = True
                        agent = holders[(i * 7919) % agents].agent
                        admitted = recorder.admitted[agent.id] = trio.Event()
                        recorder.sent[agent.id] = trio.current_time()
                        agent.followup(HUMAN_TEXT)
                        await admitted.wait()
                        await agent.wait_idle()
                        for j in range(per_agent):  # the producer queues its context again
                            agent.reserve(_automatic(f"automatic context {j}"), "inject")
                        if i % 16 == 0:
                            progress(i / (warmup + humans), f"{name}: {i}/{humans} humans")
                    gc_pauses.active = False
                    measured = trio.current_time() - measured_from
                    busy_measured = busy_turns - busy_from
                    nursery.cancel_scope.cancel()
            pending_at_end = sum(h.agent.inbox_size for h in holders)
    finally:
        home.remove()
    return {
        "scenario": name,
        "agents": agents,
        "pending": pending_at_start,
        "pending_at_end": pending_at_end,
        "per_agent": per_agent,
        "busy_agents": busy,
        "busy_turns_per_s": busy_measured / measured if measured > 0 else 0.0,
        "humans": humans,
        "admission": summary_ms(recorder.admission),
        "gc": gc_pauses.summary(),
    }


async def run_priority(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``agents``, ``pending``, ``humans``, ``busy``, ``busy_interval``,
    ``one_agent_humans``."""
    parent = params.get("home_parent")
    scenarios = [
        ("spread", params["agents"], params["pending"], params["humans"], 0),
        ("spread+busy", params["agents"], params["pending"], params["humans"], params["busy"]),
        ("one-agent", 1, params["pending"], params["one_agent_humans"], 0),
    ]
    rows = []
    for index, (name, agents, pending, humans, busy) in enumerate(scenarios):

        def sub(fraction: float, label: str, index: int = index) -> None:
            progress((index + fraction) / len(scenarios), label)

        rows.append(
            await _priority_scenario(name, agents, pending, humans, busy, params["busy_interval"], parent, sub)
        )
    return {"rows": rows}
