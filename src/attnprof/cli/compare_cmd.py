"""`attnprof compare`: every selected variant at every shape, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import config_from_options, config_on_device, execute, note_outputs
from attnprof.cli.options import shared_options

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import RunOutcome
    from attnprof.registry import Registry

PatternsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--variants",
        metavar="PATTERN",
        help="Include pattern, e.g. 'sdpa-*' (repeatable; replaces the config's variants and exclude).",
        show_default=False,
    ),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude", metavar="PATTERN", help="Exclude pattern (repeatable; overrides the config).", show_default=False
    ),
]
BaselineOpt = Annotated[str | None, typer.Option(help="Variant the speed-ups are relative to.", show_default=False)]
ResumeOpt = Annotated[
    Path | None,
    typer.Option(
        "--resume",
        metavar="FOLDER",
        help="An earlier run's folder: run only the cells that have no row there yet, and write the results "
        "(old rows and new) into it as results-2.json, ... (a torchrun run's folder keeps each rank's rows).",
        show_default=False,
    ),
]


@c.handle_errors
@shared_options
def compare_command(
    config: c.ConfigArg = None,
    config_file: c.ConfigOpt = None,
    variants: PatternsOpt = None,
    exclude: ExcludeOpt = None,
    baseline: BaselineOpt = None,
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
    from attnprof.pipeline import check_names, distributed, plan_cells, select_variants, without_collective

    if variants and exclude is None:
        exclude = []  # an explicit selection replaces the config's include and exclude lists together
    cfg = config_from_options(
        c.config_path(config, config_file), overrides, variants=variants or None, exclude=exclude, baseline=baseline
    )
    loaded = c.load_variants_for_cli()
    for line in c.plugin_notes(loaded):
        c.note(line)
    check_names(cfg, loaded.registry)  # a typo fails before torch is imported
    cfg, device = config_on_device(cfg)
    chosen = without_collective(cfg, select_variants(cfg, loaded.registry, device), distributed.current() is not None)
    if exclude is None:  # the config's own exclusions, not the command line's
        _note_exclusions(cfg, loaded.registry, device)
    if cfg.baseline and cfg.baseline not in [v.name for v in chosen]:
        c.note(f"baseline {cfg.baseline!r} is not among the selected variants: no speed-ups")
    outcome = execute("compare", cfg, plan_cells(cfg, chosen, device), device, measure, resume)
    _print(outcome, fmt, cfg.baseline, c.table_width(fmt, wide))
    note_outputs(outcome)
    raise typer.Exit(outcome.exit_code)


def _note_exclusions(config: Config, registry: Registry, device: str) -> None:
    """One stderr line naming what the config's exclude entries left out on `device`, each with its reason."""
    from attnprof.pipeline import config_exclusions

    groups = [
        ", ".join(names) + (f" ({reason})" if reason else "")
        for names, reason in config_exclusions(config, registry, device)
    ]
    if groups:
        c.note(f"excluded by the config: {'; '.join(groups)}")


def _print(outcome: "RunOutcome", fmt: c.OutputFormat, baseline: str | None, width: int | None) -> None:
    from attnprof.report.export import to_json
    from attnprof.report.tables import compare_report

    if fmt is c.OutputFormat.json:
        c.emit(to_json(outcome.document))
        return
    if not outcome.document["results"]:  # interrupted before the first cell finished
        return
    c.emit(compare_report(outcome.document["results"], fmt.value, baseline, width))
