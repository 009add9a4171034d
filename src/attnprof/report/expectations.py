"""`attnprof check`: expectations declared per variant, checked against the rows of a compare.

The expectations file maps a variant name or glob pattern (`"*"`, `sdpa-*`) to the fields its rows
must show, each field of the results row (`report.serialize.ROW`):

    sdpa-flash: {kernels_per_forward: 1, memcpy_per_forward: 0, findings: {has: [single-fused-kernel]}}
    sdpa-math:  {pct_of_peak: {max: 2}}
    "*":        {status: ok}

A scalar must equal the measured value; `{min: A, max: B}` bounds it (either end may be left out);
`findings: {has: [...], lacks: [...], any: [...]}` names finding ids that must be present, absent, or
present at least one of. `faster_than: VARIANT` (or `{variant: VARIANT, by: X, FIELD: VALUE, ...}`)
wants the row's latency below that of VARIANT's row at the same cell, or at the cell with the given
fields changed (`mask: prefix:1`: the same shape with that mask), and by at least X times when `by` is
given. A pattern may map to a list of such mappings, and a mapping may start with `where: {FIELD:
VALUE or [VALUES]}`, which checks it only on the rows whose fields match (`where: {q_len: 1}`: the
decode cells). The one other top-level key, `config` (a path relative to the file, or a list of them),
names the configs `check` runs, one compare each, when it is given no results. Every row of a matching
variant is checked (all shapes and modes). A row that was skipped (this machine cannot run it) is `not
run`, not a miss, as is a comparison with a row that was skipped; a failed row is a miss; a pattern
that no row matches is a miss.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from attnprof.errors import ExpectationsError
from attnprof.report.formatting import fmt_number
from attnprof.report.layout import Column, limit, table, wrap
from attnprof.report.serialize import CSV_FIELDS, row_finding_ids
from attnprof.report.tables import cell_label

CONFIG_KEY = "config"
FINDINGS = "findings"
FASTER = "faster_than"
WHERE = "where"
VALID_FIELDS = tuple(name for name in CSV_FIELDS if name != FINDINGS)
#: The fields that make a cell (`RunSpec.cell_key`, `causal` being the mask's): what `faster_than` keeps or changes.
CELL_FIELDS = (
    *("device", "dtype", "batch", "heads", "kv_heads", "seq", "head_dim"),
    *("mode", "mask", "score_mod", "q_len", "kv_len"),
)
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
    """`findings: {has: [...], lacks: [...], any: [...]}`, each a finding id attnprof reports."""

    has: list[str] = []
    lacks: list[str] = []
    any: list[str] = []


Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Faster:
    """`faster_than`: the row's latency below that of `variant`'s row at the same cell with `fields` changed,
    by at least `by` times when given."""

    variant: str
    fields: tuple[tuple[str, Scalar], ...] = ()
    by: float | None = None

    @property
    def text(self) -> str:
        """`faster than sdpa at mask=prefix:1 by 1.5x`."""
        at = " at " + ", ".join(f"{k}={v}" for k, v in self.fields) if self.fields else ""
        return f"faster than {self.variant}{at}" + (f" by {self.by:g}x" if self.by is not None else "")


@dataclass(frozen=True)
class Expectation:
    """One expected fact: `kind` is `equals` (a scalar), `range` (a Range), `has` or `lacks` (a finding id),
    `any` (finding ids) or `faster` (a Faster); checked on the rows of `pattern` whose fields match `where`
    (field, the values it may take)."""

    pattern: str
    field: str
    kind: str
    value: Any
    where: tuple[tuple[str, tuple[Scalar, ...]], ...] = ()

    @property
    def expected_text(self) -> str:
        """`= 1`, `>= 30`, `<= 2`, `10 to 20`, `has single-fused-kernel`, `any of memory-bound, bandwidth-bound`,
        `faster than sdpa`."""
        if self.kind in ("has", "lacks"):
            return f"{self.kind} {self.value}"
        if self.kind == "any":
            return f"any of {', '.join(self.value)}"
        if self.kind == "faster":
            return str(self.value.text)
        if self.kind == "range":
            low, high = self.value.min, self.value.max
            if low is not None and high is not None:
                return f"{low:g} to {high:g}"
            return f">= {low:g}" if low is not None else f"<= {high:g}"
        return f"= {self.value}"


@dataclass(frozen=True)
class Expectations:
    """An expectations file: its expectations, in file order, and the configs it names (in order)."""

    path: Path
    items: list[Expectation]
    configs: tuple[Path, ...] = ()


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
        raise ExpectationsError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_expectations(data, path)


def parse_expectations(data: Any, path: Path) -> Expectations:
    """Validate the mapping of an expectations file (see the module docstring)."""
    if not isinstance(data, dict) or not data:
        raise ExpectationsError(f"{path}: expected a mapping of variant patterns to expectations")
    configs: tuple[Path, ...] = ()
    items: list[Expectation] = []
    for pattern, fields in data.items():
        if pattern == CONFIG_KEY and _config_paths(fields):
            configs = tuple(path.parent / name for name in _config_paths(fields))
            continue
        entries = fields if isinstance(fields, list) and fields else [fields]
        for k, entry in enumerate(entries):
            where = f"{pattern}" if len(entries) == 1 else f"{pattern}[{k}]"
            items += _parse_entry(str(pattern), where, entry, path)
    return Expectations(path, items, configs)


def _config_paths(value: Any) -> list[str]:
    """The config paths of a `config` value (a string or a list of strings), else []."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return []


