"""What `run`, `compare`, `sweep` and `check` share at the edge: build the config, choose the variants, run
the cells with a progress display on stderr, and write the results (through the pipeline).

Under torchrun (`pipeline.distributed`) the process group starts with the device (`config_on_device`),
and every rank runs its share of the cells through `pipeline.sharded` (`execute_job`), saying on stderr,
as `[rank R]`, which cell it starts; so does a `--resume` (`resumed_rows`) and every sweep."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.cli import common
from attnprof.cli.common import STATE, note, terminal_console
from attnprof.cli.options import config_changes
from attnprof.cli.settings import build_config
from attnprof.interrupts import raise_if_interrupted

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.run import Cell
    from attnprof.pipeline.sharded import Job, Recorder, RunShare
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.registry import RunSpec, Variant
    from attnprof.report.results_file import ResultsFile
    from attnprof.results import CellResult


def config_from_options(source: Path | Config | None, overrides: dict[str, Any], **more: Any) -> Config:
    """The config file (a Config already loaded, or the built-in default) with the shared overrides and
    `more` fields applied."""
    return build_config(source, **config_changes(overrides), **more)


def resumable_config(
    command: str, resume: Path | None, path: Path | None, overrides: dict[str, Any], measure: MeasureOptions
) -> tuple[ResultsFile | None, Config, MeasureOptions]:
    """The run `resume` names (None without), the config (`path`, else the one that run recorded, else the
    default, with the overrides) and the measurement options (those left at their defaults taken from it)."""
    from attnprof.pipeline.resume import inherit_measure, open_previous, recorded_config

    previous = open_previous(resume, command) if resume is not None else None
    source = recorded_config(previous) if previous is not None and path is None else path
    config = config_from_options(source, overrides)
    return previous, config, inherit_measure(measure, previous) if previous is not None else measure


def config_on_device(config: Config) -> tuple[Config, str]:
    """The config resolved for its device (`dtype: auto` made concrete), and that device as torch resolves it.
    Under torchrun the device is the rank's own (`cuda:LOCAL_RANK`), and the process group starts here."""
    from attnprof.pipeline import distributed as dist
    from attnprof.pipeline import resolve_config
    from attnprof.profiling.inputs import resolve_torch_device

    ctx = dist.detect()
    if ctx is None:
        device = resolve_torch_device(config.device)
    else:
        device = dist.rank_device(ctx, config.device)
        dist.start(ctx, device)
    return resolve_config(config, device), device


def choose_variants(config: Config, exclude_given: bool) -> tuple[Config, str, list[Variant]]:
    """The registry's variants the config selects on its device, with the config resolved for that device
    (`config_on_device`). Names are checked before torch is imported; stderr names plugins that failed,
    what the config's own exclude entries left out (unless `exclude_given` on the command line), and a
    baseline left out of the selection. Outside torchrun, collective variants only a wildcard chose are
    left out (`pipeline.without_collective`)."""
    from attnprof.pipeline import check_names, config_exclusions, distributed, select_variants, without_collective

    loaded = common.load_variants_for_cli()
    for line in common.plugin_notes(loaded):
        note(line)
    check_names(config, loaded.registry)  # a typo fails before torch is imported
    config, device = config_on_device(config)
    grouped = distributed.current() is not None
    chosen = without_collective(config, select_variants(config, loaded.registry, device), grouped)
    groups = [
        ", ".join(names) + (f" ({reason})" if reason else "")
        for names, reason in config_exclusions(config, loaded.registry, device)
    ]
    if groups and not exclude_given:
        note(f"excluded by the config: {'; '.join(groups)}")
    if config.baseline and config.baseline not in [v.name for v in chosen]:
        note(f"baseline {config.baseline!r} is not among the selected variants: no speed-ups")
    return config, device, chosen


