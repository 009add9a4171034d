"""The expectations file of `attnprof check`: its format, read and validated into `Expectation`s.

The expectations file maps a variant name or glob pattern (`"*"`, `sdpa-*`) to the fields its rows
must show, each a scalar field of the results row (`results.schema.Row`, a column of its CSV):

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

A field name is resolved against the row's schema when the file is loaded (an unknown one is an error naming
the nearest fields); checking reads it from each typed row by attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from attnprof.config import did_you_mean, yaml_problem
from attnprof.errors import ExpectationsError
from attnprof.results.schema import CELL_COLUMNS, MODEL_COLUMNS, Row

CONFIG_KEY = "config"
FINDINGS = "findings"
FASTER = "faster_than"
WHERE = "where"
#: The fields an expectation or a `where` may name: the row's scalar fields (the columns of a cell's or a model
#: row's CSV), in the schema's order; `findings` has its own rule.
VALID_FIELDS = tuple(
    name for name in Row.__struct_fields__ if name in {*CELL_COLUMNS, *MODEL_COLUMNS} and name != FINDINGS
)
#: The fields that make a cell (`RunSpec.cell_key`, `causal` being the mask's): what `faster_than` keeps or changes.
CELL_FIELDS = (
    *("device", "dtype", "batch", "heads", "kv_heads", "seq", "head_dim"),
    *("mode", "mask", "score_mod", "q_len", "kv_len"),
)
assert set(CELL_FIELDS) <= set(VALID_FIELDS), "a cell field is not a field of the row"


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
        field = _field(str(name), f"{at}.{name}", VALID_FIELDS)
        values = wanted if isinstance(wanted, list) and wanted else [wanted]
        if not all(_scalar(v) for v in values):
            raise ExpectationsError(f"{at}.{name}: expected a value or a list of values")
        found.append((field, tuple(values)))
    return tuple(found)


def _parse_faster(value: Any, where: str) -> Faster:
    """`faster_than: VARIANT` or `{variant: VARIANT, by: X, FIELD: VALUE, ...}`."""
    if isinstance(value, str) and value:
        return Faster(value)
    changes = dict(value) if isinstance(value, dict) else {}
    variant, by = changes.pop("variant", None), changes.pop("by", None)
    if not isinstance(variant, str) or not variant:
        raise ExpectationsError(f"{where}: expected a variant name or {{variant: NAME, by: X, FIELD: VALUE}}")
    if by is not None and (isinstance(by, bool) or not isinstance(by, (int, float)) or by <= 0):
        raise ExpectationsError(f"{where}.by: expected a positive number (got {by!r})")
    fields = []
    for name, changed in changes.items():
        if name not in CELL_FIELDS:
            raise ExpectationsError(f"{where}.{name}: not a field of the cell; cell fields: {', '.join(CELL_FIELDS)}")
        if not _scalar(changed):
            raise ExpectationsError(f"{where}.{name}: expected a value")
        fields.append((str(name), changed))
    return Faster(variant, tuple(fields), None if by is None else float(by))


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
                near = did_you_mean(unknown[0], FINDING_IDS) if len(unknown) == 1 else ""
                raise ExpectationsError(
                    f"{where}: unknown finding {', '.join(unknown)}{near}",
                    hint=f"attnprof findings lists all {len(FINDING_IDS)}",
                )
            return (
                [Expectation(pattern, name, "has", f) for f in rule.has]
                + [Expectation(pattern, name, "lacks", f) for f in rule.lacks]
                + ([Expectation(pattern, name, "any", tuple(rule.any))] if rule.any else [])
            )
        name = _field(name, where, (FINDINGS, FASTER, WHERE, *VALID_FIELDS))
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


def _field(name: str, at: str, choices: tuple[str, ...]) -> str:
    """`name`, a scalar field of the row (`VALID_FIELDS`); else a one-line ExpectationsError naming it and the
    nearest of `choices`."""
    if name in VALID_FIELDS:
        return name
    raise ExpectationsError(
        f"{at}: unknown field{did_you_mean(name, choices)}",
        hint=f"a field is {FINDINGS}, {FASTER}, {WHERE} or one of the {len(VALID_FIELDS)} scalar fields of a "
        "results row (the columns of its CSV)",
    )
