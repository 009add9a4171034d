"""One kernel's hardware counters (`KernelCounters`), the report they come from (`CounterReport`), and
the one function that fills them from a metric lookup, shared by the CSV and the `ncu_report` readers.

Every figure is in base units on the way in (`units.to_base`) and in the unit its field names on the
way out: µs, bytes, GB/s, percent. A metric the report lacks gives None, never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnprof.analysis.counters.metrics import (
    BLOCK_METRICS,
    COUNTER_METRICS,
    GRID_METRICS,
    STALL_REASONS,
    stall_label,
    stall_metric,
)
from attnprof.analysis.counters.units import to_base

#: How many stall reasons a kernel keeps, largest share first.
TOP_STALLS = 3
#: A metric's value (a number or a string) and its unit, as a report gives it; None when missing.
Lookup = Callable[[str], "tuple[float | str, str] | None"]
#: Each field's multiplier from base units (seconds, bytes, bytes per second) to the unit it is kept in.
_FROM_BASE = {"duration_us": 1e6, "dram_gbps": 1e-9}
_INTEGERS = ("registers_per_thread", "shared_memory_bytes")


@dataclass(frozen=True)
class StallShare:
    """One warp-stall reason: warps stalled for it per issued instruction (ncu's ratio), and its share of
    all the stalls (the issuing warp, `selected`, left out), percent."""

    reason: str
    per_issue: float
    share_pct: float

    @property
    def label(self) -> str:
        """`long scoreboard`."""
        return stall_label(self.reason)

    @property
    def words(self) -> str:
        """What the stalled warps wait for, in plain words."""
        return STALL_REASONS.get(self.reason, self.label)


@dataclass(frozen=True)
class KernelCounters:
    """What Nsight Compute measured of one kernel launch (see `metrics.COUNTER_METRICS` for each figure).

    `name` is the report's (demangled) name, `index` its position among the report's kernels (0-based).
    `block` and `grid` are (x, y, z); `stalls` the `TOP_STALLS` largest warp-stall reasons.
    """

    name: str
    index: int
    duration_us: float | None = None
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    dram_gbps: float | None = None
    dram_pct_of_peak: float | None = None
    sm_throughput_pct: float | None = None
    tensor_pipe_pct: float | None = None
    gmma_instructions: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    block: tuple[int, int, int] | None = None
    grid: tuple[int, int, int] | None = None
    stalls: tuple[StallShare, ...] = ()

    @property
    def short_name(self) -> str:
        """The kernel's name without namespaces, template arguments or parameters."""
        from attnprof.analysis.short_names import short_kernel_name

        return short_kernel_name(self.name)

    @property
    def tensor_pipe(self) -> str | None:
        """`wgmma` when warpgroup MMA instructions ran (Hopper), `mma` when the tensor pipe was busy
        without them; None when it was idle or not measured."""
        if not self.tensor_pipe_pct:
            return None
        return "wgmma" if self.gmma_instructions else "mma"

    @property
    def dram_bytes(self) -> float | None:
        """DRAM bytes read and written; None when either is unknown."""
        if self.dram_read_bytes is None or self.dram_write_bytes is None:
            return None
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def tensor_active_us(self) -> float | None:
        """The time its tensor pipe was active: its utilisation times its duration, µs."""
        if self.tensor_pipe_pct is None or self.duration_us is None:
            return None
        return self.tensor_pipe_pct / 100.0 * self.duration_us


@dataclass
class CounterReport:
    """The kernels of one Nsight Compute report, in its order, with where it came from: `path`, `form`
    (`ncu-rep` or `raw-csv`) and the GPU it ran on (`device`, as the report names it)."""

    path: str
    form: str
    kernels: list[KernelCounters]
    device: str | None = None
    notes: list[str] = field(default_factory=list)


def kernel_counters(name: str, index: int, lookup: Lookup) -> KernelCounters:
    """A kernel's counters from `lookup(metric) -> (value, unit) | None` (see `metrics.COUNTER_METRICS`)."""
    values: dict[str, Any] = {}
    for metric in COUNTER_METRICS:
        value = _first_number(lookup, metric.names)
        if value is not None:
            value *= _FROM_BASE.get(metric.field, 1.0)
            values[metric.field] = round(value) if metric.field in _INTEGERS else value
    return KernelCounters(
        name,
        index,
        **values,
        block=_dims(lookup, BLOCK_METRICS),
        grid=_dims(lookup, GRID_METRICS),
        stalls=_top_stalls(lookup),
    )


def _number(lookup: Lookup, metric: str) -> float | None:
    """The metric in base units; None when the report lacks it or it is not a number."""
    found = lookup(metric)
    if found is None or isinstance(found[0], str):
        return None
    return to_base(float(found[0]), found[1])


def _first_number(lookup: Lookup, names: tuple[str, ...]) -> float | None:
    return next((v for v in (_number(lookup, n) for n in names) if v is not None), None)


def _dims(lookup: Lookup, names: tuple[str, str, str]) -> tuple[int, int, int] | None:
    dims = [_number(lookup, n) for n in names]
    if any(d is None for d in dims):
        return None
    x, y, z = (int(d) for d in dims)  # type: ignore[arg-type]
    return (x, y, z)


def _top_stalls(lookup: Lookup) -> tuple[StallShare, ...]:
    """The `TOP_STALLS` largest stall reasons with their shares of all stalls (`selected` left out)."""
    ratios = {reason: value for reason in STALL_REASONS if (value := _number(lookup, stall_metric(reason))) is not None}
    total = sum(ratios.values())
    if not total > 0:
        return ()
    ranked = sorted(ratios.items(), key=lambda item: -item[1])[:TOP_STALLS]
    return tuple(StallShare(reason, ratio, 100.0 * ratio / total) for reason, ratio in ranked if ratio > 0)
