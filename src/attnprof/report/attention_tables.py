"""The attention ledger of a trace analysis (`AttentionRecord`), per forward (or step): a summary line, one
row per attention call (with its bytes and GB/s where the ledger has them) and one per overhead kind.
Formatting only, for `report.analysis_tables`."""

from __future__ import annotations

from attnprof.report.formatting import fmt_number
from attnprof.report.kernel_tables import per_unit
from attnprof.report.layout import Column, table, wrap
from attnprof.results.parts import AttentionRecord, CallRecord, OverheadRecord

CALL_COLUMNS = (
    Column("#"),
    Column("attention call", narrow=24),
    Column("backend"),
    Column("implementation", narrow=12, drop=5),
    Column("phase", drop=2),
    Column("kernels", drop=1),
    Column("µs / fwd"),
)
BYTES_COLUMNS = (Column("MB / fwd", drop=3), Column("GB/s (% read bw)", drop=4))
OVERHEAD_COLUMNS = (
    Column("overhead"),
    Column("count / fwd"),
    Column("µs / fwd"),
    Column("launched by", narrow=20, drop=1),
)
CHAINS_SHOWN = 2


def gbps_text(gbps: float) -> str:
    """GB/s: whole above 100 ("4,359"), else three significant digits ("0.848", as on a CPU)."""
    return f"{gbps:,.0f}" if gbps >= 100 else f"{gbps:.3g}"


def _rate(gbps: float | None, pct: float | None) -> str:
    """ "4,359 (90.8%)": GB/s and its % of the read bandwidth; "" without a rate."""
    if gbps is None:
        return ""
    return gbps_text(gbps) + ("" if pct is None else f" ({pct:g}%)")


def _megabytes(value: float | None) -> str:
    return "" if value is None else f"{value / 1e6:,.1f}"


def ledger_line(ledger: AttentionRecord, unit: str) -> str:
    """The ledger in one sentence: calls and backends, the implementations that served them, their time and
    share, bytes and GB/s, overhead."""
    backends = ", ".join(f"{b}:{n}" for b, n in ledger.backends.items())
    on_cpu = ledger.time_base == "cpu"
    backward = sum(1 for c in ledger.calls if c.phase == "backward")
    counts = f"{fmt_number(ledger.calls_per_forward)} attention call(s)"
    if backward:  # a training step's (or a backward alone's) calls: the forward count says nothing of them
        counts = f"{fmt_number(ledger.calls_per_forward)} forward and {backward} backward attention call(s)"
    line = f"{counts} per {unit}" + (f" ({backends})" if backends else "")
    line += f"; their {'CPU' if on_cpu else 'device'} time {fmt_number(ledger.kernel_time_us)} µs per {unit}"
    if ledger.attention_impl is not None:
        line += f", served by {ledger.attention_impl}"
    if ledger.gpu_time_pct is not None:
        line += f", {fmt_number(ledger.gpu_time_pct)}% of the GPU time"
    if ledger.cpu_time_pct is not None:
        line += f", {fmt_number(ledger.cpu_time_pct)}% of the CPU time"
    if ledger.backward_kernel_time_us is not None:
        line += f" ({fmt_number(ledger.backward_kernel_time_us)} µs of it in the backward)"
    if ledger.bytes_per_forward is not None:
        line += f"; they move {ledger.bytes_per_forward / 1e6:,.1f} MB per {unit}"
        if ledger.achieved_gbps is not None:
            line += f" at {gbps_text(ledger.achieved_gbps)} GB/s"
        if ledger.pct_of_read_bandwidth is not None:
            line += f", {ledger.pct_of_read_bandwidth:g}% of the {ledger.read_bandwidth_source}"
    if on_cpu:
        return line + " (a CPU-only trace: times are the calls' ops on the CPU)."
    return line + f"; overhead around them {fmt_number(ledger.overhead_us)} µs per {unit}."


def calls_table(calls: list[CallRecord], on_cpu: bool, fmt: str, width: int | None, unit: str) -> str:
    """One row per attention call; its MB and GB/s columns when some call has bytes."""
    with_bytes = any(c.bytes is not None for c in calls)
    rows = [
        [
            str(i + 1),
            c.op,
            _backend(c),
            c.attention_impl or "n/a",
            c.phase if c.forward_call is None else f"{c.phase} of #{c.forward_call + 1}",
            "n/a" if on_cpu else str(len(c.kernels)),
            fmt_number(c.time_us),
        ]
        + ([_megabytes(c.bytes), _rate(c.achieved_gbps, c.pct_of_read_bandwidth)] if with_bytes else [])
        for i, c in enumerate(calls)
    ]
    return table(per_unit(CALL_COLUMNS + (BYTES_COLUMNS if with_bytes else ()), unit), rows, fmt, width)


def _backend(call: CallRecord) -> str:
    """The call's backend, with its packed sequences where it runs on some: `math (nested, 8 sequences)`."""
    varlen = call.varlen
    if varlen is None:
        return call.backend
    count = "" if varlen.sequences is None else f", {varlen.sequences} sequences"
    return f"{call.backend} ({varlen.kind}{count})"


def overhead_table(overhead: list[OverheadRecord], fmt: str, width: int | None, unit: str) -> str:
    """One row per kind of work around the calls, with its first `CHAINS_SHOWN` op chains."""
    rows = [
        [
            o.kind,
            fmt_number(o.count_per_forward),
            fmt_number(o.time_us),
            "; ".join(o.ops[:CHAINS_SHOWN]) + (" …" if len(o.ops) > CHAINS_SHOWN else ""),
        ]
        for o in overhead
    ]
    return table(per_unit(OVERHEAD_COLUMNS, unit), rows, fmt, width)


def attention_section(
    ledger: AttentionRecord | None, fmt: str, width: int | None = None, unit: str = "forward"
) -> list[str]:
    """The attention ledger: a summary line, one row per call and one per overhead kind ([] without a ledger)."""
    if ledger is None:
        return []
    parts = [*wrap(ledger_line(ledger, unit), width)]
    if ledger.calls:
        parts += ["", calls_table(ledger.calls, ledger.time_base == "cpu", fmt, width, unit)]
    if ledger.overhead:
        parts += ["", overhead_table(ledger.overhead, fmt, width, unit)]
    return parts
