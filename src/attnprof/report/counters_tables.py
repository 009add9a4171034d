"""The "Kernel counters" table: what Nsight Compute measured inside each attention kernel, for `run`,
`compare` and `analyze`. Formatting only: it reads the counters' JSON form (`CellCounters.to_dict`).

One row per counted kernel of the step the counters show (the median one; `--wide` and markdown: every
kernel of the report): time, DRAM bytes and throughput, SM throughput, tensor-pipe utilisation and its
pipe, achieved and theoretical occupancy, L2 hit rate, registers, shared memory, the largest warp-stall
reasons and the kernel's place on the roofline. Fitted to a width, the less wanted columns go first
(`report.layout`); a missing figure reads n/a, never 0. Under the table: for each row, the ceilings the
placements use, the FLOPs, the time Nsight Compute took, the report, and the counters' notes.
"""

from __future__ import annotations

from typing import Any

from attnprof.report.formatting import fmt_number
from attnprof.report.layout import Column, bullets, limit, table, wrap

COUNTER_COLUMNS = (
    Column("variant", narrow=12),
    Column("kernel", narrow=20, cut=True),
    Column("µs"),
    Column("DRAM MB read / written", drop=7),
    Column("DRAM GB/s (% peak)", drop=3),
    Column("SM %", drop=2),
    Column("tensor pipe"),
    Column("occupancy achieved / theoretical", narrow=8, drop=5),
    Column("L2 hit", drop=6),
    Column("regs / shared mem", drop=1),
    Column("block / grid", drop=0),
    Column("top warp stalls", narrow=12, drop=4, wide=56),
    Column("roofline", narrow=11, wide=44),
)


