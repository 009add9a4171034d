"""`attnprof check`: expectations declared per variant (`report.expectations_file` reads them), checked
against the typed rows of a compare: each expectation on every row its pattern and `where` match, then the
table and the JSON of the outcomes. A field an expectation names was resolved against the row's schema when
the file was loaded, and is read from each row by attribute.
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
from attnprof.report.layout import Column, limit, table, wrap
from attnprof.results.keys import cell_label
from attnprof.results.schema import Row

__all__ = ["Expectation", "Expectations", "Outcome", "check_json", "check_rows", "check_table", "counts"]
__all__ += ["load_expectations", "parse_expectations"]

MARKS = {"held": "✓", "missed": "✗", "not run": "–"}

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
    verdict: str  # held, missed or not run
    measured: str


def _same(measured: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(measured, bool):
        return measured is expected
    if isinstance(expected, (int, float)) and isinstance(measured, (int, float)):
        return float(measured) == float(expected)
    return measured == expected


def _judge(expectation: Expectation, row: Row, rows: list[Row]) -> tuple[str, str]:
    """(verdict, measured text) of one expectation on one row (`rows`: all of them, for `faster_than`)."""
    status = row.status
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), status
    if expectation.kind in ("has", "lacks", "any"):
        ids = row.finding_ids
        if expectation.kind == "any":
            present_ids = [f for f in expectation.value if f in ids]
            return ("held" if present_ids else "missed"), ", ".join(present_ids) or "none present"
        present = expectation.value in ids
        held = present if expectation.kind == "has" else not present
        return ("held" if held else "missed"), "present" if present else "absent"
    if expectation.kind == "faster":
        return _judge_faster(expectation.value, row, rows)
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


def _judge_faster(faster: Faster, row: Row, rows: list[Row]) -> tuple[str, str]:
    """The row's latency against that of `faster.variant` at its cell (with `faster.fields` changed)."""
    changed = dict(faster.fields)
    others = [r for r in rows if r.variant == faster.variant and _same_cell(r, row, changed)]
    if not others:
        at = "".join(f", {k}={v}" for k, v in faster.fields)
        return "missed", f"no {faster.variant} row at this cell{at}"
    other = next((r for r in others if r.status == "ok"), others[0])
    status = other.status
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), f"{faster.variant}: {status}"
    mine, theirs = _latency(row), _latency(other)
    if mine is None or theirs is None:
        return "missed", f"no latency: {fmt_number(mine)} against {faster.variant} {fmt_number(theirs)} us"
    ratio = theirs / mine
    held = ratio >= faster.by if faster.by is not None else ratio > 1
    return ("held" if held else "missed"), f"{ratio:.2f}x: {fmt_number(mine)} us against {fmt_number(theirs)} us"


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
            verdict, measured = _judge(expectation, row, rows)
            outcomes.append(Outcome(expectation, row, verdict, measured))
    return outcomes


def _cell(row: Row | None) -> str:
    return "" if row is None else cell_label(row)


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """How many expectations held, were missed, or were not run."""
    return {verdict: sum(1 for o in outcomes if o.verdict == verdict) for verdict in MARKS}


def check_table(outcomes: list[Outcome], fmt: str, width: int | None = None) -> str:
    """One line per expectation and row: ✓ held, ✗ missed, – not run; the expected value next to the
    measured one; then a summary line."""
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
    tally = ", ".join(f"{count} {verdict}" for verdict, count in counts(outcomes).items())
    heading = wrap(f"checked at {cells[0]}", width) + [""] if one_cell and cells else []
    return "\n".join([*heading, table(columns, body, fmt, width), "", *wrap(tally, width)])


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
            }
            for o in outcomes
        ],
        **counts(outcomes),
    }