def _parse_entry(pattern: str, label: str, fields: Any, path: Path) -> list[Expectation]:
    if not isinstance(fields, dict) or not fields or list(fields) == [WHERE]:
        raise ExpectationsError(f"{path}: {label}: expected a mapping of fields to expected values")
    where = _parse_where(fields.get(WHERE), f"{path}: {label}.{WHERE}") if WHERE in fields else ()
    items: list[Expectation] = []
    for name, value in fields.items():
        if name != WHERE:
            items += _parse_field(pattern, str(name), value, path, label)
    return [replace(item, where=where) for item in items]


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _parse_where(value: Any, at: str) -> tuple[tuple[str, tuple[Scalar, ...]], ...]:
    """`where: {field: value or [values]}` as (field, values) pairs; ExpectationsError otherwise."""
    if not isinstance(value, dict) or not value:
        raise ExpectationsError(f"{at}: expected a mapping of row fields to a value or a list of values")
    found = []
    for name, wanted in value.items():
        if name not in VALID_FIELDS:
            raise ExpectationsError(f"{at}.{name}: unknown field; valid fields: {', '.join(VALID_FIELDS)}")
        values = wanted if isinstance(wanted, list) and wanted else [wanted]
        if not all(_scalar(v) for v in values):
            raise ExpectationsError(f"{at}.{name}: expected a value or a list of values")
        found.append((str(name), tuple(values)))
    return tuple(found)


def _parse_faster(value: Any, where: str) -> Faster:
    """`faster_than: VARIANT` or `{variant: VARIANT, by: X, FIELD: VALUE, ...}`."""
    if isinstance(value, str) and value:
        return Faster(value)
    if not isinstance(value, dict) or not isinstance(value.get("variant"), str) or not value["variant"]:
        raise ExpectationsError(f"{where}: expected a variant name or {{variant: NAME, by: X, FIELD: VALUE}}")
    by = value.get("by")
    if by is not None and (isinstance(by, bool) or not isinstance(by, (int, float)) or by <= 0):
        raise ExpectationsError(f"{where}.by: expected a positive number (got {by!r})")
    fields = []
    for name, changed in value.items():
        if name in ("variant", "by"):
            continue
        if name not in CELL_FIELDS:
            raise ExpectationsError(f"{where}.{name}: not a field of the cell; cell fields: {', '.join(CELL_FIELDS)}")
        if not _scalar(changed):
            raise ExpectationsError(f"{where}.{name}: expected a value")
        fields.append((str(name), changed))
    return Faster(value["variant"], tuple(fields), None if by is None else float(by))


