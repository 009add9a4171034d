"""`attnprof sweep`: every selected variant at every point of the config's sweep axes, each finished cell
streamed to `results.jsonl` at once, with an estimate of the time left; `--resume` continues one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import (
    ceiling_note,
    cell_progress,
    choose_variants,
    config_from_options,
    note_ceiling_replaced,
    note_outputs,
)
from attnprof.cli.options import SHAPE_FIELDS, exclude_given, shared_options

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.run import Cell
    from attnprof.pipeline.sweep import OomRule
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.report.results_file import ResultsFile
    from attnprof.results import CellResult

ResumeOpt = Annotated[
    Path | None,
    typer.Option(
        "--resume",
        metavar="DIR_OR_FILE",
        show_default=False,
        help="Continue the sweep whose folder (or results.jsonl) this is: its finished cells are copied into "
        "this run's stream and not run again. Without a config, the one it ran with.",
    ),
]


@c.handle_errors
@shared_options(select=True)
def sweep_command(
    config: c.ConfigArg = None,
    config_file: c.ConfigOpt = None,
    resume: ResumeOpt = None,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Run every selected variant at every point of the config's sweep axes (their cross product).

    Sequence lengths run in ascending order; once a variant runs out of memory at one, its larger ones
    (the other axes equal) are skipped: `OOM at smaller size`. Each finished cell is appended to
    results.jsonl at once; results.json and results.csv follow at the end. A shape, dtype, causal or
    mode option fixes that axis.
    """
    from attnprof.pipeline.resume import check_resumable, inherit_measure, kept_rows, open_previous, recorded_config
    from attnprof.pipeline.sweep import cell_key, plan_sweep, row_key, without_axes

    previous = open_previous(resume) if resume is not None else None
    path = c.config_path(config, config_file)
    source = recorded_config(previous) if previous is not None and path is None else path
    cfg = without_axes(config_from_options(source, overrides), fixed_axes(overrides))
    if previous is not None:
        measure = inherit_measure(measure, previous)
    cfg, device, chosen = choose_variants(cfg, exclude_given(overrides))
    if previous is not None:
        check_resumable(previous, cfg, measure, device)
    cells, left_out = plan_sweep(cfg, chosen, device)
    if left_out:
        c.note(f"left out of the sweep (no valid shape): {'; '.join(left_out)}")
    kept = kept_rows(previous) if previous is not None else []
    finished = {row_key(row) for row in kept}
    todo = [cell for cell in cells if cell_key(cell[0].name, cell[1]) not in finished]
    if previous is not None:
        c.note(
            f"resuming {previous.path}: {len(kept)} finished cell(s) kept"
            f"{' (its last line was cut short)' if previous.truncated else ''}, {len(todo)} of {len(cells)} to run"
        )
    outcome, code = _execute(cfg, todo, device, measure, kept, previous)
    _print(outcome, fmt, cfg.baseline, c.table_width(fmt, wide))
    note_outputs(outcome)
    c.note(f"stream: {outcome.document['files']['results_jsonl']} (one line per cell, written as it finished)")
    raise typer.Exit(code)


def fixed_axes(overrides: dict[str, Any]) -> list[str]:
    """The sweep axes a command-line option fixes: its own, and kv_heads with --heads alone (which
    makes the heads plain multi-head attention, as in `compare`)."""
    names = [name for name in (*SHAPE_FIELDS, "dtype", "causal", "mode") if overrides.get(name) is not None]
    if "heads" in names and "kv_heads" not in names:
        names.append("kv_heads")
    return names


def _execute(
    config: Config,
    cells: list[Cell],
    device: str,
    measure: MeasureOptions,
    kept: list[dict[str, Any]],
    previous: ResultsFile | None,
) -> tuple[RunOutcome, int]:
    """Open the run's folder and stream, run the cells with progress and time left on stderr, and write
    results.json and results.csv of every row (the kept ones first). Returns the outcome and exit code."""
    from attnprof.pipeline import RunOutcome, open_run_folder
    from attnprof.pipeline.sweep import OomRule, run_sweep, sweep_document, sweep_exit_code, write_sweep_results
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.profiling.environment import collect_environment
    from attnprof.report.export import ResultsStream
    from attnprof.report.results_file import stream_header

    folder = open_run_folder(Path(config.output_dir), "sweep")
    environment = collect_environment(device)
    resumed_from = str(previous.path) if previous is not None else None
    header = sweep_document(config, environment, {}, [], [], False, folder, measure, resumed_from)
    stream = ResultsStream(folder.dir / "results.jsonl", stream_header(header))
    oom = OomRule()
    ceilings: dict[str, RunCeiling] = {}

    def ceiling_for(dtype: str) -> RunCeiling | None:
        if not measure.timing:
            return None
        ceilings[dtype] = RunCeiling.start(device, dtype, refresh=measure.refresh_ceiling)
        c.note(ceiling_note(ceilings[dtype]))
        return ceilings[dtype]

    try:
        for row in kept:
            stream.append(row)
            oom.note_row(row)
        with cell_progress(len(cells), _time_left(cells, oom)) as shown:
            results, interrupted = run_sweep(
                cells, config, measure, ceiling_for, stream, oom, shown.on_start, shown.on_done, folder.traces
            )
    finally:
        stream.close()
    for ceiling in ceilings.values():
        note_ceiling_replaced(ceiling, results)
    if interrupted:
        c.note(f"interrupted: keeping the {len(kept) + len(results)} finished cell(s); --resume {folder.dir} goes on")
    document = sweep_document(config, environment, ceilings, results, kept, interrupted, folder, measure, resumed_from)
    write_sweep_results(folder, document)
    return RunOutcome("sweep", results, document, folder, interrupted), sweep_exit_code(results, interrupted)


def _time_left(cells: list[Cell], oom: OomRule) -> Any:
    """The progress display's `time_left`: each cell that ran joins the estimate (`pipeline.eta`), which
    covers the cells still to come that this machine can run and the OOM rule does not skip."""
    from attnprof.pipeline.eta import Eta

    eta = Eta()
    runnable = [variant.unavailable_reason(spec) is None for variant, spec in cells]

    def time_left(index: int, result: CellResult, seconds: float) -> str:
        if result.status != "skipped":
            eta.add(result.variant, result.spec, seconds)
        pending = [
            (variant.name, spec)
            for (variant, spec), can_run in zip(cells[index + 1 :], runnable[index + 1 :], strict=True)
            if can_run and oom.skip_reason(variant, spec) is None
        ]
        return eta_text(eta.remaining(pending))

    return time_left


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


def _print(outcome: RunOutcome, fmt: c.OutputFormat, baseline: str | None, width: int | None) -> None:
    from attnprof.report.export import to_json
    from attnprof.report.tables import compare_report

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
    elif outcome.document["results"]:
        c.emit(compare_report(outcome.document["results"], fmt.value, baseline, width))
