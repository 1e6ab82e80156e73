"""The few statistics a report needs, exact and dependency-free.

- ``wilson``: the Wilson score interval of a success rate (good at 0/n and n/n, where
  the normal approximation collapses to a point);
- ``mean_interval``: a mean with Student's t interval, for paired differences;
- ``percentile``: linear interpolation between closest ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054

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


def wilson(successes: int, n: int) -> tuple[float, float]:
    """95% Wilson interval of ``successes / n``; (0, 1) when n is 0."""
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
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    if variance == 0:
        return mean, math.nan, math.nan
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
