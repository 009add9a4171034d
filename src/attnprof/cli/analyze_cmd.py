"""`attnprof analyze`: per-forward facts and findings for any torch.profiler Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnprof.cli import common as c
from attnprof.registry import DEFAULT_REGION

TraceArg = Annotated[Path, typer.Argument(help="A torch.profiler Chrome trace (.json or .json.gz).")]
DtypeHintOpt = Annotated[str | None, typer.Option("--dtype", help="Input dtype (bf16/fp16/fp32) when the trace does not record it.", show_default=False)]


@c.handle_errors
def analyze_command(trace: TraceArg, region: Annotated[str, typer.Option(help="Name of the record_function region that marks one forward.")] = DEFAULT_REGION,
                    dtype: DtypeHintOpt = None, fmt: c.FormatOpt = c.OutputFormat.table, wide: c.WideOpt = False) -> None:
    """Analyse a trace: attribute GPU work to each forward and explain what it shows."""
    from attnprof.analysis import analyze_trace
    from attnprof.report.analysis_tables import render_analysis

    analysis = analyze_trace(trace, region=region, dtype=dtype)
    if fmt is c.OutputFormat.json:
        c.emit(json.dumps(analysis.to_dict(), indent=2))
        return
    c.emit(render_analysis(analysis, fmt.value, c.table_width(fmt, wide)))
