"""The part `run` and `compare` share: resolve, run the cells with progress, write and print results."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprof.cli.common import OutputFormat, emit, note, stderr_console
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnprof.config import Config
    from attnprof.registry import RunSpec, Variant


@dataclass
class Measure:
    """The measurement flags both commands take."""

    timing: bool = True
    min_time_s: float = 0.25
    cuda_graph: bool = False
    flush_l2: bool = False
    check_masking: bool = False
    refresh_ceiling: bool = False
    clocks: bool = True


@dataclass
class Outcome:
    """What a run produced: results, the JSON document, and files written."""

    results: list[Any]
    document: dict[str, Any]
    files: tuple[Path, Path]
    interrupted: bool


def execute(command: str, config: "Config", cells: "list[tuple[Variant, RunSpec]]", device: str,
            measure: Measure, fmt: OutputFormat) -> Outcome:
    """Run the cells with a progress display on stderr and write JSON and CSV."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from attnprof.profiling import session
    from attnprof.profiling.runner import ensure_output_dir, run_cells

    output_dir = ensure_output_dir(Path(config.output_dir))
    ceiling = None
    if measure.timing:
        note(f"{config.dtype} matmul ceiling on {device}: measured once, then cached (--refresh-ceiling measures again)")
        ceiling = session.measure_ceiling(device, config.dtype, refresh=measure.refresh_ceiling)
    options = session.run_options(config, timing=measure.timing, min_time_s=measure.min_time_s,
                                  cuda_graph=measure.cuda_graph, flush_l2=measure.flush_l2,
                                  check_masking=measure.check_masking, ceiling=ceiling,
                                  sample_clocks=measure.clocks)
    console = stderr_console()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("starting", total=len(cells))

        def on_start(index: int, total: int, variant: "Variant", spec: "RunSpec") -> None:
            progress.update(task, description=f"{variant.name} @ {spec.shape_label}")
            if not console.is_terminal:
                note(f"[{index + 1}/{total}] {variant.name} @ {spec.shape_label} {spec.dtype} on {spec.device}")

        def on_done(result: Any) -> None:
            progress.advance(task)
            if result.status != "ok":
                note(f"  {result.variant} @ {result.spec.shape_label}: {result.status}: {result.reason}")

        results, interrupted = run_cells(cells, options, on_start, on_done)
    if interrupted:
        note(f"interrupted: keeping the {len(results)} finished cell(s)")
    document = session.build_document(command, config, device, results, ceiling, interrupted)
    files = session.write_outputs(session.result_file_stem(command), output_dir, document, results, config.baseline)
    return Outcome(results, document, files, interrupted)


def exit_code(outcome: Outcome) -> int:
    """130 after Ctrl-C, 1 if any cell failed, else 0 (a skipped cell is not a failure)."""
    if outcome.interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in outcome.results) else 0
