"""Tables for `list`, `run` and `compare`, rendered with tabulate. Formatting only.

Every renderer takes `width`: None (`--wide`, and always for markdown) gives the full tables;
a number fits every line of the `table` style to it (see `report.layout`): low-value columns
are dropped, long text is wrapped, and reasons and finding messages move below the tables,
with the finding ids left in them; fitted, only the `problem` findings show (see `report.impact`).
`compare` and `run` end with "What to look at", the findings that cost the most.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnprof.report.counters_tables import counters_section
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.impact import finding_line, left_out, shown, shown_ids, unit_of, what_to_look_at
from attnprof.report.layout import (
    Column,
    bullets,
    fit_profiler_table,
    fitted_columns,
    limit,
    table,
    wrap,
)

UNRELIABLE = (
    "~x? marks an unreliable speed-up: the variant's or the baseline's timing was still unstable "
    "(IQR over 10% of the median) after a re-time"
)

LIST_COLUMNS = (
    Column("variant", narrow=16),
    Column("runs here"),
    Column("why not", narrow=10, wide=40),
    Column("from", narrow=10),
    Column("description", narrow=20, wide=60),
)

BANDWIDTH_HEADER = "GB/s (% read BW)"
SHAPE_COLUMNS = (
    Column("variant", narrow=16),
    Column("status", wide=36),
    Column("kernels/fwd", drop=7),
    Column("GPU µs", drop=8),
    Column("CPU µs", drop=5),
    Column("latency µs ± IQR", narrow=17),
    Column("TFLOP/s (latency)", drop=3),
    Column("TFLOP/s (kernels)", drop=4),
    Column("% peak", drop=2),
    Column(BANDWIDTH_HEADER, drop=1),  # kept to the last when a row is memory-bound (`shape_columns`)
    Column("executed/useful FLOPs", drop=0),
    Column("peak MiB", drop=1),
    Column("rel err", drop=6),
    Column("speed-up"),
    Column("findings", narrow=30, wide=40),
)

GLANCE_COLUMNS = (
    Column("variant", narrow=16),
    Column("shape"),
    Column("kernels/fwd", drop=2),
    Column("GPU µs/fwd", drop=3),
    Column("CPU µs/fwd", drop=1),
    Column("what the trace revealed", narrow=30, wide=90),
)

RUN_COLUMNS = (Column("metric"), Column("value", narrow=20))

#: key_averages columns kept when the profiler's table is fitted to a width, most wanted first.
PROFILER_COLUMNS = (
    "Self CUDA",
    "CUDA total",
    "# of Calls",
    "Self CPU",
    "CPU total",
    "CUDA time avg",
    "CPU time avg",
    "Self CUDA %",
    "Self CPU %",
    "CPU total %",
)


def variant_list_table(entries: list[dict[str, Any]], fmt: str, width: int | None = None) -> str:
    """`attnprof list`: name, availability here, reason, source, description."""
    rows = [
        [e["name"], "yes" if e["available"] else "no", e["reason"] or "", e["source"], e["description"]]
        for e in entries
    ]
    return table(LIST_COLUMNS, rows, fmt, width)


def latency_text(row: dict[str, Any], say_retimed: bool = False) -> str:
    if row.get("latency_us") is None:
        return "n/a"
    text = f"{fmt_number(row['latency_us'])} ± {fmt_number(row.get('latency_iqr_us'))}"
    if clock_held_down(row):
        text += f" @ {fmt_count(row['sm_clock_mhz'])} MHz"
    retimed = say_retimed and bool(row.get("retimed"))
    if row.get("unstable"):
        return text + (" (unstable, also when re-timed)" if retimed else " (unstable)")
    return text + (" (re-timed: the first sample was unstable)" if retimed else "")


def clock_held_down(row: dict[str, Any]) -> bool:
    """True when the median SM clock while timing was more than 1% under the device's maximum."""
    mhz, top = row.get("sm_clock_mhz"), row.get("sm_clock_max_mhz")
    return bool(mhz and top and mhz < 0.99 * top)


