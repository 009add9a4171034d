"""`attnprof compare`: every selected variant at every shape, side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import choose_variants, config_from_options, execute, note_outputs
from attnprof.cli.options import exclude_given, shared_options

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.pipeline import RunOutcome


@c.handle_errors
@shared_options(select=True)
def compare_command(
    config: c.ConfigArg = None,
    config_file: c.ConfigOpt = None,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Profile every selected variant at every configured shape and compare them."""
    from attnprof.pipeline import plan_cells

    cfg = config_from_options(c.config_path(config, config_file), overrides)
    cfg, device, chosen = choose_variants(cfg, exclude_given(overrides))
    baseline = cfg.baseline if cfg.baseline in [v.name for v in chosen] else None  # no title promises speed-ups
    outcome = execute("compare", cfg, plan_cells(cfg, chosen, device), device, measure)
    _print(outcome, fmt, baseline, c.table_width(fmt, wide))
    note_outputs(outcome)
    raise typer.Exit(outcome.exit_code)


def _print(outcome: "RunOutcome", fmt: c.OutputFormat, baseline: str | None, width: int | None) -> None:
    from attnprof.report.export import to_json
    from attnprof.report.tables import compare_report

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    if not outcome.document["results"]:  # interrupted before the first cell finished
        return
    c.emit(compare_report(outcome.document["results"], fmt.value, baseline, width))
