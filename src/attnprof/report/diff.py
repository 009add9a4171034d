"""`attnprof diff`: two results files side by side, row by row, and the verdicts a CI gate acts on.

Rows match by variant, shape (batch, heads, seq, head_dim and kv heads), dtype, causal masking and
mode. A matched row is a regression when the new one:

- got slower beyond the noise between two runs: its median latency by more than `threshold` × base and by
  more than the device kind's noise floor (`NOISE_FLOOR`: identical runs on a shared CPU differ by up to
  half), the slowdown more than both runs' IQRs together, and its fastest call slower by more than the
  larger of the two as well (a real slowdown slows every call; other work on the machine slows some);
- started failing: its status is `failed` and the base's was not;
- gained a problem: a finding of severity `problem` in the new row's findings that the base row (also
  analysed) lacks. A gained `info` finding (a fact, nothing to fix) is shown, never gated on.

A latency change beyond `threshold` that the rest does not bear out is `within noise`, with the reason. A
pair is `not judged` on its latency (`report.judged`) when either row was timed while other processes took
more than `CONTENTION_LIMIT` (a quarter) of the machine's CPU (`cpu_contention`), whatever the change, or when
both rows' timings are unstable and a slowdown beyond `threshold` is not borne out. The diff's outcome
(`Diff.outcome`): `regressed` when a pair is a regression, else `not judged` when a pair's latency was not
judged, else `no regression`. Faster rows, fixed rows, lost findings, kernel-count and memory changes are
shown, never gated on.
Pure functions on typed rows (`results.schema.Row`, as `results.files.load_results` reads them); formatting
at the end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from attnprof.errors import UsageError
from attnprof.profiling.contention import CONTENTION_LIMIT
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.judged import CONTENTION, UNSTABLE, UNSTABLE_TEXT, both_unstable, contention
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.results.keys import cell_label
from attnprof.results.schema import Row

MATCH_FIELDS = ("variant", "shape", "dtype", "causal", "mode")
#: The least latency change, as a fraction of the base, that two runs of a device kind tell from noise:
#: back-to-back identical default compares on the 2-core development CPU differed by up to 49.9%.
NOISE_FLOOR = {"cpu": 0.5, "cuda": 0.0}
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


def parse_threshold(text: str, option: str = "--threshold") -> float:
    """`5%` or `0.05` as the fraction 0.05; UsageError (exit 2, naming `option`) for anything else or a
    negative value."""
    found = THRESHOLD_PATTERN.match(text)
    if not found:
        raise UsageError(f"{option} {text!r}: give a percentage such as 5% or a fraction such as 0.05")
    value = float(found.group(1))
    return value / 100 if found.group(2) else value


def _identity(row: Row) -> tuple[Any, ...]:
    """The row's `MATCH_FIELDS`, in order, as the row holds them."""
    return (row.variant, row.shape, row.dtype, row.causal, row.mode)


def match_key(row: Row) -> tuple[Any, ...]:
    """What a row is matched by (`MATCH_FIELDS`); a row without a mode is `fwd`."""
    variant, shape, dtype, causal, mode = _identity(row)
    return (variant, shape, dtype, causal, mode or "fwd")


def _identity_json(row: Row) -> dict[str, Any]:
    return dict(zip(MATCH_FIELDS, _identity(row), strict=True))


def _failing(row: Row) -> bool:
    return row.status.startswith("failed")


def _skipped(row: Row) -> bool:
    return row.status.startswith("skipped")


def _analysed(row: Row) -> bool:
    return row.forwards is not None


def device_kind(row: Row) -> str:
    """`cpu` or `cuda` (any `cuda:N`), from the row's device; `cpu` when it names none."""
    return (row.device or "cpu").split(":", 1)[0]


def noise_floor(base: Row, new: Row, override: float | None = None) -> float:
    """`override`, else the larger `NOISE_FLOOR` of the two rows' device kinds (0 for a kind not listed)."""
    if override is not None:
        return override
    return max(NOISE_FLOOR.get(device_kind(row), 0.0) for row in (base, new))


