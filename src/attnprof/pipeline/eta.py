"""The time a sweep has left, from the wall time of the cells it has finished.

A cell's wall time is a fixed cost (setup, profiler, analysis; compilation for torch.compile'd
variants) plus a part that grows with the work: the step's nominal seconds per call
(`pipeline.sharding.call_seconds`, the cost the ranks' split uses: the roofline bound of the step's
exact FLOPs, by mask and mode, and its bytes, so a decode cell grows with the cache it reads). Each
variant's cells are fitted as `seconds = a + b · work` by least squares (a, b >= 0); a variant with no
finished cell yet uses the fit over all cells. Only cells that ran count: a skipped cell takes no time
and says nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from attnprof.pipeline.sharding import call_seconds
from attnprof.registry import RunSpec, Variant

if TYPE_CHECKING:
    from attnprof.pipeline.measured import CellResult

#: (index of the cell that just finished, its result, its wall seconds) -> estimated seconds left (None: no
#: estimate yet).
TimeLeft = Callable[[int, "CellResult", float], float | None]

Point = tuple[float, float]  # (work: nominal seconds per call, seconds)


def fit(points: Sequence[Point]) -> Point:
    """(a, b) of `seconds = a + b · work` by least squares, both clamped at zero; with a single
    distinct work, the mean time as `a`."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return mean_y, 0.0
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / var)
    intercept = mean_y - slope * mean_x
    if intercept < 0:  # through the origin instead
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return intercept, slope


class Eta:
    """Finished cells' times by variant, and the estimate for the cells still to run."""

    def __init__(self) -> None:
        self._points: dict[str, list[Point]] = {}

    def add(self, variant: str, spec: RunSpec, seconds: float) -> None:
        """Record a cell that ran (not one that was skipped)."""
        self._points.setdefault(variant, []).append((call_seconds(spec), seconds))

    def remaining(self, cells: Iterable[tuple[str, RunSpec]]) -> float | None:
        """Estimated seconds for `cells` (variant name, spec); None before any cell has run."""
        pooled = [p for points in self._points.values() for p in points]
        if not pooled:
            return None
        fits = {name: fit(points) for name, points in self._points.items()}
        overall = fit(pooled)
        total = 0.0
        for name, spec in cells:
            a, b = fits.get(name, overall)
            total += a + b * call_seconds(spec)
        return total


def time_left(cells: Sequence[tuple[Variant, RunSpec]], skip: Callable[[Variant, RunSpec], str | None]) -> TimeLeft:
    """A sweep's `TimeLeft`: each cell that ran joins the estimate, which covers the cells still to come
    that this machine can run and `skip` (the OOM rule) does not skip."""
    eta = Eta()
    runnable = [variant.unavailable_reason(spec) is None for variant, spec in cells]

    def left(index: int, result: CellResult, seconds: float) -> float | None:
        if result.status != "skipped":
            eta.add(result.variant, result.spec, seconds)
        pending = [
            (variant.name, spec)
            for (variant, spec), can_run in zip(cells[index + 1 :], runnable[index + 1 :], strict=True)
            if can_run and skip(variant, spec) is None
        ]
        return eta.remaining(pending)

    return left