def _clock(row: dict[str, Any]) -> str:
    if not row.get("sm_clock_mhz"):
        return "n/a (not sampled: CPU, no nvidia-smi, --no-clocks or --no-timing)"
    text = (
        f"{fmt_count(row['sm_clock_mhz'])} MHz median, {fmt_count(row.get('sm_clock_min_mhz'))} lowest, "
        f"{fmt_count(row.get('sm_clock_max_mhz'))} max"
    )
    return text + (f"; held down by {row['clock_limits']}" if row.get("clock_limits") else "")


def speedup_text(row: dict[str, Any]) -> str:
    """`4.00x`; an unreliable speed-up reads `~4.0x?`, to two significant digits (see `UNRELIABLE`);
    a missing one `n/a`."""
    value = row.get("speedup_vs_baseline")
    if value is None:
        return "n/a"
    if row.get("speedup_reliable") is False:
        return f"~{value:.2g}x?" if value < 10 else f"~{value:,.0f}x?"
    return f"{value:.2f}x"


def _throughput(row: dict[str, Any]) -> str:
    """TFLOP/s with its % of the measured peak, or `n/a: why` when there is no meaningful peak."""
    if row.get("pct_of_peak") is None and row.get("pct_of_peak_note"):
        return f"{fmt_number(row.get('tflops'))} (n/a: {row['pct_of_peak_note']})"
    return f"{fmt_number(row.get('tflops'))} ({fmt_number(row.get('pct_of_peak'))}%)"


def _kernel_throughput(row: dict[str, Any]) -> str:
    """TFLOP/s by the attention calls' device time, with its % of the measured peak when there is one."""
    if row.get("kernel_tflops") is None:
        return "n/a"
    pct = row.get("kernel_pct_of_peak")
    return fmt_number(row["kernel_tflops"]) + ("" if pct is None else f" ({fmt_number(pct)}%)")


def _bandwidth(row: dict[str, Any]) -> str:
    """ "4,310 (95.8%), memory": achieved GB/s, its % of the measured read bandwidth and the bound, with the
    note when the achieved figure beat the read bandwidth."""
    text = bandwidth_cell(row) + f", {row.get('bound') or 'n/a'}"
    return text + (f" ({row['read_bandwidth_note']})" if row.get("read_bandwidth_note") else "")


def _error(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1e}"


def _status_word(row: dict[str, Any]) -> str:
    return row["status"].partition(":")[0]


def variant_label(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The variant's name, with `(rank R)` when its cell has a row from several ranks (a collective variant
    under torchrun)."""
    if row.get("rank") is None:
        return row["variant"]
    twins = [r for r in rows if r["variant"] == row["variant"] and _shape_mode(r) == _shape_mode(row)]
    return f"{row['variant']} (rank {row['rank']})" if len(twins) > 1 else row["variant"]


def per_step(columns: tuple[Column, ...], modes: set[str]) -> tuple[Column, ...]:
    """The columns with `/fwd` read as `/step` when a backward mode is among `modes`: a row's counts
    and times there are of the whole timed step (forward, backward, or both), not of a forward."""
    if modes <= {"fwd"}:
        return columns
    return tuple(replace(c, header=c.header.replace("/fwd", "/step")) for c in columns)


def shape_columns(rows: list[dict[str, Any]]) -> tuple[Column, ...]:
    """`SHAPE_COLUMNS` for these rows (`per_step` by their modes): when one of them is memory-bound (decode),
    its achieved bandwidth is the figure to read, so that column is the last to give way to a width."""
    columns = per_step(SHAPE_COLUMNS, {row.get("mode") or "fwd" for row in rows})
    if any(row.get("bound") == "memory" for row in rows):
        columns = tuple(replace(c, drop=99) if c.header == BANDWIDTH_HEADER else c for c in columns)
    return columns


def bandwidth_cell(row: dict[str, Any]) -> str:
    """ "4,310 (95.8%)": achieved GB/s and its % of the read bandwidth (n/a without bytes)."""
    pct = row.get("pct_of_read_bandwidth")
    return fmt_number(row.get("achieved_gbps")) + ("" if pct is None else f" ({fmt_number(pct)}%)")


def shape_rows(rows: list[dict[str, Any]], full: bool, problems_only: bool = False) -> list[list[str]]:
    """The comparison table's cells (`SHAPE_COLUMNS`) for the rows of one shape; `full` keeps each
    status's reason in its cell, else only the status word; `problems_only` leaves the info findings out."""
    body = []
    for row in rows:
        status = row["status"] if full else _status_word(row)
        if row["status"] != "ok" and row.get("forwards") is None:
            body.append([variant_label(row, rows), status] + ["" for _ in SHAPE_COLUMNS[2:]])
            continue
        body.append(
            [
                variant_label(row, rows),
                status,
                fmt_count(row.get("kernels_per_forward")),
                fmt_number(row.get("gpu_time_us")),
                fmt_number(row.get("cpu_time_us")),
                latency_text(row),
                fmt_number(row.get("tflops")),
                fmt_number(row.get("kernel_tflops")),
                fmt_number(row.get("pct_of_peak")),
                bandwidth_cell(row),
                executed_text(row),
                fmt_number(row.get("peak_memory_mib")),
                _error(row.get("rel_error")),
                speedup_text(row),
                shown_ids(row, 0 if problems_only else None),
            ]
        )
    return body


