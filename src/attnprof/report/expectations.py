"""`attnprof check`: expectations declared per variant, checked against the rows of a compare.

The expectations file maps a variant name or glob pattern (`"*"`, `sdpa-*`) to the fields its rows
must show, each field of the results row (`report.serialize.ROW`):

    sdpa-flash: {kernels_per_forward: 1, memcpy_per_forward: 0, findings: {has: [single-fused-kernel]}}
    sdpa-math:  {pct_of_peak: {max: 2}}
    "*":        {status: ok}

A scalar must equal the measured value; `{min: A, max: B}` bounds it (either end may be left out);
`findings: {has: [...], lacks: [...]}` names finding ids that must be present or absent. The one
other top-level key, `config` (a path, relative to the file), names the config `check` runs when it
is given no results. Every row of a matching variant is checked (all shapes and modes). A row that was
skipped (this machine cannot run it) is `not run`, not a miss; a failed row is a miss; a pattern
that no row matches is a miss.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from attnprof.config import did_you_mean, yaml_problem
from attnprof.errors import ExpectationsError
from attnprof.report.formatting import fmt_number
from attnprof.report.layout import Column, limit, table, wrap
from attnprof.report.serialize import CSV_FIELDS, row_finding_ids
from attnprof.report.tables import cell_label

CONFIG_KEY = "config"
FINDINGS = "findings"
VALID_FIELDS = tuple(name for name in CSV_FIELDS if name != FINDINGS)
MARKS = {"held": "✓", "missed": "✗", "not run": "–"}

COLUMNS = (
    Column(""),
    Column("variant", narrow=14),
    Column("cell", narrow=16),
    Column("field", narrow=12),
    Column("expected", narrow=12),
    Column("measured", narrow=16, wide=60),
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Range(_Strict):
    """`{min: A, max: B}`: the measured value must lie between them (an end left out is open)."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _sensible(self) -> Range:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        return self


class FindingsRule(_Strict):
    """`findings: {has: [...], lacks: [...]}`, each a finding id attnprof reports."""

    has: list[str] = []
    lacks: list[str] = []


@dataclass(frozen=True)
class Expectation:
    """One expected fact: `kind` is `equals` (a scalar), `range` (a Range), `has` or `lacks` (a finding id)."""

    pattern: str
    field: str
    kind: str
    value: Any

    @property
    def expected_text(self) -> str:
        """`= 1`, `>= 30`, `<= 2`, `10 to 20`, `has single-fused-kernel`."""
        if self.kind in ("has", "lacks"):
            return f"{self.kind} {self.value}"
        if self.kind == "range":
            low, high = self.value.min, self.value.max
            if low is not None and high is not None:
                return f"{low:g} to {high:g}"
            return f">= {low:g}" if low is not None else f"<= {high:g}"
        return f"= {self.value}"


@dataclass(frozen=True)
class Expectations:
    """An expectations file: its expectations, in file order, and the config it names (or None)."""

    path: Path
    items: list[Expectation]
    config: Path | None = None


@dataclass(frozen=True)
class Outcome:
    """One expectation checked against one row (None: no row matched its pattern)."""

    expectation: Expectation
    row: dict[str, Any] | None
    verdict: str  # held, missed or not run
    measured: str


