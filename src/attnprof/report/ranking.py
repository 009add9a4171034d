"""Findings ranked by what they cost: each finding dict's severity and impact, read with fallbacks.

A finding dict carries `id` and `message`, and in newer results `severity` (`problem` or `info`),
`impact_us` (the time per forward or step at stake) and `impact_pct` (that time as a % of the cell's).
Older results have neither: their severity is the registry's for that id, their impact unknown.
Ranking puts the largest impact first, findings without an impact after every one with, and at
equal impact (or none) problems before info.
"""

from __future__ import annotations

from typing import Any

from attnprof.report.formatting import fmt_number

PROBLEM, INFO = "problem", "info"


def severity(finding: dict[str, Any]) -> str:
    """The finding's own severity, else the registry's for its id; an id the registry does not know is
    a problem (shown rather than hidden)."""
    given = finding.get("severity")
    if given in (PROBLEM, INFO):
        return str(given)
    from attnprof.analysis.findings import FINDINGS

    finding_id = str(finding.get("id"))
    return FINDINGS.get(finding_id).severity if finding_id in FINDINGS else PROBLEM


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


def rank_key(finding: dict[str, Any]) -> tuple[int, float, int]:
    """Sorts the largest impact first, then findings without one; at equal impact problems first."""
    value = impact_us(finding)
    return (value is None, -(value or 0.0), severity(finding) != PROBLEM)


def ranked(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings in rank order (a stable sort: equal ones keep the order they were reported in)."""
    return sorted(findings, key=rank_key)


def row_findings(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The finding dicts of one results row (an entry that is not a dict is left out)."""
    return [f for f in row.get("findings") or [] if isinstance(f, dict) and f.get("id")]
