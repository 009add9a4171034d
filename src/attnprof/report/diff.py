"""`attnprof diff`: two results files side by side, row by row, and the verdicts a CI gate acts on.

Rows match by variant, shape (batch, heads, seq, head_dim and kv heads), dtype, causal masking and
mode. A matched row is a regression when the new one:

- got slower: new − base latency is above `threshold` × base *and* above the two runs' measured
  spread, the mean of their IQRs ((IQR_base + IQR_new) / 2), so noise is not called a regression;
- started failing: its status is `failed` and the base's was not;
- gained a finding: an id in the new row's findings that the base row (also analysed) lacks.

Faster rows, fixed rows, lost findings, kernel-count and memory changes are shown, never gated on.
Pure functions on rows read back by `report.results_file`; formatting at the end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from attnprof.errors import UsageError
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.report.serialize import row_finding_ids
from attnprof.report.tables import cell_label

MATCH_FIELDS = ("variant", "shape", "dtype", "causal", "mode")
THRESHOLD_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*$")

COLUMNS = (
    Column("variant", narrow=14),
    Column("cell", narrow=16),
    Column("base µs", drop=3),
    Column("new µs", drop=4),
    Column("Δ"),
    Column("kernels/fwd", drop=2),
    Column("peak MiB", drop=1),
    Column("findings", narrow=16, wide=40),
    Column("verdict", narrow=14, wide=40),
)


def parse_threshold(text: str) -> float:
    """`5%` or `0.05` as the fraction 0.05; UsageError (exit 2) for anything else or a negative value."""
    found = THRESHOLD_PATTERN.match(text)
    if not found:
        raise UsageError(f"--threshold {text!r}: give a percentage such as 5% or a fraction such as 0.05")
    value = float(found.group(1))
    return value / 100 if found.group(2) else value


def match_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a row is matched by (`MATCH_FIELDS`); a row without a mode is `fwd`."""
    return tuple((row.get(name) or "fwd") if name == "mode" else row.get(name) for name in MATCH_FIELDS)


def _failing(row: dict[str, Any]) -> bool:
    return str(row.get("status", "")).startswith("failed")


def _analysed(row: dict[str, Any]) -> bool:
    return row.get("forwards") is not None


@dataclass
class RowDiff:
    """One matched pair of rows and what changed between them."""

    base: dict[str, Any]
    new: dict[str, Any]
    threshold: float
    change: float | None = None  # (new − base) / base latency, when both were timed
    slower: bool = False
    faster: bool = False
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @property
    def started_failing(self) -> bool:
        """The new row failed and the base row did not."""
        return _failing(self.new) and not _failing(self.base)

    @property
    def fixed(self) -> bool:
        """The base row failed and the new one did not."""
        return _failing(self.base) and not _failing(self.new)

    @property
    def regressions(self) -> list[str]:
        """What makes this pair a regression, one phrase each; empty when it is none."""
        found = []
        if self.slower and self.change is not None:
            found.append(f"slower by {self.change:.1%}")
        if self.started_failing:
            found.append(f"started failing: {self.new.get('reason') or self.new.get('status')}")
        found += [f"gained {finding}" for finding in self.gained]
        return found

    @property
    def verdict(self) -> str:
        """The regressions, else `faster`, `fixed`, `still failing`, `now skipped`, or `ok`."""
        if self.regressions:
            return "; ".join(self.regressions)
        if self.fixed:
            return "fixed"
        if _failing(self.new):
            return "still failing"
        if str(self.new.get("status", "")).startswith("skipped"):
            return "skipped" if str(self.base.get("status", "")).startswith("skipped") else "now skipped"
        return f"faster by {-self.change:.1%}" if self.faster and self.change is not None else "ok"


@dataclass
class Diff:
    """Every matched pair, in the new file's order, and the rows only one side has."""

    rows: list[RowDiff]
    only_base: list[dict[str, Any]]
    only_new: list[dict[str, Any]]
    threshold: float

    @property
    def regressions(self) -> list[RowDiff]:
        """The pairs that are regressions."""
        return [row for row in self.rows if row.regressions]


def compare_rows(base: dict[str, Any], new: dict[str, Any], threshold: float) -> RowDiff:
    """The change from `base` to `new` (two rows of one cell), judged against `threshold` and the spread."""
    diff = RowDiff(base, new, threshold)
    before, after = base.get("latency_us"), new.get("latency_us")
    if before and after is not None and not _failing(base) and not _failing(new):
        delta = after - before
        spread = ((base.get("latency_iqr_us") or 0.0) + (new.get("latency_iqr_us") or 0.0)) / 2
        diff.change = delta / before
        diff.slower = delta > threshold * before and delta > spread
        diff.faster = -delta > threshold * before and -delta > spread
    if _analysed(base) and _analysed(new):
        was, now = row_finding_ids(base), row_finding_ids(new)
        diff.gained = [f for f in now if f not in was]
        diff.lost = [f for f in was if f not in now]
    return diff


