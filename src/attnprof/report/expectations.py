"""`attnprof check`: expectations declared per variant (`report.expectations_file` reads them), checked
against the typed rows of a compare: each expectation on every row its pattern and `where` match, then the
table and the JSON of the outcomes. A field an expectation names was resolved against the row's schema when
the file was loaded, and is read from each row by attribute.

An expectation on a timed figure (`TIMED_FIELDS`: the latency and what is computed from it) is `not judged`
(`report.judged`) when its row was timed under contention, and a `faster_than` when either row was, or when
both rows' timings are unstable and the margin is within their IQRs. The check's outcome (`check_outcome`):
`missed` when a judged expectation missed, else `not judged` when one could not be judged, else `held`.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprof.report.expectations_file import (
    CELL_FIELDS,
    Expectation,
    Expectations,
    Faster,
    Scalar,
    load_expectations,
    parse_expectations,
)
from attnprof.report.formatting import fmt_number
from attnprof.report.judged import UNSTABLE_TEXT, both_unstable, contention, within_spread
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.results.keys import cell_label
from attnprof.results.schema import Row

__all__ = ["Expectation", "Expectations", "Outcome", "check_json", "check_rows", "check_table", "counts"]
__all__ += ["check_outcome", "load_expectations", "parse_expectations", "unjudged_lines"]

MARKS = {"held": "✓", "missed": "✗", "not run": "–", "not judged": "?"}
#: The fields timed without the profiler, or computed from that latency: not judged on a contended row.
TIMED_FIELDS = frozenset(
    {"latency_us", "latency_iqr_us", "latency_p25_us", "latency_p75_us", "latency_min_us", "cold_ms"}
    | {"tflops", "pct_of_peak", "achieved_gbps", "pct_of_read_bandwidth", "speedup_vs_baseline"}
)

COLUMNS = (
    Column(""),
    Column("variant", narrow=14),
    Column("cell", narrow=16),
    Column("field", narrow=12),
    Column("expected", narrow=12),
    Column("measured", narrow=16, wide=60),
)


@dataclass(frozen=True)
class Outcome:
    """One expectation checked against one row (None: no row matched its pattern)."""

    expectation: Expectation
    row: Row | None
    verdict: str  # held, missed, not run or not judged
    measured: str
    reason: str | None = None  # why it was not judged


def _same(measured: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(measured, bool):
        return measured is expected
    if isinstance(expected, (int, float)) and isinstance(measured, (int, float)):
        return float(measured) == float(expected)
    return measured == expected


Judged = tuple[str, str, str | None]  # verdict, measured text, why it was not judged (None: it was)


def _judge(expectation: Expectation, row: Row, rows: list[Row]) -> Judged:
    """One expectation on one row (`rows`: all of them, for `faster_than`)."""
    status = row.status
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), status, None
    if expectation.kind == "faster":
        return _judge_faster(expectation.value, row, rows)
    verdict, measured = _judge_value(expectation, row)
    timed = expectation.field in TIMED_FIELDS and getattr(row, expectation.field) is not None
    why = contention(row, row.variant) if timed else None
    return ("not judged" if why else verdict), measured, why


def _judge_value(expectation: Expectation, row: Row) -> tuple[str, str]:
    """(verdict, measured text) of an expectation on the findings or a field of an ok row."""
    if expectation.kind in ("has", "lacks", "any"):
        ids = row.finding_ids
        if expectation.kind == "any":
            present_ids = [f for f in expectation.value if f in ids]
            return ("held" if present_ids else "missed"), ", ".join(present_ids) or "none present"
        present = expectation.value in ids
        held = present if expectation.kind == "has" else not present
        return ("held" if held else "missed"), "present" if present else "absent"
    measured = getattr(row, expectation.field)  # a field of the row: resolved when the file was loaded
    if expectation.kind == "range":
        bounds = expectation.value
        inside = (
            isinstance(measured, (int, float))
            and not isinstance(measured, bool)
            and (bounds.min is None or measured >= bounds.min)
            and (bounds.max is None or measured <= bounds.max)
        )
        return ("held" if inside else "missed"), fmt_number(measured)
    return ("held" if _same(measured, expectation.value) else "missed"), fmt_number(measured)


def _cell_value(row: Row, name: str) -> Any:
    value = getattr(row, name)  # one of CELL_FIELDS, each a field of the row
    if name == "device":
        return str(value).split(":", 1)[0]
    if name in ("q_len", "kv_len") and value is None:
        return row.seq  # rows written before decode existed
    if name == "mask" and value is None:
        return "causal" if row.causal else "none"  # rows written before masks existed
    return value


def _same_cell(other: Row, row: Row, changed: dict[str, Scalar]) -> bool:
    """True when `other` is at `row`'s cell with the `changed` fields set to their values."""
    for name in CELL_FIELDS:
        wanted = changed[name] if name in changed else _cell_value(row, name)
        if not _same(_cell_value(other, name), wanted):
            return False
    return True


def _latency(row: Row) -> float | None:
    value = row.latency_us
    return float(value) if value is not None and value > 0 else None


