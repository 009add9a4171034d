"""When `diff` and `check` cannot judge a latency: the rule both gates share.

A figure timed without the profiler (the latency and what is computed from it) is *not judged* when:

- **contended**: its row was timed while other processes took more than `CONTENTION_LIMIT` (a quarter) of the
  machine's CPU (the row's `cpu_contention`, see `profiling.contention`), or its samples sat on multiples of a
  scheduler tick (`quantized_tick_ms`, the scheduler's doing). Such a timing measures the other work
  too (on the 2-core development CPU the same cell took 787 µs in one compare and 370 ms in the next), so it
  is not judged whatever it says: a contended BASE can hide a real slowdown as well as a contended NEW can
  fake one.
- **both unstable**: two timings are compared (`diff`'s BASE and NEW, `check`'s `faster_than`), both are
  unstable (IQR over 10% of the median, also when re-timed: the row's `unstable`), and the comparison's
  outcome lies within their spread: a slowdown `diff`'s noise rule does not bear out, a `faster_than` whose
  margin is within the two IQRs. One unstable side is what the IQR rule is for; a clear outcome (27x faster,
  or two medians within the threshold) is judged even when both are unstable.

A judged failure outweighs anything not judged: the gates' outcome is failed (a regression, a missed
expectation) when anything judged failed, else not judged when anything could not be judged, else passed.
The commands turn these into exit codes 1, 3 and 0.
"""

from __future__ import annotations

from attnprof.profiling.contention import CONTENTION_LIMIT
from attnprof.results.schema import Row

#: The kinds of reason, as the summaries name them.
CONTENTION = "timed while other processes held the CPU"
UNSTABLE = "both timings unstable"
#: The start of an instability reason.
UNSTABLE_TEXT = "both timings are unstable (IQR over 10% of the median)"


def contention(row: Row, whose: str) -> str | None:
    """`other processes took 49% of the CPU while {whose} was timed` when the row's `cpu_contention` is above
    `CONTENTION_LIMIT`, or that its samples sat on a scheduler tick (`quantized_tick_ms`); None otherwise, or
    when the row does not say."""
    share = row.cpu_contention
    if share is not None and share > CONTENTION_LIMIT:
        return f"other processes took {share:.0%} of the CPU while {whose} was timed"
    if row.quantized_tick_ms is not None:
        return f"{whose}'s samples sat on multiples of a {row.quantized_tick_ms:.3g} ms scheduler tick"
    return None


def both_unstable(first: Row, second: Row) -> bool:
    """True when both rows' timings are unstable."""
    return bool(first.unstable) and bool(second.unstable)


def within_spread(gap_us: float, first: Row, second: Row, scale: float = 1.0) -> bool:
    """True when `gap_us` (a difference of the two latencies, `second`'s scaled by `scale`) is no larger than
    their IQRs together (`second`'s scaled as well)."""
    return abs(gap_us) <= (first.latency_iqr_us or 0.0) + scale * (second.latency_iqr_us or 0.0)