class CellProgress:
    """Progress on stderr while cells run: a bar on a terminal (one line per cell elsewhere, each after
    `prefix`), and a line for each cell that is not ok. `time_left(index, result, seconds)` (optional)
    turns each finished cell into a `... left` text shown with the bar."""

    def __init__(
        self,
        progress: Any,
        task: Any,
        terminal: bool,
        time_left: Callable[[int, CellResult, float], str] | None,
        prefix: str = "",
    ) -> None:
        self.progress, self.task, self.terminal, self.time_left = progress, task, terminal, time_left
        self.index, self.started, self.left, self.prefix = 0, 0.0, "", prefix

    def on_start(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """A cell begins."""
        self.index, self.started = index, time.perf_counter()
        self.progress.update(self.task, description=f"{variant.name} @ {spec.cell_label}")
        if not self.terminal:
            left = f" ({self.left})" if self.left else ""
            note(
                f"{self.prefix}[{index + 1}/{total}] {variant.name} @ {spec.cell_label} {spec.dtype} on {spec.device}"
                + left
            )

    def on_done(self, result: CellResult) -> None:
        """A cell ended."""
        if self.time_left is not None:
            self.left = self.time_left(self.index, result, time.perf_counter() - self.started)
            self.progress.update(self.task, left=self.left)
        self.progress.advance(self.task)
        if not result.ok:
            note(f"{self.prefix}  {result.variant} @ {result.spec.cell_label}: {result.status}: {result.reason}")
        if STATE.debug:
            note_captured(result)


@contextmanager
def cell_progress(
    total: int, time_left: Callable[[int, CellResult, float], str] | None = None
) -> Iterator[CellProgress]:
    """A `CellProgress` for `total` cells, shown while the block runs and gone after it; under torchrun no
    bar (the ranks share the terminal), a line per cell after `[rank R]`."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
    columns += [TimeElapsedColumn()] + ([TextColumn("{task.fields[left]}")] if time_left else [])
    prefix = rank_prefix()
    with (
        terminal_console() as console,
        Progress(*columns, console=console, transient=True, disable=bool(prefix) or not console.is_terminal) as bar,
    ):
        task = bar.add_task("starting", total=total, left="")
        yield CellProgress(bar, task, console.is_terminal and not prefix, time_left, prefix)


def rank_prefix() -> str:
    """`[rank R] ` under torchrun (before every line a rank prints), else nothing."""
    from attnprof.pipeline import distributed

    group = distributed.current()
    return "" if group is None else f"[rank {group.ctx.rank}] "


def execute(
    command: str,
    config: Config,
    cells: list[Cell],
    device: str,
    measure: MeasureOptions,
    previous: ResultsFile | None = None,
    kept: list[dict[str, Any]] | None = None,
) -> RunOutcome:
    """Run the cells with a progress display on stderr and write JSON and CSV into the run's own folder.

    Ctrl-C at any point after the folder exists ends the run with the finished cells written. Under
    torchrun, or resuming `previous` (whose `kept` rows are not run again), `execute_job` runs them.
    """
    from attnprof.pipeline import distributed, finish_run, open_run_folder
    from attnprof.pipeline.sharded import Job

    if previous is not None or distributed.current() is not None:
        job = Job(command, config, device, measure, cells, previous, kept or [])
        return execute_job(job, cells_share(config, device, measure))[0]
    folder = open_run_folder(Path(config.output_dir), command)
    share = cells_share(config, device, measure)(cells, [], folder.traces, lambda result: None)
    if share.interrupted:
        note(f"interrupted: keeping the {len(share.results)} finished cell(s)")
    ceiling = share.ceilings.get(config.dtype)
    current = ceiling.current if ceiling is not None else None
    return finish_run(command, config, device, share.results, current, share.interrupted, folder, measure)


def cells_share(config: Config, device: str, measure: MeasureOptions) -> RunShare:
    """How `run` and `compare` run a rank's cells (`pipeline.sharded.RunShare`): the ceiling of the config's
    dtype, then every cell in order with progress on stderr, each finished row recorded."""
    from attnprof.pipeline import distributed, run_cells
    from attnprof.pipeline.sharded import Share
    from attnprof.profiling.ceiling import RunCeiling

    def share(cells: list[Cell], kept: list[dict[str, Any]], trace_dir: Path, record: Recorder) -> Share:
        ceiling = None
        results: list[CellResult] = []
        interrupted = False
        try:
            raise_if_interrupted()  # Ctrl-C that something swallowed before the run began
            if measure.timing:
                ceiling = RunCeiling.start(device, config.dtype, refresh=measure.refresh_ceiling)
                note(rank_prefix() + ceiling_note(ceiling))
        except KeyboardInterrupt:
            interrupted = True
        with cell_progress(len(cells)) as shown:

            def done(result: CellResult) -> None:
                record(result)
                shown.on_done(result)

            if not interrupted:
                results, interrupted = run_cells(
                    cells, config, measure, ceiling, shown.on_start, done, trace_dir, group=distributed.current()
                )
        if ceiling is not None:
            note_ceiling_replaced(ceiling, results)
        return Share(results, interrupted, {config.dtype: ceiling} if ceiling is not None else {})

    return share


def execute_job(job: Job, run_share: RunShare) -> tuple[RunOutcome, int]:
    """Run `job` across the ranks of a torchrun group (or alone: a resume, a sweep) through
    `pipeline.sharded`: rank 0 gets the outcome and the exit code, the other ranks exit with that code."""
    import typer

    from attnprof.pipeline import distributed
    from attnprof.pipeline.sharded import run_sharded

    group = distributed.current()
    try:
        where = None if group is None else distributed.placement(group.ctx, job.device)
        outcome, code = run_sharded(job, group, run_share, where)
    finally:
        distributed.stop()
    if outcome is None:
        raise typer.Exit(code)
    if outcome.interrupted:
        rows = len(outcome.document["results"])
        note(f"interrupted: keeping the {rows} finished cell(s); --resume {outcome.folder.dir} goes on")
    return outcome, code


def resumed_rows(
    previous: ResultsFile, config: Config, measure: MeasureOptions, device: str, cells: list[Cell]
) -> list[dict[str, Any]]:
    """The rows of `previous` a resume keeps, after checking that it may be continued with these settings
    (under torchrun rank 0 checks, and every rank stops on its error); says on stderr what is kept and run."""
    from attnprof.pipeline import distributed
    from attnprof.pipeline.resume import check_resumable, kept_rows, still_to_run

    group = distributed.current()
    if group is None:
        check_resumable(previous, config, measure, device)
    else:
        group.broadcast(lambda: check_resumable(previous, config, measure, device))
    kept = kept_rows(previous, {variant.name for variant, _ in cells if variant.collective})
    todo = still_to_run(cells, kept)
    cut = " (its last line was cut short)" if previous.truncated else ""
    if group is None or group.ctx.is_main:
        note(f"resuming {previous.path}: {len(kept)} finished cell(s) kept{cut}, {len(todo)} of {len(cells)} to run")
    return kept


def note_ceiling_replaced(ceiling: RunCeiling, results: list[CellResult]) -> None:
    """When a cell beat the ceiling and it was measured again: say so, naming the cells still beating it."""
    if ceiling.replaced is None:
        return
    beaten = [
        f"{r.variant} @ {r.spec.cell_label}"
        for r in results
        if r.throughput is not None and r.throughput.pct_of_peak is None and r.spec.dtype == ceiling.dtype
    ]
    note(ceiling_note(ceiling, beaten))


def note_captured(result: CellResult) -> None:
    """With --debug: the profiler's native stderr and the Python warnings captured during a cell."""
    where = f"  {result.variant} @ {result.spec.cell_label}"
    for line in result.native_stderr:
        note(f"{where}: profiler stderr: {line}")
    for line in result.warnings:
        note(f"{where}: warning: {line}")


def note_outputs(outcome: RunOutcome[Any]) -> None:
    """Say on stderr, in every format, where the results and traces went and what opens a trace."""
    folder, traces = outcome.folder, outcome.traces
    note(f"results: {folder.results_json} and {folder.results_csv.name}")
    if not traces:
        note(f"traces: none written (folder {folder.traces})")
        return
    where = str(traces[0]) if len(traces) == 1 else f"{len(traces)} files in {folder.traces}{os.sep}"
    note(f"traces: {where} (open in Perfetto, https://ui.perfetto.dev, or in chrome://tracing)")


def ceiling_note(ceiling: RunCeiling, beaten: list[str] | None = None) -> str:
    """One line on the run's matmul ceiling: cached (and when), measured now (and why), or none; once measured
    again, that, and the cells (`beaten`) that still beat it."""
    current = ceiling.current
    what = f"{ceiling.dtype} matmul ceiling on {ceiling.device}"
    if current.source == "none":
        return f"% of peak is n/a: {current.reason}"
    if ceiling.replaced is not None:
        still = f"; still beaten by {', '.join(beaten)}: % of peak is n/a there" if beaten else ""
        return (
            f"{what}: {ceiling.replaced.tflops:.3g} TFLOP/s exceeded ({current.reason}); "
            f"measured again: {current.tflops:.3g} TFLOP/s{still}"
        )
    if current.source == "cached":
        when = f"cached on {current.measured_on} (--refresh-ceiling measures again)"
    else:
        when = f"measured now ({current.reason})"
    return f"{what}: {current.tflops:.3g} TFLOP/s, {when}"
