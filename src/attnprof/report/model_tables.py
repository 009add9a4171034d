"""The `attnprof model` comparison table, from typed rows (`results.schema.Row`, subject "model"). Formatting only.

One table: a row per implementation × seq (× mode), with the latency of the whole step, the speed-up
against the baseline, attention's share of GPU time, its calls and backends, the overhead ledger, the
attention kernels' GB/s (their bytes over their device time), kernel counts, memory (these are the metric
columns of `report.columns`), the logits against the baseline's, and the finding ids. Fitted to a width,
the reasons of rows that are not ok and the messages of the problem findings follow as wrapped bullets (the
info ones are counted; `--wide` shows them), then "What to look at". Counts read `/step` when a mode runs
a backward.
"""

from __future__ import annotations

from attnprof.report.columns import Cell, placed
from attnprof.report.counters_tables import counters_section
from attnprof.report.impact import finding_line, left_out, shown, unit_of, what_to_look_at
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.report.tables import legends, per_step, reason_bullets
from attnprof.results.schema import Row

SHOWN_ALWAYS = ("implementation", "seq", "status")  # the cells of a row that never ran
UNRELIABLE = (
    "~x? marks an unreliable speed-up: the row's or the baseline's timing is unstable (IQR over 10% of the median) "
    "or was timed while other processes held the CPU"
)


def params_text(count: int | None) -> str:
    """`1.10B`, `12.3M`, `850K` parameters; `n/a` when unknown."""
    if count is None:
        return "n/a"
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(count)


def _logits(row: Row, baseline: str) -> str:
    if row.variant == baseline and row.status == "ok":
        return "baseline"
    if row.logits_max_abs_diff is None:
        return "n/a"
    return f"max {row.logits_max_abs_diff:.1e}, rel {row.logits_rel_diff:.1e}"


def _seq(row: Row, modes: int) -> str:
    seq = "n/a" if row.seq is None else str(row.seq)
    return f"{seq} {row.mode}" if modes > 1 else seq


def model_title(rows: list[Row], baseline: str) -> str:
    """`llama (1.10B parameters), batch 1, bf16, fwd on cuda:0; speed-ups and logits vs sdpa`, with the mask
    and score mod after the dtype when the config set them (`..., bf16, mask sliding_window:256, fwd ...`)."""
    first = rows[0]
    params = next((r.params for r in rows if r.params is not None), None)
    modes = ", ".join(dict.fromkeys(r.mode for r in rows))
    masks = next((r.mask for r in rows if r.mask is not None), None)
    score_mods = next((r.score_mod for r in rows if r.score_mod is not None), None)
    masking = "".join(
        f", {name} {value}"
        for name, value in (("mask", masks), ("score_mod", score_mods))
        if value not in (None, "causal")
    )
    return (
        f"{first.model} ({params_text(params)} parameters), batch {first.batch}, {first.dtype}{masking}, "
        f"{modes} on {first.device}; speed-ups and logits vs {baseline}"
    )


def _columns(baseline: str, modes: int, fitted: bool) -> list[tuple[Column, Cell]]:
    """Each column of the table, with what its cell shows for a row: its own and the metric columns
    `report.columns` places in it."""
    own: list[tuple[Column, Cell]] = [
        (Column("implementation", narrow=14), lambda r: r.variant),
        (Column("seq"), lambda r: _seq(r, modes)),
        (Column("status", wide=36), lambda r: r.status.partition(":")[0] if fitted else r.status),
        (Column("logits vs baseline", narrow=12, drop=7), lambda r: _logits(r, baseline)),
        (
            Column("findings", narrow=20, wide=40),
            lambda r: " ".join(f.id for f in shown(r.findings, 0 if fitted else None)),
        ),
    ]
    return placed("model", own)


def model_table(rows: list[Row], fmt: str, baseline: str, width: int | None = None) -> str:
    """The comparison table of `attnprof model` (see the module docstring); a row that never ran shows its
    implementation, seq and status only."""
    width = limit(width, fmt)
    columns = _columns(baseline, len({r.mode for r in rows}), fitted=width is not None)
    headers = per_step(tuple(c for c, _ in columns), {r.mode for r in rows})
    body = []
    for row in rows:
        ran = row.status == "ok" or row.forwards is not None
        body.append([cell(row) if ran or c.header in SHOWN_ALWAYS else "" for c, cell in columns])
    notes = reason_bullets(rows, width) if width is not None else []
    messages = [finding_line(f, unit_of(r), _cell(r)) for r in rows for f in shown(r.findings, width)]
    if messages:
        notes.append(bullets(messages, width))
    notes += left_out(rows, width)
    notes += legends(rows, width, UNRELIABLE)
    return "\n".join([table(list(headers), body, fmt, width)] + (["", *notes] if notes else []))


def _cell(row: Row) -> str:
    """`sdpa @ 8192 fwd`: the implementation, seq and mode of a row."""
    return f"{row.variant} @ {row.seq} {row.mode}"


def model_report(rows: list[Row], fmt: str, baseline: str, width: int | None = None) -> str:
    """The titled comparison table; empty when no row finished."""
    if not rows:
        return ""
    heading = "###" if fmt == "markdown" else "=="
    title = wrap(f"{heading} {model_title(rows, baseline)}", limit(width, fmt))
    cells = [(_cell(r), unit_of(r), r.findings) for r in rows]
    look = what_to_look_at(cells, fmt, limit(width, fmt))
    unit = "step" if any(unit_of(r) == "step" for r in rows) else "forward"
    counters = counters_section([(_cell(r), r.counters) for r in rows], fmt, width, unit)
    parts = [*title, "", model_table(rows, fmt, baseline, width)] + (["", *counters] if counters else [])
    return "\n".join(parts + (["", look] if look else []))
