"""What `run`, `compare`, `sweep` and `check` share at the edge: build the config, choose the variants, run
the cells with a progress display on stderr, and write the results (through the pipeline)."""

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
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.registry import RunSpec, Variant
    from attnprof.results import CellResult


def config_from_options(source: Path | Config | None, overrides: dict[str, Any], **more: Any) -> Config:
    """The config file (a Config already loaded, or the built-in default) with the shared overrides and
    `more` fields applied."""
    return build_config(source, **config_changes(overrides), **more)


def config_on_device(config: Config) -> tuple[Config, str]:
    """The config resolved for its device (`dtype: auto` made concrete), and that device as torch resolves it."""
    from attnprof.pipeline import resolve_config
    from attnprof.profiling.inputs import resolve_torch_device

    device = resolve_torch_device(config.device)
    return resolve_config(config, device), device


def choose_variants(config: Config, exclude_given: bool) -> tuple[Config, str, list[Variant]]:
    """The registry's variants the config selects on its device, with the config resolved for that device
    (`config_on_device`). Names are checked before torch is imported; stderr names plugins that failed,
    what the config's own exclude entries left out (unless `exclude_given` on the command line), and a
    baseline left out of the selection."""
    from attnprof.pipeline import check_names, config_exclusions, select_variants

    loaded = common.load_variants_for_cli()
    for line in common.plugin_notes(loaded):
        note(line)
    check_names(config, loaded.registry)  # a typo fails before torch is imported
    config, device = config_on_device(config)
    chosen = select_variants(config, loaded.registry, device)
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
    """Progress on stderr while cells run: a bar on a terminal (one line per cell elsewhere), and a line
    for each cell that is not ok. `time_left(index, result, seconds)` (optional) turns each finished
    cell into a `... left` text shown with the bar."""

    def __init__(
        self, progress: Any, task: Any, terminal: bool, time_left: Callable[[int, CellResult, float], str] | None
    ) -> None:
        self.progress, self.task, self.terminal, self.time_left = progress, task, terminal, time_left
        self.index, self.started, self.left = 0, 0.0, ""

    def on_start(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """A cell begins."""
        self.index, self.started = index, time.perf_counter()
        self.progress.update(self.task, description=f"{variant.name} @ {spec.cell_label}")
        if not self.terminal:
            left = f" ({self.left})" if self.left else ""
            note(f"[{index + 1}/{total}] {variant.name} @ {spec.cell_label} {spec.dtype} on {spec.device}{left}")

    def on_done(self, result: CellResult) -> None:
        """A cell ended."""
        if self.time_left is not None:
            self.left = self.time_left(self.index, result, time.perf_counter() - self.started)
            self.progress.update(self.task, left=self.left)
        self.progress.advance(self.task)
        if not result.ok:
            note(f"  {result.variant} @ {result.spec.cell_label}: {result.status}: {result.reason}")
        if STATE.debug:
            note_captured(result)


@contextmanager
def cell_progress(
    total: int, time_left: Callable[[int, CellResult, float], str] | None = None
) -> Iterator[CellProgress]:
    """A `CellProgress` for `total` cells, shown while the block runs and gone after it."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
    columns += [TimeElapsedColumn()] + ([TextColumn("{task.fields[left]}")] if time_left else [])
    with (
        terminal_console() as console,
        Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress,
    ):
        task = progress.add_task("starting", total=total, left="")
        yield CellProgress(progress, task, console.is_terminal, time_left)


def execute(command: str, config: Config, cells: list[Cell], device: str, measure: MeasureOptions) -> RunOutcome:
    """Run the cells with a progress display on stderr and write JSON and CSV into the run's own folder.

    Ctrl-C at any point after the folder exists ends the run with the finished cells written.
    """
    from attnprof.pipeline import finish_run, open_run_folder, run_cells
    from attnprof.profiling.ceiling import RunCeiling

    folder = open_run_folder(Path(config.output_dir), command)
    ceiling = None
    results: list[CellResult] = []
    interrupted = False
    try:
        raise_if_interrupted()  # Ctrl-C that something swallowed before the run began
        if measure.timing:
            ceiling = RunCeiling.start(device, config.dtype, refresh=measure.refresh_ceiling)
            note(ceiling_note(ceiling))
    except KeyboardInterrupt:
        interrupted = True
    with cell_progress(len(cells)) as shown:
        if not interrupted:
            results, interrupted = run_cells(
                cells, config, measure, ceiling, shown.on_start, shown.on_done, folder.traces
            )
    if ceiling is not None:
        note_ceiling_replaced(ceiling, results)
    if interrupted:
        note(f"interrupted: keeping the {len(results)} finished cell(s)")
    return finish_run(command, config, device, results, ceiling.current if ceiling else None, interrupted, folder)


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
