"""What `run` and `compare` share at the edge: build the config, run the cells with a progress display on
stderr, and write the results (through the pipeline)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.cli.common import STATE, note, terminal_console
from attnprof.cli.options import config_changes
from attnprof.cli.settings import build_config
from attnprof.interrupts import raise_if_interrupted

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.run import Cell
    from attnprof.registry import RunSpec, Variant
    from attnprof.results import CellResult


def config_from_options(path: Path | None, overrides: dict[str, Any], **more: Any) -> "Config":
    """The config file (or the built-in default) with the shared overrides and `more` fields applied."""
    return build_config(path, **config_changes(overrides), **more)


def execute(command: str, config: Config, cells: list[Cell], device: str,
            measure: MeasureOptions) -> RunOutcome:
    """Run the cells with a progress display on stderr and write JSON and CSV into the run's own folder.

    Ctrl-C at any point after the folder exists ends the run with the finished cells written.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from attnprof.pipeline import device_ceiling, finish_run, open_run_folder, run_cells

    folder = open_run_folder(Path(config.output_dir), command)
    ceiling = None
    results: list[CellResult] = []
    interrupted = False
    try:
        raise_if_interrupted()  # Ctrl-C that something swallowed before the run began
        if measure.timing:
            note(f"{config.dtype} matmul ceiling on {device}: measured once, then cached "
                 "(--refresh-ceiling measures again)")
            ceiling = device_ceiling(device, config.dtype, refresh=measure.refresh_ceiling)
    except KeyboardInterrupt:
        interrupted = True
    with terminal_console() as console, Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("starting", total=len(cells))

        def on_start(index: int, total: int, variant: Variant, spec: RunSpec) -> None:
            progress.update(task, description=f"{variant.name} @ {spec.shape_label}")
            if not console.is_terminal:
                note(f"[{index + 1}/{total}] {variant.name} @ {spec.shape_label} {spec.dtype} on {spec.device}")

        def on_done(result: CellResult) -> None:
            progress.advance(task)
            if not result.ok:
                note(f"  {result.variant} @ {result.spec.shape_label}: {result.status}: {result.reason}")
            if STATE.debug:
                note_captured(result)

        if not interrupted:
            results, interrupted = run_cells(cells, config, measure, ceiling, on_start, on_done, folder.traces)
    if interrupted:
        note(f"interrupted: keeping the {len(results)} finished cell(s)")
    return finish_run(command, config, device, results, ceiling, interrupted, folder)


def note_captured(result: CellResult) -> None:
    """With --debug: the profiler's native stderr and the Python warnings captured during a cell."""
    where = f"  {result.variant} @ {result.spec.shape_label}"
    for line in result.native_stderr:
        note(f"{where}: profiler stderr: {line}")
    for line in result.warnings:
        note(f"{where}: warning: {line}")


def note_outputs(outcome: RunOutcome) -> None:
    """Say on stderr, in every format, where the results and traces went and what opens a trace."""
    folder, traces = outcome.folder, outcome.traces
    note(f"results: {folder.results_json} and {folder.results_csv.name}")
    if not traces:
        note(f"traces: none written (folder {folder.traces})")
        return
    where = str(traces[0]) if len(traces) == 1 else f"{len(traces)} files in {folder.traces}{os.sep}"
    note(f"traces: {where} (open in Perfetto, https://ui.perfetto.dev, or in chrome://tracing)")