def diff_results(base_rows: list[dict[str, Any]], new_rows: list[dict[str, Any]], threshold: float) -> Diff:
    """Match the rows of two results files (`MATCH_FIELDS`; the last of repeated keys counts) and
    compare each pair."""
    base = {match_key(row): row for row in base_rows}
    new = {match_key(row): row for row in new_rows}
    pairs = [compare_rows(base[key], row, threshold) for key, row in new.items() if key in base]
    return Diff(
        pairs,
        [row for key, row in base.items() if key not in new],
        [row for key, row in new.items() if key not in base],
        threshold,
    )


def _latency(row: dict[str, Any]) -> str:
    if _failing(row) or str(row.get("status", "")).startswith("skipped"):
        return str(row.get("status", "")).partition(":")[0]
    if row.get("latency_us") is None:
        return "n/a"
    return f"{fmt_number(row['latency_us'])} ± {fmt_number(row.get('latency_iqr_us'))}"


def _arrow(before: Any, after: Any, show: Any = fmt_number) -> str:
    if before == after:
        return show(after)
    return f"{show(before)} → {show(after)}"


def _findings(pair: RowDiff) -> str:
    changes = [f"+{f}" for f in pair.gained] + [f"-{f}" for f in pair.lost]
    return " ".join(changes) if changes else "same" if _analysed(pair.base) and _analysed(pair.new) else ""


def diff_table(diff: Diff, fmt: str, width: int | None = None) -> str:
    """One line per matched pair, then the rows only one side has, then the summary."""
    width = limit(width, fmt)
    body = [
        [
            pair.new.get("variant", ""),
            cell_label(pair.new),
            _latency(pair.base),
            _latency(pair.new),
            "n/a" if pair.change is None else f"{pair.change:+.1%}",
            _arrow(pair.base.get("kernels_per_forward"), pair.new.get("kernels_per_forward"), fmt_count),
            _arrow(pair.base.get("peak_memory_mib"), pair.new.get("peak_memory_mib")),
            _findings(pair),
            pair.verdict,
        ]
        for pair in diff.rows
    ]
    parts = [table(COLUMNS, body, fmt, width)]
    unmatched = [f"only in BASE: {row.get('variant')} @ {cell_label(row)}" for row in diff.only_base]
    unmatched += [f"only in NEW: {row.get('variant')} @ {cell_label(row)}" for row in diff.only_new]
    if unmatched:
        parts += ["", bullets(unmatched, width)]
    parts += ["", *wrap(summary(diff), width)]
    return "\n".join(parts)


def summary(diff: Diff) -> str:
    """One line: how many rows matched and how many are regressions, of which kind."""
    regressions = diff.regressions
    kinds = {
        "slower": sum(1 for r in regressions if r.slower),
        "started failing": sum(1 for r in regressions if r.started_failing),
        "gained a finding": sum(1 for r in regressions if r.gained),
    }
    detail = ", ".join(f"{count} {kind}" for kind, count in kinds.items() if count)
    rule = f"threshold {diff.threshold:.1%} and the runs' spread"
    if not regressions:
        return f"{len(diff.rows)} row(s) matched: no regression ({rule})"
    return f"{len(diff.rows)} row(s) matched: {len(regressions)} regression(s): {detail} ({rule})"


def diff_json(diff: Diff, base_path: str, new_path: str) -> dict[str, Any]:
    """The diff as a JSON-ready document."""
    return {
        "base": base_path,
        "new": new_path,
        "threshold": diff.threshold,
        "rows": [
            {
                **{name: pair.new.get(name) for name in MATCH_FIELDS},
                "base_status": pair.base.get("status"),
                "new_status": pair.new.get("status"),
                "base_latency_us": pair.base.get("latency_us"),
                "new_latency_us": pair.new.get("latency_us"),
                "base_latency_iqr_us": pair.base.get("latency_iqr_us"),
                "new_latency_iqr_us": pair.new.get("latency_iqr_us"),
                "latency_change": pair.change,
                "base_kernels_per_forward": pair.base.get("kernels_per_forward"),
                "new_kernels_per_forward": pair.new.get("kernels_per_forward"),
                "base_peak_memory_mib": pair.base.get("peak_memory_mib"),
                "new_peak_memory_mib": pair.new.get("peak_memory_mib"),
                "findings_gained": pair.gained,
                "findings_lost": pair.lost,
                "regressions": pair.regressions,
                "verdict": pair.verdict,
            }
            for pair in diff.rows
        ],
        "only_in_base": [{name: row.get(name) for name in MATCH_FIELDS} for row in diff.only_base],
        "only_in_new": [{name: row.get(name) for name in MATCH_FIELDS} for row in diff.only_new],
        "regressions": len(diff.regressions),
        "summary": summary(diff),
    }