def _pct(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def _mb(value: Any) -> str:
    return "n/a" if value is None else f"{value / 1e6:,.0f}"


def _kib(value: Any) -> str:
    return "n/a" if value is None else f"{value / 1024:,.1f} KB"


def _dims(value: Any) -> str:
    return "x".join(str(v) for v in value) if value else "n/a"


def kernel_cells(kernel: dict[str, Any], placement: dict[str, Any] | None, compact: bool = False) -> list[str]:
    """The cells of `COUNTER_COLUMNS` after the variant's, for one kernel and its placement (`compact`: the
    roofline in a few words, `roofline_cell`)."""
    pipe = kernel.get("tensor_pipe")
    tensor = _pct(kernel.get("tensor_pipe_pct")) + (f" {pipe}" if pipe else "")
    gbps = kernel.get("dram_gbps")
    shown = (kernel.get("stalls") or [])[: 1 if compact else None]
    stalls = ", ".join(f"{s['label']} {s['share_pct']:.0f}%" for s in shown) or "n/a"
    return [
        kernel.get("short_name") or kernel.get("name", ""),
        fmt_number(kernel.get("duration_us")),
        f"{_mb(kernel.get('dram_read_bytes'))} / {_mb(kernel.get('dram_write_bytes'))}",
        ("n/a" if gbps is None else fmt_number(gbps)) + f" ({_pct(kernel.get('dram_pct_of_peak'))})",
        _pct(kernel.get("sm_throughput_pct")),
        tensor,
        f"{_pct(kernel.get('achieved_occupancy_pct'))} / {_pct(kernel.get('theoretical_occupancy_pct'))}",
        _pct(kernel.get("l2_hit_rate_pct")),
        f"{fmt_number(kernel.get('registers_per_thread'))} / {_kib(kernel.get('shared_memory_bytes'))}",
        f"{_dims(kernel.get('block'))} / {_dims(kernel.get('grid'))}",
        stalls,
        roofline_cell(placement, compact),
    ]


def roofline_cell(placement: dict[str, Any] | None, compact: bool) -> str:
    """The placement's words, or compact (fitted tables): `compute 68%` (bound, and its % of that ceiling),
    `memory 7% (no FLOPs)`, `not placed`."""
    if placement is None:
        return "n/a"
    if not compact:
        return placement.get("text") or "n/a"
    bound, pct = placement.get("bound"), placement.get("pct_of_ceiling")
    if bound is None or pct is None:
        return "not placed"
    return f"{bound} {pct:.0f}%" + (" (no FLOPs)" if placement.get("flops") == 0 else "")


def shown_kernels(counters: dict[str, Any], every: bool) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """The kernels a table shows, each with its placement: the shown step's counted kernels, or with
    `every` every kernel of the report."""
    kernels = counters.get("kernels") or []
    placements = {p["index"]: p for p in counters.get("placements") or []}
    if every:
        chosen = list(range(len(kernels)))
    else:
        per_step, step = counters.get("kernels_per_step") or 0, counters.get("shown_step") or 0
        chosen = (counters.get("counted") or [])[step * per_step : (step + 1) * per_step]
    return [(kernels[i], placements.get(kernels[i].get("index", i))) for i in chosen if i < len(kernels)]


def ceilings_line(counters: dict[str, Any]) -> str:
    """`ceilings: matmul 989 TFLOP/s and read 4,800 GB/s (...), datasheet H200`, or that there are none."""
    peaks = counters.get("peaks") or {}
    return "ceilings: " + (peaks.get("text") or "none (no measured ceiling, no datasheet for this GPU)")


def counters_facts(counters: dict[str, Any], ceilings: bool = True) -> str:
    """One line: the GPU, the ceilings (unless `ceilings` is False), the FLOPs per step, the step shown,
    Nsight Compute's time, the report."""
    unit = counters.get("unit") or "forward"
    parts = [f"on {counters['device']}" if counters.get("device") else "GPU not named in the report"]
    if ceilings:
        parts.append(ceilings_line(counters))
    flops = counters.get("flops_per_step")
    if flops is not None:
        parts.append(f"{flops / 1e12:,.3g} TFLOP per {unit}, split by tensor-pipe time")
    steps = counters.get("steps") or 0
    if steps > 1:
        parts.append(f"{unit} {(counters.get('shown_step') or 0) + 1} of {steps} shown (the median by time)")
    if counters.get("seconds") is not None:
        parts.append(f"Nsight Compute took {fmt_number(float(counters['seconds']))} s")
    if counters.get("report_path"):
        parts.append(f"report {counters['report_path']}")
    return "; ".join(parts) + "."


def counters_report(items: list[tuple[str, dict[str, Any]]], fmt: str, width: int | None = None) -> str:
    """The "Kernel counters" table of several rows, `items` (label, counters dict; label "" for one set of
    counters, e.g. `analyze`), then for each its facts, its match with the trace and its notes; fitted to
    `width` (None: every kernel of the reports, every column)."""
    width = limit(width, fmt)
    labelled = any(label for label, _ in items)
    columns = COUNTER_COLUMNS if labelled else COUNTER_COLUMNS[1:]
    rows = [
        ([label] if labelled else []) + kernel_cells(kernel, placement, compact=width is not None)
        for label, counters in items
        for kernel, placement in shown_kernels(counters, width is None)
    ]
    parts = [table(columns, rows, fmt, width)] if rows else []
    shared = {ceilings_line(counters) for _, counters in items}
    lines: list[str] = []
    if len(items) > 1 and len(shared) == 1:
        line = next(iter(shared))
        lines.append(line[0].upper() + line[1:] + ".")
    for label, counters in items:
        lead = f"{label}: " if label else ""
        lines.append(lead + counters_facts(counters, ceilings=len(items) == 1 or len(shared) > 1))
        if counters.get("match"):
            lines.append(lead + counters["match"]["text"] + ".")
        lines += [lead + note for note in (counters.get("occupancy_measured") or [])]
        lines += [lead + note for note in counters.get("notes") or []]
    if lines:
        parts += ["", bullets(lines, width) if fmt == "table" else "\n".join(f"- {line}" for line in lines)]
    return "\n".join(parts)


def counters_heading(fmt: str, width: int | None, unit: str = "forward") -> list[str]:
    """The section's heading and the line that says how to read it."""
    title = "Kernel counters (Nsight Compute)"
    heading = f"### {title}" if fmt == "markdown" else title
    intro = (
        f"One {unit}'s kernels as Nsight Compute measured them (it replays each kernel, by default at base "
        "clocks: its times may differ from the trace's); tensor pipe: cycles it was active, of the SMs' "
        "active cycles; top warp stalls: shares of the stalled warps' reasons; roofline: the kernel's share "
        "of the FLOPs over its DRAM bytes against the ceilings, and its % of the ceiling that bounds it (the "
        "matmul ceiling or the read bandwidth)."
    )
    return [heading, "", *wrap(intro, limit(width, fmt))]


def counters_section(
    items: list[tuple[str, dict[str, Any] | None]], fmt: str, width: int | None = None, unit: str = "forward"
) -> list[str]:
    """The heading, the line on how to read it and `counters_report` of the items that have counters;
    [] when none has."""
    present = [(label, counters) for label, counters in items if counters]
    if not present:
        return []
    return [*counters_heading(fmt, width, unit), "", counters_report(present, fmt, width)]
