"""The "Kernel counters" table: what Nsight Compute measured inside each attention kernel, for `run`,
`compare`, `model` and `analyze`. Formatting only: it reads typed counters, `CellCounters` (a row's
`counters` JSON read back by `counted`, which also keeps the notes on which occupancies Nsight Compute measured).

One row per counted kernel of the step the counters show (the median one; `--wide` and markdown: every
kernel of the report): time, DRAM bytes and throughput, SM throughput, tensor-pipe utilisation and its
pipe, achieved and theoretical occupancy, L2 hit rate, registers, shared memory, the largest warp-stall
reasons and the kernel's place on the roofline. Fitted to a width, the less wanted columns go first
(`report.layout`); a missing figure reads n/a, never 0. Under the table: for each row, the ceilings the
placements use, the FLOPs, the time Nsight Compute took, the report, and the counters' notes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from attnprof.analysis.counters.cell import CellCounters, ceilings_text
from attnprof.analysis.counters.kernel import KernelCounters
from attnprof.analysis.counters.roofline import KernelPlacement
from attnprof.report.formatting import fmt_number
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.results.parts import CountersRecord
from attnprof.results.records import counters_of

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


@dataclass(frozen=True)
class Counted:
    """One set of counters a table shows: its label ("" for the one set of `analyze`), the counters and the
    notes on the occupancies Nsight Compute measured (`occupancy_measured` of the row's counters)."""

    label: str
    counters: CellCounters
    occupancy_measured: list[str] = field(default_factory=list)


def counted(label: str, found: CountersRecord | None) -> Counted | None:
    """A row's `counters` as the tables read them; None without."""
    if found is None:
        return None
    return Counted(label, counters_of(found), list(found.occupancy_measured))


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:,.0f}"


def _kib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1024:,.1f} KB"


def _dims(value: Sequence[int] | None) -> str:
    return "x".join(str(v) for v in value) if value else "n/a"


def kernel_cells(kernel: KernelCounters, placement: KernelPlacement | None, compact: bool = False) -> list[str]:
    """The cells of `COUNTER_COLUMNS` after the variant's, for one kernel and its placement (`compact`: the
    roofline in a few words, `roofline_cell`)."""
    pipe = kernel.tensor_pipe
    tensor = _pct(kernel.tensor_pipe_pct) + (f" {pipe}" if pipe else "")
    gbps = kernel.dram_gbps
    shown = kernel.stalls[: 1 if compact else None]
    stalls = ", ".join(f"{s.label} {s.share_pct:.0f}%" for s in shown) or "n/a"
    return [
        kernel.short_name or kernel.name,
        fmt_number(kernel.duration_us),
        f"{_mb(kernel.dram_read_bytes)} / {_mb(kernel.dram_write_bytes)}",
        ("n/a" if gbps is None else fmt_number(gbps)) + f" ({_pct(kernel.dram_pct_of_peak)})",
        _pct(kernel.sm_throughput_pct),
        tensor,
        f"{_pct(kernel.achieved_occupancy_pct)} / {_pct(kernel.theoretical_occupancy_pct)}",
        _pct(kernel.l2_hit_rate_pct),
        f"{fmt_number(kernel.registers_per_thread)} / {_kib(kernel.shared_memory_bytes)}",
        f"{_dims(kernel.block)} / {_dims(kernel.grid)}",
        stalls,
        roofline_cell(placement, compact),
    ]


def roofline_cell(placement: KernelPlacement | None, compact: bool) -> str:
    """The placement's words, or compact (fitted tables): `compute 68%` (bound, and its % of that ceiling),
    `memory 7% (no FLOPs)`, `not placed`."""
    if placement is None:
        return "n/a"
    if not compact:
        return placement.text or "n/a"
    bound, pct = placement.bound, placement.pct_of_ceiling
    if bound is None or pct is None:
        return "not placed"
    return f"{bound} {pct:.0f}%" + (" (no FLOPs)" if placement.flops == 0 else "")


