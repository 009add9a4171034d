"""The kernels of a trace analysis, per forward (or step): one row per distinct kernel, memcpy or memset
(`KernelRecord`), and for a CPU-only trace the top ops by self CPU time instead (`CpuOpRecord`).
Formatting only, for `report.analysis_tables` and the HTML report.

An occupancy the profiler did not report reads "unreported"; tensor cores read yes / no / ?; kernel
names are cut to `NAME_WIDTH` in the table style. Headers count per step where the instances run a
backward (`per_unit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from attnprof.report.formatting import fmt_number
from attnprof.report.layout import Column, table
from attnprof.results.parts import CpuOpRecord, KernelRecord

NAME_WIDTH = 60

KERNEL_COLUMNS = (
    Column("kernel", narrow=40, cut=True),
    Column("count / fwd", drop=8),
    Column("µs / fwd"),
    Column("grid", drop=5),
    Column("block", drop=1),
    Column("regs", drop=2),
    Column("shared mem", drop=3),
    Column("achieved occ.", drop=6),
    Column("theoretical occ.", drop=7),
    Column("tensor cores", drop=9),
    Column("launched by", drop=4),
)
CPU_OP_COLUMNS = (
    Column("op", narrow=30, cut=True),
    Column("calls / fwd"),
    Column("self CPU µs"),
    Column("self CPU %"),
    Column("CPU total µs", drop=2),
    Column("input shapes", narrow=16, drop=1),
)


def pct_text(value: float | None) -> str:
    """`42.5%`; `n/a` when missing."""
    return "n/a" if value is None else f"{value:g}%"


def per_unit(columns: tuple[Column, ...], unit: str) -> tuple[Column, ...]:
    """The columns with `/ fwd` read as `/ step` when an instance is a step."""
    if unit == "forward":
        return columns
    return tuple(replace(c, header=c.header.replace("/ fwd", "/ step")) for c in columns)


def short(name: str, fmt: str) -> str:
    """The name, cut to `NAME_WIDTH` with "…" in the table style."""
    if fmt == "table" and len(name) > NAME_WIDTH:
        return name[: NAME_WIDTH - 1] + "…"
    return name


def _dims(value: Sequence[int] | None) -> str:
    return "x".join(str(v) for v in value) if value else ""


def _bytes(value: int | None) -> str:
    if value is None:
        return ""
    if value >= 1024:
        return f"{value / 1024:,.1f} KB"
    return f"{value} B"


def _tensor_cores(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def kernel_table(kernels: Sequence[KernelRecord], fmt: str, width: int | None = None, unit: str = "forward") -> str:
    """One row per distinct kernel, memcpy or memset, in the order they first ran (counts and times per `unit`)."""
    return table(per_unit(KERNEL_COLUMNS, unit), kernel_rows(kernels, fmt), fmt, width)


def kernel_rows(kernels: Sequence[KernelRecord], fmt: str) -> list[list[str]]:
    """The cells of `KERNEL_COLUMNS` for each kernel (names cut to NAME_WIDTH in the table style)."""
    rows = []
    for k in kernels:
        achieved = pct_text(k.achieved_occupancy_pct)
        if k.achieved_occupancy_pct is None:
            achieved = "unreported" if k.kind == "kernel" else ""
        theoretical = ""
        if k.theoretical_occupancy_pct is not None:
            theoretical = pct_text(k.theoretical_occupancy_pct)
            if k.occupancy_limiter:
                theoretical += f" ({k.occupancy_limiter})"
        rows.append(
            [
                short(k.short_name or k.name, fmt),
                fmt_number(k.count_per_forward),
                fmt_number(k.time_us),
                _dims(k.grid),
                _dims(k.block),
                "" if k.registers_per_thread is None else str(k.registers_per_thread),
                _bytes(k.shared_memory_bytes),
                achieved,
                theoretical,
                _tensor_cores(k.tensor_cores),
                k.launch_api or "",
            ]
        )
    return rows


def cpu_ops_table(
    ops: Sequence[CpuOpRecord] | None, fmt: str, width: int | None = None, unit: str = "forward"
) -> str | None:
    """A CPU-only trace's top ops by self CPU time per instance, as key_averages counts them; None without."""
    if not ops:
        return None
    columns = (CPU_OP_COLUMNS[0], replace(CPU_OP_COLUMNS[1], header=f"calls / {unit}"), *CPU_OP_COLUMNS[2:])
    rows = [
        [
            short(op.name, fmt),
            fmt_number(op.calls_per_forward),
            fmt_number(op.self_cpu_us),
            pct_text(None if op.self_cpu_pct is None else round(op.self_cpu_pct, 1)),
            fmt_number(op.cpu_total_us),
            op.input_shapes or "",
        ]
        for op in ops
    ]
    return table(columns, rows, fmt, width)
