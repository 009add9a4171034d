"""What `run` and `compare` share at the edge: build the config, run the cells with a progress display on
stderr, and write the results (through the pipeline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.cli.common import note, stderr_console
from attnprof.cli.options import config_changes
from attnprof.cli.settings import build_config

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
    """The config resolved for its device (`dtype: auto` made concrete), and that device as torch resolves it."""
    from attnprof.pipeline import resolve_config
    from attnprof.profiling.inputs import resolve_torch_device

    device = resolve_torch_device(config.device)
    return resolve_config(config, device), device


def execute(command: str, config: Config, cells: list[Cell], device: str,
            measure: MeasureOptions) -> RunOutcome:
    """Run the cells with a progress display on stderr and write JSON and CSV."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from attnprof.pipeline import ensure_output_dir, finish_run, run_cells
    from attnprof.profiling.ceiling import RunCeiling

    ensure_output_dir(Path(config.output_dir))
    ceiling = None
    if measure.timing:
        ceiling = RunCeiling.start(device, config.dtype, refresh=measure.refresh_ceiling)
        note(ceiling_note(ceiling))
    console = stderr_console()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("starting", total=len(cells))

        def on_start(index: int, total: int, variant: Variant, spec: RunSpec) -> None:
            progress.update(task, description=f"{variant.name} @ {_cell(spec)}")
            if not console.is_terminal:
                note(f"[{index + 1}/{total}] {variant.name} @ {_cell(spec)} {spec.dtype} on {spec.device}")

        def on_done(result: CellResult) -> None:
            progress.advance(task)
            if not result.ok:
                note(f"  {result.variant} @ {_cell(result.spec)}: {result.status}: {result.reason}")

        results, interrupted = run_cells(cells, config, measure, ceiling, on_start, on_done)
    if ceiling is not None and ceiling.replaced is not None:
        note(ceiling_note(ceiling, [f"{r.variant} @ {_cell(r.spec)}" for r in results
                                    if r.throughput is not None and r.throughput.pct_of_peak is None]))
    if interrupted:
        note(f"interrupted: keeping the {len(results)} finished cell(s)")
    return finish_run(command, config, device, results, ceiling.current if ceiling else None, interrupted)


def ceiling_note(ceiling: RunCeiling, beaten: list[str] | None = None) -> str:
    """One line on the run's matmul ceiling: cached (and when), measured now (and why), or none; once measured
    again, that, and the cells (`beaten`) that still beat it."""
    current = ceiling.current
    what = f"{ceiling.dtype} matmul ceiling on {ceiling.device}"
    if current.source == "none":
        return f"% of peak is n/a: {current.reason}"
    if ceiling.replaced is not None:
        still = f"; still beaten by {', '.join(beaten)}: % of peak is n/a there" if beaten else ""
        return (f"{what}: {ceiling.replaced.tflops:.3g} TFLOP/s exceeded ({current.reason}); "
                f"measured again: {current.tflops:.3g} TFLOP/s{still}")
    if current.source == "cached":
        when = f"cached on {current.measured_on} (--refresh-ceiling measures again)"
    else:
        when = f"measured now ({current.reason})"
    return f"{what}: {current.tflops:.3g} TFLOP/s, {when}"


def _cell(spec: "RunSpec") -> str:
    """The spec's shape, with its mode after it when that is not the default `fwd`."""
    return f"{spec.shape_label} {spec.mode}" if spec.backward else spec.shape_label