@dataclass
class RowDiff:
    """One matched pair of rows and what changed between them. `noise` says why a latency change beyond
    the threshold was not taken as one (None: it was, or there was none)."""

    base: Row
    new: Row
    threshold: float
    floor: float = 0.0
    change: float | None = None  # (new − base) / base latency, when both were timed
    slower: bool = False
    faster: bool = False
    noise: str | None = None
    unjudged_by: str | None = None  # not judged: `judged.CONTENTION` or `judged.UNSTABLE`
    gained: list[str] = field(default_factory=list)  # problem findings the new row gained: gated on
    gained_info: list[str] = field(default_factory=list)  # info findings it gained: shown only
    lost: list[str] = field(default_factory=list)

    @property
    def not_judged(self) -> bool:
        """The latencies were not judged (`report.judged`): a row was timed while other processes held the
        CPU, or both timings are unstable and a slowdown is not borne out."""
        return self.unjudged_by is not None

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
            found.append(f"started failing: {self.new.reason or self.new.status}")
        found += [f"gained {finding}" for finding in self.gained]
        return found

    @property
    def verdict(self) -> str:
        """The regressions, else `faster`, `fixed`, `still failing`, `now skipped`, the noise (`within
        noise: ...`, `not judged: ...`), or `ok`."""
        if self.regressions:
            return "; ".join(self.regressions + ([self.noise] if self.noise else []))
        if self.fixed:
            return "fixed"
        if _failing(self.new):
            return "still failing"
        if _skipped(self.new):
            return "skipped" if _skipped(self.base) else "now skipped"
        if self.faster and self.change is not None:
            return f"faster by {-self.change:.1%}"
        return self.noise or "ok"


@dataclass
class Diff:
    """Every matched pair, in the new file's order, and the rows only one side has."""

    rows: list[RowDiff]
    only_base: list[Row]
    only_new: list[Row]
    threshold: float
    floor_override: float | None = None

    @property
    def regressions(self) -> list[RowDiff]:
        """The pairs that are regressions."""
        return [row for row in self.rows if row.regressions]

    @property
    def unjudged(self) -> list[RowDiff]:
        """The pairs whose latency was not judged and that are no regression otherwise: what could hide one."""
        return [row for row in self.rows if row.not_judged and not row.regressions]

    @property
    def outcome(self) -> str:
        """`regressed` (a judged regression outweighs the rest), `not judged`, or `no regression`."""
        return "regressed" if self.regressions else "not judged" if self.unjudged else "no regression"


def _contended(base: Row, new: Row) -> str | None:
    """`not judged: ...` when either row was timed while other processes took over `CONTENTION_LIMIT` of
    the CPU; None otherwise (or when the rows do not say)."""
    reason = contention(base, "BASE") or contention(new, "NEW")
    return None if reason is None else f"not judged: {reason}"


def _latency_noise(base: Row, new: Row, change: float, threshold: float, floor: float) -> str | None:
    """Why a latency change beyond the threshold is noise (`within noise: ...`), or None when it is real:
    beyond the noise floor, beyond both runs' IQRs together, and the fastest call moved beyond the
    threshold and the floor as well."""
    before, after = base.latency_us or 0.0, new.latency_us or 0.0  # both timed: compare_rows asks first
    how = "slower" if change > 0 else "faster"
    if abs(change) <= floor:
        return f"within noise: {change:+.1%} is under the {device_kind(new)} noise floor of {floor:.0%}"
    spread = (base.latency_iqr_us or 0.0) + (new.latency_iqr_us or 0.0)
    if abs(after - before) <= spread:
        return f"within noise: {change:+.1%} is within the runs' IQRs ({fmt_number(spread)} µs together)"
    fastest_before, fastest_after = base.latency_min_us, new.latency_min_us
    if fastest_before and fastest_after is not None:
        fastest = fastest_after / fastest_before - 1
        if (fastest if change > 0 else -fastest) <= max(threshold, floor):
            return f"within noise: {change:+.1%}, but the fastest call is only {fastest:+.1%} ({how} calls, not all)"
    return None


