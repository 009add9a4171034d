"""What `run`, `compare`, `sweep` and `check` share at the edge: build the config, choose the variants, and
show on stderr what the engine (`pipeline.engine.run_job`) says while it runs the cells: each matmul
ceiling, a progress display, the cells that failed, what a `--resume` keeps.

Under torchrun (`pipeline.distributed`) the process group starts with the device (`choose_variants`,
through `pipeline.engine.start_on_device`), and every rank says on stderr, as `[rank R]`, which cell it
starts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from attnprof.cli import common
from attnprof.cli.common import STATE, note, terminal_console
from attnprof.cli.options import config_changes
from attnprof.cli.settings import build_config

#: The commands that take `--resume` (an interrupted one says how to go on).
RESUMABLE = ("compare", "sweep")

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.engine import Job
    from attnprof.pipeline.eta import TimeLeft
    from attnprof.pipeline.measured import CellResult
    from attnprof.pipeline.run import Cell
    from attnprof.profiling.ceiling import Ceiling, RunCeiling
    from attnprof.registry import RunSpec, Variant
    from attnprof.results.files import ResultsFile
    from attnprof.results.schema import Row


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


def choose_variants(config: Config, exclude_given: bool) -> tuple[Config, str, list[Variant]]:
    """The registry's variants the config selects on its device, with the config resolved for that device
    (`pipeline.engine.start_on_device`). Names are checked before torch is imported; an optional plugin's variant
    whose plugin is absent is chosen as a stand-in whose cells are skipped (`plugins.with_absent_plugins`), said
    on stderr as "not run"; stderr names plugins that failed,
    what the config's own exclude entries left out (unless `exclude_given` on the command line), and a
    baseline left out of the selection. Outside torchrun, collective variants only a wildcard chose are
    left out (`pipeline.without_collective`), and so are those no cell of the config can run: varlen-only variants
    without packed shapes, variants of none of its dtypes (`pipeline.without_unrunnable_wildcards`)."""
    from attnprof.pipeline import (
        check_names,
        config_exclusions,
        distributed,
        select_variants,
        without_collective,
        without_unrunnable_wildcards,
    )
    from attnprof.pipeline.engine import start_on_device
    from attnprof.plugins import with_absent_plugins

    loaded = common.load_variants_for_cli()
    for line in common.plugin_notes(loaded):
        note(line)
    registry = with_absent_plugins(loaded)  # a shipped config may name an optional plugin's variant
    check_names(config, registry)  # a typo fails before torch is imported
    config, device = start_on_device(config)
    grouped = distributed.current() is not None
    chosen = without_collective(config, select_variants(config, registry, device), grouped)
    chosen = without_unrunnable_wildcards(config, chosen)
    absent = [f"{v.name}: {v.not_installed}" for v in chosen if v.not_installed]
    if absent:
        note(f"not run: {'; '.join(absent)}")
    groups = [
        ", ".join(names) + (f" ({reason})" if reason else "")
        for names, reason in config_exclusions(config, registry, device)
    ]
    if groups and not exclude_given:
        note(f"excluded by the config: {'; '.join(groups)}")
    if config.baseline and config.baseline not in [v.name for v in chosen]:
        note(f"baseline {config.baseline!r} is not among the selected variants: no speed-ups")
    return config, device, chosen


class CellProgress:
    """Progress on stderr while cells run: a bar on a terminal (one line per cell elsewhere, each after
    `prefix`), and a line for each cell that is not ok. `time_left(index, result, seconds)` (optional)
    estimates, after each finished cell, the seconds left, shown with the bar (`eta_text`)."""

    def __init__(
        self,
        progress: Any,
        task: Any,
        terminal: bool,
        time_left: TimeLeft | None,
        prefix: str = "",
    ) -> None:
        self.progress, self.task, self.terminal, self.time_left = progress, task, terminal, time_left
        self.index, self.started, self.left, self.prefix = 0, 0.0, "", prefix
        self.said: set[str] = set()  # the notes said once (`say_once`)

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

    def on_counters(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """A cell's Nsight Compute pass begins (--ncu)."""
        self.counters_started(index, total, f"{variant.name} {spec.cell_label}")

    def counters_started(self, index: int, total: int, label: str) -> None:
        """`counters 3/12: LABEL` on the bar, or as a line."""
        text = f"counters {index + 1}/{total}: {label}"
        self.progress.update(self.task, description=text)
        if not self.terminal:
            note(self.prefix + text)

    def on_done(self, result: CellResult) -> None:
        """A cell ended."""
        if self.time_left is not None:
            self.left = eta_text(self.time_left(self.index, result, time.perf_counter() - self.started))
            self.progress.update(self.task, left=self.left)
        self.progress.advance(self.task)
        if not result.ok:
            self.say(f"{self.prefix}  {result.variant} @ {result.spec.cell_label}: {result.status}: {result.reason}")
        self.counters_note(result.ncu_note)
        self.health_note(result.gpu_health_note)
        if STATE.debug:
            note_captured(result, self.say)

    def counters_note(self, reason: str | None) -> None:
        """Say once per distinct reason why a row has no counters (--ncu)."""
        if reason:
            self.say_once(f"{self.prefix}--ncu: no counters: {reason}")

    def health_note(self, reason: str | None) -> None:
        """Say once per distinct reason why the GPU was not sampled through NVML while a row was timed."""
        if reason:
            self.say_once(
                f"{self.prefix}no GPU clock, power, temperature or throttle samples over the timed calls: {reason}"
            )

    def say_once(self, text: str) -> None:
        """`say` the text unless it was said already."""
        if text not in self.said:
            self.said.add(text)
            self.say(text)

    def say(self, text: str) -> None:
        """A note on stderr while the cells run: above the bar on a terminal (never on its line)."""
        if self.terminal:
            self.progress.console.print(text, markup=False, highlight=False, emoji=False)
        else:
            note(text)


