"""``run_experiment``: every rollout of an experiment as one agent session, concurrently,
resumable.

A rerun reads the run back from the store first: a rollout with a score is done and is
not touched (no model call); any other rollout (failed, interrupted by a kill, stopped by
the budget, never started) runs again as a new attempt in a fresh working directory and
a fresh session. Within one run a rollout whose turn ended in an error (the model failed
after its adapter's own retries) is tried again up to ``retries`` times, after its
provider's gate has backed off.

Cancellation (Ctrl-C): every running rollout's turn ends ``aborted`` and its session is
made durable; none of them has a score, so the next run runs them again.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from loopdock.actors import AgentContext, PreStep, Reject, SessionActor, Verdict
from loopdock.runtime import Event, LoopdockError, Next, get_logger, safe_message
from loopdock.runtime.models import ModelAdapter, ModelRequest, RetryNotice, build_adapter

from .._runtime import Runtime
from ._budget import Budget, Estimate, check_estimate, estimate, experiment_prices, price_of, rollout_cost
from ._errors import ExperimentError
from ._gate import ProviderGate
from ._history import RunHistory, read_run
from ._records import (
    BUDGET_REASON,
    RECORD_EVENT,
    RolloutResult,
    error_record,
    fold_rollout,
    plan_record,
    rollout_record,
    score_record,
    usage_of,
)
from ._rollouts import Rollout, plan, rollout_session_id, run_session_id
from ._scoring import Score, ScoreInput, ScorerFailed, Scoring, load_function
from ._spec import Experiment, Limits, Model, Price
from ._workdir import prepare, work_root

log = get_logger(__name__)

Outcome = Literal["scored", "model-error", "failed", "budget"]


@attrs.frozen
class Progress:
    """One step of a run, for a progress display. ``result`` is the attempt that just
    finished (``finished``), if any."""

    kind: Literal["planned", "finished"]
    total: int  # rollouts in the plan
    done: int  # rollouts with a score (earlier runs' included)
    failed: int  # rollouts this run gave up on
    running: int
    spent: float
    cells: tuple[tuple[str, int, int], ...] = ()  # (model x loop, scored, planned)
    result: RolloutResult | None = None
    note: str = ""


@attrs.frozen
class RunSummary:
    run: str
    total: int
    skipped: int  # scored before this run started
    scored: int  # scored by this run
    failed: int  # gave up on in this run (they run again next time)
    not_started: int  # left out because the budget ran out
    spent: float  # the run's total, earlier invocations included
    estimate: Estimate | None
    currency: str
    throttles: Mapping[str, int] = attrs.field(factory=dict)  # provider -> how often it pushed back

    @property
    def complete(self) -> bool:
        return self.skipped + self.scored == self.total


class _Meter:
    """One rollout's usage as its log records it: enforces the turn and token limits and
    the run's budget at every step's entry as ceilings. A step is admitted only if what
    it is expected to use fits: its input is at least the previous step's input and
    output (the context only grows), its output about the previous one's. A step already
    running is not cut off: it may use more than expected (docs/experiments.md)."""

    def __init__(
        self, session: SessionActor, price: Price | None, budget: Budget, limits: Limits, largest_step: list[int],
    ) -> None:  # fmt: skip
        self._session = session
        self._price = price
        self._budget = budget
        self._limits = limits
        self._seen = 0
        self._last: tuple[int, int] | None = None  # (input, output) of this rollout's newest step
        # The model's largest (input, output) step in this run so far, shared by its
        # rollouts: the expected cost of a rollout's first step against the budget.
        self._largest = largest_step
        self._reserved = 0.0
        self.tokens = 0

    async def catch_up(self) -> None:
        events = await self._session.read_events(self._seen)  # the ones not counted yet
        for event in events:
            used_in, used_out = usage_of(event)
            if used_in or used_out:
                self.tokens += used_in + used_out
                self._last = used_in, used_out
                if used_in + used_out > sum(self._largest):
                    self._largest[:] = [used_in, used_out]
                if self._price is not None:
                    self._budget.add(self._price.cost(used_in, used_out))
        self._seen += len(events)
        self.release()  # the step it was held for is counted now

    def release(self) -> None:
        self._budget.release(self._reserved)
        self._reserved = 0.0

    def _next_step(self) -> tuple[int, int] | None:
        if self._last is None:
            return None
        used_in, used_out = self._last
        return used_in + used_out, used_out

    async def pre_step(self, pre: PreStep, next_: Next[PreStep, Verdict]) -> Verdict:
        await self.catch_up()
        limits = self._limits
        if limits.turns is not None and pre.step > limits.turns:
            return Reject(f"turn limit {limits.turns} reached")
        expected = self._next_step()
        more = sum(expected) if expected else 0
        if limits.tokens is not None and self.tokens + more > limits.tokens:
            return Reject(f"token limit {limits.tokens} reached ({self.tokens} used, the next step about {more} more)")
        if self._price is not None and self._budget.limit is not None:
            step_in, step_out = expected or (self._largest[0], self._largest[1])
            cost = self._price.cost(step_in, step_out)
            if not self._budget.fits(cost):
                return Reject(BUDGET_REASON)
            self._budget.reserve(cost)
            self._reserved = cost
        elif self._budget.exhausted:
            return Reject(BUDGET_REASON)
        return await next_(pre)


def _last_turn_end(events: Sequence[Event]) -> Mapping[str, Any] | None:
    for event in reversed(events):
        if event.type == "turn/end":
            reason = event.data.get("reason")
            return reason if isinstance(reason, Mapping) else None
    return None


def final_answer(events: Sequence[Event]) -> str:
    """The text of the last assistant message ('' if the agent never said anything)."""
    for event in reversed(events):
        if event.type == "assistant/message":
            return "".join(b.get("text", "") for b in event.data.get("content", ()) if b.get("type") == "text")
    return ""


class _Run:
    def __init__(
        self,
        rt: Runtime,
        experiment: Experiment,
        history: RunHistory,
        scoring: Scoring,
        on_progress: Callable[[Progress], None],
    ) -> None:
        self.rt = rt
        self.experiment = experiment
        self.scoring = scoring
        self.on_progress = on_progress
        self.prices = experiment_prices(experiment)
        self.work_root = work_root(rt.home, experiment.name)
        spent = sum(c for r in history.results if (c := rollout_cost(r, self.prices)) is not None)
        spent += sum(self._judge_cost(r) for r in history.results)
        self.budget = Budget(experiment.limits.budget, spent)
        self.gates: dict[str, ProviderGate] = {}
        self.total = 0
        self.done = 0
        self.scored = 0
        self.failed = 0
        self.not_started = 0
        self.running = 0
        self.cell_done: dict[str, int] = {}
        self.largest_step: dict[str, list[int]] = {}  # model label -> [input, output] of its largest step
        self.cell_total: dict[str, int] = {}

    def _judge_cost(self, result: RolloutResult) -> float:
        if not result.judge_input_tokens and not result.judge_output_tokens:
            return 0.0
        for task in self.experiment.tasks:
            judge = self.experiment.scorer_for(task).judge
            if task.id == result.task and judge is not None:
                price = price_of(judge.provider, judge.model, self.prices)
                return price.cost(result.judge_input_tokens, result.judge_output_tokens) if price else 0.0
        return 0.0

    def _report(self, kind: Literal["planned", "finished"], result: RolloutResult | None = None, note: str = "") -> None:
        cells = tuple((label, self.cell_done.get(label, 0), total) for label, total in self.cell_total.items())
        self.on_progress(
            Progress(kind, self.total, self.done, self.failed, self.running, self.budget.spent, cells, result, note)
        )

    async def worker(self, queue: Iterator[Rollout], attempts: Mapping[str, int]) -> None:
        """Run rollouts from ``queue`` (shared with the provider's other workers) one by one."""
        for rollout in queue:
            await self.rollout(rollout, attempts.get(rollout.key, 0) + 1)

    async def rollout(self, rollout: Rollout, attempt: int) -> None:
        gate = self.gates[rollout.model.provider]
        for _ in range(self.experiment.retries + 1):
            if self.budget.exhausted:
                self.not_started += 1
                return
            async with gate.slot():
                if self.budget.exhausted:
                    self.not_started += 1
                    return
                self.running += 1
                try:
                    outcome, result = await self._attempt(rollout, attempt)
                finally:
                    self.running -= 1
            if outcome == "scored":
                gate.succeeded()
                self.done += 1
                self.scored += 1
                self.cell_done[rollout.cell] = self.cell_done.get(rollout.cell, 0) + 1
                self._report("finished", result)
                return
            if outcome == "budget":
                self.not_started += 1
                self._report("finished", result, BUDGET_REASON)
                return
            if outcome == "model-error":
                gate.throttled()
            self._report("finished", result, f"attempt {attempt} failed")
            if outcome == "failed":
                break  # a scorer or setup failure will not mend itself within this run
            attempt += 1
        self.failed += 1

    async def _attempt(self, rollout: Rollout, attempt: int) -> tuple[Outcome, RolloutResult | None]:
        experiment = self.experiment
        session_id = rollout_session_id(experiment.name, rollout.key, attempt)
        workdir = await trio.to_thread.run_sync(prepare, self.work_root, rollout.key, rollout.sample)
        gate = self.gates[rollout.model.provider]
        price = price_of(rollout.model.provider, rollout.model.model, self.prices)
        meter: list[_Meter] = []

        async def watch_retries(request: ModelRequest, next_: Next[ModelRequest, ModelRequest]) -> ModelRequest:
            # The adapter retries a 429/5xx itself and reports each retry here: the
            # provider is pushing back, so admit fewer rollouts for a while.
            inner = request.on_retry

            async def on_retry(notice: RetryNotice) -> None:
                gate.throttled()
                if inner is not None:
                    await inner(notice)

            return await next_(attrs.evolve(request, on_retry=on_retry))

        def setup(ctx: AgentContext) -> None:
            # Inside the publication transaction: the session exists only with its identity.
            ctx.session.append(RECORD_EVENT, rollout_record(experiment.name, rollout, attempt))
            largest = self.largest_step.setdefault(rollout.model.label, [0, 0])
            m = _Meter(ctx.session, price, self.budget, experiment.limits, largest)
            meter.append(m)
            ctx.on("agent/pre-step", m.pre_step, prepend=True)
            ctx.on("agent/request", watch_retries)

        started = trio.current_time()
        try:
            handle = await self.rt.create_agent(
                session_id=session_id,
                loop=rollout.loop.loop,
                driver=rollout.loop.driver,
                agent_options={**rollout.model.agent_options(), "cwd": str(workdir)},
                setup=setup,
            )
        except LoopdockError as exc:
            log.warning("rollout not created", session_id=session_id, error=safe_message(exc))
            return "failed", None
        try:
            agent = handle.agent
            agent.followup(rollout.sample.input)
            limit = experiment.limits.time
            with trio.move_on_after(limit if limit is not None else math.inf) as timer:
                await agent.wait_idle()
            if timer.cancelled_caught:
                agent.cancel(f"time limit {limit:g} s reached")
                await agent.wait_idle()
            latency_ms = round((trio.current_time() - started) * 1000)
            await meter[0].catch_up()
            events = await agent.session.read_events()
            ended = _last_turn_end(events)
            outcome: Outcome
            if ended is None or ended.get("kind") in ("error", "interrupted"):
                why = str(ended.get("message", ended.get("kind"))) if ended else "the turn never ended"
                agent.session.append(RECORD_EVENT, error_record(why, ended, latency_ms))
                outcome = "model-error"
            elif ended.get("kind") == "blocked" and ended.get("reason") == BUDGET_REASON:
                agent.session.append(RECORD_EVENT, error_record(BUDGET_REASON, ended, latency_ms))
                outcome = "budget"
            else:
                outcome = await self._score(rollout, agent.session, events, ended, workdir, latency_ms)
            await agent.session.flush()
            return outcome, fold_rollout(session_id, await agent.session.read_events())
        finally:
            if meter:
                meter[0].release()  # a rollout that ends early holds no share of the budget
            with trio.CancelScope(shield=True):
                await handle.dispose()

    async def _score(
        self, rollout: Rollout, session: SessionActor, events: Sequence[Event], ended: Mapping[str, Any], workdir: Path,
        latency_ms: int,
    ) -> Outcome:  # fmt: skip
        scorer = self.experiment.scorer_for(rollout.task)
        answer = final_answer(events)
        score_input = ScoreInput(
            task=rollout.task.id,
            sample=rollout.sample.id,
            input=rollout.sample.input,
            target=rollout.sample.target,
            answer=answer,
            workdir=workdir,
            metadata=rollout.sample.metadata,
            model=rollout.model.label,
            loop=rollout.loop.label,
        )
        try:
            score: Score = await self.scoring.score(scorer, score_input)
        except ScorerFailed as exc:
            session.append(RECORD_EVENT, error_record(f"scorer failed: {exc}", ended, latency_ms))
            return "failed"
        if score.judge_usage is not None and scorer.judge is not None:
            judge_price = price_of(scorer.judge.provider, scorer.judge.model, self.prices)
            if judge_price is not None:
                self.budget.add(judge_price.cost(int(score.judge_usage["inputTokens"]),
                                                 int(score.judge_usage["outputTokens"])))  # fmt: skip
        session.append(
            RECORD_EVENT,
            score_record(score.value, answer, score.explanation, scorer.label, ended, latency_ms, score.judge_usage),
        )
        return "scored"


def _check_registered(rt: Runtime, experiment: Experiment) -> None:
    def missing_adapter(provider: str, where: str) -> ExperimentError:
        hint = " (the deepseek adapter is registered when DEEPSEEK_API_KEY is set)" if provider == "deepseek" else ""
        return ExperimentError(
            "INVALID_EXPERIMENT",
            f"{where} names provider {provider!r}, which has no model adapter{hint}; "
            f"registered: {', '.join(rt.adapters.names())}",
        )

    for index, model in enumerate(experiment.models):
        if model.provider not in rt.adapters:
            raise missing_adapter(model.provider, f"models[{index}]")
    for index, loop in enumerate(experiment.loops):
        if not rt.dock.has(loop.loop):
            known = ", ".join(info.id for info in rt.dock.list_loops())
            raise ExperimentError("INVALID_EXPERIMENT", f"loops[{index}] {loop.loop!r} is not a registered loop; loops: {known}")
        if loop.driver is not None and not rt.dock.has_driver(loop.driver):
            known = ", ".join(rt.dock.list_drivers())
            raise ExperimentError(
                "INVALID_EXPERIMENT", f"loops[{index}].driver {loop.driver!r} is not a registered driver; drivers: {known}"
            )
    for task in experiment.tasks:
        judge = experiment.scorer_for(task).judge
        if judge is not None and judge.provider not in rt.adapters:
            raise missing_adapter(judge.provider, f"the judge of task {task.id!r}")


def _register_adapters(rt: Runtime, experiment: Experiment, adapters: Mapping[str, ModelAdapter]) -> None:
    for name, adapter in adapters.items():
        if name not in rt.adapters:
            rt.register_adapter(name, adapter)
    for name, spec in experiment.providers.items():
        if name not in rt.adapters:
            rt.register_adapter(name, build_adapter(spec, os.environ))
    for index, model in enumerate(experiment.models):
        if model.adapter is not None and model.provider not in rt.adapters:
            factory = load_function(model.adapter, experiment.base)
            try:
                adapter = factory()
            except Exception as exc:
                raise ExperimentError(
                    "INVALID_EXPERIMENT", f"models[{index}].adapter {model.adapter} failed: {type(exc).__name__}: {exc}"
                ) from None
            rt.register_adapter(model.provider, adapter)


def _adapter_identity(rt: Runtime, model: Model) -> str:
    if model.adapter is not None:
        return model.adapter
    adapter = rt.adapters.get(model.provider)
    return f"{type(adapter).__module__}.{type(adapter).__qualname__}"


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))  # as the session log gives it back (tuples as lists)


