"""loopdock's own workloads. Every one runs a real ``Runtime`` on a home on disk (SQLite
persistence on, unless it says otherwise) in a process of its own.

- ``turns``: N agents on the ``standard`` loop, K turns each; a turn is the client's
  request (followup -> ping calls ``bench_echo`` -> the tool runs -> ping answers ->
  idle), persisted. The unit the autogen-core peer is compared on.
- ``bare``: the runtime alone: a no-op loop (a turn that takes no step), persistence off.
- ``priority``: people arriving open-loop (Poisson) at idle agents while automatic turns
  load the runtime: idle, busy, saturated, and saturated without the admission gate.
- ``history``: one agent, thousands of turns: CPU per turn against the turn number.
- ``memory``: N agents each with a 100-turn history (made by one agent's real turns and
  copied in the store), resumed, one more turn each, then idle: RSS per agent, GC pauses.
- ``idle``: N idle agents created one after another: creation CPU and RSS per agent.
- ``latency``: N agents whose model calls take 0.5-30 s (a heavy-tailed stand-in adapter
  sleeping real seconds): the runtime's CPU and latency per call, memory while waiting.
- ``loops``: loops that differ (one tool call, three in parallel, a chain of four, no
  model, a 20 ms model), each measured alone: CPU and latency per turn.

Times come from ``trio.current_time()`` (wall) and ``time.process_time()`` (CPU of the
whole process, both threads).
"""

from __future__ import annotations

import gc
import json
import math
import random
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from loopdock import GC_THRESHOLD, DriverLoop, Message, ProducerSource, Runtime, TextBlock
from loopdock.actors import FakeDriver, ReactDriver
from loopdock.runtime import header_to_wire
from loopdock.runtime.models import Chunk, Finish, ModelRequest, TextDelta, ToolCallChunk, Usage
from loopdock.runtime.tools import Tool

from ._common import Progress, peak_rss_bytes, percentile, rss_bytes, settled_rss, summary_ms

TOOL_NAME = "bench_echo"
# One tool call per turn: the ping model calls the tool named on a `call:` line, then
# answers the tool's result with `pong: ...` (two steps per turn on the react driver).
TASK = 'call: bench_echo {"text": "hi"}'
TASK_3 = "\n".join(f'call: bench_echo {{"text": "part {i}"}}' for i in range(3))
HUMAN_TEXT = "a person asks: how is it going?"
PRODUCER = "bench-driver"
PING = {"provider": "ping", "model": "ping-1"}


async def _echo(arguments: Mapping[str, Any], ctx: Any) -> str:
    return f"echo: {arguments.get('text', '')}"


ECHO_TOOL = Tool(
    TOOL_NAME,
    "Echo the text back (a cheap in-memory tool for benchmarks).",
    {"type": "object", "properties": {"text": {"type": "string"}}},
    _echo,
    # It changes nothing: a crash-cut call runs again on resume, and no durable start
    # mark (a store commit) precedes each call (actors._step_resume).
    read_only=True,
)


# -- stand-in models ----------------------------------------------------------------------


class ChainModel:
    """Calls ``bench_echo`` until the turn holds ``length`` tool results, then answers:
    a loop of ``length + 1`` steps, all CPU."""

    cpu_bound = True

    def __init__(self, length: int) -> None:
        self.length = length

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        await trio.lowlevel.checkpoint()
        results = 0
        for message in reversed(request.messages):
            if message.role == "user":
                break
            results += message.role == "tool"
        if results < self.length:
            yield ToolCallChunk(f"chain-{len(request.messages)}", TOOL_NAME, json.dumps({"text": str(results)}))
            yield Finish("tool-calls")
            return
        yield TextDelta(f"done after {results} calls")
        yield Usage(0, 3)
        yield Finish("stop")


class SleepyModel:
    """A latency-bound stand-in: waits ``delay(request)`` real seconds (a trio sleep, as
    a network read would), then answers. Records how late each answer came back."""

    def __init__(self, delay: Any) -> None:
        self.delay = delay
        self.calls = 0
        self.late: list[float] = []  # seconds past the intended delay when resumed

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        delay = self.delay(request)
        due = trio.current_time() + delay
        await trio.sleep_until(due)
        self.late.append(trio.current_time() - due)
        self.calls += 1
        yield TextDelta("pong")
        yield Usage(0, 1)
        yield Finish("stop")


