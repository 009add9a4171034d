"""`attnprof run`'s view of one row: the cell and its measurements outside the profiler (`run_summary_table`),
the trace analysis the row holds (its kernels, findings, attention ledger, phases, communication and counters,
rendered by `report.analysis_tables`), the profiler's own key_averages table and "What to look at".
Formatting only: every figure is the row's (`results.schema.Row`).
"""

from __future__ import annotations

from attnprof.report.counters_tables import counters_section
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.impact import unit_of, what_to_look_at
from attnprof.report.layout import Column, fit_profiler_table, limit, table, wrap
from attnprof.report.tables import bandwidth_cell, cell_label, cell_title, error_text, executed_text, latency_text
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


def _clock(row: Row) -> str:
    if not row.sm_clock_mhz:
        return "n/a (not sampled: CPU, no nvidia-smi, --no-clocks or --no-timing)"
    text = (
        f"{fmt_count(row.sm_clock_mhz)} MHz median, {fmt_count(row.sm_clock_min_mhz)} lowest, "
        f"{fmt_count(row.sm_clock_max_mhz)} max"
    )
    return text + (f"; held down by {row.clock_limits}" if row.clock_limits else "")


def _throughput(row: Row) -> str:
    """TFLOP/s with its % of the measured peak, or `n/a: why` when there is no meaningful peak."""
    if row.pct_of_peak is None and row.pct_of_peak_note:
        return f"{fmt_number(row.tflops)} (n/a: {row.pct_of_peak_note})"
    return f"{fmt_number(row.tflops)} ({fmt_number(row.pct_of_peak)}%)"


def _kernel_throughput(row: Row) -> str:
    """TFLOP/s by the attention calls' device time, with its % of the measured peak when there is one."""
    if row.kernel_tflops is None:
        return "n/a"
    pct = row.kernel_pct_of_peak
    return fmt_number(row.kernel_tflops) + ("" if pct is None else f" ({fmt_number(pct)}%)")


def _bandwidth(row: Row) -> str:
    """ "4,310 (95.8%), memory": achieved GB/s, its % of the measured read bandwidth and the bound, with the
    note when the achieved figure beat the read bandwidth."""
    text = bandwidth_cell(row) + f", {row.bound or 'n/a'}"
    return text + (f" ({row.read_bandwidth_note})" if row.read_bandwidth_note else "")


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
    return ", ".join(f"{name} {error_text(e)}" for name, e in errors.items())


def _flops_text(row: Row) -> str:
    """The step's useful FLOPs, and a block-sparse kernel's executed ones with their ratio."""
    useful = row.flops
    if useful is None:
        return "n/a"
    if row.executed_flops is None:
        return f"{useful:.3g}, n/a (the variant does not report its tiles)"
    return f"{useful:.3g}, {row.executed_flops:.3g} ({executed_text(row)})"


def run_summary_table(row: Row, fmt: str, width: int | None = None) -> str:
    """`attnprof run`: the cell and its measurements outside the profiler (the trace facts follow it)."""
    items = [
        ("variant", f"{row.variant} ({row.source})"),
        ("shape", cell_title(row)),
        ("status", row.status),
        ("backend dispatched", row.backend or "n/a"),
        ("latency (µs, median ± IQR)", latency_text(row, say_retimed=True)),
        ("timing method", row.timing_method or "n/a"),
        ("SM clock while timed", _clock(row)),
        ("cold first call (ms)", fmt_number(row.cold_ms)),
        ("TFLOP/s by latency (% of measured peak)", _throughput(row)),
        ("TFLOP/s by kernel time (% of peak)", _kernel_throughput(row)),
        ("achieved GB/s (% of read bandwidth), bound", _bandwidth(row)),
        ("GB/s by kernel time", fmt_number(row.kernel_gbps)),
        ("FLOPs useful, executed by the kernel's tiles", _flops_text(row)),
        ("peak extra memory (MiB)", fmt_number(row.peak_memory_mib)),
        ("rel. error vs float64", error_text(row.rel_error)),
        ("trace", row.trace or "n/a"),
    ]
    if (row.mode or "fwd") != "fwd":
        items.insert(-1, ("gradient rel. error vs float64", _grad_errors(row)))
        items.insert(2, ("kernels per step: forward + backward", _phase_split(row)))
    return table(RUN_COLUMNS, [list(item) for item in items], fmt, width)


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