def compare_rows(base: Row, new: Row, threshold: float, floor: float | None = None) -> RowDiff:
    """The change from `base` to `new` (two rows of one cell), judged against `threshold` and the noise
    between runs (the module docstring); `floor` overrides the device kind's noise floor."""
    diff = RowDiff(base, new, threshold, noise_floor(base, new, floor))
    before, after = base.latency_us, new.latency_us
    if before and after is not None and not _failing(base) and not _failing(new):
        diff.change = after / before - 1
        diff.noise = _contended(base, new)  # whatever the change: a contended BASE hides a slowdown too
        if diff.noise is not None:
            diff.unjudged_by = CONTENTION
        elif abs(diff.change) > threshold:
            diff.noise = _latency_noise(base, new, diff.change, threshold, diff.floor)
            if diff.noise is not None and diff.change > 0 and both_unstable(base, new):
                diff.noise = f"not judged: {UNSTABLE_TEXT}: {diff.noise.removeprefix('within noise: ')}"
                diff.unjudged_by = UNSTABLE
            diff.slower = diff.noise is None and diff.change > 0
            diff.faster = diff.noise is None and diff.change < 0
    if _analysed(base) and _analysed(new):
        was, now = base.finding_ids, new.finding_ids
        gained = [f for f in new.findings if f.id not in was]  # each with its severity, as the reader filled it
        diff.gained = [f.id for f in gained if f.severity != "info"]
        diff.gained_info = [f.id for f in gained if f.id not in diff.gained]
        diff.lost = [f for f in was if f not in now]
    return diff


def diff_results(base_rows: list[Row], new_rows: list[Row], threshold: float, floor: float | None = None) -> Diff:
    """Match the rows of two results files (`MATCH_FIELDS`; the last of repeated keys counts) and
    compare each pair; `floor` overrides every device kind's noise floor."""
    base = {match_key(row): row for row in base_rows}
    new = {match_key(row): row for row in new_rows}
    pairs = [compare_rows(base[key], row, threshold, floor) for key, row in new.items() if key in base]
    return Diff(
        pairs,
        [row for key, row in base.items() if key not in new],
        [row for key, row in new.items() if key not in base],
        threshold,
        floor,
    )


def _latency(row: Row) -> str:
    if _failing(row) or _skipped(row):
        return row.status.partition(":")[0]
    if row.latency_us is None:
        return "n/a"
    return f"{fmt_number(row.latency_us)} ± {fmt_number(row.latency_iqr_us)}"


def _arrow(before: Any, after: Any, show: Any = fmt_number) -> str:
    if before == after:
        return show(after)
    return f"{show(before)} → {show(after)}"


def _findings(pair: RowDiff) -> str:
    changes = [f"+{f}" for f in pair.gained + pair.gained_info] + [f"-{f}" for f in pair.lost]
    return " ".join(changes) if changes else "same" if _analysed(pair.base) and _analysed(pair.new) else ""


def diff_table(diff: Diff, fmt: str, width: int | None = None) -> str:
    """One line per matched pair, then the rows only one side has, then the summary."""
    width = limit(width, fmt)
    body = [
        [
            pair.new.variant,
            cell_label(pair.new),
            _latency(pair.base),
            _latency(pair.new),
            "n/a" if pair.change is None else f"{pair.change:+.1%}",
            _arrow(pair.base.kernels_per_forward, pair.new.kernels_per_forward, fmt_count),
            _arrow(pair.base.peak_memory_mib, pair.new.peak_memory_mib),
            _findings(pair),
            pair.verdict,
        ]
        for pair in diff.rows
    ]
    parts = [table(COLUMNS, body, fmt, width)]
    unmatched = [f"only in BASE: {row.variant} @ {cell_label(row)}" for row in diff.only_base]
    unmatched += [f"only in NEW: {row.variant} @ {cell_label(row)}" for row in diff.only_new]
    if unmatched:
        parts += ["", bullets(unmatched, width)]
    if diff.unjudged:
        parts += ["", bullets(unjudged_lines(diff), width)]
    parts += ["", *wrap(summary(diff), width)]
    return "\n".join(parts)


def unjudged_lines(diff: Diff) -> list[str]:
    """One line per pair not judged (and no regression otherwise): `not judged: VARIANT @ CELL: why`."""
    return [f"not judged: {pair.new.variant} @ {cell_label(pair.new)}: {_why(pair)}" for pair in diff.unjudged]