@contextmanager
def cell_progress(total: int, time_left: TimeLeft | None = None) -> Iterator[CellProgress]:
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


class StderrWatcher:
    """The engine's `Watcher` on stderr: each ceiling (after `[rank R]` under torchrun), the cells'
    progress (`cell_progress`), and the cells that still beat a ceiling measured again. A ceiling
    started while the bar shows is said above it (`CellProgress.say`)."""

    def __init__(self) -> None:
        self.shown: CellProgress | None = None

    def ceiling(self, ceiling: RunCeiling) -> None:
        """Say which ceiling the run uses."""
        text = rank_prefix() + ceiling_note(ceiling)
        if self.shown is not None:
            self.shown.say(text)
        else:
            note(text)

    def ceiling_replaced(self, ceiling: RunCeiling, beaten: list[str]) -> None:
        """Say the ceiling was beaten and measured again."""
        note(ceiling_note(ceiling, beaten))

    @contextmanager
    def cells(self, total: int, time_left: TimeLeft | None) -> Iterator[CellProgress]:
        """The progress display."""
        with cell_progress(total, time_left) as shown:
            self.shown = shown
            try:
                yield shown
            finally:
                self.shown = None


def execute(job: Job) -> tuple[RunOutcome, int]:
    """Run `job` through the engine with its progress on stderr; the outcome (results written into the
    run's own folder) and the exit code. A rank other than 0 of a torchrun group exits here with that code.
    Ctrl-C at any point after the folder exists ends the run with the finished cells written."""
    from attnprof.pipeline.engine import run_job

    outcome, code = run_job(job, StderrWatcher())
    if outcome is None:
        raise typer.Exit(code)
    if job.measure.ncu:
        note(counters_text(outcome.document.ncu, len(outcome.results)))
    if outcome.interrupted:
        rows = len(outcome.document.results)
        goes_on = f"; to go on: {resume_command(job.command, outcome.folder.dir)}" if job.command in RESUMABLE else ""
        note(f"interrupted: keeping the {rows} finished cell(s){goes_on}")
    return outcome, code


def resume_command(command: str, folder: Path) -> str:
    """The command line that goes on with an interrupted run: `attnprof compare --resume DIR` (with
    `--no-plugins` when this one had it, so the resumed run plans the same cells)."""
    plugins = " --no-plugins" if STATE.no_plugins else ""
    return f"attnprof{plugins} {command} --resume {folder}"


