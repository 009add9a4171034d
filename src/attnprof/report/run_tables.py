"""`attnprof run`'s view of one row: the cell and its measurements outside the profiler (`run_summary_table`),
the trace analysis the row holds (its kernels, findings, attention ledger, phases, communication and counters,
rendered by `report.analysis_tables`), the profiler's own key_averages table and "What to look at".
Formatting only: every figure is the row's (`results.schema.Row`).
"""

from __future__ import annotations

from attnprof.report.columns import Cell, error_text, placed
from attnprof.report.counters_tables import counters_section
from attnprof.report.formatting import fmt_number
from attnprof.report.impact import unit_of, what_to_look_at
from attnprof.report.layout import Column, fit_profiler_table, limit, table, wrap
from attnprof.report.tables import cell_label, cell_title
from attnprof.results.parts import Analysis
from attnprof.results.schema import Row

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


def _phase_split(row: Row) -> str:
    """`1 + 5 (backward after the region)`: the step's kernels by phase, from the row's phase fields."""
    forward, backward = row.forward_kernels, row.backward_kernels
    if forward is None or backward is None:
        return "n/a"
    text = f"{forward} + {backward}"
    if row.backward_kernel_time_us is not None:
        text += f" ({fmt_number(row.forward_kernel_time_us)} + {fmt_number(row.backward_kernel_time_us)} µs)"
    return text + (" (backward after the region)" if row.backward_outside_region else "")


def _grad_errors(row: Row) -> str:
    errors = {"dq": row.grad_rel_error_dq, "dk": row.grad_rel_error_dk, "dv": row.grad_rel_error_dv}
    if all(e is None for e in errors.values()):
        return "n/a"
    if row.grad_rel_error_dsinks is not None:
        errors["dsinks"] = row.grad_rel_error_dsinks
    return ", ".join(f"{name} {error_text(e)}" for name, e in errors.items())


def run_summary_table(row: Row, fmt: str, width: int | None = None) -> str:
    """`attnprof run`: the cell and its measurements outside the profiler (the trace facts follow it), a line
    per figure: its own and the metric columns `report.columns` places in it."""
    stepped = (row.mode or "fwd") != "fwd"
    own: list[tuple[str, Cell]] = [
        ("variant", lambda r: f"{r.variant} ({r.source})"),
        ("shape", cell_title),
        *([("kernels per step: forward + backward", _phase_split)] if stepped else []),
        ("status", lambda r: r.status),
        ("backend dispatched", lambda r: r.backend or "n/a"),
        ("timing method", lambda r: r.timing_method or "n/a"),
        *([("gradient rel. error vs float64", _grad_errors)] if stepped else []),
        ("trace", lambda r: r.trace or "n/a"),
    ]
    items = placed("run", [(Column(label), cell) for label, cell in own])
    return table(RUN_COLUMNS, [[column.header, cell(row)] for column, cell in items], fmt, width)


def trace_analysis(row: Row) -> Analysis | None:
    """The trace analysis a row holds, as `analyze` gives it, with the row's findings (the judge's) and
    counters; None when the row has none (no trace was analysed: `forwards` is None)."""
    if row.forwards is None:
        return None
    return Analysis(
        region=row.region or "",
        forwards=row.forwards,
        kernels_per_forward=row.kernels_per_forward,
        memcpy_per_forward=row.memcpy_per_forward,
        memset_per_forward=row.memset_per_forward,
        gpu_time_us=row.gpu_time_us,
        gpu_annotation_time_us=row.gpu_annotation_time_us,
        kernel_time_us=row.kernel_time_us,
        cpu_time_us=row.cpu_time_us,
        self_device_time_total_us=row.self_device_time_total_us,
        launch_apis=row.launch_apis,
        transposes_per_forward=row.transposes_per_forward,
        cpu_ops_per_forward=row.cpu_ops_per_forward,
        kernels=row.kernels,
        findings=row.findings,
        spread=row.spread,
        device=row.trace_device,
        input_dtype=row.input_dtype,
        annotation_mismatches=row.annotation_mismatches,
        notes=row.notes,
        phases=row.phases,
        comm=row.comm,
        attention=row.attention,
        top_cpu_ops=row.top_cpu_ops,
        counters=row.counters,
    )


def run_report(row: Row, key_averages: str | None, fmt: str, width: int | None = None) -> str:
    """`attnprof run`, one row: the summary, the trace analysis (when the row has one, `trace_analysis`;
    with the row's findings) and the profiler's own key_averages table (fitted to
    `width` by dropping its less wanted columns)."""
    width = limit(width, fmt)
    parts = [run_summary_table(row, fmt, width)]
    analysis = trace_analysis(row)
    if analysis is not None:
        from attnprof.report.analysis_tables import render_analysis

        parts += ["", render_analysis(analysis, fmt, width)]
    elif row.counters:
        parts += ["", *counters_section([("", row.counters)], fmt, width, unit_of(row))]
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
    look = what_to_look_at([(f"{row.variant}, {cell_label(row)}", unit_of(row), row.findings)], fmt, width)
    return "\n".join(parts + (["", look] if look else []))
