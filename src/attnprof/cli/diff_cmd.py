"""`attnprof diff`: two results files side by side; exit 1 on a regression, for CI gates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnprof.cli import common as c

BaseArg = Annotated[Path, typer.Argument(help="The results to compare against (results.json or results.jsonl).")]
NewArg = Annotated[Path, typer.Argument(help="The results to judge (results.json or results.jsonl).")]
ThresholdOpt = Annotated[
    str,
    typer.Option(
        "--threshold",
        metavar="PCT",
        help="How much slower counts as a regression, as 5% or 0.05 (it must also exceed the noise between runs).",
    ),
]
NoiseFloorOpt = Annotated[
    str | None,
    typer.Option(
        "--noise-floor",
        metavar="PCT",
        help="The least latency change two runs tell from noise, as 50% or 0.5 (default: cpu 50%, cuda 0%).",
    ),
]


@c.handle_errors
def diff_command(
    base: BaseArg,
    new: NewArg,
    threshold: ThresholdOpt = "5%",
    noise_floor: NoiseFloorOpt = None,
    allow_unjudged: c.AllowUnjudgedOpt = False,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
) -> None:
    """Compare two results files row by row (variant, shape, dtype, causal, mode).

    Exit 1 when a row got slower beyond the noise between runs (by more than the threshold and the
    device's noise floor, by more than both runs' latency IQRs together, and in its fastest call too),
    started failing, or gained a finding. A change the rest does not bear out is `within noise`. A row
    timed while other processes held over a quarter of the CPU (in either file), or a slowdown not borne
    out between two unstable timings, is `not judged`, with the reason: exit 3 when no judged row
    regressed (--allow-unjudged: 0). Exit 0 when every row was judged and none regressed; 1 outweighs 3.
    Exit 2 for unreadable files, a bad threshold or noise floor, or files without a row in common.
    """
    from attnprof.errors import UsageError
    from attnprof.report.diff import diff_json, diff_results, diff_table, parse_threshold
    from attnprof.results.files import load_results, to_json

    fraction = parse_threshold(threshold)
    floor = parse_threshold(noise_floor, "--noise-floor") if noise_floor is not None else None
    before, after = load_results(base), load_results(new)
    for loaded in (before, after):
        if loaded.truncated or loaded.header.interrupted:
            c.note(f"{loaded.path}: an interrupted run; its unfinished cells have no row")
    diff = diff_results(before.rows, after.rows, fraction, floor)
    if not diff.rows:
        raise UsageError(
            f"no row of {new} matches a row of {base}",
            hint="rows match by variant, shape, dtype, causal masking and mode",
        )
    if fmt is c.OutputFormat.json:
        c.emit(to_json(diff_json(diff, str(base), str(new))))
    else:
        c.emit(diff_table(diff, fmt.value, c.table_width(fmt, wide)))
    c.gate_exit(bool(diff.regressions), len(diff.unjudged), allow_unjudged, "row(s)")
