"""The agent lifecycle at scale: registered agents, their first message, their churn.

``loopdock bench --lifecycle [--quick] [--out DIR]`` (issue 32, item 5), through the public
API only (``Runtime.open(home, passivate_after=...)``, persistence on, ``create_agent``
with the default ``standard`` loop and the offline ``ping`` model), each phase in a fresh
process so that one phase's heap does not carry into the next:

- ``registered``: ``n`` agents created (``creators`` tasks at once: one after the other,
  each creation waits for a store read, and a user making a million would not wait for
  each in turn), the first ``active`` of them held active (``agent.keep_active()``), the
  rest passivated after ``passivate_after`` seconds; no handle kept (``rt.get_agent(id)``
  finds each). Then, in the same process and at the same size:

  - RSS after a full collection, in total and per registered agent (the ``active`` held
    ones included), and the creation rate and CPU (passivation included);
  - first message to a passivated agent -> its turn admitted, open loop: ``messages``
    followups at ``rate`` per second on a fixed schedule, each to a different passivated
    agent, each timed from its *scheduled* send time (a late sender counts against us)
    to the admission of its turn's first step (an outermost ``agent/pre-step``
    listener); p50/p99/max, the sender's lateness and every collector pause
    (``gc.callbacks``) over the window, and which of the slow ones a pause or a late
    sender explains;
  - reactivation CPU: ``reactivations`` other passivated agents brought back one after
    the other with ``await agent.activate()``: the process's CPU time (both threads) /
    agents, and what passivating them again costs.

- ``steady``: ``n`` agents, all passivated; then for ``seconds`` a fixed schedule touches
  ``fraction`` of them per second (a followup to a random agent), RSS sampled every
  ``sample_every`` seconds with how many agents are active, how many messages wait and
  how late the sender runs; the verdict says whether memory stayed flat after the
  warm-up and whether the process kept up (why, if it did not).

``run_lifecycle`` runs both phases and writes ``bench-lifecycle-<mode>.json``, from which
``loopdock bench --tables`` writes the tables of benchmarks/PROFILE.md and docs/lifecycle.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from loopdock import GC_THRESHOLD, Runtime

from ._common import Progress, load_average, machine, percentile, rss_bytes, settled_rss, summary_ms

#: The sizes of ``loopdock bench --lifecycle``. ``full`` is as large as fits a ~30 minute
#: run on the 2-core machine the committed results come from (benchmarks/PROFILE.md).
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "registered": {
            "n": 1_000_000, "active": 1000, "creators": 16, "passivate_after": 2.0,
            "rate": 200.0, "messages": 2000, "reactivations": 2000, "seed": 1,
        },
        "steady": {
            "n": 100_000, "creators": 16, "passivate_after": 10.0, "fraction": 0.01,
            "seconds": 600.0, "sample_every": 10.0, "warmup": 60.0, "seed": 2,
        },
    },
    "quick": {
        "registered": {
            "n": 2000, "active": 200, "creators": 16, "passivate_after": 0.5,
            "rate": 200.0, "messages": 100, "reactivations": 100, "seed": 1,
        },
        "steady": {
            "n": 2000, "creators": 16, "passivate_after": 0.5, "fraction": 0.01,
            "seconds": 4.0, "sample_every": 0.5, "warmup": 1.0, "seed": 2,
        },
    },
}

#: The issue's targets (judged on a full run only).
TARGET_N = 1_000_000
TARGET_ACTIVE = 1000
TARGET_RSS_GB = 2.0
TARGET_P99_MS = 5.0
#: Flat: RSS at the end within this fraction of RSS after the warm-up.
FLAT_TOLERANCE = 0.10
#: Kept up: at the end, at most this many seconds of touches still waiting for admission.
BACKLOG_SECONDS = 2.0
#: A message slower than this is "slow" in the explanation of the tail (the target's ms).
SLOW_MS = TARGET_P99_MS
#: A sender this late (ms) is a stall of the process, not of the agent.
LATE_MS = 1.0

TEXT = "hello again"


class Admissions:
    """When each followup's turn is admitted: an outermost ``agent/pre-step`` listener
    reads the clock once the rest of the waterfall let the step in (as the ``priority``
    benchmark does). The same bound method is every agent's setup (a fresh one per agent
    would weigh on each passivated agent's recipe). ``keep``: keep every (scheduled,
    admitted) pair; else only a count and the latencies since ``take_latencies`` (the
    steady phase: its memory must not grow with the messages)."""

    def __init__(self, keep: bool = True) -> None:
        self.due: dict[str, float] = {}  # message id -> its scheduled send time
        self.done: list[tuple[float, float]] = []  # (scheduled, admitted), trio's clock
        self.count = 0
        self._keep = keep
        self._recent: list[float] = []
        self.setup = self._setup

    def take_latencies(self) -> list[float]:
        recent, self._recent = self._recent, []
        return recent

    def _setup(self, ctx: Any) -> None:
        ctx.on("agent/pre-step", self._listener, prepend=True)

    async def _listener(self, pre: Any, next_: Any) -> Any:
        verdict = await next_(pre)
        now = trio.current_time()
        for message in pre.messages:
            due = self.due.pop(message.id, None)
            if due is not None:
                self.count += 1
                if self._keep:
                    self.done.append((due, now))
                else:
                    self._recent.append(now - due)
        return verdict


class Pauses:
    """Every collector pause while inside, with when it started (trio's clock), so that a
    slow admission can be matched with the pauses it waited through. Kept per thread: the
    store's writer thread collects too."""

    def __init__(self, offset: float) -> None:
        self._offset = offset  # trio.current_time() - time.perf_counter()
        self._started: dict[int, float] = {}
        self.windows: list[tuple[float, float, int]] = []  # (start, seconds, generation)

    def __enter__(self) -> Pauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        thread, now = threading.get_ident(), time.perf_counter()
        if phase == "start":
            self._started[thread] = now
            return
        started = self._started.pop(thread, None)
        if started is not None:
            self.windows.append((started + self._offset, now - started, info["generation"]))

    def take(self) -> dict[str, Any]:
        """The summary of the pauses since the last ``take``, which it forgets (the
        steady phase: its memory must not grow with the collections)."""
        summary, self.windows = self.summary(), []
        return summary

    def summary(self) -> dict[str, Any]:
        pauses = [seconds for _, seconds, _ in self.windows]
        return {
            "collections": len(pauses),
            "by_generation": [sum(1 for *_, g in self.windows if g == gen) for gen in range(3)],
            "p99_ms": percentile(pauses, 99) * 1e3, "max_ms": max(pauses, default=0.0) * 1e3,
            "total_ms": sum(pauses) * 1e3,
        }


class Stalls:
    """When trio's loop did not run for a while: a task that sleeps ``TICK`` seconds over
    and over records each wakeup later than ``STALL`` past its due time, and how much CPU
    the loop's thread used meanwhile. A stall with little CPU is the process not being
    run (the OS ran something else: a shared machine); one with much is the loop busy
    with work of its own (a long step of some task, or a collection)."""

    TICK = 0.001
    STALL = 0.002

    def __init__(self) -> None:
        self.windows: list[tuple[float, float, float]] = []  # (start, seconds, cpu seconds), trio's clock

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            start, cpu = trio.current_time(), time.thread_time()
            await trio.sleep(self.TICK)
            gap = trio.current_time() - start - self.TICK
            if gap > self.STALL:
                self.windows.append((start + self.TICK, gap, time.thread_time() - cpu))

    def summary(self) -> dict[str, Any]:
        gaps = [seconds for _, seconds, _ in self.windows]
        idle = [seconds for _, seconds, cpu in self.windows if cpu < seconds / 2]
        return {
            "over_ms": self.STALL * 1e3, "stalls": len(gaps), "max_ms": max(gaps, default=0.0) * 1e3,
            "total_ms": sum(gaps) * 1e3, "not_run": len(idle), "not_run_ms": sum(idle) * 1e3,
        }


def _overlap(windows: Sequence[tuple[float, float, Any]], start: float, end: float) -> float:
    return sum(min(w_start + seconds, end) - max(w_start, start) for w_start, seconds, _ in windows
               if w_start < end and w_start + seconds > start)


def _clock_offset() -> float:
    return trio.current_time() - time.perf_counter()


async def _create(
    rt: Runtime, n: int, creators: int, prefix: str, setup: Any, progress: Progress, label: str,
    held: contextlib.ExitStack | None = None, active: int = 0,
) -> None:
    """``n`` agents ``<prefix><i>``, ``creators`` at a time; the first ``active`` held
    active in ``held``. No handle is kept."""
    created = 0

    async def creator(first: int) -> None:
        nonlocal created
        for i in range(first, n, creators):
            handle = await rt.create_agent(session_id=f"{prefix}{i}", setup=setup)
            if held is not None and i < active:
                held.enter_context(handle.agent.keep_active())  # before any checkpoint: still idle
            created += 1
            if created % 5000 == 0:
                progress(created / n, f"{label}: {created:,}/{n:,} agents created")

    async with trio.open_nursery() as nursery:
        for first in range(min(creators, n)):
            nursery.start_soon(creator, first)


def _store_mb(home: Path) -> float:
    return sum(path.stat().st_size for path in home.rglob("*") if path.is_file()) / 2**20


def explain_tail(done: list[tuple[float, float]], lateness: dict[float, float],
                 windows: list[tuple[float, float, int]],
                 stalls: Sequence[tuple[float, float, float]] = ()) -> dict[str, Any]:
    """Of the admissions slower than ``SLOW_MS``: how many waited through a collector
    pause (one overlapping the wait), how many had a sender already late by ``LATE_MS``
    (the process stalled before it sent), how many waited through a stall of the loop in
    which the process was not run (``Stalls``), and how many none of these explains."""
    slow = [(due, admitted) for due, admitted in done if (admitted - due) * 1e3 > SLOW_MS]
    not_run = [window for window in stalls if window[2] < window[1] / 2]
    with_gc = late = descheduled = neither = 0
    gc_ms_in_slow = 0.0
    for due, admitted in slow:
        paused = _overlap(windows, due, admitted)
        sender_late = lateness.get(due, 0.0) * 1e3 > LATE_MS
        off = _overlap(not_run, due, admitted) > 0
        with_gc += paused > 0
        late += sender_late
        descheduled += off
        neither += paused <= 0 and not sender_late and not off
        gc_ms_in_slow += paused * 1e3
    return {
        "slow_ms": SLOW_MS, "slow": len(slow), "with_gc_pause": with_gc, "sender_late": late,
        "not_run": descheduled, "neither": neither, "gc_ms_inside_slow": gc_ms_in_slow,
    }


async def _send_on_schedule(
    rt: Runtime, admissions: Admissions, targets: list[str], rate: float, lateness: dict[float, float],
    progress: Progress,
) -> None:
    start = trio.current_time() + 0.2
    for i, agent_id in enumerate(targets):
        due = start + i / rate
        await trio.sleep_until(due)
        lateness[due] = trio.current_time() - due
        agent = rt.get_agent(agent_id)
        assert agent is not None and agent.passivated, f"{agent_id} is not passivated"
        admissions.due[agent.followup(TEXT).id] = due  # no checkpoint since it was sent
        if i % 200 == 0:
            progress(i / len(targets), f"open loop: {i:,}/{len(targets):,} messages")
    # Each turn is admitted before its agent is idle again; one never admitted stays out
    # of the figures, and ``admitted`` says so.
    with trio.move_on_after(60 + len(targets) / rate):
        for agent_id in targets:
            agent = rt.get_agent(agent_id)
            assert agent is not None
            await agent.wait_idle()


async def _open_loop(
    rt: Runtime, admissions: Admissions, targets: list[str], rate: float, progress: Progress,
) -> dict[str, Any]:
    """One followup to each of ``targets`` (passivated), at ``rate`` per second on a fixed
    schedule; timed from the schedule to admission."""
    lateness: dict[float, float] = {}
    cpu0, ctx0 = time.process_time(), _context_switches()
    before = rt.supervisor.lifecycle.reactivations
    stalls = Stalls()
    async with trio.open_nursery() as watching:
        with Pauses(_clock_offset()) as pauses:
            await watching.start(stalls.run)
            await _send_on_schedule(rt, admissions, targets, rate, lateness, progress)
        watching.cancel_scope.cancel()
    cpu, ctx = time.process_time() - cpu0, _context_switches() - ctx0
    latencies = [admitted - due for due, admitted in admissions.done]
    late = list(lateness.values())
    return {
        "messages": len(targets), "rate_per_s": rate, "admitted": len(admissions.done),
        "reactivations": rt.supervisor.lifecycle.reactivations - before,
        "admission": summary_ms(latencies), "sender_late": summary_ms(late),
        "gc": pauses.summary(), "stalls": stalls.summary(),
        "tail": explain_tail(admissions.done, lateness, pauses.windows, stalls.windows),
        "cpu_us_per_message": cpu / len(targets) * 1e6, "involuntary_context_switches": ctx,
    }


def _context_switches() -> int:
    """How many times the OS took the CPU from this process's main thread (trio's) so
    far; 0 without /proc."""
    try:
        with open("/proc/self/status") as status:
            return sum(int(line.split()[1]) for line in status if line.startswith("nonvoluntary_ctxt_switches"))
    except OSError:
        return 0


async def _reactivation_cpu(rt: Runtime, targets: list[str], progress: Progress) -> dict[str, Any]:
    """``activate()`` each of ``targets``, one after the other; then what passivating
    them again costs."""
    lifecycle = rt.supervisor.lifecycle
    agents = [rt.get_agent(agent_id) for agent_id in targets]
    walls = []
    reactivations, passivations = lifecycle.reactivations, lifecycle.passivations
    cpu0 = time.process_time()
    for i, agent in enumerate(agents):
        assert agent is not None and agent.passivated
        t0 = time.perf_counter()
        await agent.activate()
        walls.append(time.perf_counter() - t0)
        if i % 200 == 0:
            progress(i / len(agents), f"reactivations: {i:,}/{len(agents):,}")
    cpu = time.process_time() - cpu0
    done = lifecycle.reactivations - reactivations
    cpu1 = time.process_time()
    await lifecycle.wait_until(lambda: lifecycle.passivations - passivations >= len(agents))
    passivation_cpu = time.process_time() - cpu1
    return {
        "agents": len(agents), "reactivated": done, "cpu_us_per_agent": cpu / len(agents) * 1e6,
        "wall": summary_ms(walls), "passivation_cpu_us_per_agent": passivation_cpu / len(agents) * 1e6,
    }


async def run_registered(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The ``registered`` phase (module docstring); ``params`` as in ``SIZES``, and
    optionally ``home_parent``."""
    n, active, after = params["n"], params["active"], params["passivate_after"]
    messages, reactivations = params["messages"], params["reactivations"]
    if n - active < messages + reactivations:
        raise ValueError("too few passivated agents for the messages and the reactivations")
    admissions = Admissions()
    with tempfile.TemporaryDirectory(prefix="loopdock-lifecycle-", dir=params.get("home_parent")) as scratch:
        home = Path(scratch) / "home"
        async with Runtime.open(home, passivate_after=after, gc_threshold=GC_THRESHOLD) as rt:
            lifecycle = rt.supervisor.lifecycle
            await (await rt.create_agent(session_id="warm")).dispose()
            before = settled_rss()
            with contextlib.ExitStack() as held:
                cpu0, t0 = time.process_time(), time.perf_counter()
                await _create(rt, n, params["creators"], "r", admissions.setup, progress, "registered", held, active)
                created_s = time.perf_counter() - t0
                await lifecycle.wait_until(lambda: lifecycle.passivations >= n - active)
                all_s, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                passivated = lifecycle.passivated
                rss = settled_rss()
                registered = {
                    "agents": len(rt.list_agents()), "passivated": passivated, "active": n - passivated,
                    "rss_mb": rss / 2**20, "rss_before_mb": before / 2**20,
                    "bytes_per_registered": (rss - before) / n,
                    "created_per_s": n / created_s, "created_and_passivated_per_s": n / all_s,
                    "cpu_us_per_agent": cpu / n * 1e6, "seconds": all_s, "store_mb": _store_mb(home),
                }
                progress(1.0, f"registered: {passivated:,} of {n:,} passivated, RSS {rss / 2**30:.2f} GB")
                rng = random.Random(params["seed"])
                picked = [f"r{i}" for i in rng.sample(range(active, n), messages + reactivations)]
                open_loop = await _open_loop(rt, admissions, picked[:messages], params["rate"], progress)
                # The messaged agents passivate again first: their passivation is not a reactivation's cost.
                settled = n - active + messages
                await lifecycle.wait_until(lambda: lifecycle.passivations >= settled)
                reactivation = await _reactivation_cpu(rt, picked[messages:], progress)
                held.close()
                registered["active_at_end"] = n - lifecycle.passivated
    return {"n": n, "params": params, "registered": registered, "open_loop": open_loop, "reactivation": reactivation}


def steady_verdict(samples: list[dict[str, Any]], warmup: float, rate: float) -> dict[str, Any]:
    """Flat or not after the warm-up, whether the process kept up, and why (in words)."""
    after = [sample for sample in samples if sample["t"] >= warmup] or samples[-1:]
    ref, end = after[0], samples[-1]
    growth = (end["rss_mb"] - ref["rss_mb"]) / ref["rss_mb"]
    flat = growth <= FLAT_TOLERANCE
    kept_up = end["behind"] <= rate * BACKLOG_SECONDS
    peak = max(sample["rss_mb"] for sample in after)
    late = max(sample["sender_late_ms"] for sample in after)
    memory = (f"RSS {ref['rss_mb']:,.0f} MB at {ref['t']:.0f} s -> {end['rss_mb']:,.0f} MB at {end['t']:.0f} s "
              f"({growth:+.1%}, peak {peak:,.0f} MB)")
    if kept_up:
        pace = (f"it kept up: {end['behind']:,} of {end['sent']:,} messages not yet admitted at the end, "
                f"{end['active']:,} agents active, the sender at most {late:,.0f} ms late")
    else:
        pace = (f"it did not keep up: {end['behind']:,} of {end['sent']:,} messages not admitted at the end, "
                f"{end['active']:,} agents active with {end['queued']:,} messages queued, the sender up to "
                f"{late:,.0f} ms late (more touches arrived than the process could run, and an agent with a "
                "message waiting is not passivated: the active agents grew with the backlog)")
    return {
        "flat": flat, "kept_up": kept_up, "growth": growth, "tolerance": FLAT_TOLERANCE,
        "reference_t": ref["t"], "peak_mb": peak,
        "why": f"{'flat' if flat else 'not flat'}: {memory}; {pace}",
    }


async def run_steady(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The ``steady`` phase (module docstring); ``params`` as in ``SIZES``."""
    n, after, seconds, every = params["n"], params["passivate_after"], params["seconds"], params["sample_every"]
    rate = n * params["fraction"]
    total = int(rate * seconds)
    admissions = Admissions(keep=False)
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loopdock-lifecycle-", dir=params.get("home_parent")) as scratch, \
            contextlib.ExitStack() as stack:
        async with Runtime.open(Path(scratch) / "home", passivate_after=after, gc_threshold=GC_THRESHOLD) as rt:
            lifecycle = rt.supervisor.lifecycle
            await _create(rt, n, params["creators"], "s", admissions.setup, progress, "steady")
            await lifecycle.wait_until(lambda: lifecycle.passivations >= n)
            rng = random.Random(params["seed"])
            sent, late = 0, 0.0
            start = trio.current_time() + 0.2
            cpu0 = time.process_time()
            reactivations0 = lifecycle.reactivations
            pauses = stack.enter_context(Pauses(_clock_offset()))  # each sample takes those since the last

            def sample(at: float) -> None:
                nonlocal late
                collected = pauses.take()
                agents = list(rt.supervisor.agents.values())
                passivated = sum(1 for agent in agents if agent.passivated)
                latencies = admissions.take_latencies()
                samples.append({
                    "t": round(at - start, 3), "rss_mb": rss_bytes() / 2**20, "active": len(agents) - passivated,
                    "queued": sum(agent.inbox_size for agent in agents), "sent": sent,
                    "admitted": admissions.count, "behind": sent - admissions.count,
                    "sender_late_ms": late * 1e3, "reactivations": lifecycle.reactivations - reactivations0,
                    "cpu_s": time.process_time() - cpu0, "admission": summary_ms(latencies),
                    "gc": {key: collected[key] for key in ("collections", "max_ms", "total_ms")},
                })
                late = 0.0
                progress((at - start) / seconds, f"steady: {at - start:,.0f}/{seconds:,.0f} s, "
                         f"RSS {samples[-1]['rss_mb']:,.0f} MB, {samples[-1]['active']:,} active, "
                         f"{samples[-1]['behind']:,} behind")

            async def sampler() -> None:
                k = 0
                while k * every <= seconds:
                    await trio.sleep_until(start + k * every)
                    sample(start + k * every)
                    k += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sampler)
                for i in range(total):
                    due = start + (i + 0.5) / rate  # between the samples' instants, never on one
                    await trio.sleep_until(due)
                    late = max(late, trio.current_time() - due)
                    agent = rt.get_agent(f"s{rng.randrange(n)}")
                    assert agent is not None
                    admissions.due[agent.followup(TEXT).id] = due
                    sent += 1
            cpu = time.process_time() - cpu0
    verdict = steady_verdict(samples, params["warmup"], rate)
    admitted = samples[-1]["admitted"]
    return {
        "n": n, "params": params, "rate_per_s": rate, "sent": sent, "samples": samples, "verdict": verdict,
        "reactivations": samples[-1]["reactivations"], "cpu_us_per_touch": cpu / max(sent, 1) * 1e6,
        "cpu_us_per_admitted": samples[-1]["cpu_s"] / max(admitted, 1) * 1e6, "cpu_share": cpu / seconds,
        "gc": {"collections": sum(s["gc"]["collections"] for s in samples),
               "max_ms": max(s["gc"]["max_ms"] for s in samples), "total_ms": sum(s["gc"]["total_ms"] for s in samples)},
    }


PHASES = {"registered": run_registered, "steady": run_steady}


def _one_phase(phase: str, params: dict[str, Any], stderr: TextIO) -> dict[str, Any]:
    """One phase in a fresh process (its progress goes to ``stderr``)."""
    command = [sys.executable, "-P", "-m", "loopdock.benchmarks._lifecycle", "--phase", phase,
               "--params", json.dumps(params)]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=stderr, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the lifecycle benchmark's {phase} phase failed (exit {done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def targets(mode: str, registered: dict[str, Any], steady: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets against the figures (``passed`` None: not judged, quick mode),
    each saying at which size it was measured; below N = 1,000,000 the RSS is also
    extrapolated, labelled as such."""
    judged = mode == "full"
    n = registered["n"]
    reg, loop = registered["registered"], registered["open_loop"]
    at_n = f"N = {n:,} registered, {n - reg['passivated']:,} active"
    rss_gb = reg["rss_mb"] / 1024
    rss_note = None
    rss_judged = rss_gb
    if n < TARGET_N:
        rss_judged = (reg["rss_before_mb"] * 2**20 + reg["bytes_per_registered"] * TARGET_N) / 2**30
        rss_note = (f"extrapolated to N = {TARGET_N:,}: {rss_judged:.2f} GB (RSS before the agents + "
                    f"{reg['bytes_per_registered']:,.0f} B x {TARGET_N:,}); measured at N = {n:,}")
    p99 = loop["admission"]["p99_ms"]
    every = loop["admitted"] == loop["messages"]
    verdict = steady["verdict"]
    seconds = steady["params"]["seconds"]
    during = f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
    return [
        {"target": f"RSS with {TARGET_N:,} registered / {TARGET_ACTIVE:,} active <= {TARGET_RSS_GB:g} GB",
         "measured": rss_gb, "unit": "GB", "at": at_n, "note": rss_note,
         "passed": (rss_judged <= TARGET_RSS_GB) if judged else None},
        {"target": f"first message to a passivated agent -> admission, open loop, p99 <= {TARGET_P99_MS:g} ms "
                   f"at N = {TARGET_N:,}",
         "measured": p99, "unit": "ms", "at": f"{at_n}, {loop['rate_per_s']:g} messages/s",
         "note": None if every else f"only {loop['admitted']} of {loop['messages']} admitted",
         "passed": (p99 <= TARGET_P99_MS and every and n >= TARGET_N) if judged else None},
        {"target": "reactivation CPU per agent (no target: reported)",
         "measured": registered["reactivation"]["cpu_us_per_agent"], "unit": "us", "at": at_n, "note": None,
         "passed": None},
        {"target": f"{steady['n']:,} agents, {steady['params']['fraction']:.0%} touched per second for "
                   f"{during}: memory flat",
         "measured": verdict["growth"] * 100, "unit": "% RSS growth after the warm-up", "at": f"N = {steady['n']:,}",
         "note": verdict["why"], "passed": (verdict["flat"] and verdict["kept_up"]) if judged else None},
    ]


def run_lifecycle(mode: str, out_dir: Path, stderr: TextIO = sys.stderr) -> dict[str, Any]:
    """``loopdock bench --lifecycle``: both phases of ``SIZES[mode]``, each in a fresh
    process; writes and returns ``bench-lifecycle-<mode>.json``."""
    cfg = SIZES[mode]
    ran_on = machine()  # the commit and the load as the runs start
    registered = _one_phase("registered", cfg["registered"], stderr)
    registered["load_average"] = load_average()
    stderr.write("\n")
    steady = _one_phase("steady", cfg["steady"], stderr)
    steady["load_average"] = load_average()
    stderr.write("\n")
    results = {
        "mode": mode, "config": cfg, "registered": registered, "steady": steady,
        "targets": targets(mode, registered, steady), "machine": {**ran_on, "load_average_at_end": load_average()},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"bench-lifecycle-{mode}.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopdock.benchmarks._lifecycle",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=sorted(PHASES), required=True)
    parser.add_argument("--params", required=True, help="the phase's sizes, as JSON (see SIZES)")
    args = parser.parse_args(argv)
    try:
        params = json.loads(args.params)
    except ValueError:
        parser.error(f"--params must be a JSON object, not {args.params!r}")
    if not isinstance(params, dict):
        parser.error(f"--params must be a JSON object, not {args.params!r}")

    def progress(fraction: float, label: str) -> None:
        sys.stderr.write(f"\r{label} ({fraction:.0%})")
        sys.stderr.flush()

    result = trio.run(PHASES[args.phase], params, progress)
    result["machine"] = machine()
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