def plan_fields(rt: Runtime, experiment: Experiment, rollouts: Sequence[Rollout], pending: int) -> dict[str, Any]:
    """What the run's session records of one ``experiment run``: enough for a report to
    know the matrix, the prices and which rollouts belong to it, without the file, and
    for a resume to see what would change under its earlier results."""
    return {
        "run": experiment.name,
        "tasks": [
            {"id": t.id, "samples": len(t.samples), "scorer": experiment.scorer_for(t).label,
             "scorerIdentity": _json(attrs.asdict(experiment.scorer_for(t)))}
            for t in experiment.tasks
        ],  # fmt: skip
        "models": [
            {"label": m.label, "price": None if m.price is None else {"input": m.price.input, "output": m.price.output},
             "adapter": _adapter_identity(rt, m)}
            for m in experiment.models
        ],  # fmt: skip
        "loops": [lp.label for lp in experiment.loops],
        "repeats": experiment.repeats,
        "limits": attrs.asdict(experiment.limits),
        "currency": experiment.currency,
        "compare": [list(pair) for pair in experiment.compare],
        "rollouts": len(rollouts),
        "pending": pending,
        "keys": [r.key for r in rollouts],
    }


# What a rollout's result depends on besides its key: a resume under a change of one of
# these would mix results made under the old value with ones made under the new. The
# budget is not among them: raising it to finish a run is what --resume is for.
_RESULT_LIMITS = ("turns", "tokens", "time")


