"""Whether a timing is worth taking again, and the note that says what became of it (`pipeline.stages`
decides, `profiling.timing` takes the samples).

* An unstable sample (IQR over 10% of the median) whose halves' medians disagree by more than `RETIME_DRIFT`
  could give another median, so it is worth a second sample (`worth_retiming`); one that did not drift has
  the spread of the forward itself, which a second sample would repeat (`retime_note` says so).
* A contended sample (`Timing.contended`) is worth another once the CPU calmed (`retimes_after`), and
  `contention_note` says how each wait went.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnprof.profiling.timing import RETIME_DRIFT

if TYPE_CHECKING:
    from attnprof.profiling.contention import Calm
    from attnprof.profiling.timing import Timing


def worth_retiming(timing: Timing, tolerance: float = RETIME_DRIFT) -> bool:
    """True for an unstable timing whose halves disagree by more than `tolerance`: a second sample could
    give another median."""
    return timing.unstable and timing.drift > tolerance


def retime_note(first: Timing, kept: Timing, retimed: bool) -> str:
    """What became of an unstable first sample, for `Timing.method`; empty when it was stable."""
    if not first.unstable:
        return ""
    spread = f"IQR {first.iqr_us / first.median_us:.0%} of the median" if first.median_us > 0 else "no median"
    if not retimed:
        return (
            f"unstable ({spread}) but not timed again: its halves' medians agree within {first.drift:.1%}, "
            "so a second sample would give the same median"
        )
    still = "; still unstable" if kept.unstable else ""
    return (
        f"timed again: the first sample was unstable ({spread}) and its halves' medians differed by "
        f"{first.drift:.1%}{still}"
    )


def contention_note(first: Timing, kept: Timing, waits: Sequence[Calm]) -> str:
    """What became of the first contended sample (`first`), for `Timing.method`: each wait for calm and
    re-time (`waits`, one per wait), and whether the kept sample is still contended; empty when `first` was
    not contended."""
    if not first.contended:
        return ""
    text = f"contended ({first.contention_text})"
    if not waits:
        return text + "; not timed again"
    for calm in waits:
        share = "unknown" if calm.share is None else f"{calm.share:.0%}"
        if retimes_after(calm):
            text += f"; timed again after {calm.waited_s:.1f} s for the CPU to calm (others {share})"
        else:
            text += f"; not timed again: the CPU did not calm within {calm.waited_s:.1f} s (others {share})"
    still = f"still contended ({kept.contention_text})" if kept.contended else "calm"
    return f"{text}; kept sample {still}"


def retimes_after(calm: Calm) -> bool:
    """True when a contended sample is worth timing again after this wait: the CPU calmed, or its share
    cannot be read (then only the samples' scheduler tick said contended, and a second sample may not)."""
    return calm.calm or calm.share is None
