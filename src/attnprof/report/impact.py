"""Findings by severity and by what they cost: which findings a table shows, how a finding's impact
reads, and "What to look at", the findings that cost the most across a run. Formatting only.

A finding (`results.schema.FindingRecord`) carries `severity` ("problem" or "info"), `impact_us` (the time
per instance at stake, None where the trace cannot measure it) and `impact_pct` (its share of the
instance's time). A fitted terminal table shows the `problem` findings and says how many `info`
ones it leaves to `--wide`, the JSON and the HTML report; `--wide` and markdown show them all. A
results file written before findings had a severity gets it on read (`results.upgrade`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from attnprof.report.formatting import fmt_number
from attnprof.report.layout import bullets, wrap
from attnprof.results.parts import FindingRecord
from attnprof.results.schema import Row

#: How many findings "What to look at" lists.
TOP = 5


class HasFindings(Protocol):
    """What carries findings: a row (`Row`) or an analysis (`Analysis`)."""

    findings: list[FindingRecord]


def severity(finding: FindingRecord) -> str:
    """The finding's severity ("problem" or "info")."""
    return finding.severity


def shown(findings: Sequence[FindingRecord], width: int | None) -> list[FindingRecord]:
    """The findings a table shows: every one in full (`width` None: `--wide` or markdown), else the problems."""
    if width is None:
        return list(findings)
    return [f for f in findings if f.severity == "problem"]


def shown_ids(row: Row, width: int | None) -> str:
    """The ids of the findings a table shows for a row, space-separated."""
    return " ".join(f.id for f in shown(row.findings, width))


def left_out(holders: Sequence[HasFindings], width: int | None) -> list[str]:
    """A note on the info findings a fitted table leaves out ([] when none is or the table is full)."""
    if width is None:
        return []
    hidden = sum(1 for holder in holders for f in holder.findings if f.severity == "info")
    if not hidden:
        return []
    return wrap(
        f"{hidden} info finding(s) not shown (facts, nothing to fix): --wide, the JSON and the report have them.", width
    )


def unit_of(row: Row) -> str:
    """What one instance of a results row is: "step" in the backward modes, else "forward"."""
    return "forward" if (row.mode or "fwd") == "fwd" else "step"


def impact_text(finding: FindingRecord, unit: str) -> str | None:
    """`3,994 µs per forward (9.1% of the forward)`, with `, timed` or `, estimated` where the finding says how
    its impact is known (evidence `impact_basis`); None without a measured impact."""
    if finding.impact_us is None:
        return None
    return f"{fmt_number(float(finding.impact_us))} µs per {unit}{impact_share(finding, f' of the {unit}')}"


def impact_share(finding: FindingRecord, of: str = "") -> str:
    """` (9.1%{of}, timed)`: the impact's share and how it is known (evidence `impact_basis`); "" without either."""
    pct, basis = finding.impact_pct, (finding.evidence or {}).get("impact_basis")
    parts = ([] if pct is None else [f"{fmt_number(float(pct))}%{of}"]) + ([str(basis)] if basis else [])
    return f" ({', '.join(parts)})" if parts else ""


def finding_line(finding: FindingRecord, unit: str, lead: str = "") -> str:
    """A bullet's text: `[id] message`, or `lead [id]: message` naming its cell, then `Impact: ...` where measured,
    or for a problem without one why not (`no_impact_reason`)."""
    from attnprof.analysis.findings.registry import NO_IMPACT_REASONS

    cost = impact_text(finding, unit)
    text = f"{lead} [{finding.id}]: " if lead else f"[{finding.id}] "
    if cost is None and finding.no_impact_reason:
        why = NO_IMPACT_REASONS.get(finding.no_impact_reason, finding.no_impact_reason)
        return text + finding.message + f" Impact: not measured ({finding.no_impact_reason}: {why})."
    return text + finding.message + (f" Impact: {cost}." if cost else "")


@dataclass(frozen=True)
class Ranked:
    """One finding of one cell, with what it costs."""

    cell: str  # "" for the one instance set of `analyze`
    unit: str
    finding: FindingRecord

    @property
    def key(self) -> tuple[float, float]:
        return (float(self.finding.impact_pct or 0.0), float(self.finding.impact_us or 0.0))


def ranked(cells: Sequence[tuple[str, str, Sequence[FindingRecord]]], top: int = TOP) -> list[Ranked]:
    """The `top` problem findings with a measured impact above zero over (cell, unit, findings) triples,
    largest share of its cell's time first (then the most µs)."""
    found = [
        Ranked(cell, unit, f)
        for cell, unit, findings in cells
        for f in findings
        if f.severity == "problem" and (f.impact_us or 0.0) > 0.0
    ]
    found.sort(key=lambda r: r.key, reverse=True)
    return found[:top]


def what_to_look_at(cells: Sequence[tuple[str, str, Sequence[FindingRecord]]], fmt: str, width: int | None) -> str:
    """The heading and one line per top finding (see `ranked`); "" when no finding has a measured impact."""
    top = ranked(cells)
    if not top:
        return ""
    heading = "### What to look at" if fmt == "markdown" else "What to look at"
    intro = "The findings that cost the most, by their share of the time of a forward (or step):"
    lines = [
        f"{r.finding.id}" + (f" on {r.cell}" if r.cell else "") + f": {impact_text(r.finding, r.unit)}" for r in top
    ]
    if fmt == "markdown":
        return "\n".join([heading, "", intro, "", *(f"{n}. {line}" for n, line in enumerate(lines, 1))])
    return "\n".join([heading, "", *wrap(intro, width), bullets(lines, width)])