def plan_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What ``now`` changes against the earlier plan ``before`` that would make their
    results incomparable; a plan recorded before a field was recorded does not count."""
    changes = []
    old_limits, new_limits = before.get("limits") or {}, now["limits"]
    for name in _RESULT_LIMITS:
        if name in old_limits and old_limits[name] != new_limits[name]:
            changes.append(f"limits.{name} {old_limits[name]} -> {new_limits[name]}")
    old_tasks = {t["id"]: t for t in before.get("tasks", ())}
    for task in now["tasks"]:
        old = old_tasks.get(task["id"])
        if old is not None and "scorerIdentity" in old and old["scorerIdentity"] != task["scorerIdentity"]:
            changes.append(f"the scorer of task {task['id']} ({old['scorer']} -> {task['scorer']})")
    old_models = {m["label"]: m for m in before.get("models", ())}
    for model in now["models"]:
        old = old_models.get(model["label"])
        if old is not None and "adapter" in old and old["adapter"] != model["adapter"]:
            changes.append(f"the adapter of {model['label']} ({old['adapter']} -> {model['adapter']})")
    return changes


def _check_unchanged(history: RunHistory, fields: Mapping[str, Any]) -> None:
    history.refuse_mid_rescore("resuming it")
    if history.plan is None or not any(r.finished for r in history.results):
        return
    changes = plan_changes(history.plan, fields)
    if changes:
        raise ExperimentError(
            "INVALID_EXPERIMENT",
            f"run {history.run!r} has results made under another plan; resuming would mix them with new ones. "
            f"Changed: {'; '.join(changes)}. Restore the file, or give the experiment another name",
        )


async def _record_plan(rt: Runtime, fields: Mapping[str, Any]) -> None:
    text = f"experiment {fields['run']}: {fields['rollouts']} rollouts, {fields['pending']} to run"
    record = plan_record(fields, text)

    def setup(ctx: AgentContext) -> None:
        ctx.session.append(RECORD_EVENT, record)

    session_id = run_session_id(str(fields["run"]))
    exists = await trio.to_thread.run_sync(rt.supervisor.store.exists, session_id)
    if exists:
        handle = await rt.resume_agent(resume_session_id=session_id, setup=setup)
    else:
        handle = await rt.create_agent(session_id=session_id, agent_options={"provider": "ping"}, setup=setup)
    await handle.dispose()


async def run_in_runtime(
    rt: Runtime,
    experiment: Experiment,
    *,
    adapters: Mapping[str, ModelAdapter] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> RunSummary:
    """Run (or resume) ``experiment`` on an open runtime. Raises ExperimentError before
    anything starts if the experiment names something the runtime lacks, a scorer cannot
    be loaded, or the estimate is over the budget."""
    _register_adapters(rt, experiment, adapters or {})
    _check_registered(rt, experiment)
    scoring = Scoring([experiment.scorer_for(t) for t in experiment.tasks], experiment.base, rt.adapters)
    history = await trio.to_thread.run_sync(read_run, rt.supervisor.store, experiment.name)
    rollouts = list(plan(experiment))
    done = {key for key, result in history.latest().items() if result.done}
    pending = [r for r in rollouts if r.key not in done]
    fields = plan_fields(rt, experiment, rollouts, len(pending))
    _check_unchanged(history, fields)
    run = _Run(rt, experiment, history, scoring, on_progress or (lambda _: None))
    guess = None
    if experiment.limits.budget is not None:
        guess = estimate(experiment, pending, history.results)
        check_estimate(experiment, guess, run.budget.spent)
    await _record_plan(rt, fields)
    run.total = len(rollouts)
    run.done = len(rollouts) - len(pending)
    for rollout in rollouts:
        run.cell_total[rollout.cell] = run.cell_total.get(rollout.cell, 0) + 1
        if rollout.key in done:
            run.cell_done[rollout.cell] = run.cell_done.get(rollout.cell, 0) + 1
    providers = {m.provider for m in experiment.models}
    run.gates = {p: ProviderGate(experiment.concurrency.limit(p)) for p in providers}
    run._report("planned", note=f"{len(pending)} to run, {run.done} already scored")
    async with trio.open_nursery() as nursery:
        for provider, gate in run.gates.items():
            # A provider's rollouts start lazily: as many workers as its gate admits at
            # most, each taking the next rollout when its last one is done. A task per
            # rollout would hold the whole plan in memory from the start.
            queue = iter([r for r in pending if r.model.provider == provider])
            for _ in range(gate.max_limit):
                nursery.start_soon(run.worker, queue, history.attempts)
    return RunSummary(
        run=experiment.name,
        total=len(rollouts),
        skipped=len(rollouts) - len(pending),
        scored=run.scored,
        failed=run.failed,
        not_started=run.not_started,
        spent=run.budget.spent,
        estimate=guess,
        currency=experiment.currency,
        throttles={p: gate.throttles for p, gate in run.gates.items() if gate.throttles},
    )


async def run_experiment(
    experiment: Experiment,
    *,
    home: str | os.PathLike[str] | None = None,
    adapters: Mapping[str, ModelAdapter] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> RunSummary:
    """Open the runtime on ``home`` and run (or resume) ``experiment`` in it; see
    ``run_in_runtime``."""
    async with Runtime.open(home) as rt:
        return await run_in_runtime(rt, experiment, adapters=adapters, on_progress=on_progress)
