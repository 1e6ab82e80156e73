"""A long run holds what its running rollouts need, not what the finished ones left: memory
stays flat as rollouts finish, and at most ``concurrency`` rollouts exist as tasks at once."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import trio

from loopdock import Runtime
from loopdock.actors._agent import AgentActor
from loopdock.experiment import parse_experiment, run_in_runtime
from loopdock.runtime.models import ModelRequest, Reply, ScriptedAdapter, ToolCall, Usage

SAMPLES = 800
EARLY = 200  # finished rollouts at the first measurement
CONCURRENCY = 4


class Forgetful(ScriptedAdapter):
    """A stand-in that keeps no requests (ScriptedAdapter keeps each one for tests to read)."""

    async def stream(self, request: ModelRequest):  # type: ignore[override]
        async for chunk in super().stream(request):
            yield chunk
        self.requests.clear()


def respond(request):
    if any(c.name == "list_dir" for m in request.messages for c in m.tool_calls):
        return Reply(text="pong", usage=Usage(10, 2))
    return Reply(tool_calls=[ToolCall("list_dir", {"path": "."})], usage=Usage(10, 2))


def rollout_tasks() -> int:
    """Tasks running the experiment runner's code, found by walking trio's task tree."""
    count = 0
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += task.name.startswith("loopdock.experiment._runner.")
        stack.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return count


async def test_memory_stays_flat_as_rollouts_finish_and_tasks_stay_within_concurrency(tmp_path):
    experiment = parse_experiment(
        {
            "name": "flat",
            "tasks": [{"id": "t", "samples": [{"id": f"s{i}", "input": f"q{i}", "target": "pong"}
                                              for i in range(SAMPLES)]}],  # fmt: skip
            "scorer": "includes",
            "models": [{"provider": "stub", "model": "m"}],
            "loops": ["standard"],
            "concurrency": {"default": CONCURRENCY},
        },
        base=Path(tmp_path),
    )
    traced: dict[int, int] = {}
    agents: dict[int, int] = {}
    most_tasks = 0

    def on_progress(progress):
        nonlocal most_tasks
        if progress.kind != "finished":
            return
        most_tasks = max(most_tasks, rollout_tasks())
        if progress.done in (EARLY, SAMPLES):
            gc.collect()
            traced[progress.done] = tracemalloc.get_traced_memory()[0]
            agents[progress.done] = sum(isinstance(o, AgentActor) for o in gc.get_objects())

    tracemalloc.start()
    try:
        with trio.fail_after(300):
            async with Runtime.open(tmp_path / "home") as rt:
                summary = await run_in_runtime(rt, experiment, adapters={"stub": Forgetful(respond)},
                                               on_progress=on_progress)  # fmt: skip
    finally:
        tracemalloc.stop()
    assert summary.scored == SAMPLES
    assert 1 <= most_tasks <= CONCURRENCY
    # Only the running rollouts' agents are alive, however many have finished.
    assert agents[EARLY] <= CONCURRENCY + 1 and agents[SAMPLES] <= CONCURRENCY + 1
    per_rollout = (traced[SAMPLES] - traced[EARLY]) / (SAMPLES - EARLY)
    assert abs(per_rollout) < 1024, f"{per_rollout:.0f} bytes per finished rollout"
