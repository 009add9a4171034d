"""`attnprof sweep`'s terminal output: one pivot table per point of the other axes, variants down and the
swept length (seq, else kv_len or q_len, else the first field that varies) across, then each finding
once per variant. Formatting only.

A cell reads `1,343 (3.23x)`: the median latency in µs and the speed-up against the baseline at that
point (`~3.2x?` when unreliable, see `tables.UNRELIABLE`). Without a latency in the group (`--no-timing`)
the cell holds the time the speed-up is computed from instead, GPU µs, else CPU µs, and the title says
which. A row that did not run shows its status word; the reasons follow as bullets. A variant whose every row in
a table was skipped for its dtype (a dtype sweep's bf16 variants in the fp8 table) is left out of that table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnprof.report.columns import speedup_text
from attnprof.report.contended import marked
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.report.ranking import INFO, impact_text, rank_key, ranked, row_findings, severity
from attnprof.report.tables import legends, variant_label
from attnprof.results.parts import FindingRecord
from attnprof.results.schema import Row

#: The fields a sweep varies, in the order a group's title names them.
AXIS_FIELDS = (
    "batch",
    "heads",
    "kv_heads",
    "seq",
    "q_len",
    "kv_len",
    "head_dim",
    "mask",
    "score_mod",
    "dtype",
    "causal",
    "mode",
    "device",
)
#: The column axis, in order of preference: the first of these that varies.
PIVOT_FIELDS = ("seq", "kv_len", "q_len")
LENGTHS = ("seq", "q_len", "kv_len")
#: What a speed-up's time is, by its `results.SPEED_KEYS` name, for a title (`{unit}`: forward or step).
BASIS_WORDS = {"latency_us": "latency µs", "gpu_time_us": "GPU µs per {unit}", "cpu_time_us": "CPU µs per {unit}"}
SPEED_KEYS = tuple(BASIS_WORDS)


def basis_words(key: str, rows: list[Row]) -> str:
    """`latency µs`, `GPU µs per forward`, `CPU µs per step` (a backward mode among the rows: per step)."""
    unit = "forward" if all((row.mode or "fwd") == "fwd" for row in rows) else "step"
    return BASIS_WORDS[key].format(unit=unit)


def axis(row: Row, name: str) -> Any:
    """The row's value of the field `name` (one of `AXIS_FIELDS` or `SPEED_KEYS`)."""
    return getattr(row, name)


def pivot_field(rows: list[Row]) -> str | None:
    """The field the sweep's table runs across: seq, kv_len or q_len when it varies, else the first
    of `AXIS_FIELDS` that varies; None when every row is at one point."""
    varying = [f for f in AXIS_FIELDS if len({_hashable(axis(row, f)) for row in rows}) > 1]
    return next((f for f in PIVOT_FIELDS if f in varying), varying[0] if varying else None)


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, (dict, list)) else value


def _group_key(row: Row, pivot: str) -> tuple[Any, ...]:
    """The row's point on every axis but the pivot; a length equal to the pivot's moves with it."""
    key = []
    for name in AXIS_FIELDS:
        value = axis(row, name)
        if name == pivot or (pivot in LENGTHS and name in LENGTHS and value == axis(row, pivot)):
            value = "="
        key.append(_hashable(value))
    return tuple(key)


def _axis_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return fmt_count(value) if isinstance(value, (int, float)) else str(value)


def group_title(row: Row, pivot: str) -> str:
    """`batch 1, heads 4, head_dim 32, fp32 causal fwd on cpu`: the row's point on every axis but the pivot."""
    parts = []
    for name in ("batch", "heads", "kv_heads", "head_dim", "seq", "q_len", "kv_len", "mask", "score_mod"):
        value = axis(row, name)
        if value is None or name == pivot or (pivot in LENGTHS and name in LENGTHS and value == axis(row, pivot)):
            continue
        if (name == "kv_heads" and value == row.heads) or (name == "mask" and value in ("causal", "none")):
            continue
        if name in ("q_len", "kv_len") and value == row.seq and pivot != "seq":
            continue
        parts.append(f"{name} {value}")
    masking = "causal" if row.causal else "full"
    words = [str(axis(row, name) or "") for name in ("dtype", "mode") if name != pivot]
    words.insert(1, "" if pivot == "causal" else masking)
    where = "" if pivot == "device" else f" on {row.device}"
    return ", ".join(parts + [" ".join(w for w in words if w)]) + where


