"""`attnprof check`: declared expectations against a compare, run now or read from a results file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnprof.cli import common as c
from attnprof.cli.execute import choose_variants, config_from_options, execute, note_outputs
from attnprof.cli.options import exclude_given, shared_options

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.results.schema import Row

ExpectationsArg = Annotated[Path, typer.Argument(help="YAML: variant name or pattern → expected fields.")]
CheckConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        show_default=False,
        help="The config of the compare check runs without RESULTS (default: the expectations file's `config`, "
        "one compare per config it lists, else the built-in default).",
    ),
]
ResultsArg = Annotated[
    list[Path] | None,
    typer.Argument(
        help="results.json or results.jsonl files to check, their rows together; without any, check runs a "
        "compare first (one per config).",
        show_default=False,
    ),
]


@c.handle_errors
@shared_options(select=True)
def check_command(
    expectations: ExpectationsArg,
    results: ResultsArg = None,
    config_file: CheckConfigOpt = None,
    allow_unjudged: c.AllowUnjudgedOpt = False,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
    *,
    overrides: dict[str, Any],
    measure: "MeasureOptions",
) -> None:
    """Check each variant's results against declared expectations: ✓ held, ✗ missed, – not run, ? not judged.

    With RESULTS, reads them (several files: their rows together); without, runs a compare (the config
    from -c, else each config the expectations file names, one compare each, else the built-in default)
    and checks its rows. Exit 1 on any miss. A latency figure (latency_us, pct_of_peak, speedup_vs_baseline,
    ...) of a row timed while other processes held over a quarter of the CPU, or a faster_than between two
    unstable timings whose margin is within their IQRs, is not judged, with the reason: exit 3 when nothing
    judged missed (--allow-unjudged: 0). Exit 0 when nothing missed and everything was judged; 1 outweighs 3.
    """
    from attnprof.config import MeasureOptions
    from attnprof.errors import UsageError
    from attnprof.pipeline import plan_cells
    from attnprof.pipeline.engine import Job
    from attnprof.report.expectations import check_json, check_rows, check_table, counts, load_expectations
    from attnprof.results.files import load_results, to_json

    declared = load_expectations(expectations)
    rows: list[Row] = []
    sources: list[str] = []
    code = 0
    if results:
        given = {**overrides, "config": config_file}
        named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
        if named or measure != MeasureOptions():
            raise UsageError(
                f"RESULTS given: {', '.join(named) or 'measurement options'} would run a compare, and nothing is run"
            )
        for results_path in results:
            loaded = load_results(results_path)
            rows += loaded.rows
            sources.append(str(loaded.path))
    else:
        configs: list[Path | None] = [config_file] if config_file is not None else [*declared.configs] or [None]
        for config_path in configs:
            cfg, device, chosen = choose_variants(config_from_options(config_path, overrides), exclude_given(overrides))
            outcome, _ = execute(Job("check", cfg, device, measure, plan_cells(cfg, chosen, device)))
            note_outputs(outcome)
            rows += load_results(outcome.folder.results_json).rows  # the rows as written: what is checked
            sources.append(str(outcome.folder.results_json))
            if outcome.interrupted:
                code = 130
                break
    outcomes = check_rows(declared, rows)
    if fmt is c.OutputFormat.json:
        c.emit(to_json(check_json(outcomes, expectations, sources[0] if len(sources) == 1 else sources)))
    else:
        c.emit(check_table(outcomes, fmt.value, c.table_width(fmt, wide)))
    if code:
        raise typer.Exit(code)
    found = counts(outcomes)
    c.gate_exit(bool(found["missed"]), found["not judged"], allow_unjudged, "expectation(s)")
