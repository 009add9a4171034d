"""`attnprof run`: profile one variant and print what its trace shows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import config_from_options, execute, note_outputs
from attnprof.cli.options import shared_options
from attnprof.errors import VariantUnavailableError

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.registry import RunSpec, Variant
    from attnprof.variant_registry import Registry

VariantOpt = Annotated[str, typer.Option("--variant", "-v", help="The variant to profile (see `attnprof list`).")]


@c.handle_errors
@shared_options
def run_command(
    variant: VariantOpt,
    config: c.ConfigArg = None,
    config_file: c.ConfigOpt = None,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Profile one variant with torch.profiler and print its per-forward facts."""
    from attnprof.pipeline import check_baseline, plan_cells
    from attnprof.pipeline.engine import Job, start_on_device

    cfg = config_from_options(c.config_path(config, config_file), overrides)
    loaded = c.load_variants_for_cli()
    chosen = loaded.registry.get(variant)
    check_baseline(cfg, loaded.registry)
    cfg, device = start_on_device(cfg)
    cells = plan_cells(cfg, [chosen], device)
    _refuse_unavailable(chosen, cells[0][1], loaded.registry)
    measure = measure.model_copy(update={"key_averages_table": True})  # run prints the profiler's own table
    outcome, code = execute(Job("run", cfg, device, measure, cells))
    _print(outcome, fmt, c.table_width(fmt, wide))
    note_outputs(outcome)
    failed = [row for row in outcome.document.results if row.status.startswith("failed")]
    if failed:
        c.fail(f"{failed[0].variant} failed: {failed[0].reason}", code=code)
    raise typer.Exit(code)


def _refuse_unavailable(variant: Variant, spec: RunSpec, registry: Registry) -> None:
    reason = variant.unavailable_reason(spec)
    if reason is None:
        return
    runnable = [v.name for v in registry.all() if v.unavailable_reason(spec) is None]
    where = f"{spec.device} with {spec.dtype} at {spec.shape_label}" + (f" in {spec.mode}" if spec.backward else "")
    raise VariantUnavailableError(
        f"{variant.name} cannot run on {where}: {reason}",
        hint=f"variants that can run here: {', '.join(runnable) or 'none'}",
    )


def _print(outcome: RunOutcome, fmt: c.OutputFormat, width: int | None) -> None:
    from attnprof.report.run_tables import run_report
    from attnprof.results.files import to_json
    from attnprof.results.keys import cell_key

    c.warn_contended(outcome.document.results, fmt, width)
    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    tables = {
        (r.variant, r.spec.cell_key, r.placement.rank if r.placement else None): r.key_averages_table
        for r in outcome.results
    }
    for row in outcome.document.results:  # another rank's row has no key_averages table here
        c.emit(run_report(row, tables.get((row.variant, cell_key(row), row.rank)), fmt.value, width))
