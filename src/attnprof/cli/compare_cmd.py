"""`attnprof compare`: every selected variant at every shape, side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import choose_variants, execute, note_outputs, resumable_config, resumed_rows
from attnprof.cli.options import ResumeOpt, exclude_given, shared_options

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.pipeline import RunOutcome


@c.handle_errors
@shared_options(select=True)
def compare_command(
    config: c.ConfigArg = None,
    config_file: c.ConfigOpt = None,
    resume: ResumeOpt = None,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Profile every selected variant at every configured shape and compare them.

    Under torchrun (`torchrun --nproc-per-node=N -m attnprof compare ...`) the cells are split across
    the ranks by estimated cost, each on its own GPU, and rank 0 writes the one results file."""
    from attnprof.pipeline import plan_cells
    from attnprof.pipeline.engine import Job

    previous, cfg, measure = resumable_config("compare", resume, c.config_path(config, config_file), overrides, measure)
    cfg, device, chosen = choose_variants(cfg, exclude_given(overrides))
    baseline = cfg.baseline if cfg.baseline in [v.name for v in chosen] else None  # no title promises speed-ups
    cells = plan_cells(cfg, chosen, device)
    kept = resumed_rows(previous, cfg, measure, device, cells)
    outcome, code = execute(Job("compare", cfg, device, measure, cells, previous, kept))
    _print(outcome, fmt, baseline, c.table_width(fmt, wide))
    note_outputs(outcome)
    raise typer.Exit(code)


def _print(outcome: "RunOutcome", fmt: c.OutputFormat, baseline: str | None, width: int | None) -> None:
    from attnprof.report.tables import compare_report
    from attnprof.results.files import to_json

    c.warn_contended(outcome.document.results, fmt, width)
    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    if not outcome.document.results:  # interrupted before the first cell finished
        return
    c.emit(compare_report(outcome.document.results, fmt.value, baseline, width))
