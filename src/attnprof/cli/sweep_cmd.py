"""`attnprof sweep`: every selected variant at every point of the config's sweep axes, each finished cell
streamed to `results.jsonl` at once, with an estimate of the time left; `--resume` continues one. Under
torchrun the ranks share the cells, each streaming to its own `results.rank{R}.jsonl` (`pipeline.sharded`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import (
    ceiling_note,
    cell_progress,
    choose_variants,
    execute_job,
    note_ceiling_replaced,
    note_outputs,
    rank_prefix,
    resumable_config,
    resumed_rows,
)
from attnprof.cli.options import SHAPE_FIELDS, ResumeOpt, exclude_given, shared_options

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.pipeline.run import Cell
    from attnprof.pipeline.sharded import Recorder, RunShare
    from attnprof.pipeline.sweep import OomRule
    from attnprof.results import CellResult


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

    Under torchrun (`torchrun --nproc-per-node=N -m attnprof sweep ...`) the cells are split across the
    ranks by estimated cost, a variant's growing sequence lengths on one rank, and rank 0 writes results.json.
    """
    from attnprof.pipeline.sharded import Job
    from attnprof.pipeline.sweep import chain_key, plan_sweep, without_axes

    previous, cfg, measure = resumable_config("sweep", resume, c.config_path(config, config_file), overrides, measure)
    cfg, device, chosen = choose_variants(without_axes(cfg, fixed_axes(overrides)), exclude_given(overrides))
    cells, left_out = plan_sweep(cfg, chosen, device)
    if left_out:
        c.note(f"left out of the sweep (no valid shape): {'; '.join(left_out)}")
    kept = resumed_rows(previous, cfg, measure, device, cells) if previous is not None else []
    job = Job(
        "sweep",
        cfg,
        device,
        measure,
        cells,
        previous,
        kept,
        stream_alone=True,
        keep_together=lambda variant, spec: chain_key(variant.name, spec),  # the OOM rule's chain on one rank
        out_of_memory_fails=False,
    )
    outcome, code = execute_job(job, _sweep_share(cfg, device, measure))
    _print(outcome, fmt, cfg.baseline, c.table_width(fmt, wide))
    note_outputs(outcome)
    files = outcome.document["files"]
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


def _sweep_share(config: Config, device: str, measure: MeasureOptions) -> RunShare:
    """How a sweep runs a rank's cells (`pipeline.sharded.RunShare`): dtype by dtype, each with its ceiling,
    the OOM rule (which knows the kept rows too), progress and time left on stderr."""
    from attnprof.pipeline import distributed
    from attnprof.pipeline.sharded import Share
    from attnprof.pipeline.sweep import OomRule, run_sweep
    from attnprof.profiling.ceiling import RunCeiling

    def share(cells: list[Cell], kept: list[dict[str, Any]], trace_dir: Path, record: Recorder) -> Share:
        oom = OomRule()
        for row in kept:
            oom.note_row(row)
        ceilings: dict[str, RunCeiling] = {}

        def ceiling_for(dtype: str) -> RunCeiling | None:
            if not measure.timing:
                return None
            if dtype not in ceilings:  # a dtype comes twice when collective cells run first
                ceilings[dtype] = RunCeiling.start(device, dtype, refresh=measure.refresh_ceiling)
                c.note(rank_prefix() + ceiling_note(ceilings[dtype]))
            return ceilings[dtype]

        with cell_progress(len(cells), _time_left(cells, oom)) as shown:
            results, interrupted = run_sweep(
                cells,
                config,
                measure,
                ceiling_for,
                record,
                oom,
                shown.on_start,
                shown.on_done,
                trace_dir,
                distributed.current(),
            )
        for ceiling in ceilings.values():
            note_ceiling_replaced(ceiling, results)
        return Share(results, interrupted, ceilings)

    return share


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