def executed_text(row: dict[str, Any]) -> str:
    """A block-sparse kernel's executed FLOPs over the useful ones (`1.37×`); n/a for a dense variant."""
    executed, useful = row.get("executed_flops"), row.get("flops")
    return f"{executed / useful:.2f}×" if executed is not None and useful else "n/a"


def shape_table(rows: list[dict[str, Any]], fmt: str, width: int | None = None, keep: list[int] | None = None) -> str:
    """One comparison table for the rows of one shape; fitted, the reasons of rows that are not ok
    follow it as bullets. A legend follows when a speed-up is unreliable. `keep`: the columns every
    shape's table of the output keeps (`compare_report`); None: this table's own fit."""
    width = limit(width, fmt)
    body = shape_rows(rows, full=width is None, problems_only=width is not None)
    notes = reason_bullets(rows, width) if width is not None else []
    if any(row.get("speedup_reliable") is False for row in rows):
        notes += wrap(UNRELIABLE, width)
    columns = shape_columns(rows)
    return "\n".join([table(columns, body, fmt, width, keep)] + (["", *notes] if notes else []))


def reason_bullets(rows: list[dict[str, Any]], width: int) -> list[str]:
    """One bullet per distinct reason a row is not ok, naming its variants once each (a `variant` and a
    `status` per row)."""
    grouped: dict[str, dict[str, None]] = {}
    for row in rows:
        if row["status"] != "ok":
            grouped.setdefault(row["status"], {})[variant_label(row, rows)] = None
    return [bullets([f"{', '.join(names)}: {status}" for status, names in grouped.items()], width)] if grouped else []


def glance_rows(results: list[dict[str, Any]], fitted: bool, problems_only: bool = False) -> list[list[str]]:
    """The at-a-glance cells (`GLANCE_COLUMNS`), one row per entry; `fitted` puts finding ids and
    status words where the full table has finding messages and whole statuses; `problems_only`
    leaves the info findings out."""
    body = []
    for entry in results:
        if entry.get("forwards") is None:
            body.append(
                [
                    variant_label(entry, results),
                    _shape_mode(entry),
                    "",
                    "",
                    "",
                    _status_word(entry) if fitted else entry["status"],
                ]
            )
            continue
        findings = shown(entry.get("findings") or [], 0 if problems_only else None)
        revealed = " ".join(f["id"] for f in findings) if fitted else "; ".join(f["message"] for f in findings)
        body.append(
            [
                variant_label(entry, results),
                _shape_mode(entry),
                fmt_count(entry.get("kernels_per_forward")),
                fmt_number(entry.get("gpu_time_us")),
                fmt_number(entry.get("cpu_time_us")),
                revealed or "nothing unusual",
            ]
        )
    return body


#: The at-a-glance columns of a fitted table: the last one holds finding ids.
GLANCE_FITTED = GLANCE_COLUMNS[:-1] + (replace(GLANCE_COLUMNS[-1], header="findings"),)