def _judge_faster(faster: Faster, row: Row, rows: list[Row]) -> Judged:
    """The row's latency against that of `faster.variant` at its cell (with `faster.fields` changed); not
    judged when either was timed under contention, or both are unstable and the margin within their IQRs."""
    changed = dict(faster.fields)
    others = [r for r in rows if r.variant == faster.variant and _same_cell(r, row, changed)]
    if not others:
        at = "".join(f", {k}={v}" for k, v in faster.fields)
        return "missed", f"no {faster.variant} row at this cell{at}", None
    other = next((r for r in others if r.status == "ok"), others[0])
    status = other.status
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), f"{faster.variant}: {status}", None
    mine, theirs = _latency(row), _latency(other)
    if mine is None or theirs is None:
        return "missed", f"no latency: {fmt_number(mine)} against {faster.variant} {fmt_number(theirs)} us", None
    ratio, need = theirs / mine, faster.by if faster.by is not None else 1.0
    held = ratio >= faster.by if faster.by is not None else ratio > 1
    measured = f"{ratio:.2f}x: {fmt_number(mine)} us against {fmt_number(theirs)} us"
    why = contention(row, row.variant) or contention(other, faster.variant)
    if why is None and both_unstable(row, other) and within_spread(theirs - need * mine, other, row, need):
        why = f"{UNSTABLE_TEXT}, and {ratio:.2f}x is within their IQRs of the {need:g}x wanted"
    return ("not judged" if why else "held" if held else "missed"), measured, why


def _matches(expectation: Expectation, row: Row) -> bool:
    if not fnmatch.fnmatchcase(row.variant, expectation.pattern):
        return False
    return all(any(_same(getattr(row, name), v) for v in values) for name, values in expectation.where)


def _where_text(expectation: Expectation) -> str:
    return "; ".join(f"{name} {'in' if len(v) > 1 else '='} {', '.join(map(str, v))}" for name, v in expectation.where)


def check_rows(expectations: Expectations, rows: list[Row]) -> list[Outcome]:
    """Every expectation against every row of each variant its pattern (and `where`) matches, in file order."""
    outcomes = []
    for expectation in expectations.items:
        matching = [row for row in rows if _matches(expectation, row)]
        if not matching:
            where = f" where {_where_text(expectation)}" if expectation.where else ""
            outcomes.append(Outcome(expectation, None, "missed", f"no row of this variant{where} in the results"))
        for row in matching:
            outcomes.append(Outcome(expectation, row, *_judge(expectation, row, rows)))
    return outcomes


def check_outcome(outcomes: list[Outcome]) -> str:
    """`missed` (a judged miss outweighs the rest), `not judged`, or `held` (what was not run aside)."""
    found = counts(outcomes)
    return "missed" if found["missed"] else "not judged" if found["not judged"] else "held"


def unjudged_lines(outcomes: list[Outcome]) -> list[str]:
    """One line per row and reason not judged: `not judged: VARIANT @ CELL: why`."""
    found = dict.fromkeys(
        (o.row.variant, _cell(o.row), o.reason) for o in outcomes if o.row is not None and o.reason is not None
    )
    return [f"not judged: {variant} @ {cell}: {why}" for variant, cell, why in found]


def _cell(row: Row | None) -> str:
    return "" if row is None else cell_label(row)


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """How many expectations held, were missed, were not run, or were not judged."""
    return {verdict: sum(1 for o in outcomes if o.verdict == verdict) for verdict in MARKS}


def check_table(outcomes: list[Outcome], fmt: str, width: int | None = None) -> str:
    """One line per expectation and row: ✓ held, ✗ missed, – not run, ? not judged; the expected value next
    to the measured one; then why each row was not judged, and a summary line."""
    width = limit(width, fmt)
    cells = list(dict.fromkeys(_cell(o.row) for o in outcomes if o.row is not None))
    one_cell = len(cells) <= 1  # then the cell is said once, above the table
    body = [
        [
            MARKS[o.verdict],
            o.row.variant if o.row else o.expectation.pattern,
            *([] if one_cell else [_cell(o.row)]),
            o.expectation.field,
            o.expectation.expected_text,
            o.measured,
        ]
        for o in outcomes
    ]
    columns = [c for c in COLUMNS if not (one_cell and c.header == "cell")]
    found = counts(outcomes)
    tally = ", ".join(f"{n} {verdict}" for verdict, n in found.items() if n or verdict != "not judged")
    heading = wrap(f"checked at {cells[0]}", width) + [""] if one_cell and cells else []
    unjudged = ["", bullets(unjudged_lines(outcomes), width)] if found["not judged"] else []
    return "\n".join([*heading, table(columns, body, fmt, width), *unjudged, "", *wrap(tally, width)])


def check_json(outcomes: list[Outcome], expectations: Path, results: str | list[str] | None) -> dict[str, Any]:
    """The outcomes as a JSON-ready document (`results`: the file checked, or the list of them;
    `results.files.to_json` writes it)."""
    return {
        "expectations": str(expectations),
        "results": results,
        "checks": [
            {
                "verdict": o.verdict,
                "pattern": o.expectation.pattern,
                "variant": o.row.variant if o.row else None,
                "cell": _cell(o.row) or None,
                "field": o.expectation.field,
                "where": {name: list(values) for name, values in o.expectation.where} or None,
                "expected": o.expectation.expected_text,
                "measured": o.measured,
                "reason": o.reason,
            }
            for o in outcomes
        ],
        **counts(outcomes),
        "not_judged_reasons": unjudged_lines(outcomes),
        "outcome": check_outcome(outcomes),
    }
