"""`attnprof findings`: every finding attnprof reports, or one of them in full."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from attnprof.cli import common as c


@c.handle_errors
def findings_command(
    finding: Annotated[
        str | None,
        typer.Argument(
            metavar="ID", help="A finding id: print it in full. Without one: list them all.", show_default=False
        ),
    ] = None,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
) -> None:
    """List every finding attnprof reports, with its severity and summary, or one in full.

    `--format markdown` writes the reference document, docs/findings.md, with every finding's paragraph.
    """
    from attnprof.analysis.findings import FINDINGS
    from attnprof.report.findings_tables import finding_text, findings_table

    width = c.table_width(fmt, wide)
    if finding is not None:
        rule = FINDINGS.get(finding)
        text = (
            json.dumps(rule.to_dict(), indent=2) if fmt is c.OutputFormat.json else finding_text(rule, fmt.value, width)
        )
        c.emit(text)
        return
    if fmt is c.OutputFormat.json:
        c.emit(json.dumps({"findings": [rule.to_dict() for rule in FINDINGS]}, indent=2))
        return
    c.emit(findings_table(list(FINDINGS), fmt.value, width))