def load_expectations(path: Path) -> Expectations:
    """Read and validate an expectations YAML file; ExpectationsError (exit 2) with the key path."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExpectationsError(f"expectations file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"cannot read expectations {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ExpectationsError(f"{path}: not valid YAML{yaml_problem(exc)}") from None
    return parse_expectations(data, path)


def parse_expectations(data: Any, path: Path) -> Expectations:
    """Validate the mapping of an expectations file (see the module docstring)."""
    if not isinstance(data, dict) or not data:
        raise ExpectationsError(f"{path}: expected a mapping of variant patterns to expectations")
    config = None
    items: list[Expectation] = []
    for pattern, fields in data.items():
        if pattern == CONFIG_KEY and isinstance(fields, str):
            config = path.parent / fields
            continue
        if not isinstance(fields, dict) or not fields:
            raise ExpectationsError(f"{path}: {pattern}: expected a mapping of fields to expected values")
        for name, value in fields.items():
            items += _parse_field(str(pattern), str(name), value, path)
    return Expectations(path, items, config)


def _parse_field(pattern: str, name: str, value: Any, path: Path) -> list[Expectation]:
    from attnprof.analysis.findings import FINDING_IDS

    where = f"{path}: {pattern}.{name}"
    try:
        if name == FINDINGS:
            rule = FindingsRule.model_validate(value)
            unknown = [f for f in rule.has + rule.lacks if f not in FINDING_IDS]
            if unknown:
                near = did_you_mean(unknown[0], FINDING_IDS) if len(unknown) == 1 else ""
                raise ExpectationsError(
                    f"{where}: unknown finding {', '.join(unknown)}{near}",
                    hint=f"attnprof findings lists all {len(FINDING_IDS)}",
                )
            return [Expectation(pattern, name, "has", f) for f in rule.has] + [
                Expectation(pattern, name, "lacks", f) for f in rule.lacks
            ]
        if name not in VALID_FIELDS:
            raise ExpectationsError(
                f"{where}: unknown field{did_you_mean(name, (FINDINGS, *VALID_FIELDS))}",
                hint=f"a field is findings or one of the {len(VALID_FIELDS)} columns of a results.csv",
            )
        if isinstance(value, dict):
            return [Expectation(pattern, name, "range", Range.model_validate(value))]
    except ValidationError as exc:
        problem = exc.errors()[0]
        at = ".".join(str(part) for part in problem["loc"])
        message = "unknown key" if problem["type"] == "extra_forbidden" else problem["msg"]
        raise ExpectationsError(f"{where}{'.' + at if at else ''}: {message.removeprefix('Value error, ')}") from None
    if value is None or isinstance(value, (list, dict)):
        raise ExpectationsError(f"{where}: expected a number, a string, true/false or {{min, max}}")
    return [Expectation(pattern, name, "equals", value)]


def _same(measured: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(measured, bool):
        return measured is expected
    if isinstance(expected, (int, float)) and isinstance(measured, (int, float)):
        return float(measured) == float(expected)
    return measured == expected


def _judge(expectation: Expectation, row: dict[str, Any]) -> tuple[str, str]:
    """(verdict, measured text) of one expectation on one row."""
    status = str(row.get("status", ""))
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), status
    if expectation.kind in ("has", "lacks"):
        ids = row_finding_ids(row)
        present = expectation.value in ids
        held = present if expectation.kind == "has" else not present
        return ("held" if held else "missed"), "present" if present else "absent"
    measured = row.get(expectation.field)
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


def check_rows(expectations: Expectations, rows: list[dict[str, Any]]) -> list[Outcome]:
    """Every expectation against every row of each variant its pattern matches, in file order."""
    outcomes = []
    for expectation in expectations.items:
        matching = [row for row in rows if fnmatch.fnmatchcase(str(row.get("variant", "")), expectation.pattern)]
        if not matching:
            outcomes.append(Outcome(expectation, None, "missed", "no row of this variant in the results"))
        for row in matching:
            verdict, measured = _judge(expectation, row)
            outcomes.append(Outcome(expectation, row, verdict, measured))
    return outcomes


def _cell(row: dict[str, Any] | None) -> str:
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
            o.row.get("variant", "") if o.row else o.expectation.pattern,
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


def check_json(outcomes: list[Outcome], expectations: Path, results: str | None) -> dict[str, Any]:
    """The outcomes as a JSON-ready document."""
    return {
        "expectations": str(expectations),
        "results": results,
        "checks": [
            {
                "verdict": o.verdict,
                "pattern": o.expectation.pattern,
                "variant": o.row.get("variant") if o.row else None,
                "cell": _cell(o.row) or None,
                "field": o.expectation.field,
                "expected": o.expectation.expected_text,
                "measured": o.measured,
            }
            for o in outcomes
        ],
        **counts(outcomes),
    }
