"""Findings ranked by what they cost, for the report and `sweep`: a compact impact text and the order.

A finding dict carries `id` and `message`, `severity` (`problem` or `info`; from the registry for older
results, see `report.impact.severity`), `impact_us` (the time per forward or step at stake) and
`impact_pct` (its share of the cell's time). Ranking follows "What to look at" (`report.impact.ranked`):
the largest share first, then the most µs; findings without an impact after every one with; at equal
impact (or none) problems before info.
"""

from __future__ import annotations

from typing import Any

from attnprof.report.formatting import fmt_number
from attnprof.report.impact import severity

__all__ = ["INFO", "PROBLEM", "impact_text", "impact_us", "rank_key", "ranked", "row_findings", "severity"]

PROBLEM, INFO = "problem", "info"


def impact_us(finding: dict[str, Any]) -> float | None:
    """The time at stake per forward or step, in µs, when the finding states one."""
    value = finding.get("impact_us")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def impact_text(finding: dict[str, Any]) -> str:
    """`126.6 µs (11.8%)`, `126.6 µs`, or "" without an impact."""
    value = impact_us(finding)
    if value is None:
        return ""
    pct = finding.get("impact_pct")
    return f"{fmt_number(value)} µs" + (f" ({fmt_number(pct)}%)" if isinstance(pct, (int, float)) else "")


def rank_key(finding: dict[str, Any]) -> tuple[bool, float, float, bool]:
    """Sorts the largest share of the cell's time first, then the most µs, then findings without an
    impact; at equal impact problems first."""
    value = impact_us(finding)
    pct = finding.get("impact_pct")
    share = float(pct) if isinstance(pct, (int, float)) and not isinstance(pct, bool) else 0.0
    return (value is None, -share, -(value or 0.0), severity(finding) != PROBLEM)


def ranked(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings in rank order (a stable sort: equal ones keep the order they were reported in)."""
    return sorted(findings, key=rank_key)


def row_findings(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The finding dicts of one results row (an entry that is not a dict is left out)."""
    return [f for f in row.get("findings") or [] if isinstance(f, dict) and f.get("id")]
