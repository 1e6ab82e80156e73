"""A run's report, computed from its session logs: one row per (model, loop) cell, and
paired deltas between cells. docs/experiments.md ("Statistics") gives every formula.

Samples, not rollouts, are the statistical unit: a sample's repeats are averaged first.
A rollout counts once it is finished: scored (its value, partial credit kept), or
failed (a score of 0, and a failure in the cell's count). A rollout still running, cut
off by a kill, stopped by the budget or never started is pending, never a failure.

Cells: the pass rate (a score of 1) and the mean score, each the mean over samples of
the per-sample mean, with a Wilson interval over the samples. Deltas are paired per
sample: for each (task, sample) both cells finished, the mean score over its repeats on
one side minus the other's; the mean of those differences with a 95% t interval, the
exact sign-flip test's p-value, and Holm's adjustment over all of the report's deltas.
Loop deltas compare the loops of one model, model deltas the models on one loop, and
``compare`` in the experiment adds any other pair.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

import attrs

from ._budget import price_of
from ._history import RunHistory
from ._records import RolloutResult
from ._rollouts import cell_label
from ._spec import Price
from ._stats import clip, holm, mean_interval, percentile, sign_flip_p, wilson

_LIMIT_PREFIXES = ("turn limit", "token limit", "time limit")


def _limit_hit(result: RolloutResult) -> bool:
    ended = result.ended or {}
    why = str(ended.get("reason") or ended.get("cause") or "")
    return why.startswith(_LIMIT_PREFIXES)


@attrs.frozen
class Cell:
    model: str
    loop: str
    rollouts: int  # finished rollouts: scored or failed
    samples: int  # distinct (task, sample) among them: the statistical unit
    successes: int  # rollouts with a score of 1
    success_rate: float  # mean over samples of each sample's pass rate
    success_low: float
    success_high: float
    score: float  # mean over samples of each sample's mean score (failed: 0)
    score_low: float
    score_high: float
    failed: int  # finished rollouts that failed (counted as 0)
    pending: int  # rollouts of the plan not finished: not run yet, running, or stopped
    limit_hits: int
    turns: float  # mean model turns (steps) per finished rollout
    input_tokens: int  # totals over finished rollouts
    output_tokens: int
    cost: float | None  # total over finished rollouts; None without a price
    latency_p50_ms: float
    latency_p95_ms: float

    @property
    def label(self) -> str:
        return cell_label(self.model, self.loop)

    @property
    def cost_per_rollout(self) -> float | None:
        return None if self.cost is None or not self.rollouts else self.cost / self.rollouts

    @property
    def tokens_per_rollout(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.rollouts if self.rollouts else math.nan


@attrs.frozen
class Delta:
    """``a`` minus ``b``, paired per sample."""

    kind: str  # "loop", "model" or "compare"
    a: str
    b: str
    pairs: int
    success: float  # mean paired difference of scores (partial credit kept)
    success_low: float
    success_high: float
    cost: float | None
    cost_low: float | None
    cost_high: float | None
    p_value: float = math.nan  # exact sign-flip test; nan without pairs
    p_holm: float = math.nan  # adjusted over all the report's deltas

    @property
    def significant(self) -> bool:
        """Holm-adjusted p below 0.05 (never from an interval's width alone)."""
        return not math.isnan(self.p_holm) and self.p_holm < SIGNIFICANCE


SIGNIFICANCE = 0.05


@attrs.frozen
class Report:
    run: str
    currency: str
    planned: int
    cells: tuple[Cell, ...]
    deltas: tuple[Delta, ...]
    tasks: tuple[tuple[str, tuple[tuple[str, int, int], ...]], ...]  # task -> (cell, successes, finished)
    rollouts: tuple[RolloutResult, ...]  # the attempt each cell counts, in plan order
    judge_input_tokens: int
    judge_output_tokens: int

    @property
    def scored(self) -> int:
        return sum(c.rollouts - c.failed for c in self.cells)


def _cost(result: RolloutResult, prices: Mapping[str, Price]) -> float | None:
    price = price_of(result.provider, result.model, prices)
    return None if price is None else price.cost(result.input_tokens, result.output_tokens)


def _by_sample(results: Iterable[RolloutResult]) -> dict[tuple[str, str], list[RolloutResult]]:
    grouped: dict[tuple[str, str], list[RolloutResult]] = {}
    for result in results:
        if result.finished:
            grouped.setdefault((result.task, result.sample), []).append(result)
    return grouped


def _passed(result: RolloutResult) -> bool:
    return result.done and (result.value or 0.0) >= 1.0


def _cell(model: str, loop: str, chosen: Sequence[RolloutResult], planned: int, prices: Mapping[str, Price]) -> Cell:
    finished = [r for r in chosen if r.finished]
    groups = list(_by_sample(finished).values())
    m = len(groups)
    passes = sum(sum(1 for r in g if _passed(r)) / len(g) for g in groups)  # sum of per-sample pass rates
    scores = sum(sum(r.score for r in g) / len(g) for g in groups)
    costs = [_cost(r, prices) for r in finished]
    latencies = [float(r.latency_ms) for r in finished if r.latency_ms is not None]
    n = len(finished)
    return Cell(
        model=model,
        loop=loop,
        rollouts=n,
        samples=m,
        successes=sum(1 for r in finished if _passed(r)),
        success_rate=passes / m if m else math.nan,
        success_low=wilson(passes, m)[0],
        success_high=wilson(passes, m)[1],
        score=scores / m if m else math.nan,
        score_low=wilson(scores, m)[0],
        score_high=wilson(scores, m)[1],
        failed=sum(1 for r in finished if r.failed),
        pending=max(0, planned - n),
        limit_hits=sum(1 for r in finished if _limit_hit(r)),
        turns=sum(r.steps for r in finished) / n if n else math.nan,
        input_tokens=sum(r.input_tokens for r in finished),
        output_tokens=sum(r.output_tokens for r in finished),
        cost=None if any(c is None for c in costs) else sum(c for c in costs if c is not None),
        latency_p50_ms=percentile(latencies, 50),
        latency_p95_ms=percentile(latencies, 95),
    )


def _per_sample(results: Iterable[RolloutResult], prices: Mapping[str, Price]) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(task, sample) -> (mean score over its finished repeats, mean cost or None)."""
    out = {}
    for key, group in _by_sample(results).items():
        costs = [_cost(r, prices) for r in group]
        cost = None if any(c is None for c in costs) else sum(c for c in costs if c is not None) / len(group)
        out[key] = (sum(r.score for r in group) / len(group), cost)
    return out


def _delta(kind: str, a: str, b: str, by_cell: Mapping[str, dict[tuple[str, str], tuple[float, float | None]]]) -> Delta:
    left, right = by_cell.get(a, {}), by_cell.get(b, {})
    shared = sorted(set(left) & set(right))
    differences = [left[k][0] - right[k][0] for k in shared]
    mean, low, high = mean_interval(differences)
    success = mean, clip(low, -1.0, 1.0), clip(high, -1.0, 1.0)  # a difference of scores is within +-1
    cost_pairs = [(left[k][1], right[k][1]) for k in shared]
    cost: tuple[float, float, float] | None = None
    if cost_pairs and all(x is not None and y is not None for x, y in cost_pairs):
        cost = mean_interval([x - y for x, y in cost_pairs if x is not None and y is not None])
    return Delta(
        kind, a, b, len(shared), *success,
        cost=cost[0] if cost else None, cost_low=cost[1] if cost else None, cost_high=cost[2] if cost else None,
        p_value=sign_flip_p(differences),
    )  # fmt: skip


def _with_holm(deltas: Sequence[Delta]) -> list[Delta]:
    adjusted = holm([d.p_value for d in deltas])
    return [attrs.evolve(d, p_holm=p) for d, p in zip(deltas, adjusted, strict=True)]


def _plan_order(history: RunHistory, chosen: Sequence[RolloutResult]) -> tuple[list[str], list[str], list[str]]:
    plan = history.plan
    if plan is not None:
        return [m["label"] for m in plan["models"]], list(plan["loops"]), [t["id"] for t in plan["tasks"]]
    models = list(dict.fromkeys(r.model_label for r in chosen))
    loops = list(dict.fromkeys(r.loop_label for r in chosen))
    return models, loops, list(dict.fromkeys(r.task for r in chosen))


def plan_prices(history: RunHistory) -> dict[str, Price]:
    """The prices the newest plan was run with."""
    plan = history.plan or {}
    prices = {}
    for model in plan.get("models", ()):
        price = model.get("price")
        if price is not None:
            prices[model["label"]] = Price(float(price["input"]), float(price["output"]))
    return prices


def build_report(history: RunHistory, prices: Mapping[str, Price] | None = None) -> Report:
    """The report of ``history``; ``prices`` (per "provider/model") override the plan's."""
    all_prices = {**plan_prices(history), **(prices or {})}
    plan = history.plan or {}
    latest = history.latest()
    keys = list(plan.get("keys") or latest)
    chosen = [latest[k] for k in keys if k in latest]
    models, loops, tasks = _plan_order(history, chosen)
    per_cell: dict[str, list[RolloutResult]] = {}
    for result in chosen:
        per_cell.setdefault(cell_label(result.model_label, result.loop_label), []).append(result)
    planned = len(keys)
    rollouts_per_cell = planned // (len(models) * len(loops)) if models and loops else 0
    cells = []
    for model in models:
        for loop in loops:
            results = per_cell.get(cell_label(model, loop), [])
            cells.append(_cell(model, loop, results, rollouts_per_cell, all_prices))
    by_cell = {label: _per_sample(results, all_prices) for label, results in per_cell.items()}
    deltas = [_delta("loop", cell_label(m, b), cell_label(m, a), by_cell) for m in models for a, b in combinations(loops, 2)]
    deltas += [_delta("model", cell_label(b, lp), cell_label(a, lp), by_cell) for lp in loops for a, b in combinations(models, 2)]
    deltas += [_delta("compare", pair[0], pair[1], by_cell) for pair in plan.get("compare", ())]
    deltas = _with_holm(deltas)
    task_rows = []
    for task in tasks:
        row = []
        for cell in cells:
            finished = [r for r in per_cell.get(cell.label, []) if r.task == task and r.finished]
            row.append((cell.label, sum(1 for r in finished if _passed(r)), len(finished)))
        task_rows.append((task, tuple(row)))
    return Report(
        run=history.run,
        currency=str(plan.get("currency", "USD")),
        planned=planned,
        cells=tuple(cells),
        deltas=tuple(deltas),
        tasks=tuple(task_rows),
        rollouts=tuple(chosen),
        judge_input_tokens=sum(r.judge_input_tokens for r in chosen if r.finished),
        judge_output_tokens=sum(r.judge_output_tokens for r in chosen if r.finished),
    )


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def cells_json(report: Report) -> dict[str, Any]:
    """The cells for programs (``report --json``): counts, tokens, cost, latency."""
    return {
        "run": report.run,
        "currency": report.currency,
        "planned": report.planned,
        "cells": [
            {
                "model": c.model,
                "loop": c.loop,
                "rollouts": c.rollouts,
                "samples": c.samples,
                "successes": c.successes,
                "successRate": _number(c.success_rate),
                "successInterval": [c.success_low, c.success_high],
                "score": _number(c.score),
                "scoreInterval": [c.score_low, c.score_high],
                "failed": c.failed,
                "pending": c.pending,
                "limitHits": c.limit_hits,
                "turns": _number(c.turns),
                "inputTokens": c.input_tokens,
                "outputTokens": c.output_tokens,
                "cost": c.cost,
                "costPerRollout": c.cost_per_rollout,
                "latencyMs": {"p50": _number(c.latency_p50_ms), "p95": _number(c.latency_p95_ms)},
            }
            for c in report.cells
        ],
        "deltas": [
            {
                "kind": d.kind, "a": d.a, "b": d.b, "pairs": d.pairs,
                "success": _number(d.success), "successInterval": [_number(d.success_low), _number(d.success_high)],
                "p": _number(d.p_value), "pHolm": _number(d.p_holm),
                "cost": _number(d.cost), "costInterval": [_number(d.cost_low), _number(d.cost_high)],
            }
            for d in report.deltas
        ],  # fmt: skip
    }