class NoopBody:
    async def run_turn(self, turn: Any) -> str:
        return "completed"


class NoopDriver:
    """The cheapest loop there is: a turn that takes no step (nothing but the runtime)."""

    async def create_agent(self, owner: Any, options: Any) -> Any:
        from loopdock.actors import create_with_body

        return await create_with_body(owner, options, NoopBody())

    async def resume(self, owner: Any, options: Any) -> Any:
        from loopdock.actors import resume_with_body

        return await resume_with_body(owner, options, NoopBody())


# -- helpers ------------------------------------------------------------------------------


class Recorder:
    """Times followups to the admission of the step they enter, through an outermost
    ``agent/pre-step`` listener (it reads the clock after ``await next_(pre)``, right
    before ``step/start``). Keyed by message, so an agent sent a second message before
    its first was admitted loses neither."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}  # message id -> intended arrival
        self.admission: list[float] = []

    def setup(self, ctx: Any) -> None:
        ctx.on("agent/pre-step", self._listener, prepend=True)

    async def _listener(self, pre: Any, next_: Any) -> Any:
        verdict = await next_(pre)
        for message in pre.messages:
            t0 = self.sent.pop(message.id, None)
            if t0 is not None:
                self.admission.append(trio.current_time() - t0)
        return verdict


class GcPauses:
    """CPython's cyclic-GC pauses while inside (the usual cause of latency tails): wall
    time, and the CPU time the collecting thread spent (a pause far longer in wall time
    than in CPU is the thread not running: preempted, its virtual CPU not scheduled, or
    waiting for the GIL, which a collector callback written in Python may hand to the
    other thread).

    Collections happen in whichever thread allocates (the store's writer thread too), so
    starts are kept per thread. A collector callback may give the GIL away, so this can be
    entered while another thread's collection is under way: a ``stop`` whose ``start`` it
    did not see is skipped (it once showed up as a pause of 29,000 s)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.cpu: list[float] = []
        self.by_generation: list[int] = [0, 0, 0]
        self._started: dict[int, tuple[float, float]] = {}

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._started[thread] = (time.perf_counter(), time.thread_time())
            return
        started = self._started.pop(thread, None)
        if started is None:
            return
        self.pauses.append(time.perf_counter() - started[0])
        self.cpu.append(time.thread_time() - started[1])
        self.by_generation[info["generation"]] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "collections": len(self.pauses),
            "by_generation": self.by_generation,
            "p99_ms": percentile(self.pauses, 99) * 1e3,
            "max_ms": max(self.pauses, default=0.0) * 1e3,
            "cpu_p99_ms": percentile(self.cpu, 99) * 1e3,
            "cpu_max_ms": max(self.cpu, default=0.0) * 1e3,
            "over_10ms": sum(1 for p in self.pauses if p > 0.01),
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
    rt.dock.register(DriverLoop.from_driver("bench-noop", NoopDriver()))
    rt.register_adapter("chain", ChainModel(4))


def _automatic(text: str) -> Message:
    return Message("user", (TextBlock(text),), source=ProducerSource(PRODUCER))


async def _create(
    rt: Runtime, home: _Home, session_id: str, loop: str = "standard", *,
    recorder: Recorder | None = None, model: Mapping[str, str] = PING, driver: str | None = None,
) -> Any:
    return await rt.create_agent(
        session_id=session_id, loop=loop, driver=driver,
        setup=recorder.setup if recorder is not None else None,
        agent_options={**model, "cwd": str(home.work)},
    )


async def _dispose(handles: list[Any]) -> None:
    async with trio.open_nursery() as nursery:
        for handle in handles:
            nursery.start_soon(handle.dispose)


async def _clients(agents: list[Any], k: int, text: str, latencies: list[float] | None = None) -> None:
    """Every agent's client sends ``k`` followups, one after the other's turn ended."""

    async def client(agent: Any) -> None:
        for _ in range(k):
            t0 = trio.current_time()
            agent.followup(text)
            await agent.wait_idle()
            if latencies is not None:
                latencies.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        for agent in agents:
            nursery.start_soon(client, agent)


async def _steps(handles: list[Any]) -> int:
    steps = 0
    for handle in handles:
        steps += sum(1 for e in await handle.agent.session.read_events() if e.type == "step/start")
    return steps


# -- turns: the unit compared with the peer ------------------------------------------------


async def run_turns(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``n``, ``k``; optional ``home_parent``, and ``tracing`` (spans on: an
    SDK provider whose batch processor counts and drops them, see ``_tracing``)."""
    n, k = params["n"], params["k"]
    home = _Home(params.get("home_parent"))
    latencies: list[float] = []
    provider = spans = None
    if params.get("tracing"):
        from ._tracing import counting_provider

        provider, spans = counting_provider()
    traced: dict[str, Any] = {}
    try:
        async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD, tracer_provider=provider) as rt:
            _prepare(rt)
            warm = await _create(rt, home, "warm")
            await _clients([warm.agent], 2, TASK)
            await _dispose([warm])
            progress(0.1, f"turns N={n}: creating")
            handles = [await _create(rt, home, f"a{i}") for i in range(n)]
            for handle in handles:
                await handle.agent.session.flush()
            if provider is not None:
                provider.force_flush()  # the warm-up's spans: not in the figure
                spans0 = spans.spans
            progress(0.3, f"turns N={n}: running")
            gc_pauses = GcPauses()
            with gc_pauses:
                started, cpu0 = time.perf_counter(), time.process_time()
                await _clients([h.agent for h in handles], k, TASK, latencies)
                for handle in handles:
                    await handle.agent.session.flush()
                if provider is not None:
                    provider.force_flush()  # every span exported, inside the clock
                seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
            if provider is not None:
                traced = {"spans_per_turn": (spans.spans - spans0) / (n * k)}
            steps = await _steps(handles)
            commits = rt.supervisor.writer.commits
    finally:
        if provider is not None:
            provider.shutdown()
        home.remove()
    turns = n * k
    return {
        "n": n, "k": k, "turns": turns, "steps": steps, "seconds": seconds, "commits": commits,
        "turns_per_s": turns / seconds, "cpu_us_per_turn": cpu / turns * 1e6,
        "turn": summary_ms(latencies), "gc": gc_pauses.summary(), "peak_rss_mb": peak_rss_bytes() / 2**20,
        "tracing": provider is not None, **traced,
    }


async def run_bare(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The runtime alone: a no-op loop, persistence off. ``params``: ``n``, ``k``."""
    n, k = params["n"], params["k"]
    home = _Home(params.get("home_parent"))
    try:
        async with Runtime.open(home.path / "home", persist=False, gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            handles = [await _create(rt, home, f"b{i}", "bench-noop") for i in range(n)]
            await _clients([h.agent for h in handles[:1]], 10, "warm up")
            started, cpu0 = time.perf_counter(), time.process_time()
            await _clients([h.agent for h in handles], k, "x")
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        home.remove()
    turns = n * k
    return {"n": n, "k": k, "turns": turns, "seconds": seconds, "turns_per_s": turns / seconds,
            "cpu_us_per_turn": cpu / turns * 1e6}


# -- people arriving open-loop ------------------------------------------------------------


async def run_priority(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``scenario`` (idle, busy, saturated, saturated-ungated), ``holders``
    (idle agents people talk to), ``automatic`` (agents running automatic turns),
    ``think`` (seconds between one automatic turn's end and the next; 0 = back to back),
    ``rate`` (people per second, Poisson), ``seconds`` (how long people arrive),
    ``drain`` (how long after the last arrival people are waited for; None: until every
    one is admitted), ``seed``. Each person's followup is timed from its *intended*
    arrival (so a late sender counts against us) to the admission of its first step; a
    person still waiting when ``drain`` runs out counts with the wait so far (a lower
    bound: ``admission.censored`` says how many)."""
    scenario = params["scenario"]
    slots = {"automatic_slots": 10**9} if scenario.endswith("ungated") else {}
    home = _Home(params.get("home_parent"))
    recorder = Recorder()
    rng = random.Random(params.get("seed", 1))
    automatic_turns = 0
    try:
        async with Runtime.open(home.path / "home", **slots, gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            holders = [await _create(rt, home, f"h{i}", recorder=recorder) for i in range(params["holders"])]
            workers = [await _create(rt, home, f"w{i}") for i in range(params["automatic"])]
            for handle in holders:  # warm: each has answered once
                handle.agent.followup("hello")
            for handle in holders:
                await handle.agent.wait_idle()
            recorder.admission.clear()

            async def automatic(agent: Any) -> None:
                nonlocal automatic_turns
                await trio.sleep(rng.random() * max(params["think"], 0.01))
                while True:
                    reservation = agent.reserve(_automatic(TASK))
                    await agent.wait_idle()
                    if reservation.state == "admitted":
                        automatic_turns += 1
                    if params["think"]:
                        await trio.sleep(params["think"])

            gc_pauses = GcPauses()
            async with trio.open_nursery() as nursery:
                for handle in workers:
                    nursery.start_soon(automatic, handle.agent)
                await trio.sleep(0.5)  # the load is on
                # Without people first: the automatic throughput people must not cut.
                before, t0, cpu0 = automatic_turns, trio.current_time(), time.process_time()
                await trio.sleep(params["seconds"] / 2)
                alone = (automatic_turns - before) / (trio.current_time() - t0)
                alone_cpu = time.process_time() - cpu0
                arrivals = []
                t = trio.current_time()
                end = t + params["seconds"]
                while True:
                    t += rng.expovariate(params["rate"])
                    if t >= end:
                        break
                    arrivals.append(t)
                before, t0, cpu0 = automatic_turns, trio.current_time(), time.process_time()
                with gc_pauses:
                    for i, due in enumerate(arrivals):
                        await trio.sleep_until(due)
                        agent = holders[i % len(holders)].agent
                        recorder.sent[agent.followup(HUMAN_TEXT).id] = due  # admitted at a later checkpoint
                        progress(i / len(arrivals), f"priority {scenario}")
                    await trio.sleep_until(end)
                    drain = params.get("drain")
                    with trio.move_on_at(end + drain if drain is not None else math.inf):
                        for handle in holders:
                            await handle.agent.wait_idle()
                    censored = [trio.current_time() - due for due in recorder.sent.values()]
                    admitted = list(recorder.admission)
                with_people = (automatic_turns - before) / (trio.current_time() - t0)
                people_cpu = time.process_time() - cpu0
                busy = rt.supervisor.admission
                nursery.cancel_scope.cancel()
    finally:
        home.remove()
    return {
        "scenario": scenario, "holders": params["holders"], "automatic_agents": params["automatic"],
        "people": len(arrivals), "rate": params["rate"], "drain": params.get("drain"),
        "admission": {**summary_ms(admitted + censored), "censored": len(censored)},
        "automatic_turns_per_s_alone": alone, "automatic_turns_per_s_with_people": with_people,
        "cpu_share_alone": alone_cpu / (params["seconds"] / 2), "cpu_share_with_people": people_cpu / params["seconds"],
        "gate": {"granted": busy.granted, "waited": busy.waited, "stalled": busy.stalled},
        "gc": gc_pauses.summary(),
    }


# -- CPU per turn against history ----------------------------------------------------------


async def run_history(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """One agent, ``turns`` tool-call turns back to back; CPU per turn per ``block``."""
    turns, block = params["turns"], params["block"]
    home = _Home(params.get("home_parent"))
    blocks: list[float] = []
    try:
        async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            agent = (await _create(rt, home, "long")).agent
            for b in range(turns // block):
                cpu0 = time.process_time()
                for _ in range(block):
                    agent.followup(TASK)
                    await agent.wait_idle()
                blocks.append((time.process_time() - cpu0) / block * 1e6)
                progress((b + 1) * block / turns, f"history: {(b + 1) * block} turns")
            events = agent.session.event_count
            in_memory = agent.session.in_memory
            messages = len(await agent.read_transcript())
    finally:
        home.remove()
    return {"turns": turns, "block": block, "cpu_us_per_turn_by_block": blocks,
            "first_block_us": blocks[0], "last_block_us": blocks[-1], "last_vs_first": blocks[-1] / blocks[0],
            "events": events, "events_in_memory": in_memory, "transcript_messages": messages}


# -- memory: idle agents with a history -----------------------------------------------------


def _seed(db: Path, template: str, prefix: str, n: int) -> None:
    """Copy ``template``'s header and events to ``n`` new sessions, inside SQLite."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        # Benchmark data, not a user's: no fsync while copying it.
        conn.execute("PRAGMA synchronous=OFF")
        from loopdock.runtime import header_from_wire

        header = header_from_wire(json.loads(conn.execute("SELECT header FROM sessions WHERE id = ?", (template,)).fetchone()[0]))
        conn.execute("BEGIN IMMEDIATE")
        for i in range(n):
            sid = f"{prefix}{i}"
            wire = header_to_wire(attrs.evolve(header, id=sid))
            conn.execute("INSERT INTO sessions(id, header) VALUES (?, ?)", (sid, json.dumps(wire)))
            conn.execute(
                "INSERT INTO events(session_id, seq, type, time, data) "
                "SELECT ?, seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq",
                (sid, template),
            )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def run_memory(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``n`` agents, ``history`` turns each, ``wave`` (agents resumed and run
    at once). One agent makes the history with real turns; the store copies it to ``n``
    sessions; each is resumed and runs one more turn; then all are idle."""
    n, history, wave = params["n"], params["history"], params["wave"]
    home = _Home(params.get("home_parent"))
    try:
        async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            template = await _create(rt, home, "template")
            await _clients([template.agent], history, "hello there, how are you today?")
            await template.dispose()
        progress(0.1, f"memory: seeding {n} histories")
        await trio.to_thread.run_sync(_seed, home.path / "home" / "sessions.db", "template", "m", n)
        progress(0.2, "memory: resuming")
        async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            await trio.sleep(0.1)
            before = settled_rss()
            handles: list[Any] = []
            gc_pauses = GcPauses()
            cpu0 = time.process_time()
            with gc_pauses:
                for start in range(0, n, wave):
                    batch = [await rt.resume_agent(resume_session_id=f"m{i}") for i in range(start, min(n, start + wave))]
                    await _clients([h.agent for h in batch], 1, "one more question")
                    handles.extend(batch)
                    progress(0.2 + 0.75 * len(handles) / n, f"memory: {len(handles)}/{n} agents")
            cpu = time.process_time() - cpu0
            after = settled_rss()
            cache = rt.supervisor.history
            sample = handles[-1].agent
            result = {
                "n": n, "history_turns": history + 1, "events_per_session": sample.session.event_count,
                "kb_per_agent": (after - before) / n / 1024, "rss_mb": after / 2**20,
                "peak_rss_mb": peak_rss_bytes() / 2**20, "cpu_ms_per_agent": cpu / n * 1e3,
                "gc": gc_pauses.summary(), "warm_agents": len(cache), "warm_bytes": cache.held,
                "evictions": cache.evictions,
            }
            await _dispose(handles)
    finally:
        home.remove()
    return result


async def run_idle(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``n`` idle agents on the ``standard`` loop, created one by one."""
    n = params["n"]
    home = _Home(params.get("home_parent"))
    try:
        async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            await _dispose([await _create(rt, home, "warm")])
            before = settled_rss()
            handles = []
            cpu0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                handles.append(await _create(rt, home, f"i{i}"))
                if i % 1000 == 0:
                    progress(i / n, f"idle: {i}/{n} agents")
            for handle in handles:
                await handle.agent.session.flush()
            cpu, seconds = time.process_time() - cpu0, time.perf_counter() - t0
            after = settled_rss()
            result = {"n": n, "cpu_us_per_agent": cpu / n * 1e6, "seconds": seconds,
                      "kb_per_agent": (after - before) / n / 1024, "rss_mb": after / 2**20,
                      "peak_rss_mb": peak_rss_bytes() / 2**20}
            await _dispose(handles)
    finally:
        home.remove()
    return result


# -- latency-bound: model calls of seconds ---------------------------------------------------


def heavy_tailed(seed: int, low: float, high: float, alpha: float) -> Any:
    """Pareto(``alpha``) delays from ``low`` seconds, cut at ``high``; deterministic."""
    rng = random.Random(seed)

    def delay(request: ModelRequest) -> float:
        return min(high, low * (1.0 - rng.random()) ** (-1.0 / alpha))

    return delay


async def run_latency(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``n`` agents, one turn each (one model call), delays ``low``-``high``
    real seconds, Pareto ``alpha``."""
    n = params["n"]
    home = _Home(params.get("home_parent"))
    model = SleepyModel(heavy_tailed(params.get("seed", 7), params["low"], params["high"], params["alpha"]))
    overhead: list[float] = []  # turn wall time less the model's own delay
    try:
        async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD) as rt:
            _prepare(rt)
            rt.register_adapter("sleepy", model)
            before = settled_rss()
            handles = [await _create(rt, home, f"l{i}", model={"provider": "sleepy", "model": "s"}) for i in range(n)]
            for handle in handles:
                await handle.agent.session.flush()
            created = settled_rss()
            gate = rt.supervisor.admission
            peak_waiting = [0, 0]  # calls in flight, slots in use while they wait
            cpu0, t0 = time.process_time(), trio.current_time()

            async def client(agent: Any) -> None:
                started = trio.current_time()
                agent.followup("question")
                await agent.wait_idle()
                overhead.append(trio.current_time() - started)

            async def watch() -> None:
                while True:
                    await trio.sleep(0.5)
                    in_flight = len(handles) - model.calls
                    if in_flight > peak_waiting[0]:
                        peak_waiting[:] = [in_flight, gate.in_use]
                    progress(min(1.0, (trio.current_time() - t0) / params["high"]), f"latency: {model.calls}/{n} calls")

            async with trio.open_nursery() as nursery:
                watcher = trio.CancelScope()

                async def run_watch() -> None:
                    with watcher:
                        await watch()

                nursery.start_soon(run_watch)
                waiting_rss = 0
                async with trio.open_nursery() as clients:
                    for handle in handles:
                        clients.start_soon(client, handle.agent)
                    await trio.sleep(params["low"] / 2)  # everyone is waiting on the model
                    waiting_rss = rss_bytes()
                watcher.cancel()
            cpu, wall = time.process_time() - cpu0, trio.current_time() - t0
            await _dispose(handles)
    finally:
        home.remove()
    return {
        "n": n, "calls": model.calls, "low_s": params["low"], "high_s": params["high"], "alpha": params["alpha"],
        "wall_s": wall, "cpu_us_per_call": cpu / model.calls * 1e6,
        "turn_s": summary_ms(overhead),
        "late_ms": summary_ms(model.late),
        "kb_per_agent_idle": (created - before) / n / 1024, "kb_per_agent_waiting": (waiting_rss - before) / n / 1024,
        "peak_in_flight": peak_waiting[0], "slots_in_use_then": peak_waiting[1],
    }


# -- loops that differ ------------------------------------------------------------------------

#: loop name -> (loop, driver, model options, the client's text): what one turn does.
LOOPS: dict[str, tuple[str, str | None, dict[str, str], str]] = {
    "standard: 1 tool call": ("standard", None, PING, TASK),
    "minimal-first: 3 parallel calls": ("minimal-first", None, PING, TASK_3),
    "chain of 4 calls (react-b)": ("standard", "react-b", {"provider": "chain", "model": "chain-4"}, "go"),
    "fake driver: no model": ("bench-fake", None, PING, "hello"),
    "20 ms model": ("standard", None, {"provider": "sleepy", "model": "s"}, "hello"),
}


async def run_loops(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Each loop alone: ``n`` agents x ``k`` turns; CPU and latency per turn."""
    n, k = params["n"], params["k"]
    rows = []
    for index, (name, (loop, driver, model, text)) in enumerate(LOOPS.items()):
        home = _Home(params.get("home_parent"))
        latencies: list[float] = []
        try:
            async with Runtime.open(home.path / "home", gc_threshold=GC_THRESHOLD) as rt:
                _prepare(rt)
                rt.register_adapter("sleepy", SleepyModel(lambda request: 0.02))
                handles = [await _create(rt, home, f"x{i}", loop, model=model, driver=driver) for i in range(n)]
                await _clients([handles[0].agent], 1, text)
                steps0 = await _steps(handles)
                cpu0, t0 = time.process_time(), time.perf_counter()
                await _clients([h.agent for h in handles], k, text, latencies)
                for handle in handles:
                    await handle.agent.session.flush()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
                steps = await _steps(handles) - steps0
        finally:
            home.remove()
        turns = n * k
        rows.append({"loop": name, "turns": turns, "steps_per_turn": steps / turns,
                     "cpu_us_per_turn": cpu / turns * 1e6, "turns_per_s": turns / wall, "turn": summary_ms(latencies)})
        progress((index + 1) / len(LOOPS), f"loops: {name}")
    return {"n": n, "k": k, "rows": rows}
