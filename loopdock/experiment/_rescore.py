"""``rescore``: score a run's finished rollouts again with the experiment file's scorers,
from what their sessions hold (the agent's last answer) and their working directories,
without calling the rollouts' models again (a judge scorer does call its judge).

Each rescored rollout gets a new ``score`` record in its session: the newest one is its
result, so a report uses the new scores. The run's session gets a new plan record with
the new scorers' identities, so a ``--resume`` with the edited file goes on without
refusing a changed scorer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from loopdock.actors import AgentContext
from loopdock.runtime import LoopdockError
from loopdock.runtime.models import ModelAdapter

from .._runtime import Runtime
from ._errors import ExperimentError
from ._history import read_run
from ._records import RECORD_EVENT, RolloutResult, error_record, plan_record, score_record
from ._rollouts import Rollout, plan, run_session_id
from ._runner import _json, _register_adapters, final_answer
from ._scoring import ScoreInput, ScorerFailed, Scoring
from ._spec import Experiment
from ._workdir import work_root

_SCORER_FAILED = "scorer failed"


@attrs.frozen
class RescoreSummary:
    run: str
    rescored: int  # rollouts with a new score
    changed: int  # of them, how many scores differ from the old ones
    failed: tuple[str, ...] = ()  # "key: why" for each rollout the new scorer failed on (its old result stays)
    skipped: int = 0  # finished rollouts the file no longer plans (not rescored)


def _rescorable(result: RolloutResult) -> bool:
    """Scored, or failed only in its scorer: the agent's part is complete."""
    return result.done or (result.error or "").startswith(_SCORER_FAILED)


async def _append(rt: Runtime, session_id: str, record: Mapping[str, Any]) -> None:
    def setup(ctx: AgentContext) -> None:
        ctx.session.append(RECORD_EVENT, record)

    handle = await rt.resume_agent(resume_session_id=session_id, setup=setup)
    await handle.dispose()


async def rescore_in_runtime(
    rt: Runtime, experiment: Experiment, *, adapters: Mapping[str, ModelAdapter] | None = None
) -> RescoreSummary:
    """Rescore the run ``experiment.name`` with the scorers ``experiment`` names. Raises
    ExperimentError if the store holds no such run or a scorer cannot be loaded."""
    history = await trio.to_thread.run_sync(read_run, rt.supervisor.store, experiment.name)
    if history.plan is None and not history.results:
        raise ExperimentError("UNKNOWN_RUN", f"no experiment run {experiment.name!r} in {rt.home}: nothing to rescore")
    _register_adapters(rt, experiment, adapters or {})
    scoring = Scoring([experiment.scorer_for(t) for t in experiment.tasks], experiment.base, rt.adapters)
    planned: dict[str, Rollout] = {r.key: r for r in plan(experiment)}
    root = work_root(rt.home, experiment.name)
    run_session = run_session_id(experiment.name)
    if history.plan is not None:
        # Said first: until the last record below, the rollouts' scores mix old and new
        # scorers, and a report or a resume is refused (RESCORE_INTERRUPTED) if this stops.
        rescoring = {**_rescored_plan(history.plan, experiment), "rescoring": True}
        await _append(rt, run_session, plan_record(rescoring, f"experiment {experiment.name}: rescoring"))
    rescored = changed = skipped = 0
    failed: list[str] = []
    for result in history.latest().values():
        if not _rescorable(result):
            continue
        rollout = planned.get(result.key)
        if rollout is None:
            skipped += 1
            continue
        loaded = await trio.to_thread.run_sync(rt.supervisor.store.load, result.session_id)
        events = loaded[1] if loaded is not None else []
        answer = final_answer(events)
        scorer = experiment.scorer_for(rollout.task)
        score_input = ScoreInput(
            task=rollout.task.id, sample=rollout.sample.id, input=rollout.sample.input, target=rollout.sample.target,
            answer=answer, workdir=root / rollout.key, metadata=rollout.sample.metadata, model=rollout.model.label,
            loop=rollout.loop.label,
        )  # fmt: skip
        ended = dict(result.ended or {})
        latency = result.latency_ms or 0
        try:
            score = await scoring.score(scorer, score_input)
        except ScorerFailed as exc:
            failed.append(f"{result.key}: {exc}")
            if not result.done:  # still failed in its scorer: say why, now
                await _append(rt, result.session_id, error_record(f"{_SCORER_FAILED}: {exc}", ended, latency))
            continue
        record = score_record(score.value, answer, score.explanation, scorer.label, ended, latency, score.judge_usage)
        try:
            await _append(rt, result.session_id, record)
        except LoopdockError as exc:
            failed.append(f"{result.key}: its session could not take the new score: {exc}")
            continue
        rescored += 1
        changed += result.value != score.value
    if history.plan is not None:
        done = _rescored_plan(history.plan, experiment)
        await _append(rt, run_session, plan_record(done, f"experiment {experiment.name}: rescored"))
    return RescoreSummary(experiment.name, rescored, changed, tuple(failed), skipped)


def _rescored_plan(before: Mapping[str, Any], experiment: Experiment) -> dict[str, Any]:
    scorers = {t.id: experiment.scorer_for(t) for t in experiment.tasks}
    tasks = []
    for task in before.get("tasks", ()):
        scorer = scorers.get(task["id"])
        if scorer is not None:
            task = {**task, "scorer": scorer.label, "scorerIdentity": _json(attrs.asdict(scorer))}
        tasks.append(task)
    fields = {k: v for k, v in before.items() if k not in ("kind", "record", "schemaVersion", "rescoring")}
    return {**fields, "tasks": tasks, "pending": 0}


async def rescore_experiment(
    experiment: Experiment,
    *,
    home: str | os.PathLike[str] | None = None,
    adapters: Mapping[str, ModelAdapter] | None = None,
) -> RescoreSummary:
    """Open the runtime on ``home`` and rescore; see ``rescore_in_runtime``."""
    async with Runtime.open(home) as rt:
        return await rescore_in_runtime(rt, experiment, adapters=adapters)