def _why(pair: RowDiff) -> str:
    return (pair.noise or "").removeprefix("not judged: ")


def rule_text(diff: Diff) -> str:
    """The latency rule in words: the threshold, the noise floors in force, the IQRs and fastest calls."""
    if diff.floor_override is not None:
        floors = f"noise floor {diff.floor_override:.0%}"
    else:
        kinds = sorted({device_kind(pair.new) for pair in diff.rows} | {device_kind(pair.base) for pair in diff.rows})
        floors = "noise floor " + ", ".join(f"{kind} {NOISE_FLOOR.get(kind, 0.0):.0%}" for kind in kinds)
    return f"threshold {diff.threshold:.1%}, {floors}, beyond both runs' IQRs and in the fastest call too"


def summary(diff: Diff) -> str:
    """One line: how many rows matched and how many are regressions, of which kind, and how many latency
    changes were within noise or not judged."""
    regressions = diff.regressions
    kinds = {
        "slower": sum(1 for r in regressions if r.slower),
        "started failing": sum(1 for r in regressions if r.started_failing),
        "gained a finding": sum(1 for r in regressions if r.gained),
    }
    detail = ", ".join(f"{count} {kind}" for kind, count in kinds.items() if count)
    unjudged = [r for r in diff.rows if r.not_judged]
    if regressions:
        found = f"{len(regressions)} regression(s): {detail}"
    else:
        found = "no judged regression" if unjudged else "no regression"
    noisy = sum(1 for r in diff.rows if r.noise) - len(unjudged)
    notes = [f"{noisy} latency change(s) within noise"] if noisy else []
    if unjudged:
        why = " or ".join(kind for kind in (CONTENTION, UNSTABLE) if any(r.unjudged_by == kind for r in unjudged))
        notes.append(f"{len(unjudged)} not judged ({why})")
    extra = f"; {', '.join(notes)}" if notes else ""
    return f"{len(diff.rows)} row(s) matched: {found}{extra} ({rule_text(diff)})"


def diff_json(diff: Diff, base_path: str, new_path: str) -> dict[str, Any]:
    """The diff as a JSON-ready document (`results.files.to_json` writes it)."""
    return {
        "base": base_path,
        "new": new_path,
        "threshold": diff.threshold,
        "noise_floor": diff.floor_override if diff.floor_override is not None else dict(NOISE_FLOOR),
        "contention_limit": CONTENTION_LIMIT,
        "rows": [_pair_json(pair) for pair in diff.rows],
        "only_in_base": [_identity_json(row) for row in diff.only_base],
        "only_in_new": [_identity_json(row) for row in diff.only_new],
        "regressions": len(diff.regressions),
        "not_judged": len(diff.unjudged),
        "not_judged_rows": [
            {**_identity_json(pair.new), "reason": _why(pair), "kind": pair.unjudged_by} for pair in diff.unjudged
        ],
        "outcome": diff.outcome,
        "summary": summary(diff),
    }


def _pair_json(pair: RowDiff) -> dict[str, Any]:
    base, new = pair.base, pair.new
    return {
        **_identity_json(new),
        "base_status": base.status,
        "new_status": new.status,
        "base_latency_us": base.latency_us,
        "new_latency_us": new.latency_us,
        "base_latency_iqr_us": base.latency_iqr_us,
        "new_latency_iqr_us": new.latency_iqr_us,
        "base_latency_min_us": base.latency_min_us,
        "new_latency_min_us": new.latency_min_us,
        "base_cpu_contention": base.cpu_contention,
        "new_cpu_contention": new.cpu_contention,
        "latency_change": pair.change,
        "noise_floor": pair.floor,
        "noise": pair.noise,
        "judged": not pair.not_judged,
        "base_kernels_per_forward": base.kernels_per_forward,
        "new_kernels_per_forward": new.kernels_per_forward,
        "base_peak_memory_mib": base.peak_memory_mib,
        "new_peak_memory_mib": new.peak_memory_mib,
        "findings_gained": pair.gained,
        "findings_gained_info": pair.gained_info,
        "findings_lost": pair.lost,
        "regressions": pair.regressions,
        "verdict": pair.verdict,
    }
