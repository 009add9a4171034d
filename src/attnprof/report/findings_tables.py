"""`attnprof findings`: the findings attnprof reports, as a table, one finding in full, or the
reference document (docs/findings.md). Each finding is its registry `Rule`: id, severity, summary,
paragraph, and what its impact counts (`impact_text`, None for a finding without one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import NO_IMPACT_REASONS
from attnprof.report.layout import Column, table, wrap

if TYPE_CHECKING:
    from attnprof.analysis.findings.registry import Rule

LIST_COLUMNS = (Column("id"), Column("severity"), Column("summary", narrow=30))
FACT_COLUMNS = (Column(""), Column("", narrow=30))
#: The command that writes docs/findings.md (a test holds the file equal to its output).
REGENERATE = "attnprof findings --format markdown > docs/findings.md"
INTRO = (
    "Each finding attnprof reports is one sentence with the numbers that prove it, read from the trace; "
    "when the evidence is missing the finding is absent. The ids are stable: the JSON's `findings[].id`, "
    "the compare table's `findings` column, `diff`'s gained and lost findings and `check`'s "
    "`findings: {has: [...], lacks: [...]}` use them. Severity **problem** means something to act on, with what "
    "it costs; **info**, a fact worth knowing with nothing to fix (terminal tables show the problems; `--wide`, the "
    "JSON and the HTML report show both). Where the trace measures it, a problem carries its **impact**: "
    "`impact_us`, the time per forward (or step) at stake, and `impact_pct`, its share of the instance's time "
    "(the larger of its CPU time and its GPU time); each section says what its impact counts. `run`, `compare`, "
    "`model` and `analyze` end with the findings of largest impact. They are listed in the order they are reported."
)


def findings_table(findings: Sequence[Rule], fmt: str, width: int | None = None) -> str:
    """Every finding's id, severity and summary, one a row; markdown: the reference document."""
    if fmt == "markdown":
        return findings_markdown(findings)
    return table(LIST_COLUMNS, [[f.id, f.severity, f.summary] for f in findings], fmt, width)


def finding_text(finding: Rule, fmt: str, width: int | None = None) -> str:
    """One finding in full: its id, severity and summary, then its paragraph."""
    if fmt == "markdown":
        return _section(finding)
    facts = [["id", finding.id], ["severity", finding.severity], ["summary", finding.summary]]
    if finding.impact_text:
        facts.append(["impact", finding.impact_text])
    return "\n".join([table(FACT_COLUMNS, facts, fmt, width), "", *wrap(finding.paragraph, width)])


NO_IMPACT_INTRO = (
    "A problem whose impact the trace cannot measure says why in `no_impact_reason` (null otherwise), one of:"
)


def findings_markdown(findings: Sequence[Rule]) -> str:
    """docs/findings.md: the introduction, the table of every finding linked to its section, the sections."""
    rows = [[f"[`{f.id}`](#{f.id})", f.severity, f.summary] for f in findings]
    parts = [
        "# Findings",
        "",
        f"<!-- Generated from the registry in src/attnprof/analysis/findings/ by `{REGENERATE}`. -->",
        "",
        INTRO,
        "",
        NO_IMPACT_INTRO,
        "",
        *(f"- `{reason}`: {text}." for reason, text in NO_IMPACT_REASONS.items()),
        "",
        table(LIST_COLUMNS, rows, "markdown"),
    ]
    for finding in findings:
        parts += ["", _section(finding)]
    return "\n".join(parts)


def _section(finding: Rule) -> str:
    impact = f"\n\n**Impact**: {finding.impact_text}" if finding.impact_text else ""
    return f"## {finding.id}\n\n**{finding.severity}**: {finding.summary}\n\n{finding.paragraph}{impact}"
