"""The few statistics a report needs, exact and dependency-free (docs/experiments.md,
"Statistics", gives every formula).

- ``wilson``: the Wilson score interval of a rate (good at 0/n and n/n, where the normal
  approximation collapses to a point), clipped to [0, 1];
- ``mean_interval``: a mean with Student's t interval, for paired differences;
- ``sign_flip_p``: the exact two-sided paired permutation (sign-flip) test; on pass/fail
  pairs it is the exact McNemar test;
- ``holm``: Holm's step-down adjustment of p-values for many comparisons;
- ``percentile``: linear interpolation between closest ranks (numpy's default).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from fractions import Fraction

Z95 = 1.959963984540054
_SAME = 1e-12  # relative: values closer than this are equal

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_T975_TAIL = ((40, 2.021), (60, 2.000), (120, 1.980))


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    for bound, value in _T975_TAIL:
        if df <= bound:
            return value
    return Z95


def wilson(successes: float, n: int) -> tuple[float, float]:
    """95% Wilson interval of ``successes / n``; (0, 1) when n is 0. ``successes`` may be
    a sum of scores in [0, 1] (a mean score is bounded by the same variance p(1 - p))."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # Rounding puts the bound at 0/n or n/n a hair inside the scale (0.9999999999999999),
    # and a bound must never sit on the wrong side of the rate it bounds.
    return clip(centre - half, 0.0, p), clip(centre + half, p, 1.0)


def clip(value: float, low: float, high: float) -> float:
    """``value`` within ``[low, high]``; nan stays nan."""
    return value if math.isnan(value) else min(high, max(low, value))


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean with its 95% t interval; low and high are nan for a
    single value or for values that are all equal: neither says anything about spread,
    and a zero-width interval would read as certainty."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan, math.nan
    if max(values) - min(values) <= _SAME * max(1.0, max(abs(v) for v in values)):
        return mean, math.nan, math.nan  # equal up to float noise (sums of prices, say)
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = t975(n - 1) * math.sqrt(variance / n)
    return mean, mean - half, mean + half


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# Exact enumeration keeps at most this many distinct sums; past it (scores on no common
# grid, many samples) the p-value is a Monte Carlo estimate with a fixed seed.
MAX_EXACT_SUMS = 200_000
MONTE_CARLO_DRAWS = 20_000
MONTE_CARLO_SEED = 37
# Differences are read as fractions of at most this denominator: exact for averaged
# repeats (thirds stay thirds, so sums that tie in exact arithmetic tie here) and for
# decimal scores, within 1e-12 of any other float.
MAX_DENOMINATOR = 10**6


def sign_flip_p(differences: Sequence[float]) -> float:
    """Two-sided p-value of the paired permutation test of "no difference": under it each
    pair's difference is as likely to have either sign, so p is the share of the 2^n sign
    assignments whose |sum| is at least the observed |sum|. nan without pairs.

    Exact (by counting the sums' distribution) unless more than ``MAX_EXACT_SUMS`` sums
    are distinct; then ``(1 + hits) / (1 + MONTE_CARLO_DRAWS)`` with a fixed seed."""
    if not differences:
        return math.nan
    exact = [Fraction(d).limit_denominator(MAX_DENOMINATOR) for d in differences]
    scale = math.lcm(*(f.denominator for f in exact))
    signed = [int(f * scale) for f in exact if f]  # whole numbers: sums compare exactly
    if not signed:
        return 1.0
    observed = abs(sum(signed))
    steps = [abs(step) for step in signed]
    counts: dict[int, int] = {0: 1}
    for step in steps:
        following: dict[int, int] = {}
        for total, count in counts.items():
            following[total + step] = following.get(total + step, 0) + count
            following[total - step] = following.get(total - step, 0) + count
        counts = following
        if len(counts) > MAX_EXACT_SUMS:
            return _sign_flip_monte_carlo(steps, observed)
    extreme = sum(count for total, count in counts.items() if abs(total) >= observed)
    return min(1.0, extreme / float(2 ** len(steps)))


def _sign_flip_monte_carlo(steps: Sequence[int], observed: int) -> float:
    draw = random.Random(MONTE_CARLO_SEED)
    hits = 0
    for _ in range(MONTE_CARLO_DRAWS):
        if abs(sum(s if draw.random() < 0.5 else -s for s in steps)) >= observed:
            hits += 1
    return (1 + hits) / (1 + MONTE_CARLO_DRAWS)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the given order: the k-th smallest of the m p-values
    becomes max over j <= k of min(1, (m - j + 1) p_(j)). nan stays nan and is not counted
    in m."""
    known = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(known):
        running = max(running, min(1.0, (len(known) - rank) * p))
        adjusted[index] = running
    return adjusted
