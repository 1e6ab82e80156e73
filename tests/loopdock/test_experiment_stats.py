"""The report's statistics against scipy's on fixed data, including the all-0 and all-1
cases, and what the report makes of them: samples as the unit, failed rollouts as 0,
partial credit kept, p-values with Holm's adjustment. scipy is a test dependency only."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from loopdock.experiment._history import RunHistory
from loopdock.experiment._html import render_html
from loopdock.experiment._report import build_report, cells_json
from loopdock.experiment._stats import MONTE_CARLO_DRAWS, holm, mean_interval, sign_flip_p, wilson
from loopdock.experiment._text import render_text

from .test_experiment_report import plan, result


def scipy_wilson(k: int, n: int) -> tuple[float, float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return ci.low, ci.high


@pytest.mark.parametrize("n", [1, 2, 5, 10, 13, 30, 50])
def test_wilson_matches_scipy_from_all_0_to_all_1(n):
    for k in range(n + 1):
        assert wilson(k, n) == pytest.approx(scipy_wilson(k, n), abs=1e-9)
    assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0


def test_the_t_interval_matches_scipy():
    for values in ([0.0, 1.0, 0.5, 1.0], [0.2, -0.4, 0.1, 0.0, 1.0, -1.0, 0.5, 0.25] * 3):
        mean, low, high = mean_interval(values)
        sem = stats.sem(values)
        expected = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=sem)
        assert (mean, low, high) == pytest.approx((np.mean(values), *expected), abs=2e-3)


PASS_FAIL_PAIRS = [
    ([1, 1, 1, 1], [0, 0, 0, 0]),  # four discordant pairs one way: p = 0.125
    ([1] * 12, [1] * 12),  # all 1 on both sides
    ([0] * 12, [0] * 12),  # all 0 on both sides
    ([1, 1, 1, 0, 1, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0, 1, 1, 0, 0]),
    ([1] * 30 + [0] * 10, [1] * 20 + [0] * 20),
]


@pytest.mark.parametrize(("a", "b"), PASS_FAIL_PAIRS)
def test_pass_fail_pairs_get_the_exact_mcnemar_p(a, b):
    # Exact McNemar: a binomial test of the discordant pairs at one half.
    better = sum(1 for x, y in zip(a, b, strict=True) if x > y)
    worse = sum(1 for x, y in zip(a, b, strict=True) if x < y)
    expected = 1.0 if better + worse == 0 else stats.binomtest(better, better + worse, 0.5).pvalue
    assert sign_flip_p([x - y for x, y in zip(a, b, strict=True)]) == pytest.approx(expected, abs=1e-12)


def scipy_paired_permutation(a, b, **options):
    result = stats.permutation_test((np.array(a), np.array(b)), lambda x, y, axis: np.mean(x - y, axis=axis),
                                    permutation_type="samples", vectorized=True, **options)  # fmt: skip
    return result.pvalue


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([0.5, 1.0, 0.25, 1.0, 0.75, 0.0], [0.0, 0.5, 0.5, 0.0, 0.25, 0.0]),
        # Repeats averaged first: thirds, whose float sums must still tie exactly.
        ([1 / 3, 2 / 3, 1.0, 1 / 3, 2 / 3, 1 / 3, 0.0, 1.0], [0.0, 1 / 3, 2 / 3, 2 / 3, 0.0, 0.0, 1 / 3, 1 / 3]),
        ([0.9, 0.1, 0.35, 0.6, 0.2, 0.8, 0.45, 0.7, 0.05, 0.5, 0.3, 0.65], [0.1] * 12),
    ],
)
def test_partial_scores_get_the_exact_paired_permutation_p(a, b):
    expected = scipy_paired_permutation(a, b, n_resamples=np.inf)
    assert sign_flip_p([x - y for x, y in zip(a, b, strict=True)]) == pytest.approx(expected, abs=1e-12)


def test_too_many_distinct_sums_fall_back_to_a_seeded_monte_carlo():
    draw = np.random.default_rng(7)
    a, b = draw.random(40).round(6), draw.random(40).round(6)
    a = a + 0.15
    p = sign_flip_p(list(a - b))
    assert p == sign_flip_p(list(a - b))  # the seed is fixed
    assert (p * (1 + MONTE_CARLO_DRAWS)) % 1 == pytest.approx(0, abs=1e-6)  # a Monte Carlo estimate, not exact
    assert p == pytest.approx(scipy_paired_permutation(a, b, n_resamples=100_000, random_state=1), abs=0.01)
    assert math.isnan(sign_flip_p([]))


def test_holm_steps_down_and_keeps_order():
    p = [0.01, 0.04, 0.03, 0.005, math.nan]
    # m = 4: sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, then max(0.06, 0.04) = 0.06.
    assert holm(p)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(holm(p)[4])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def history_of(results, models, loops, **extra):
    return RunHistory("r", (plan(results, models, loops, **extra),), tuple(results), {})


def test_cells_treat_samples_not_repeats_as_the_unit():
    # 5 samples x 10 repeats, 4 passes each: 20/50 rollouts, but only 5 samples of evidence.
    results = [result("t", str(s), "p/a", "std", r, 1.0 if r <= 4 else 0.0) for s in range(1, 6) for r in range(1, 11)]
    [cell] = build_report(history_of(results, ["p/a"], ["std"])).cells
    assert (cell.rollouts, cell.samples, cell.successes, cell.success_rate) == (50, 5, 20, 0.4)
    assert (cell.success_low, cell.success_high) == pytest.approx(scipy_wilson(2, 5), abs=1e-9)
    assert cell.success_high - cell.success_low > 0.6  # not [0.28, 0.54], as 50 independent rollouts would say


def test_failed_rollouts_count_as_0_and_running_ones_are_pending():
    results = [
        result("t", "1", "p/a", "std", 1, 1.0),
        result("t", "2", "p/a", "std", 1, 0.0, status="error"),
        result("t", "3", "p/a", "std", 1, 0.0, status="incomplete"),  # running now, or cut off by a kill
    ]
    [cell] = build_report(history_of(results, ["p/a"], ["std"])).cells
    assert (cell.rollouts, cell.failed, cell.pending, cell.success_rate, cell.score) == (2, 1, 1, 0.5, 0.5)


def test_deltas_keep_partial_credit_and_carry_p_values_with_holm():
    results = []
    for s in range(1, 9):
        results += [result("t", str(s), "p/m", "a", 1, 0.5), result("t", str(s), "p/m", "b", 1, 0.0),
                    result("t", str(s), "p/m", "c", 1, 0.5 if s % 2 else 0.0)]  # fmt: skip
    report = build_report(history_of(results, ["p/m"], ["a", "b", "c"]))
    by_pair = {(d.a, d.b): d for d in report.deltas}
    ab = by_pair[("p/m x b", "p/m x a")]
    assert ab.success == -0.5  # not -0: a half-right answer is not a failure
    assert ab.p_value == pytest.approx(2 / 2**8)
    assert [d.p_holm for d in report.deltas] == pytest.approx(holm([d.p_value for d in report.deltas]))
    assert ab.p_holm == pytest.approx(3 * 2 / 2**8) and ab.significant
    text = render_text(report)
    assert "p (Holm)" in text and "0.023  *" in text
    page = render_html(report, None)
    assert page.count("class='bad'") == 1 and "<th>p (Holm)</th>" in page
    [ab_json] = [d for d in cells_json(report)["deltas"] if d["a"] == "p/m x b" and d["b"] == "p/m x a"]
    assert ab_json["p"] == pytest.approx(2 / 2**8) and ab_json["pHolm"] == pytest.approx(6 / 2**8)