def shown_kernels(counters: CellCounters, every: bool) -> list[tuple[KernelCounters, KernelPlacement | None]]:
    """The kernels a table shows, each with its placement: the shown step's counted kernels, or with
    `every` every kernel of the report."""
    kernels = counters.kernels
    placements = {p.index: p for p in counters.placements}
    if every:
        chosen = list(range(len(kernels)))
    else:
        per_step, step = counters.kernels_per_step, counters.shown_step
        chosen = counters.counted[step * per_step : (step + 1) * per_step]
    return [(kernels[i], placements.get(kernels[i].index)) for i in chosen if i < len(kernels)]


def ceilings_line(counters: CellCounters) -> str:
    """`ceilings: matmul 989 TFLOP/s and read 4,800 GB/s (...), datasheet H200`, or that there are none."""
    if counters.peaks is None:
        return "ceilings: none (no measured ceiling, no datasheet for this GPU)"
    return "ceilings: " + ceilings_text(counters.peaks)


def counters_facts(counters: CellCounters, ceilings: bool = True) -> str:
    """One line: the GPU, the ceilings (unless `ceilings` is False), the FLOPs per step, the step shown,
    Nsight Compute's time, the report."""
    unit = counters.unit or "forward"
    parts = [f"on {counters.device}" if counters.device else "GPU not named in the report"]
    if ceilings:
        parts.append(ceilings_line(counters))
    if counters.flops_per_step is not None:
        parts.append(f"{counters.flops_per_step / 1e12:,.3g} TFLOP per {unit}, split by tensor-pipe time")
    if counters.steps > 1:
        parts.append(f"{unit} {counters.shown_step + 1} of {counters.steps} shown (the median by time)")
    if counters.seconds is not None:
        parts.append(f"Nsight Compute took {fmt_number(float(counters.seconds))} s")
    if counters.report_path:
        parts.append(f"report {counters.report_path}")
    return "; ".join(parts) + "."


def counters_report(items: Sequence[Counted], fmt: str, width: int | None = None) -> str:
    """The "Kernel counters" table of several rows' counters (a label "" for one set of counters, e.g.
    `analyze`), then for each its facts, its match with the trace and its notes; fitted to `width` (None:
    every kernel of the reports, every column)."""
    width = limit(width, fmt)
    labelled = any(item.label for item in items)
    columns = COUNTER_COLUMNS if labelled else COUNTER_COLUMNS[1:]
    rows = [
        ([item.label] if labelled else []) + kernel_cells(kernel, placement, compact=width is not None)
        for item in items
        for kernel, placement in shown_kernels(item.counters, width is None)
    ]
    parts = [table(columns, rows, fmt, width)] if rows else []
    shared = {ceilings_line(item.counters) for item in items}
    lines: list[str] = []
    if len(items) > 1 and len(shared) == 1:
        line = next(iter(shared))
        lines.append(line[0].upper() + line[1:] + ".")
    for item in items:
        lead = f"{item.label}: " if item.label else ""
        lines.append(lead + counters_facts(item.counters, ceilings=len(items) == 1 or len(shared) > 1))
        if item.counters.match is not None:
            lines.append(lead + item.counters.match.text + ".")
        lines += [lead + note for note in item.occupancy_measured]
        lines += [lead + note for note in item.counters.notes]
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
    items: Sequence[tuple[str, CountersRecord | None]], fmt: str, width: int | None = None, unit: str = "forward"
) -> list[str]:
    """The heading, the line on how to read it and `counters_report` of the items that have counters: (label,
    a row's `counters`, None for a row without), typed by `counted`; [] when none has."""
    present = [item for label, data in items if (item := counted(label, data)) is not None]
    if not present:
        return []
    return [*counters_heading(fmt, width, unit), "", counters_report(present, fmt, width)]
