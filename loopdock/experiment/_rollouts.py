"""Rollouts: every (task, sample, model, loop, repeat) of an experiment, each with a
stable identity.

A rollout's key is a digest of everything that decides what its agent sees and does
(the sample's content, the model and its parameters, the loop and driver, the repeat),
so a rerun of an unchanged experiment finds its earlier rollouts, and a changed sample
or parameter is a new rollout rather than a stale result. Each attempt at a rollout is
one session, ``exp.<run>.<key>.<attempt>``; the run's own session ``exp.<run>`` holds
its plans.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import attrs

from ._spec import Experiment, Loop, Model, Sample, Task

SESSION_PREFIX = "exp."


@attrs.frozen
class Rollout:
    task: Task
    sample: Sample
    model: Model
    loop: Loop
    repeat: int  # from 1
    key: str

    @property
    def cell(self) -> str:
        return cell_label(self.model.label, self.loop.label)


def cell_label(model: str, loop: str) -> str:
    return f"{model} x {loop}"


def run_session_id(run: str) -> str:
    return f"{SESSION_PREFIX}{run}"


def rollout_session_id(run: str, key: str, attempt: int) -> str:
    return f"{SESSION_PREFIX}{run}.{key}.{attempt}"


def rollout_prefix(run: str) -> str:
    return f"{SESSION_PREFIX}{run}."


def parse_rollout_session_id(run: str, session_id: str) -> tuple[str, int] | None:
    """``(key, attempt)`` of one of ``run``'s rollout sessions, else None."""
    prefix = rollout_prefix(run)
    if not session_id.startswith(prefix):
        return None
    key, dot, attempt = session_id[len(prefix) :].partition(".")
    if not dot or not attempt.isdigit() or "." in key:
        return None
    return key, int(attempt)


def _sample_identity(sample: Sample) -> dict[str, object]:
    files = {dest: str(source.path) if source.path is not None else {"text": source.text}
             for dest, source in sorted(sample.files.items())}  # fmt: skip
    return {"id": sample.id, "input": sample.input, "target": list(sample.target), "files": files}


def rollout_key(run: str, task: Task, sample: Sample, model: Model, loop: Loop, repeat: int) -> str:
    identity = {
        "run": run,
        "task": task.id,
        "sample": _sample_identity(sample),
        "model": model.agent_options(),
        "loop": loop.loop,
        "driver": loop.driver,
        "repeat": repeat,
    }
    text = json.dumps(identity, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(experiment: Experiment) -> Iterator[Rollout]:
    """Every rollout, repeat by repeat: an interrupted run then has whole repeats of the
    matrix rather than all repeats of its first tasks."""
    for repeat in range(1, experiment.repeats + 1):
        for task in experiment.tasks:
            for sample in task.samples:
                for model in experiment.models:
                    for loop in experiment.loops:
                        key = rollout_key(experiment.name, task, sample, model, loop, repeat)
                        yield Rollout(task, sample, model, loop, repeat, key)