def _parse_field(pattern: str, name: str, value: Any, path: Path, label: str | None = None) -> list[Expectation]:
    from attnprof.analysis.findings import FINDING_IDS

    where = f"{path}: {label or pattern}.{name}"
    if name == FASTER:
        return [Expectation(pattern, name, "faster", _parse_faster(value, where))]
    try:
        if name == FINDINGS:
            rule = FindingsRule.model_validate(value)
            unknown = [f for f in rule.has + rule.lacks + rule.any if f not in FINDING_IDS]
            if unknown:
                raise ExpectationsError(
                    f"{where}: unknown finding {', '.join(unknown)}; known findings: {', '.join(FINDING_IDS)}"
                )
            return (
                [Expectation(pattern, name, "has", f) for f in rule.has]
                + [Expectation(pattern, name, "lacks", f) for f in rule.lacks]
                + ([Expectation(pattern, name, "any", tuple(rule.any))] if rule.any else [])
            )
        if name not in VALID_FIELDS:
            raise ExpectationsError(
                f"{where}: unknown field; valid fields: findings, {FASTER}, {WHERE}, {', '.join(VALID_FIELDS)}"
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


def _judge(expectation: Expectation, row: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[str, str]:
    """(verdict, measured text) of one expectation on one row (`rows`: all of them, for `faster_than`)."""
    status = str(row.get("status", ""))
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), status
    if expectation.kind in ("has", "lacks", "any"):
        ids = row_finding_ids(row)
        if expectation.kind == "any":
            present_ids = [f for f in expectation.value if f in ids]
            return ("held" if present_ids else "missed"), ", ".join(present_ids) or "none present"
        present = expectation.value in ids
        held = present if expectation.kind == "has" else not present
        return ("held" if held else "missed"), "present" if present else "absent"
    if expectation.kind == "faster":
        return _judge_faster(expectation.value, row, rows)
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


def _cell_value(row: dict[str, Any], name: str) -> Any:
    value = row.get(name)
    if name == "device":
        return str(value).split(":", 1)[0]
    if name in ("q_len", "kv_len") and value is None:
        return row.get("seq")  # rows written before decode existed
    if name == "mask" and value is None:
        return "causal" if row.get("causal") else "none"  # rows written before masks existed
    return value


def _same_cell(other: dict[str, Any], row: dict[str, Any], changed: dict[str, Scalar]) -> bool:
    """True when `other` is at `row`'s cell with the `changed` fields set to their values."""
    for name in CELL_FIELDS:
        wanted = changed[name] if name in changed else _cell_value(row, name)
        if not _same(_cell_value(other, name), wanted):
            return False
    return True


def _latency(row: dict[str, Any]) -> float | None:
    value = row.get("latency_us")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _judge_faster(faster: Faster, row: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[str, str]:
    """The row's latency against that of `faster.variant` at its cell (with `faster.fields` changed)."""
    changed = dict(faster.fields)
    others = [r for r in rows if r.get("variant") == faster.variant and _same_cell(r, row, changed)]
    if not others:
        at = "".join(f", {k}={v}" for k, v in faster.fields)
        return "missed", f"no {faster.variant} row at this cell{at}"
    other = next((r for r in others if r.get("status") == "ok"), others[0])
    status = str(other.get("status", ""))
    if status != "ok":
        return ("not run" if status.startswith("skipped") else "missed"), f"{faster.variant}: {status}"
    mine, theirs = _latency(row), _latency(other)
    if mine is None or theirs is None:
        return "missed", f"no latency: {fmt_number(mine)} against {faster.variant} {fmt_number(theirs)} us"
    ratio = theirs / mine
    held = ratio >= faster.by if faster.by is not None else ratio > 1
    return ("held" if held else "missed"), f"{ratio:.2f}x: {fmt_number(mine)} us against {fmt_number(theirs)} us"


def _matches(expectation: Expectation, row: dict[str, Any]) -> bool:
    if not fnmatch.fnmatchcase(str(row.get("variant", "")), expectation.pattern):
        return False
    return all(any(_same(row.get(name), v) for v in values) for name, values in expectation.where)


def _where_text(expectation: Expectation) -> str:
    return "; ".join(f"{name} {'in' if len(v) > 1 else '='} {', '.join(map(str, v))}" for name, v in expectation.where)


def check_rows(expectations: Expectations, rows: list[dict[str, Any]]) -> list[Outcome]:
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


def check_json(outcomes: list[Outcome], expectations: Path, results: str | list[str] | None) -> dict[str, Any]:
    """The outcomes as a JSON-ready document (`results`: the file checked, or the list of them)."""
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
                "where": {name: list(values) for name, values in o.expectation.where} or None,
                "expected": o.expectation.expected_text,
                "measured": o.measured,
            }
            for o in outcomes
        ],
        **counts(outcomes),
    }