def glance_table(results: list[dict[str, Any]], fmt: str, width: int | None = None) -> str:
    """One row per variant: kernels/forward, GPU and CPU time, and what the trace revealed; fitted, the
    column holds the finding ids and the messages follow as wrapped bullets."""
    width = limit(width, fmt)
    fitted = width is not None
    body = glance_rows(results, fitted, problems_only=fitted)
    modes = {entry.get("mode") or "fwd" for entry in results}
    if not fitted:
        return table(per_step(GLANCE_COLUMNS, modes), body, fmt)
    shapes = len({_shape_mode(entry) for entry in results})
    messages = [
        finding_line(f, unit_of(e), f"{variant_label(e, results)}{' @ ' + _shape_mode(e) if shapes > 1 else ''}")
        for e in results
        for f in shown(e.get("findings") or [], width)
    ]
    columns = per_step(GLANCE_FITTED, modes)
    notes = (["", bullets(messages, width)] if messages else []) + left_out(results, width)
    return "\n".join([table(columns, body, fmt, width), *notes])


def cell_label(row: dict[str, Any]) -> str:
    """`8x16x1024x64 bf16 causal fwd+bwd`: shape, dtype, masking and mode of a row. A sized mask is in the
    shape (`4x16x4096x64 sw256`), so its masking word is `masked`."""
    sized = row.get("mask") not in (None, "", "causal", "none")
    masking = "masked" if sized else "causal" if row.get("causal") else "full"
    return f"{row.get('shape')} {row.get('dtype')} {masking} {row.get('mode') or 'fwd'}"


