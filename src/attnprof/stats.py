"""Medians, quantiles and spreads of small samples: the one place attnprof computes them.

Imports nothing of attnprof and no torch, so any module (and the benchmarks) can use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def median(values: Sequence[float]) -> float:
    """The median: the middle value, or the mean of the two middle ones. ValueError when empty."""
    if not values:
        raise ValueError("median of an empty sample")
    return float(statistics.median(values))


def median_count(values: Sequence[int]) -> int:
    """The low median of counts: a count some sample really had (never a half); 0 when empty."""
    return int(statistics.median_low(values)) if values else 0


def median_count_of(counts: Iterable[tuple[int, int]]) -> int:
    """`median_count` of samples given as (count, how many samples had it); 0 when there are none."""
    pairs = sorted(counts)
    left = (sum(n for _, n in pairs) - 1) // 2  # the low median's index among the samples, sorted
    for value, n in pairs:
        if left < n:
            return int(value)
        left -= n
    return 0


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by linear interpolation between order statistics (numpy's
    and torch's default). ValueError when empty or q is out of range."""
    if not values:
        raise ValueError("quantile of an empty sample")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float] | None:
    """{"min", "max"} rounded to `digits`, or None when fewer than two values or all are equal."""
    if len(values) < 2 or min(values) == max(values):
        return None
    return {"min": round(min(values), digits), "max": round(max(values), digits)}