def speed_basis(rows: list[Row]) -> str:
    """The time the rows are compared by, as speed-ups are: latency when any ok row has one, else GPU
    time, else CPU time (a `SPEED_KEYS` name)."""
    ok = [row for row in rows if row.status == "ok"]
    return next((key for key in SPEED_KEYS if any(axis(row, key) is not None for row in ok)), "latency_us")


def _cell(row: Row | None, basis: str) -> str:
    if row is None:
        return ""
    if row.status != "ok":
        return row.status.partition(":")[0]
    value = axis(row, basis)
    if value is None:
        return "n/a"
    speedup = speedup_text(row)
    text = fmt_number(value) + ("" if speedup == "n/a" else f" ({speedup})")
    return marked(row, text) if basis == "latency_us" else text


def _problem_ids(rows: list[Row]) -> str:
    ids = {f.id: None for row in rows for f in ranked(row_findings(row)) if severity(f) != INFO}
    return " ".join(ids)


def sweep_groups(rows: list[Row]) -> tuple[str | None, list[list[Row]]]:
    """The pivot field and the rows of each point of the other axes, in file order."""
    pivot = pivot_field(rows)
    if pivot is None:
        return None, [rows] if rows else []
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(_group_key(row, pivot), []).append(row)
    return pivot, list(groups.values())


def pivot_cells(group: list[Row], pivot: str) -> tuple[list[str], list[list[str]]]:
    """The headers and cells of one pivot table: variants down, the pivot's values across (ascending),
    then each variant's problem finding ids."""
    values = sorted(dict.fromkeys(_hashable(axis(row, pivot)) for row in group), key=_sort_key)
    basis = speed_basis(group)
    body = []
    for variant in dict.fromkeys(variant_label(row, group) for row in group):
        mine = [row for row in group if variant_label(row, group) == variant]
        if all(other_dtype(row) for row in mine) and not all(other_dtype(row) for row in group):
            continue  # a variant of another dtype (a dtype sweep's bf16 ones in its fp8 table): the bullets say so
        at = {_hashable(axis(row, pivot)): row for row in mine}
        body.append([variant] + [_cell(at.get(v), basis) for v in values] + [_problem_ids(mine)])
    label = pivot.replace("_", " ")
    return ["variant"] + [f"{label} {_axis_text(v)}" for v in values] + ["findings"], body


def other_dtype(row: Row) -> bool:
    """True for a row skipped because its variant runs other dtypes (`needs dtype ...`)."""
    return row.status.startswith("skipped: needs dtype ")


def pivot_table(group: list[Row], pivot: str, fmt: str, width: int | None) -> str:
    """One pivot table (`pivot_cells`) in the terminal's style."""
    headers, body = pivot_cells(group, pivot)
    columns = (
        [Column(headers[0], narrow=16)]
        + [Column(header, narrow=9) for header in headers[1:-1]]
        + [Column(headers[-1], narrow=20, wide=40)]
    )
    return table(columns, body, fmt, width)


def pivot_title(group: list[Row], pivot: str, baseline: str | None) -> str:
    """`batch 1, heads 4, head_dim 32, fp32 causal fwd on cpu: latency µs (speed-up vs sdpa-math) by seq`."""
    versus = f" (speed-up vs {baseline})" if baseline else ""
    basis = basis_words(speed_basis(group), group)
    return f"{group_title(group[0], pivot)}: {basis}{versus} by {pivot.replace('_', ' ')}"


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _point(row: Row) -> str:
    mode = row.mode or "fwd"
    return str(row.shape) + ("" if mode == "fwd" else f" {mode}")


