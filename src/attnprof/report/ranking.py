"""Findings ranked by what they cost, for the report and `sweep`: a compact impact text and the order.

A finding (`results.schema.FindingRecord`) carries `id` and `message`, `severity` (`problem` or `info`),
`impact_us` (the time per forward or step at stake) and `impact_pct` (its share of the cell's time).
Ranking follows "What to look at" (`report.impact.ranked`): the largest share first, then the most µs;
findings without an impact after every one with; at equal impact (or none) problems before info.
"""

from __future__ import annotations

from collections.abc import Collection

from attnprof.report.formatting import fmt_number
from attnprof.report.impact import impact_share, severity
from attnprof.results.parts import FindingRecord
from attnprof.results.schema import Row

__all__ = [
    "INFO",
    "PROBLEM",
    "costliest_problem",
    "impact_text",
    "impact_us",
    "rank_key",
    "ranked",
    "row_findings",
    "severity",
]

PROBLEM, INFO = "problem", "info"


def impact_us(finding: FindingRecord) -> float | None:
    """The time at stake per forward or step, in µs, when the finding states one."""
    return finding.impact_us


def impact_text(finding: FindingRecord) -> str:
    """`126.6 µs (11.8%)`, `126.6 µs`, `126.6 µs (11.8%, timed)` where the finding says how its impact is known
    (evidence `impact_basis`), or "" without an impact."""
    if finding.impact_us is None:
        return ""
    return f"{fmt_number(finding.impact_us)} µs{impact_share(finding)}"


def rank_key(finding: FindingRecord) -> tuple[bool, float, float, bool]:
    """Sorts the largest share of the cell's time first, then the most µs, then findings without an
    impact; at equal impact problems first."""
    value = finding.impact_us
    share = float(finding.impact_pct or 0.0)
    return (value is None, -share, -(value or 0.0), finding.severity != PROBLEM)


def ranked(findings: list[FindingRecord]) -> list[FindingRecord]:
    """The findings in rank order (a stable sort: equal ones keep the order they were reported in)."""
    return sorted(findings, key=rank_key)


def row_findings(row: Row) -> list[FindingRecord]:
    """The findings of one results row."""
    return list(row.findings)


def costliest_problem(row: Row, leave_out: Collection[str] = ()) -> FindingRecord | None:
    """The row's problem finding with the most µs at stake, other than the ids `leave_out`; without any
    impact, its first problem; None when it has no problem finding."""
    problems = [f for f in row.findings if f.severity == PROBLEM and f.id not in leave_out]
    costed = [f for f in problems if f.impact_us is not None]
    return max(costed, key=lambda f: f.impact_us or 0.0) if costed else next(iter(problems), None)
