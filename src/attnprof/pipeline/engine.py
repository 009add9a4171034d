"""The one engine that runs cells: `run`, `compare`, `check` and `sweep`, in one process or under torchrun,
fresh or continuing an earlier run (`--resume`), all go through `run_job`.

`run_job(job, watcher)` hands the job to `pipeline.sharded`, which checks that the ranks planned alike,
opens the run's folder, shares out the cells still to run, streams each rank's rows and has rank 0 write
the one results file. This process's share runs here (`run_share`): dtype after dtype (a compare has
one), the dtype's matmul ceiling first, then its cells through `run_cells`. Each finished cell gets its
speed-up against its point's baseline cell when that ran before it, and is recorded (its row streamed)
before the watcher hears of it. In a sweep (`Job.sweep`) the OOM rule (`pipeline.sweep.OomRule`, which
knows the resumed rows too) skips the larger sequence lengths of a variant that ran out of memory, and
the watcher gets an estimate of the time left (`pipeline.eta`).

With `--ncu` (`MeasureOptions.ncu`, one process only: refused under torchrun, and before any cell runs on a
device without counters or without Nsight Compute, `pipeline.counters.refuse_counters`) each ok cell's step
runs again under Nsight Compute after its measurement (`pipeline.counters`), before its row is recorded.

The engine prints nothing: what a command shows (each ceiling, progress, failed cells, each cell's Nsight
Compute pass) it learns through its `Watcher`. Ctrl-C ends the share with its finished cells kept and
written (exit code 130); a variant that fails becomes a failed row and the others run on.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from attnprof.config import Config, MeasureOptions
from attnprof.errors import ConfigError
from attnprof.interrupts import raise_if_interrupted
from attnprof.pipeline import distributed
from attnprof.pipeline.counters import CounterCollector, refuse_counters
from attnprof.pipeline.eta import TimeLeft, time_left
from attnprof.pipeline.mask_alternatives import Alternatives
from attnprof.pipeline.measured import CellResult, attach_speedups
from attnprof.pipeline.resume import check_resumable, kept_rows, still_to_run
from attnprof.pipeline.run import Cell, RunOutcome, resolve_config, run_cells
from attnprof.pipeline.sharded import Job, Recorder, Share, run_sharded
from attnprof.pipeline.sweep import OomRule
from attnprof.registry import RunSpec, Variant

if TYPE_CHECKING:
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.results.files import ResultsFile
    from attnprof.results.schema import Row

__all__ = ["CellWatch", "Job", "Resumed", "Watcher", "resume_rows", "run_job", "start_on_device"]


class CellWatch(Protocol):
    """Told of each cell as it starts and ends."""

    def on_start(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """A cell begins: its index among the share's `total` cells."""

    def on_done(self, result: CellResult) -> None:
        """A cell ended (its row is already recorded)."""

    def on_counters(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """The cell's Nsight Compute pass begins (--ncu), after its measurement."""


class Watcher(Protocol):
    """What the engine tells its caller as it runs (the CLI shows it on stderr)."""

    def ceiling(self, ceiling: RunCeiling) -> None:
        """A dtype's matmul ceiling is ready (cached, measured now, or none)."""

    def ceiling_replaced(self, ceiling: RunCeiling, beaten: list[str]) -> None:
        """A cell beat the ceiling, which was measured again; `beaten`: the cells that still beat it."""

    def cells(self, total: int, time_left: TimeLeft | None) -> AbstractContextManager[CellWatch]:
        """Watch the share's `total` cells run (`time_left`: a sweep's estimate, else None)."""


class Unwatched:
    """A Watcher that is told everything and shows nothing."""

    def ceiling(self, ceiling: RunCeiling) -> None:
        """Nothing to show."""

    def ceiling_replaced(self, ceiling: RunCeiling, beaten: list[str]) -> None:
        """Nothing to show."""

    def cells(self, total: int, time_left: TimeLeft | None) -> AbstractContextManager[CellWatch]:
        """This object, which ignores the cells."""
        return nullcontext(self)

    def on_start(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """Nothing to show."""

    def on_done(self, result: CellResult) -> None:
        """Nothing to show."""

    def on_counters(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """Nothing to show."""


def start_on_device(config: Config) -> tuple[Config, str]:
    """The config resolved for its device (`dtype: auto` made concrete), and that device as torch resolves it.
    Under torchrun the device is the rank's own (`cuda:LOCAL_RANK`), and the process group starts here
    (`run_job` closes it)."""
    from attnprof.profiling.inputs import resolve_torch_device

    ctx = distributed.detect()
    if ctx is None:
        device = resolve_torch_device(config.device)
    else:
        device = distributed.rank_device(ctx, config.device)
        distributed.start(ctx, device)
    return resolve_config(config, device), device


@dataclass(frozen=True)
class Resumed:
    """What a `--resume` keeps of the earlier run: its finished rows, and how many of the plan's cells are
    still to run; `announce` when this process is the one to say so (rank 0, or alone)."""

    rows: list[Row]
    to_run: int
    planned: int
    announce: bool


def resume_rows(
    previous: ResultsFile, config: Config, measure: MeasureOptions, device: str, cells: list[Cell]
) -> Resumed:
    """The rows of `previous` a resume keeps, after checking that it may be continued with these settings
    (under torchrun rank 0 checks, and every rank raises its error)."""
    group = distributed.current()
    if group is None:
        check_resumable(previous, config, measure, device)
    else:
        group.broadcast(lambda: check_resumable(previous, config, measure, device))
    kept = kept_rows(previous, {variant.name for variant, _ in cells if variant.collective})
    announce = group is None or group.ctx.is_main
    return Resumed(kept, len(still_to_run(cells, kept)), len(cells), announce)


def run_job(job: Job, watcher: Watcher | None = None) -> tuple[RunOutcome | None, int]:
    """Run `job` as the module docstring says: (the outcome, on rank 0 or alone, else None; the exit code,
    the same on every rank: 130 after Ctrl-C, 1 when a row failed, else 0). Closes the process group.
    `--ncu` that cannot give counters is refused before the run's folder exists (`refuse_counters`)."""
    group = distributed.current()
    try:
        if group is not None and job.measure.ncu:
            raise ConfigError(
                "--ncu does not run under torchrun (each rank would start Nsight Compute on its own)",
                hint="collect counters in one process: the same command without torchrun, with --ncu",
            )
        if job.measure.ncu:
            refuse_counters(job.device)
        where = None if group is None else distributed.placement(group.ctx, job.device)
        return run_sharded(job, group, partial(run_share, job, watcher or Unwatched()), where)
    finally:
        distributed.stop()


def run_share(
    job: Job, watcher: Watcher, cells: list[Cell], kept: list[Row], trace_dir: Path, record: Recorder
) -> Share:
    """This process's `cells` (`pipeline.sharded.RunShare`), dtype by dtype, each after its ceiling; each
    finished result goes to `record` and then to the watcher. `kept`: the resumed rows (the OOM rule's)."""
    oom = OomRule() if job.sweep else None
    if oom is not None:
        for row in kept:
            oom.note_row(row)
    ceilings = _Ceilings(job.device, job.measure, watcher)
    counters = CounterCollector(job.measure.ncu_launches) if job.measure.ncu else None
    with watcher.cells(len(cells), time_left(cells, oom.skip_reason) if oom is not None else None) as shown:
        tally = _Tally(len(cells), job.config.baseline, record, oom, shown)
        results, interrupted = _by_dtype(job, cells, ceilings.start, tally, trace_dir, counters)
    for ceiling in ceilings.started.values():
        if ceiling.replaced is not None:
            watcher.ceiling_replaced(ceiling, _beating(ceiling, results))
    return Share(results, interrupted, ceilings.started, counters.summary() if counters is not None else None)


def _by_dtype(
    job: Job,
    cells: list[Cell],
    ceiling_for: Callable[[str], RunCeiling | None],
    tally: _Tally,
    trace_dir: Path,
    counters: CounterCollector | None = None,
) -> tuple[list[CellResult], bool]:
    """Run the cells a dtype at a time (`ceiling_for(dtype)` gives each its ceiling; `counters`, with --ncu,
    each ok cell's Nsight Compute pass); the results, and whether Ctrl-C cut the share short."""
    results: list[CellResult] = []
    skip = tally.oom.skip_reason if tally.oom is not None else None
    for dtype, of_dtype in groupby(cells, key=lambda cell: cell[1].dtype):
        tally.offset = len(results)
        try:
            raise_if_interrupted()  # also one recorded before the run began, and swallowed since
            ceiling = ceiling_for(dtype)
        except KeyboardInterrupt:
            return results, True
        done, interrupted = run_cells(
            list(of_dtype),
            job.config,
            job.measure,
            ceiling,
            tally.started,
            tally.done,
            trace_dir,
            skip=skip,
            group=distributed.current(),
            alternatives=Alternatives(job.cells),
            counters=counters,
            on_counters=tally.counters,
        )
        results += done
        if interrupted:
            return results, True
    return results, False


class _Ceilings:
    """Each dtype's matmul ceiling, started once when its first cell is about to run (a dtype comes
    twice when collective cells run first); none without timing."""

    def __init__(self, device: str, measure: MeasureOptions, watcher: Watcher) -> None:
        self.device, self.measure, self.watcher = device, measure, watcher
        self.started: dict[str, RunCeiling] = {}

    def start(self, dtype: str) -> RunCeiling | None:
        """The ceiling of `dtype`."""
        from attnprof.profiling.ceiling import RunCeiling

        if not self.measure.timing:
            return None
        if dtype not in self.started:
            self.started[dtype] = RunCeiling.start(self.device, dtype, refresh=self.measure.refresh_ceiling)
            self.watcher.ceiling(self.started[dtype])
        return self.started[dtype]


class _Tally:
    """What happens around each cell: progress indices among all the share's cells, the speed-up against
    the point's baseline cell, the OOM rule, then the row recorded before the watcher hears of it."""

    def __init__(
        self, total: int, baseline: str | None, record: Recorder, oom: OomRule | None, shown: CellWatch
    ) -> None:
        self.total, self.baseline, self.record, self.oom, self.shown = total, baseline, record, oom, shown
        self.offset = 0  # cells of the dtypes before the current one
        self.baselines: dict[RunSpec, CellResult] = {}

    def started(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """Pass the start on with the index among all the share's cells."""
        self.shown.on_start(self.offset + index, self.total, variant, spec)

    def counters(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """Pass the start of a cell's Nsight Compute pass on, with the index among all the share's cells."""
        self.shown.on_counters(self.offset + index, self.total, variant, spec)

    def done(self, result: CellResult) -> None:
        """Speed-up, OOM rule, then the row on disk before anyone else hears of the cell."""
        if result.variant == self.baseline:
            self.baselines[result.spec] = result
        base = self.baselines.get(result.spec)
        attach_speedups([result] if base is None or base is result else [base, result], self.baseline)
        if self.oom is not None:
            self.oom.note_result(result)
        self.record(result)
        self.shown.on_done(result)


def _beating(ceiling: RunCeiling, results: list[CellResult]) -> list[str]:
    """The cells of the ceiling's dtype that beat it even measured again (the run's % of peak is then of the
    best of them: `pipeline.references`)."""
    return [
        f"{r.variant} @ {r.spec.cell_label}"
        for r in results
        if (tp := r.throughput) is not None
        and tp.peak_tflops
        and tp.tflops > tp.peak_tflops
        and r.spec.dtype == ceiling.dtype
    ]
