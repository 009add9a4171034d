"""`attnprof sweep`: every selected variant at every point of the config's sweep axes, each finished cell
streamed to `results.jsonl` at once, with an estimate of the time left; `--resume` continues one. Under
torchrun the ranks share the cells, each streaming to its own `results.rank{R}.jsonl` (`pipeline.sharded`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import choose_variants, execute, note_outputs, resumable_config, resumed_rows
from attnprof.cli.options import SHAPE_FIELDS, ResumeOpt, exclude_given, shared_options

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.pipeline import RunOutcome


@c.handle_errors
@shared_options(select=True)
def sweep_command(
    config: c.ConfigArg = None,
    config_file: c.ConfigOpt = None,
    resume: ResumeOpt = None,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    per_point: Annotated[
        bool,
        typer.Option(
            "--per-point",
            help="Print compare's full table for every point of the sweep instead of one pivot table "
            "per point of the other axes.",
        ),
    ] = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Run every selected variant at every point of the config's sweep axes (their cross product).

    It prints one table per point of the other axes: variants down, the swept length (seq) across, each
    cell the median latency and the speed-up; then each finding once per variant (--per-point: compare's
    table at every point).

    Sequence lengths run in ascending order; once a variant runs out of memory at one, its larger ones
    (the other axes equal) are skipped: `OOM at smaller size`. Each finished cell is appended to
    results.jsonl at once; results.json and results.csv follow at the end. A shape, dtype, causal or
    mode option fixes that axis.

    Under torchrun (`torchrun --nproc-per-node=N -m attnprof sweep ...`) the cells are split across the
    ranks by estimated cost, a variant's growing sequence lengths on one rank, and rank 0 writes results.json.
    """
    from attnprof.pipeline.engine import Job
    from attnprof.pipeline.sweep import plan_sweep, without_axes

    previous, cfg, measure = resumable_config("sweep", resume, c.config_path(config, config_file), overrides, measure)
    cfg, device, chosen = choose_variants(without_axes(cfg, fixed_axes(overrides)), exclude_given(overrides))
    cells, left_out = plan_sweep(cfg, chosen, device)
    if left_out:
        c.note(f"left out of the sweep (no valid shape): {'; '.join(left_out)}")
    kept = resumed_rows(previous, cfg, measure, device, cells)
    outcome, code = execute(Job("sweep", cfg, device, measure, cells, previous, kept, sweep=True))
    _print(outcome, fmt, cfg.baseline, c.table_width(fmt, wide), per_point)
    note_outputs(outcome)
    files = outcome.document.files or {}
    streams = files["rank_streams"] if "rank_streams" in files else [files["results_jsonl"]]
    c.note(f"stream: {', '.join(streams)} (one line per cell, written as it finished)")
    raise typer.Exit(code)


def fixed_axes(overrides: dict[str, Any]) -> list[str]:
    """The sweep axes a command-line option fixes: its own, and kv_heads with --heads alone (which
    makes the heads plain multi-head attention, as in `compare`)."""
    names = [name for name in (*SHAPE_FIELDS, "dtype", "causal", "mode") if overrides.get(name) is not None]
    if "heads" in names and "kv_heads" not in names:
        names.append("kv_heads")
    return names


def _print(outcome: RunOutcome, fmt: c.OutputFormat, baseline: str | None, width: int | None, per_point: bool) -> None:
    from attnprof.report.sweep_tables import sweep_report
    from attnprof.report.tables import compare_report
    from attnprof.results.files import to_json

    rows = outcome.document.results
    c.warn_contended(rows, fmt, width)
    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
    elif rows:
        c.emit((compare_report if per_point else sweep_report)(rows, fmt.value, baseline, width))
