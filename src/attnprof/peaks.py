"""The peaks a trace analysis compares against, from the ceilings measured on this machine.

Between the stages: it reads `profiling.ceiling` and builds `analysis.hardware.Peaks`, for the pipeline
and the CLI (a module of its own, so `analyze` loads neither the pipeline nor torch).

`run`, `compare` and `sweep` pass their run's ceiling (`measured_peaks`); `analyze` and `model`, which
measure none, look the trace's GPU and dtype up in the ceiling cache (`cached_peaks`, a
`analysis.hardware.PeaksLookup`). Without a measured figure the analysis uses the GPU's datasheet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnprof.analysis.hardware import Peaks

if TYPE_CHECKING:
    from attnprof.profiling.ceiling import Ceiling


def measured_peaks(ceiling: Ceiling | None) -> Peaks | None:
    """The read bandwidth and matmul ceiling of `ceiling` as `Peaks`; None when either is unknown."""
    if ceiling is None or not ceiling.read_gbps or not ceiling.tflops:
        return None
    return Peaks.measured(ceiling.read_gbps, ceiling.tflops, ceiling.measured_on)


def cached_peaks(gpu: str | None, dtype: str | None) -> Peaks | None:
    """The peaks measured on this machine for the GPU called `gpu` in `dtype`, from the ceiling cache
    (`profiling.ceiling.cached_ceiling`); None when the cache holds none (or no GPU or dtype is known)."""
    from attnprof.profiling.ceiling import cached_ceiling

    if not gpu or not dtype:
        return None
    return measured_peaks(cached_ceiling(gpu, dtype))
