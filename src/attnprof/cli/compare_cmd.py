"""`attnprof compare`: every selected variant at every shape, side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import config_from_options, execute, note_outputs
from attnprof.cli.options import shared_options

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.pipeline import RunOutcome

PatternsOpt = Annotated[Optional[list[str]], typer.Option("--variants", help="Include pattern, e.g. 'sdpa-*' (repeatable; replaces the config's variants and exclude).", show_default=False)]
ExcludeOpt = Annotated[Optional[list[str]], typer.Option("--exclude", help="Exclude pattern (repeatable; overrides the config).", show_default=False)]
BaselineOpt = Annotated[Optional[str], typer.Option(help="Variant the speed-ups are relative to.", show_default=False)]


@c.handle_errors
@shared_options
def compare_command(config: c.ConfigArg = None, variants: PatternsOpt = None, exclude: ExcludeOpt = None,
                    baseline: BaselineOpt = None, fmt: c.FormatOpt = c.OutputFormat.table, *,
                    overrides: dict[str, Any], measure: "MeasureOptions") -> None:
    """Profile every selected variant at every configured shape and compare them."""
    from attnprof.pipeline import plan_cells, select_variants
    from attnprof.profiling.inputs import resolve_torch_device

    if variants and exclude is None:
        exclude = []  # an explicit selection replaces the config's include and exclude lists together
    cfg = config_from_options(config, overrides, variants=variants or None, exclude=exclude, baseline=baseline)
    loaded = c.load_variants_for_cli()
    for line in c.plugin_notes(loaded):
        c.note(line)
    chosen = select_variants(cfg, loaded.registry)
    if cfg.baseline and cfg.baseline not in [v.name for v in chosen]:
        c.note(f"baseline {cfg.baseline!r} is not among the selected variants: no speed-ups")
    device = resolve_torch_device(cfg.device)
    outcome = execute("compare", cfg, plan_cells(cfg, chosen, device), device, measure)
    _print(outcome, fmt, cfg.baseline)
    note_outputs(outcome)
    raise typer.Exit(outcome.exit_code)


def _print(outcome: "RunOutcome", fmt: c.OutputFormat, baseline: str | None) -> None:
    from attnprof.report.export import to_json
    from attnprof.report.tables import glance_table, shape_table

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    entries = outcome.document["results"]
    if not entries:  # interrupted before the first cell finished: nothing to tabulate
        return
    heading = "###" if fmt is c.OutputFormat.markdown else "=="
    for shape in dict.fromkeys(e["shape"] for e in entries):
        rows = [e for e in entries if e["shape"] == shape]
        first = rows[0]
        title = f"{shape} {first['dtype']} {'causal' if first['causal'] else 'full'} on {first['device']}"
        if baseline:
            title += f", speed-up vs {baseline}"
        c.emit(f"\n{heading} {title}\n")
        c.emit(shape_table(rows, fmt.value))
    c.emit(f"\n{heading} at a glance\n")
    c.emit(glance_table(entries, fmt.value))
