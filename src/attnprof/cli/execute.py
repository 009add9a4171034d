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
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.registry import RunSpec, Variant
    from attnprof.results import CellResult


def config_from_options(path: Path | None, overrides: dict[str, Any], **more: Any) -> Config:
    """The config file (or the built-in default) with the shared overrides and `more` fields applied."""
    return build_config(path, **config_changes(overrides), **more)


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


def execute(
    command: str,
    config: Config,
    cells: list[Cell],
    device: str,
    measure: MeasureOptions,
    resume: Path | None = None,
) -> RunOutcome:
    """Run the cells with a progress display on stderr and write JSON and CSV into the run's own folder.

    Ctrl-C at any point after the folder exists ends the run with the finished cells written. Under
    torchrun, or with `resume` (an earlier run's folder), `execute_sharded` runs them instead.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from attnprof.pipeline import distributed, finish_run, open_run_folder, run_cells
    from attnprof.profiling.ceiling import RunCeiling

    if resume is not None or distributed.current() is not None:
        return execute_sharded(command, config, cells, device, measure, resume)
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
    with (
        terminal_console() as console,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as progress,
    ):
        task = progress.add_task("starting", total=len(cells))

        def on_start(index: int, total: int, variant: Variant, spec: RunSpec) -> None:
            progress.update(task, description=f"{variant.name} @ {spec.cell_label}")
            if not console.is_terminal:
                note(f"[{index + 1}/{total}] {variant.name} @ {spec.cell_label} {spec.dtype} on {spec.device}")

        def on_done(result: CellResult) -> None:
            progress.advance(task)
            if not result.ok:
                note(f"  {result.variant} @ {result.spec.cell_label}: {result.status}: {result.reason}")
            if STATE.debug:
                note_captured(result)

        if not interrupted:
            results, interrupted = run_cells(cells, config, measure, ceiling, on_start, on_done, folder.traces)
    if ceiling is not None and ceiling.replaced is not None:
        note(
            ceiling_note(
                ceiling,
                [
                    f"{r.variant} @ {r.spec.cell_label}"
                    for r in results
                    if r.throughput is not None and r.throughput.pct_of_peak is None
                ],
            )
        )
    if interrupted:
        note(f"interrupted: keeping the {len(results)} finished cell(s)")
    return finish_run(command, config, device, results, ceiling.current if ceiling else None, interrupted, folder)


def execute_sharded(
    command: str, config: Config, cells: list[Cell], device: str, measure: MeasureOptions, resume: Path | None
) -> RunOutcome:
    """`execute` across the ranks of a torchrun group (or resuming a folder): each rank says on stderr,
    as `[rank R]`, which cell it starts; rank 0 gets the outcome, the other ranks exit with its code."""
    import typer

    from attnprof.pipeline import distributed
    from attnprof.pipeline.sharded import run_sharded
    from attnprof.profiling.ceiling import RunCeiling

    group = distributed.current()
    main = group is None or group.ctx.is_main
    prefix = "" if group is None else f"[rank {group.ctx.rank}] "
    try:
        ceiling = RunCeiling.start(device, config.dtype, refresh=measure.refresh_ceiling) if measure.timing else None
        if ceiling is not None and main:
            note(ceiling_note(ceiling))

        def on_start(index: int, total: int, variant: Variant, spec: RunSpec) -> None:
            note(f"{prefix}[{index + 1}/{total}] {variant.name} @ {spec.cell_label} {spec.dtype} on {spec.device}")

        def on_done(result: CellResult) -> None:
            if not result.ok:
                note(f"{prefix}  {result.variant} @ {result.spec.cell_label}: {result.status}: {result.reason}")
            if STATE.debug:
                note_captured(result)

        where = None if group is None else distributed.placement(group.ctx, device)
        outcome, code = run_sharded(
            command,
            config,
            cells,
            device,
            measure,
            group,
            resume=resume,
            ceiling=ceiling,
            where=where,
            on_start=on_start,
            on_done=on_done,
        )
    finally:
        distributed.stop()
    if outcome is None:
        raise typer.Exit(code)
    resumed = outcome.document.get("resumed")
    if resumed:
        note(
            f"resumed {resumed['from']}: {resumed['kept_rows']} row(s) kept, {resumed['cells_run']} cell(s) run"
            + (
                f", {resumed['rows_of_other_cells']} row(s) of cells not in this plan left out"
                if resumed["rows_of_other_cells"]
                else ""
            )
        )
    if outcome.interrupted:
        note(f"interrupted: keeping the {len(outcome.document['results'])} finished row(s)")
    return outcome


def note_captured(result: CellResult) -> None:
    """With --debug: the profiler's native stderr and the Python warnings captured during a cell."""
    where = f"  {result.variant} @ {result.spec.cell_label}"
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
