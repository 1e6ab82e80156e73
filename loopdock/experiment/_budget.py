"""Prices, the cost estimate checked before a run starts, and the budget while it runs.

Cost is never stored: it is tokens (in the session logs) times a price, so a report can
be re-priced (``report --prices``). The offline ``ping`` model costs nothing; any other
model has a price only if the experiment (or the report) gives one.

The estimate, per model, for each rollout still to run: the mean cost of the rollouts of
that model this run already scored if there are any; else ``limits.tokens`` at the
model's higher price (an upper bound); else ``ESTIMATED_TOKENS`` at that price (a rough
guess: set ``limits.tokens`` for a bound). A judge's cost is counted while the run goes
on but not estimated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from ._errors import ExperimentError
from ._records import RolloutResult
from ._rollouts import Rollout
from ._spec import Experiment, Model, Price

ESTIMATED_TOKENS = 20_000
FREE = Price(0.0, 0.0)


def price_of(provider: str, model: str, prices: Mapping[str, Price]) -> Price | None:
    label = f"{provider}/{model}"
    if label in prices:
        return prices[label]
    return FREE if provider == "ping" else None


def experiment_prices(experiment: Experiment) -> dict[str, Price]:
    return {m.label: m.price for m in experiment.models if m.price is not None}


def rollout_cost(result: RolloutResult, prices: Mapping[str, Price]) -> float | None:
    price = price_of(result.provider, result.model, prices)
    return price.cost(result.input_tokens, result.output_tokens) if price is not None else None


@attrs.frozen
class Estimate:
    cost: float
    rollouts: int
    how: str  # one line on how it was made


def _per_rollout(model: Model, price: Price, scored: Sequence[RolloutResult], tokens: int | None) -> tuple[float, str]:
    if scored:
        mean = sum(price.cost(r.input_tokens, r.output_tokens) for r in scored) / len(scored)
        return mean, f"{model.label}: the mean of its {len(scored)} scored rollouts"
    bound = tokens if tokens is not None else ESTIMATED_TOKENS
    per = bound * max(price.input, price.output) / 1_000_000
    why = "limits.tokens" if tokens is not None else f"a guess of {ESTIMATED_TOKENS:,} tokens (set limits.tokens)"
    return per, f"{model.label}: {why} at its higher price"


def estimate(experiment: Experiment, pending: Iterable[Rollout], history: Sequence[RolloutResult]) -> Estimate:
    prices = experiment_prices(experiment)
    counts: dict[str, int] = {}
    for rollout in pending:
        counts[rollout.model.label] = counts.get(rollout.model.label, 0) + 1
    total = 0.0
    notes = []
    for model in experiment.models:
        if model.label not in counts:
            continue
        price = price_of(model.provider, model.model, prices)
        if price is None:
            raise ExperimentError(
                "INVALID_EXPERIMENT",
                f"model {model.label} has no price, and limits.budget needs one: give the model a "
                f"price {{input, output}} ({experiment.currency} per million tokens) or drop the budget",
            )
        scored = [r for r in history if r.done and r.model_label == model.label]
        per, why = _per_rollout(model, price, scored, experiment.limits.tokens)
        total += per * counts[model.label]
        notes.append(f"{counts[model.label]} x {per:.4g} ({why})")
    return Estimate(total, sum(counts.values()), "; ".join(notes))


class Budget:
    """What the run has spent (earlier invocations included) against ``limits.budget``,
    and what the steps admitted but not yet counted are expected to spend (``reserved``):
    a step is admitted only if its expected cost fits beside both."""

    def __init__(self, limit: float | None, spent: float = 0.0) -> None:
        self.limit = limit
        self.spent = spent
        self.reserved = 0.0

    def add(self, cost: float) -> None:
        self.spent += cost

    def fits(self, cost: float) -> bool:
        return self.limit is None or self.spent + self.reserved + cost <= self.limit

    def reserve(self, cost: float) -> None:
        self.reserved += cost

    def release(self, cost: float) -> None:
        self.reserved = max(0.0, self.reserved - cost)

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent + self.reserved >= self.limit


def check_estimate(experiment: Experiment, guess: Estimate, spent: float) -> None:
    """Raise BUDGET_EXCEEDED, before anything runs, if the estimate does not fit."""
    budget = experiment.limits.budget
    if budget is None or spent + guess.cost <= budget:
        return
    currency = experiment.currency
    raise ExperimentError(
        "BUDGET_EXCEEDED",
        f"the {guess.rollouts} rollouts left to run are estimated at {guess.cost:.4g} {currency}"
        f"{f' (already spent: {spent:.4g})' if spent else ''}, over limits.budget {budget:g} {currency}; "
        f"nothing was started. Estimate: {guess.how}. Raise the budget, or lower repeats or limits.tokens",
    )