def cell_title(row: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> str:
    """`8x16x1024x64 bf16 causal fwd+bwd on cuda:0`: `cell_label` and the device of a row (every device of
    `rows`, when they ran on several: the ranks of a torchrun run)."""
    return f"{cell_label(row)} on {', '.join(dict.fromkeys(r['device'] for r in rows or [row]))}"


def _shape_mode(entry: dict[str, Any]) -> str:
    """The shape, with the mode after it when it is not the default `fwd`."""
    mode = entry.get("mode") or "fwd"
    return entry["shape"] if mode == "fwd" else f"{entry['shape']} {mode}"


def _phase_split(row: dict[str, Any]) -> str:
    """`1 + 5 (backward after the region)`: the step's kernels by phase, from the row's phase fields."""
    forward, backward = row.get("forward_kernels"), row.get("backward_kernels")
    if forward is None or backward is None:
        return "n/a"
    text = f"{forward} + {backward}"
    if row.get("backward_kernel_time_us") is not None:
        text += f" ({fmt_number(row.get('forward_kernel_time_us'))} + {fmt_number(row['backward_kernel_time_us'])} µs)"
    return text + (" (backward after the region)" if row.get("backward_outside_region") else "")


def _grad_errors(row: dict[str, Any]) -> str:
    errors = [row.get(f"grad_rel_error_{name}") for name in ("dq", "dk", "dv")]
    if all(e is None for e in errors):
        return "n/a"
    return ", ".join(f"{name} {_error(e)}" for name, e in zip(("dq", "dk", "dv"), errors, strict=True))


def compare_groups(entries: list[dict[str, Any]], baseline: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
    """The entries of each shape and mode, in file order, with the title of their comparison table."""
    groups = []
    for shape, mode in dict.fromkeys((e["shape"], e.get("mode", "fwd")) for e in entries):
        rows = [e for e in entries if e["shape"] == shape and e.get("mode", "fwd") == mode]
        title = cell_title(rows[0], rows) + (f", speed-up vs {baseline}" if baseline else "")
        groups.append((title, rows))
    return groups


def compare_report(entries: list[dict[str, Any]], fmt: str, baseline: str | None, width: int | None = None) -> str:
    """`attnprof compare`: a titled table per shape, then the at-a-glance table. Fitted to a width, the
    shapes' tables all leave out the same columns: those that the widest of them needs to drop."""
    heading = "###" if fmt == "markdown" else "=="
    width = limit(width, fmt)
    groups = compare_groups(entries, baseline)
    keep = None
    if width is not None:  # one choice of columns for every shape's table, made on all their rows
        every = [cells for _, rows in groups for cells in shape_rows(rows, full=False, problems_only=True)]
        keep = fitted_columns(shape_columns(entries), every, width)
    parts = []
    for title, rows in groups:
        parts += ["", *wrap(f"{heading} {title}", width), "", shape_table(rows, fmt, width, keep)]
    parts += ["", f"{heading} at a glance", "", glance_table(entries, fmt, width)]
    shapes = len({_shape_mode(e) for e in entries})
    counters = counters_section(
        [
            (variant_label(e, entries) + (f" @ {_shape_mode(e)}" if shapes > 1 else ""), e.get("counters"))
            for e in entries
        ],
        fmt,
        width,
        "step" if any(unit_of(e) == "step" for e in entries) else "forward",
    )
    if counters:
        parts += ["", *counters]
    look = what_to_look_at(
        [(f"{variant_label(e, entries)}, {cell_label(e)}", unit_of(e), e.get("findings") or []) for e in entries],
        fmt,
        width,
    )
    return "\n".join(parts + (["", look] if look else []))


def run_summary_table(row: dict[str, Any], fmt: str, width: int | None = None) -> str:
    """`attnprof run`: the cell and its measurements outside the profiler (the trace facts follow it)."""
    items = [
        ("variant", f"{row['variant']} ({row['source']})"),
        ("shape", cell_title(row)),
        ("status", row["status"]),
        ("backend dispatched", row.get("backend") or "n/a"),
        ("latency (µs, median ± IQR)", latency_text(row, say_retimed=True)),
        ("timing method", row.get("timing_method") or "n/a"),
        ("SM clock while timed", _clock(row)),
        ("cold first call (ms)", fmt_number(row.get("cold_ms"))),
        ("TFLOP/s by latency (% of measured peak)", _throughput(row)),
        ("TFLOP/s by kernel time (% of peak)", _kernel_throughput(row)),
        ("achieved GB/s (% of read bandwidth), bound", _bandwidth(row)),
        ("FLOPs useful, executed by the kernel's tiles", _flops_text(row)),
        ("peak extra memory (MiB)", fmt_number(row.get("peak_memory_mib"))),
        ("rel. error vs float64", _error(row.get("rel_error"))),
        ("trace", row.get("trace") or "n/a"),
    ]
    if (row.get("mode") or "fwd") != "fwd":
        items.insert(-1, ("gradient rel. error vs float64", _grad_errors(row)))
        items.insert(2, ("kernels per step: forward + backward", _phase_split(row)))
    return table(RUN_COLUMNS, [list(item) for item in items], fmt, width)


def _flops_text(row: dict[str, Any]) -> str:
    """The step's useful FLOPs, and a block-sparse kernel's executed ones with their ratio."""
    useful = row.get("flops")
    if useful is None:
        return "n/a"
    if row.get("executed_flops") is None:
        return f"{useful:.3g}, n/a (the variant does not report its tiles)"
    return f"{useful:.3g}, {row['executed_flops']:.3g} ({executed_text(row)})"


def run_report(
    entry: dict[str, Any], analysis: Any, key_averages: str | None, fmt: str, width: int | None = None
) -> str:
    """`attnprof run`, one result: the summary, the trace analysis (when there is one) and the
    profiler's own key_averages table (fitted to `width` by dropping its less wanted columns)."""
    from attnprof.report.analysis_tables import render_analysis_dict

    width = limit(width, fmt)
    parts = [run_summary_table(entry, fmt, width)]
    if analysis is not None:  # the row's findings: the trace's joined with the counters' (`CellResult.findings`)
        data = analysis.to_dict() | {"findings": entry.get("findings") or [], "counters": entry.get("counters")}
        parts += ["", render_analysis_dict(data, fmt, width)]
    elif entry.get("counters"):
        parts += ["", *counters_section([("", entry["counters"])], fmt, width, unit_of(entry))]
    if key_averages:
        parts += [
            "",
            *wrap(
                "torch.profiler key_averages (all profiled steps; the region's CPU and GPU rows are separate):", width
            ),
        ]
        parts.append(
            fit_profiler_table(key_averages, width, PROFILER_COLUMNS) if fmt == "table" else f"```\n{key_averages}\n```"
        )
    look = what_to_look_at(
        [(f"{entry['variant']}, {cell_label(entry)}", unit_of(entry), entry.get("findings") or [])], fmt, width
    )
    return "\n".join(parts + (["", look] if look else []))