def finding_bullets(rows: list[Row], width: int | None) -> list[str]:
    """Each finding once per variant, largest impact first: where it fired (every point, or which) and
    its message where it costs most (that point named when the messages differ). Fitted (`width` set),
    info findings are only named; `--wide` and markdown give them in full."""
    lines: list[str] = []
    info: dict[str, list[str]] = {}
    for entry in fired_once(rows):
        if width is not None and entry.severity == INFO:
            info.setdefault(entry.finding_id, []).append(entry.variant)
            continue
        cost = impact_text(entry.top)
        text = f"{entry.variant} [{entry.finding_id}] {entry.where}" + (f"; up to {cost}" if cost else "")
        same = len({f.message for f, _row in entry.hits}) == 1
        lines.append(text + f": {entry.top.message}" + ("" if same else f" (at {_point(entry.top_row)})"))
    out = [bullets(lines, width)] if lines else []
    if info:
        named = ", ".join(f"{i} ({v[0] if len(v) == 1 else f'{len(v)} variants'})" for i, v in info.items())
        out += wrap(f"info, facts with nothing to fix (--wide, the JSON and the report give them): {named}", width)
    return out


@dataclass
class Fired:
    """One finding of one variant over all its rows: each (finding, row) it fired in, and the top one."""

    variant: str
    finding_id: str
    hits: list[tuple[FindingRecord, Row]]
    ok_rows: int  # the variant's rows that ran

    @property
    def top(self) -> FindingRecord:
        return min((f for f, _row in self.hits), key=rank_key)

    @property
    def top_row(self) -> Row:
        return min(self.hits, key=lambda hit: rank_key(hit[0]))[1]

    @property
    def severity(self) -> str:
        return severity(self.top)

    @property
    def where(self) -> str:
        """`at every point (6)` or `at 1x4x128x64, 1x4x256x64`."""
        if len(self.hits) == self.ok_rows and self.ok_rows > 1:
            return f"at every point ({self.ok_rows})"
        return f"at {_listed([_point(row) for _f, row in self.hits])}"


def fired_once(rows: list[Row]) -> list[Fired]:
    """Every (variant, finding id) that fired, in rank order of its costliest hit."""
    fired: dict[tuple[str, str], Fired] = {}
    ran: dict[str, int] = {}
    for row in rows:
        ran[row.variant] = ran.get(row.variant, 0) + (row.status == "ok")
        for finding in row_findings(row):
            key = (row.variant, finding.id)
            fired.setdefault(key, Fired(row.variant, finding.id, [], 0)).hits.append((finding, row))
    for entry in fired.values():
        entry.ok_rows = ran[entry.variant]
    return sorted(fired.values(), key=lambda entry: rank_key(entry.top))


def _listed(names: list[str], limit_to: int = 4) -> str:
    more = f" and {len(names) - limit_to} more" if len(names) > limit_to else ""
    return ", ".join(names[:limit_to]) + more


def reason_lines(rows: list[Row], width: int | None) -> list[str]:
    """One bullet per distinct reason a row did not run, naming each variant's points."""
    grouped: dict[str, dict[str, list[str]]] = {}
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.variant] = counts.get(row.variant, 0) + 1
        if row.status != "ok":
            grouped.setdefault(row.status, {}).setdefault(row.variant, []).append(_point(row))
    items = []
    for status, variants in grouped.items():
        named = [
            f"{v} (every point)" if len(points) == counts[v] else f"{v} ({_listed(points)})"
            for v, points in variants.items()
        ]
        items.append(f"{'; '.join(named)}: {status}")
    return [bullets(items, width)] if items else []


def sweep_report(rows: list[Row], fmt: str, baseline: str | None, width: int | None = None) -> str:
    """`attnprof sweep`: a pivot table per point of the other axes, the reasons rows did not run, and
    each finding once. Rows at a single point get `compare`'s table."""
    from attnprof.report.tables import compare_report

    width = limit(width, fmt)
    pivot, groups = sweep_groups(rows)
    if pivot is None:
        return compare_report(rows, fmt, baseline, width)
    heading = "###" if fmt == "markdown" else "=="
    parts: list[str] = []
    for group in groups:
        title = f"{heading} {pivot_title(group, pivot, baseline)}"
        parts += ["", *wrap(title, width), "", pivot_table(group, pivot, fmt, width)]
    notes = reason_lines(rows, width)
    marks = legends(rows, width)
    if marks:
        notes += ([""] if notes else []) + marks
    found = finding_bullets(rows, width)
    if notes:
        parts += ["", *notes]
    if found:
        parts += ["", f"{heading} findings, each once per variant", "", *found]
    return "\n".join(parts)
