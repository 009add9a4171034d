"""The row-metric columns, each declared once: how its cell reads a typed row (`results.schema.Row`), and
where it stands in each view that shows it: compare's shape table (and the HTML report's comparison tables,
made from it), run's summary, the model table. A view lists only its own columns (variant, status,
findings, ...) and takes its metric columns from `METRIC_COLUMNS` through `placed`. Formatting only.

A metric column is one `MetricColumn`: its cell, and a `Place` per view it appears in, naming the column
it follows there (by header; run's summary: by label) and its header and layout hints there
(`report.layout.Column`: drop priority, narrow and wide widths). A new metric of the row is its `Row` field
(`results/schema.py`), its computation (`pipeline/rows.py`) and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from attnprof.report.contended import marked
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.layout import Column
from attnprof.results.parts import AttentionRecord
from attnprof.results.schema import Row

Cell = Callable[[Row], str]
View = Literal["compare", "run", "model"]
BANDWIDTH_HEADER = "GB/s (% read BW)"


@dataclass(frozen=True)
class Place:
    """Where a metric column stands in one view: after the column headed `after`, as `column` (its header
    there and how it gives way to a width)."""

    after: str
    column: Column


@dataclass(frozen=True)
class MetricColumn:
    """One metric column: its cell text for a row, and its place in each view that shows it (None: not there)."""

    cell: Cell
    compare: Place | None = None
    run: Place | None = None
    model: Place | None = None


def placed(view: View, own: Sequence[tuple[Column, Cell]]) -> list[tuple[Column, Cell]]:
    """The view's own columns with its metric columns, each right after the column it follows (and before
    those that follow it in turn); of several that follow the same column, the last in `METRIC_COLUMNS`
    stands nearest it, so an entry added at the end lands right after the column it names."""
    following: dict[str, list[tuple[Column, Cell]]] = {}
    for metric in METRIC_COLUMNS:
        place = getattr(metric, view)
        if place is not None:
            following.setdefault(place.after, []).insert(0, (place.column, metric.cell))
    columns: list[tuple[Column, Cell]] = []

    def add(column: Column, cell: Cell) -> None:
        columns.append((column, cell))
        for after in following.pop(column.header, []):
            add(*after)

    for column, cell in own:
        add(column, cell)
    if following:
        raise ValueError(f"{view}: no column {', '.join(map(repr, following))} for a metric column to follow")
    return columns


# ------------------------------------------------------------------ cell texts


def latency_text(row: Row, say_retimed: bool = False) -> str:
    """`1,380 ± 12`, with the SM clock when it was held down, `(unstable)`, and the contention mark
    (`report.contended`); `say_retimed` (run's summary) says in words what the re-times did."""
    if row.latency_us is None:
        return "n/a"
    text = f"{fmt_number(row.latency_us)} ± {fmt_number(row.latency_iqr_us)}"
    if clock_held_down(row):
        text += f" @ {fmt_count(row.sm_clock_mhz)} MHz"
    retimed = say_retimed and bool(row.retimed)
    if row.unstable:
        text += " (unstable, also when re-timed)" if retimed else " (unstable)"
    elif retimed:
        text += " (re-timed: the first sample was unstable)"
    if say_retimed and row.contended:
        again = row.retimed_for_contention or 0
        text += f" (timed while other processes held the CPU{f', also after {again} re-time(s)' if again else ''})"
    elif say_retimed and row.retimed_for_contention:
        text += f" (re-timed {row.retimed_for_contention}x once the CPU was calm)"
    if row.quantize_ms is not None:  # an fp8 cell: its quantization beside the latency, never in it
        text += f" (+ quantize {fmt_number(row.quantize_ms * 1e3)})"
    return marked(row, text)


def clock_held_down(row: Row) -> bool:
    """True when the median SM clock while timing was more than 1% under the device's maximum."""
    mhz, top = row.sm_clock_mhz, row.sm_clock_max_mhz
    return bool(mhz and top and mhz < 0.99 * top)


def speedup_text(row: Row) -> str:
    """`4.00x`; an unreliable speed-up reads `~4.0x?`, to two significant digits (see `tables.UNRELIABLE`);
    a missing one `n/a`; one against the baseline in another dtype names it (`1.58x vs bf16`)."""
    value = row.speedup_vs_baseline
    if value is None:
        return "n/a"
    text = ratio_text(value, reliable=row.speedup_reliable is not False)
    return text if row.speedup_vs_dtype is None else f"{text} vs {row.speedup_vs_dtype}"


def ratio_text(value: float, reliable: bool = True) -> str:
    """A ratio of two times: `4.00x`, or `~4.0x?` (two significant digits) when it is not reliable."""
    if not reliable:
        return f"~{value:.2g}x?" if value < 10 else f"~{value:,.0f}x?"
    return f"{value:.2f}x"


def error_text(value: float | None) -> str:
    """A relative error: `1.5e-03`, or n/a."""
    return "n/a" if value is None else f"{value:.1e}"


def output_error_text(row: Row) -> str:
    """The output's relative error against float64 (`error_text`); an fp8 row's with its SQNR and both against
    the bf16 sources' reference: `3.6e-02, 28.7 dB (vs bf16 5.7e-02, 24.9 dB)`."""
    text = error_text(row.rel_error)
    if row.sqnr_db is not None:
        text += f", {row.sqnr_db:.1f} dB"
    if row.rel_error_vs_bf16 is not None and row.sqnr_db_vs_bf16 is not None:
        text += f" (vs bf16 {row.rel_error_vs_bf16:.1e}, {row.sqnr_db_vs_bf16:.1f} dB)"
    return text


#: The mark of a figure by kernel time where the table's column is by latency (`by_kernel_time`).
KERNEL_MARK = " [k]"
KERNEL_LEGEND = (
    "[k]: by the attention kernels' device time in the trace (kernel GB/s, its % of the read bandwidth, "
    "% of peak by kernel time), not by the latency: the row is timed by CUDA-graph replay, as a serving "
    "engine runs decode, or is host-bound (cpu-bound), its latency the host's launch time"
)


def by_kernel_time(row: Row) -> bool:
    """True when a row's throughput figures are read by kernel time (marked `[k]`): it was timed by CUDA-graph
    replay, or it is host-bound (its `cpu-bound` finding stands as a problem: the judge makes it info when the
    latency timed without the profiler shows the GPU setting the pace)."""
    host_bound = row.finding("cpu-bound")
    return bool(row.cuda_graph) or (host_bound is not None and host_bound.severity == "problem")


def _gbps_pct(gbps: float | None, pct: float | None) -> str:
    return fmt_number(gbps) + ("" if pct is None else f" ({fmt_number(pct)}%)")


def latency_bandwidth(row: Row) -> str:
    """ "4,310 (95.8%)": achieved GB/s by latency and its % of the read bandwidth (n/a without bytes)."""
    return _gbps_pct(row.achieved_gbps, row.pct_of_read_bandwidth)


def kernel_bandwidth(row: Row) -> str:
    """ "3,622 (80.1%)": GB/s by the attention kernels' time and its % of the read bandwidth (n/a without)."""
    return _gbps_pct(row.kernel_gbps, row.kernel_pct_of_read_bandwidth)


def bandwidth_cell(row: Row) -> str:
    """A table's GB/s (% of read bandwidth) cell: by latency (`latency_bandwidth`), or by kernel time, marked,
    for a row read so (`by_kernel_time`) that has the kernel figure."""
    if by_kernel_time(row) and row.kernel_gbps is not None:
        return kernel_bandwidth(row) + KERNEL_MARK
    return latency_bandwidth(row)


def peak_pct_cell(row: Row) -> str:
    """The TFLOP/s' % of the measured peak: by latency, or by kernel time, marked, for a row read so."""
    if by_kernel_time(row) and row.kernel_pct_of_peak is not None:
        return fmt_number(row.kernel_pct_of_peak) + KERNEL_MARK
    return fmt_number(row.pct_of_peak)


def l2_text(row: Row) -> str:
    """ "warm; working set 128 MiB = 2.1x the 60 MiB L2": the L2 state each timed call found and the
    cell's working set against the L2 (n/a on a CPU)."""
    if row.l2_state is None:
        return "n/a"
    if row.l2_bytes is None:
        return row.l2_state
    l2 = f"{_mib(row.l2_bytes)} L2"
    if row.working_set_bytes is None:
        return f"{row.l2_state}; {l2}"
    ratio = row.working_set_bytes / row.l2_bytes
    return f"{row.l2_state}; working set {_mib(row.working_set_bytes)} = {ratio:.2g}x the {l2}"


def _mib(nbytes: int) -> str:
    return f"{fmt_number(nbytes / 2**20)} MiB"


def executed_text(row: Row) -> str:
    """A block-sparse kernel's executed FLOPs over the useful ones (`1.37×`); n/a for a dense variant."""
    executed, useful = row.executed_flops, row.flops
    return f"{executed / useful:.2f}×" if executed is not None and useful else "n/a"


def _clock(row: Row) -> str:
    if not row.sm_clock_mhz:
        return "n/a (not sampled: CPU, no nvidia-smi, --no-clocks or --no-timing)"
    text = (
        f"{fmt_count(row.sm_clock_mhz)} MHz median, {fmt_count(row.sm_clock_min_mhz)} lowest, "
        f"{fmt_count(row.sm_clock_max_mhz)} max"
    )
    return text + (f"; held down by {row.clock_limits}" if row.clock_limits else "")


#: The finding that says the GPU ran throttled while the latency was timed (`analysis.findings.gpu_health`).
THROTTLED = "throttled"


def _gpu_health(row: Row) -> str:
    """The GPU over the timed calls (NVML): clock against the applications clock, power, temperature, the
    reasons the driver held the clock down; led by `throttled:` when the row has that finding."""
    if row.nvml_samples is None:
        return "n/a (not sampled: CPU, NVML unavailable, --no-clocks or --no-timing)"
    parts = [f"{fmt_count(row.timed_sm_clock_mhz)} MHz median, {fmt_count(row.timed_sm_clock_min_mhz)} lowest"]
    if row.sm_clock_application_mhz:
        parts[0] += f" (applications clock {fmt_count(row.sm_clock_application_mhz)} MHz)"
    if row.timed_power_pct is not None:
        power, top = fmt_number(row.timed_power_pct), fmt_number(row.timed_power_max_pct)
        parts.append(f"power {power}% of its limit median, {top}% max")
    if row.timed_temperature_max_c is not None:
        parts.append(f"{fmt_count(row.timed_temperature_max_c)} °C max")
    if row.timed_clock_limits:
        parts.append(f"held down by {row.timed_clock_limits}")
    parts.append(f"{row.nvml_samples} NVML samples")
    text = "; ".join(parts)
    return f"{THROTTLED}: {text}" if row.finding(THROTTLED) is not None else text


def _throughput(row: Row) -> str:
    """TFLOP/s with its % of the measured peak (and the note when a best achieved figure raised it), or
    `n/a: why` when there is no meaningful peak."""
    if row.pct_of_peak is None and row.pct_of_peak_note:
        return f"{fmt_number(row.tflops)} (n/a: {row.pct_of_peak_note})"
    note = f"; {row.pct_of_peak_note}" if row.pct_of_peak_note else ""
    text = f"{fmt_number(row.tflops)} ({fmt_number(row.pct_of_peak)}%{note})"
    return text + (f" ({row.peak_reference_note})" if row.peak_reference_note else "")


def _kernel_throughput(row: Row) -> str:
    """TFLOP/s by the attention calls' device time, with its % of the measured peak when there is one."""
    if row.kernel_tflops is None:
        return "n/a"
    pct = row.kernel_pct_of_peak
    return fmt_number(row.kernel_tflops) + ("" if pct is None else f" ({fmt_number(pct)}%)")


def _bandwidth_bound(row: Row) -> str:
    """ "4,310 (95.8%), memory": achieved GB/s, its % of the measured read bandwidth and the bound, with the
    note when a best achieved figure raised the reference."""
    text = latency_bandwidth(row) + f", {row.bound or 'n/a'}"
    return text + (f" ({row.read_bandwidth_note})" if row.read_bandwidth_note else "")


def best_known_cell(row: Row) -> str:
    """ "64% of sdpa-cudnn": the row's rate in % of the best known at its cell (`pipeline.best_known`); "best"
    for the best itself; n/a without one."""
    pct = row.pct_of_best_known
    if pct is None:
        return "n/a"
    if row.best_known_variant == row.variant and row.best_known_source == "this run":
        return "best"
    return f"{fmt_number(pct)}% of {row.best_known_variant}"


def _best_known(row: Row) -> str:
    """ "at 64% of the best known at this shape (sdpa-cudnn, this run; by kernel time)", or n/a and why."""
    if row.pct_of_best_known is None:
        return "n/a (no other variant ran at this shape, and no attainable table entry for it)"
    source = f"{row.best_known_variant}, {row.best_known_source}; by {row.best_known_basis}"
    return f"at {fmt_number(row.pct_of_best_known)}% of the best known at this shape ({source})"


def _flops_text(row: Row) -> str:
    """The step's useful FLOPs, and a block-sparse kernel's executed ones with their ratio."""
    useful = row.flops
    if useful is None:
        return "n/a"
    if row.executed_flops is None:
        return f"{useful:.3g}, n/a (the variant does not report its tiles)"
    return f"{useful:.3g}, {row.executed_flops:.3g} ({executed_text(row)})"


def _backends(text: str | None) -> str:
    """`cudnn:2` as `cudnn ×2`; `n/a` without a ledger."""
    if text is None:
        return "n/a"
    return ", ".join(" ×".join(item.rsplit(":", 1)) for item in text.split())


def _overhead(ledger: AttentionRecord | None) -> str:
    """Each overhead entry of the ledger: `kind ×count/fwd time µs`."""
    if ledger is None or ledger.time_base == "cpu":
        return "n/a"  # no ledger, or one timed on the CPU (no overhead measured there)
    parts = [f"{o.kind} ×{fmt_count(o.count_per_forward)} {fmt_number(o.time_us)} µs" for o in ledger.overhead]
    return "; ".join(parts) or "none"


# ------------------------------------------------------------------ the registry

LATENCY = "latency µs ± IQR"
RUN_BANDWIDTH = "achieved GB/s (% of read bandwidth), bound"
RUN_KERNEL_BANDWIDTH = "GB/s by kernel time"  # its % of the read bandwidth in brackets, as the line above
BEST_KNOWN_HEADER = "% of best known"

METRIC_COLUMNS: list[MetricColumn] = [
    MetricColumn(
        lambda r: fmt_count(r.kernels_per_forward),
        compare=Place("status", Column("kernels/fwd", drop=7)),
        model=Place("kernel GB/s", Column("kernels/fwd", drop=6)),
    ),
    MetricColumn(
        lambda r: fmt_number(r.gpu_time_us),
        compare=Place("kernels/fwd", Column("GPU µs", drop=8)),
        model=Place("kernels/fwd", Column("GPU µs", drop=2)),
    ),
    MetricColumn(lambda r: fmt_number(r.cpu_time_us), compare=Place("GPU µs", Column("CPU µs", drop=5))),
    MetricColumn(
        latency_text,
        compare=Place("CPU µs", Column(LATENCY, narrow=17)),
        model=Place("status", Column(LATENCY, narrow=17)),
    ),
    MetricColumn(lambda r: fmt_number(r.tflops), compare=Place(LATENCY, Column("TFLOP/s (latency)", drop=3))),
    MetricColumn(
        lambda r: fmt_number(r.kernel_tflops),
        compare=Place("TFLOP/s (latency)", Column("TFLOP/s (kernels)", drop=4)),
    ),
    MetricColumn(peak_pct_cell, compare=Place("TFLOP/s (kernels)", Column("% peak", drop=2))),
    # kept to the last when a row is memory-bound (`tables.shape_columns`)
    MetricColumn(bandwidth_cell, compare=Place("% peak", Column(BANDWIDTH_HEADER, drop=1))),
    MetricColumn(
        lambda r: fmt_number(r.kernel_gbps),
        # the first to go: a table it does not fit in is as before
        compare=Place(BANDWIDTH_HEADER, Column("kernel GB/s", drop=-1)),
        model=Place("overhead", Column("kernel GB/s", drop=0)),
    ),
    MetricColumn(kernel_bandwidth, run=Place(RUN_BANDWIDTH, Column(RUN_KERNEL_BANDWIDTH))),
    MetricColumn(executed_text, compare=Place("kernel GB/s", Column("executed/useful FLOPs", drop=0))),
    MetricColumn(
        lambda r: fmt_number(r.peak_memory_mib),
        compare=Place("executed/useful FLOPs", Column("peak MiB", drop=1)),
        run=Place("FLOPs useful, executed by the kernel's tiles", Column("peak extra memory (MiB)")),
        model=Place("GPU µs", Column("peak MiB", drop=1)),
    ),
    MetricColumn(
        output_error_text,
        compare=Place("peak MiB", Column("rel err", drop=6)),
        run=Place("peak extra memory (MiB)", Column("rel. error vs float64")),
    ),
    MetricColumn(
        speedup_text,
        compare=Place("rel err", Column("speed-up")),
        model=Place(LATENCY, Column("speed-up")),
    ),
    MetricColumn(best_known_cell, compare=Place("speed-up", Column(BEST_KNOWN_HEADER, drop=3, narrow=10))),
    MetricColumn(_best_known, run=Place(RUN_KERNEL_BANDWIDTH, Column("best known at this shape"))),
    # the model table's attention ledger
    MetricColumn(lambda r: fmt_number(r.attention_gpu_pct), model=Place("speed-up", Column("attn % GPU", drop=8))),
    MetricColumn(
        lambda r: fmt_count(r.attention_calls_per_forward),
        model=Place("attn % GPU", Column("attn calls/fwd", drop=5)),
    ),
    MetricColumn(
        lambda r: _backends(r.attention_backends),
        model=Place("attn calls/fwd", Column("attn backends", narrow=14, drop=4, wide=30)),
    ),
    MetricColumn(
        lambda r: _overhead(r.attention),
        model=Place("attn impl", Column("overhead", narrow=20, drop=3, wide=40)),
    ),
    # run's summary, a line per figure
    MetricColumn(
        lambda r: latency_text(r, say_retimed=True),
        run=Place("backend dispatched", Column("latency (µs, median ± IQR)")),
    ),
    MetricColumn(l2_text, run=Place("timing method", Column("L2 while timed"))),
    MetricColumn(_clock, run=Place("L2 while timed", Column("SM clock while timed"))),
    MetricColumn(lambda r: fmt_number(r.cold_ms), run=Place("SM clock while timed", Column("cold first call (ms)"))),
    MetricColumn(_gpu_health, run=Place("SM clock while timed", Column("GPU over the timed calls (NVML)"))),
    MetricColumn(
        _throughput,
        run=Place("cold first call (ms)", Column("TFLOP/s by latency (% of measured peak)")),
    ),
    MetricColumn(
        _kernel_throughput,
        run=Place("TFLOP/s by latency (% of measured peak)", Column("TFLOP/s by kernel time (% of peak)")),
    ),
    MetricColumn(_bandwidth_bound, run=Place("TFLOP/s by kernel time (% of peak)", Column(RUN_BANDWIDTH))),
    MetricColumn(
        _flops_text,
        run=Place(RUN_KERNEL_BANDWIDTH, Column("FLOPs useful, executed by the kernel's tiles")),
    ),
    # the implementation that served the attention calls, read from their kernels' names
    MetricColumn(
        lambda r: r.attention_impl or "n/a",
        run=Place("backend dispatched", Column("attention implementation (from kernel names)")),
        model=Place("attn backends", Column("attn impl", narrow=12, drop=1, wide=30)),
    ),
]
