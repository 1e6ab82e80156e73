"""``loopdock experiment bench``: what the runner costs per rollout, at many at once.

N rollouts run all at once on a latency-bound stand-in model (each call sleeps, then
calls ``list_dir`` or answers), so the model's time is known and costs no CPU. The same
N agents are also run bare (``create_agent``, one followup, ``wait_idle``) on the same
model. The figures are ratios: the runner's CPU per rollout against the bare agents'
(its overhead: working directories, records, scoring, the gates), and the wall time
against the floor the model's latency sets. The load average is printed with them:
on a shared machine, compare runs taken at similar load.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TextIO

import attrs
import trio

from loopdock.runtime.models import Chunk, Finish, ModelRequest, TextDelta, ToolCallChunk, Usage

from .._runtime import Runtime
from ._runner import RunSummary, run_in_runtime
from ._spec import Concurrency, Experiment, Loop, Model, Sample, Scorer, Task


@attrs.frozen
class LatencyModel:
    """Sleeps ``latency`` seconds per call; calls ``list_dir`` until the request holds
    ``turns - 1`` tool results, then answers ``done``."""

    latency: float
    turns: int

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        await trio.sleep(self.latency)
        results = sum(1 for m in request.messages if m.role == "tool")
        if results < self.turns - 1:
            yield ToolCallChunk(f"bench-{results + 1}", "list_dir", '{"path": "."}')
            yield Usage(100, 10)
            yield Finish("tool-calls")
            return
        yield TextDelta("done")
        yield Usage(100, 1)
        yield Finish("stop")


def bench_experiment(rollouts: int, base: Path) -> Experiment:
    samples = tuple(Sample(str(i), f"sample {i}: look around, then say done", ("done",)) for i in range(1, rollouts + 1))
    return Experiment(
        name="bench",
        tasks=(Task("bench", samples),),
        scorer=Scorer("includes"),
        models=(Model("latency", "latency-1"),),
        loops=(Loop("standard"),),
        concurrency=Concurrency(default=rollouts),
        base=base,
    )


async def _bare(home: Path, model: LatencyModel, rollouts: int) -> None:
    # Beside the home, as the runner's working directories are: the file tools refuse
    # every path inside the home, so list_dir there would measure refusals, not work.
    work = home.with_name(home.name + "-work")
    work.mkdir(parents=True)
    async with Runtime.open(home) as rt:
        rt.register_adapter("latency", model)

        async def one(i: int) -> None:
            handle = await rt.create_agent(
                session_id=f"bare-{i}", agent_options={"provider": "latency", "model": "latency-1", "cwd": str(work)}
            )
            handle.agent.followup(f"sample {i}: look around, then say done")
            await handle.agent.wait_idle()
            await handle.dispose()

        async with trio.open_nursery() as nursery:
            for i in range(rollouts):
                nursery.start_soon(one, i)


async def _runner(home: Path, model: LatencyModel, rollouts: int) -> RunSummary:
    async with Runtime.open(home) as rt:
        return await run_in_runtime(rt, bench_experiment(rollouts, home), adapters={"latency": model})


@attrs.frozen
class Measured:
    wall: float
    cpu: float


def _measure(function: Callable[..., Awaitable[object]], *args: object) -> Measured:
    wall, cpu = time.perf_counter(), time.process_time()
    trio.run(function, *args)
    return Measured(time.perf_counter() - wall, time.process_time() - cpu)


def bench_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rollouts, latency, turns = args.rollouts, args.latency, args.turns
    if rollouts < 1 or latency <= 0 or turns < 1:
        print("loopdock experiment bench: --rollouts and --turns must be >= 1, --latency > 0", file=err)
        return 2
    model = LatencyModel(latency, turns)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="loopdock-xbench-") as scratch:
        print(f"bench: {rollouts} bare agents at once ...", file=err, flush=True)
        bare = _measure(_bare, Path(scratch, "bare"), model, rollouts)
        print(f"bench: {rollouts} rollouts of an experiment at once ...", file=err, flush=True)
        runner = _measure(_runner, Path(scratch, "runner"), model, rollouts)
    load_after = os.getloadavg()
    floor = latency * turns
    lines = [
        f"experiment runner bench: {rollouts} rollouts at once, {turns} model calls each, {latency:g} s per call",
        f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs)",
        "",
        f"{'':24} {'wall s':>8} {'rollouts/s':>11} {'CPU ms/rollout':>15} {'wall / floor':>13}",
    ]
    for name, m in (("bare agents", bare), ("experiment runner", runner)):
        lines.append(
            f"{name:24} {m.wall:8.2f} {rollouts / m.wall:11.1f} {m.cpu / rollouts * 1000:15.2f} {m.wall / floor:13.2f}"
        )
    lines += [
        "",
        f"runner CPU per rollout: {runner.cpu / bare.cpu:.2f}x a bare agent's "
        f"(+{(runner.cpu - bare.cpu) / rollouts * 1000:.2f} ms per rollout)",
        f"runner rollouts/s: {bare.wall / runner.wall:.2f}x the bare agents' (the floor is {rollouts / floor:.0f}/s)",
    ]
    print("\n".join(lines), file=out)
    return 0
