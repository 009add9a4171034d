"""`attnprof explain`: decode a kernel name into its parts."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from attnprof.cli import common as c


@c.handle_errors
def explain_command(
    kernel: Annotated[str, typer.Argument(help="A kernel name as the trace shows it.")],
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
) -> None:
    """Decode a GPU kernel name: library, algorithm, dtype, tile, architecture, tensor cores."""
    from attnprof.analysis import explain_kernel
    from attnprof.report.explain_tables import render_explanation

    explanation = explain_kernel(kernel)
    if fmt is c.OutputFormat.json:
        c.emit(json.dumps(asdict(explanation), indent=2))
        return
    c.emit(render_explanation(explanation, fmt.value, c.table_width(fmt, wide)))
