"""Hardware counters of the attention kernels, from Nsight Compute: read a report, place each kernel on
the roofline, and judge what the counters show.

- `metrics`: the metrics read and their meaning; `NCU_SECTIONS` and `NCU_METRICS`, what a collection
  asks `ncu` for.
- `units`: numbers and units as ncu writes them, into base units.
- `kernel`: `KernelCounters` (one kernel), `CounterReport` (a report's kernels), filled from a metric lookup.
- `readers`: `load_counters(path)`: a `.ncu-rep` through Nsight Compute's `ncu_report`, or its raw page as CSV.
- `roofline`: the steps a report's kernels form, each kernel's share of the step's FLOPs and its place
  against the ceilings; `StepCounters`, what the counter findings read.
- `cell`: `CellCounters`, what a row holds (`counters_for_cell`; `counters_for_trace` for `analyze
  --ncu-report`), and what the judge reads of it (`analysis.findings.Counted.of`).
"""

from __future__ import annotations

from attnprof.analysis.counters.cell import (
    CellCounters,
    TraceMatch,
    ceilings_text,
    counters_for_cell,
    counters_for_trace,
    occupancy_notes,
)
from attnprof.analysis.counters.kernel import CounterReport, KernelCounters, StallShare
from attnprof.analysis.counters.metrics import COUNTER_METRICS, NCU_METRICS, NCU_SECTIONS, STALL_REASONS
from attnprof.analysis.counters.readers import CounterReportError, load_counters
from attnprof.analysis.counters.roofline import KernelPlacement, StepCounters, kernel_key

__all__ = [
    "COUNTER_METRICS",
    "NCU_METRICS",
    "NCU_SECTIONS",
    "STALL_REASONS",
    "CellCounters",
    "CounterReport",
    "CounterReportError",
    "KernelCounters",
    "KernelPlacement",
    "StallShare",
    "StepCounters",
    "TraceMatch",
    "ceilings_text",
    "counters_for_cell",
    "counters_for_trace",
    "kernel_key",
    "load_counters",
    "occupancy_notes",
]