def resumed_rows(
    previous: ResultsFile | None, config: Config, measure: MeasureOptions, device: str, cells: list[Cell]
) -> list[Row]:
    """The rows of `previous` a resume keeps (none without one), after the engine checked that it may be
    continued with these settings (`pipeline.engine.resume_rows`); says on stderr (rank 0 only) what is
    kept and what runs."""
    from attnprof.pipeline.engine import resume_rows

    if previous is None:
        return []
    resumed = resume_rows(previous, config, measure, device, cells)
    if resumed.announce:
        cut = " (its last line was cut short)" if previous.truncated else ""
        note(
            f"resuming {previous.path}: {len(resumed.rows)} finished cell(s) kept{cut}, "
            f"{resumed.to_run} of {resumed.planned} to run"
        )
    return resumed.rows


def note_captured(result: CellResult, say: Callable[[str], None] = note) -> None:
    """With --debug: the profiler's native stderr and the Python warnings captured during a cell."""
    where = f"  {result.variant} @ {result.spec.cell_label}"
    for line in result.native_stderr:
        say(f"{where}: profiler stderr: {line}")
    for line in result.warnings:
        say(f"{where}: warning: {line}")


def note_outputs(outcome: RunOutcome) -> None:
    """Say on stderr, in every format, where the results and traces went and what opens a trace."""
    folder, traces = outcome.folder, outcome.traces
    note(f"results: {folder.results_json} and {folder.results_csv.name}")
    if not traces:
        note(f"traces: none written (folder {folder.traces})")
        return
    where = str(traces[0]) if len(traces) == 1 else f"{len(traces)} files in {folder.traces}{os.sep}"
    note(f"traces: {where} (open in Perfetto, https://ui.perfetto.dev, or in chrome://tracing)")


def counters_text(summary: dict[str, Any] | None, rows: int) -> str:
    """The end of an --ncu run: how many of the `rows` this run ran got counters, and the time Nsight Compute
    added to it."""
    if not summary:
        return "--ncu: no Nsight Compute pass ran"
    seconds = float(summary.get("seconds") or 0.0)
    whole = round(seconds)
    spent = f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{seconds:.1f} s"
    return (
        f"--ncu: {summary.get('with_counters', 0)} of {rows} cell(s) got counters; "
        f"Nsight Compute added {spent} to the run ({summary.get('passes', 0)} pass(es))"
    )


def ceiling_note(ceiling: RunCeiling, beaten: list[str] | None = None) -> str:
    """One line on the run's matmul ceiling and read bandwidth: cached (and when), measured now (and why), or
    none; once measured again, that, and the cells (`beaten`) that still beat it."""
    current = ceiling.current
    what = f"{ceiling.dtype} matmul ceiling on {ceiling.device}"
    if current.source == "none":
        return f"% of peak is n/a: {current.reason}"
    if ceiling.replaced is not None:
        still = f"; still beaten by {', '.join(beaten)}: % of peak is of the best achieved figure" if beaten else ""
        return (
            f"{what}: {ceiling.replaced.tflops:.3g} TFLOP/s exceeded ({current.reason}); "
            f"measured again: {current.tflops:.3g} TFLOP/s{still}"
        )
    if current.source == "cached" and current.set_aside:
        when = f"cached on {current.measured_on}, used instead of the one {current.set_aside.partition(': ')[2]}"
    elif current.source == "cached":
        when = f"cached on {current.measured_on} (--refresh-ceiling measures again)"
    else:
        when = f"measured now ({current.reason})"
    return f"{what}: {current.tflops:.3g} TFLOP/s{_read_text(current)}, {when}"


def _read_text(ceiling: Ceiling) -> str:
    """ ", read bandwidth 4,512 GB/s by torch.sum": the read ceiling and the probe that reached it."""
    from attnprof.profiling.read_probe import gbps_text, winner

    if not ceiling.read_gbps:
        return ""
    by = f" by {winner(ceiling.read_method)}" if ceiling.read_method else ""
    return f", read bandwidth {gbps_text(ceiling.read_gbps)} GB/s{by}"


def eta_text(seconds: float | None) -> str:
    """`about 3 min 20 s left`, or what stands in before the first cell has run."""
    if seconds is None:
        return "estimating the time left"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"about {seconds // 3600} h {seconds % 3600 // 60:02d} min left"
    if seconds >= 60:
        return f"about {seconds // 60} min {seconds % 60:02d} s left"
    return f"about {seconds} s left"
