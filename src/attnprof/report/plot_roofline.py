"""The roofline plot: each attention kernel Nsight Compute counted (`--ncu`) at its arithmetic intensity and
TFLOP/s, under the matmul ceiling and the read bandwidth. The placements are the row's counters'
(`analysis.counters.CellCounters`, read back from the row); this module only draws them."""

from __future__ import annotations

from collections import Counter
from typing import Any

from attnprof.analysis.hardware import Peaks
from attnprof.report.plot_style import (
    GUIDE_COLOUR,
    NOTE_COLOUR,
    NothingToPlot,
    Series,
    Style,
    canvas,
    finish,
    line_style,
    log_axis,
    number,
    ok_rows,
    series_key,
)
from attnprof.results.records import counters_of
from attnprof.results.schema import Row

#: The title of the roofline plot (`plots.PLOTS["roofline"]`).
TITLE = "Attention kernels on the roofline (Nsight Compute)"

#: The most kernels a roofline names beside their points (more: the legend and colours alone).
NAMED_POINTS = 12


def _counted_points(rows: list[Row]) -> tuple[list[Series], list[Peaks], int]:
    """The roofline's points, one series per row with counters (x: FLOPs per DRAM byte, y: TFLOP/s, each
    point labelled with its kernel's short name), the distinct ceilings, and how many kernels of the shown
    steps had no FLOPs to place (no matmul work on the tensor pipe, or FLOPs unknown)."""
    drawn: list[Series] = []
    peaks: dict[tuple[float, float], Peaks] = {}
    unplaced = 0
    for row in ok_rows(rows):
        if not row.counters:
            continue
        counters = counters_of(row.counters)
        item = Series(row.variant, series_key(row))
        shown = counters.shown
        for kernel, placement in zip(shown.kernels, shown.placements, strict=True):
            x, y = number(placement.intensity), number(placement.tflops)
            if x is None or y is None or x <= 0 or y <= 0:
                unplaced += 1
                continue
            item.points.append((x, y, row))
            item.labels.append(kernel.short_name or kernel.name)
        if item.points:
            drawn.append(item)
        found = counters.peaks
        if found is not None and found.tensor_tflops and found.read_gbps:
            peaks[(found.tensor_tflops, found.read_gbps)] = found
    return drawn, list(peaks.values()), unplaced


def roofline_figure(rows: list[Row], style: Style) -> Any:
    """Each counted attention kernel at its arithmetic intensity (its share of the step's FLOPs over the DRAM
    bytes Nsight Compute measured) and its TFLOP/s, log-log, under the roofs: the matmul ceiling and the read
    bandwidth (measured, else the datasheet), with each ridge point."""
    drawn, peaks, unplaced = _counted_points(rows)
    if not drawn:
        why = (
            "no row has hardware counters (--ncu)"
            if not any(r.counters for r in rows)
            else ("no counted kernel has a place on the roofline (no FLOPs, DRAM bytes or time)")
        )
        raise NothingToPlot(why)
    plot = canvas(width=8.5, height=6.0)
    ax = plot.axes[0]
    points = [(x, y) for item in drawn for x, y, _row in item.points]
    xs = [x for x, _ in points] + [p.tensor_tflops * 1e3 / p.read_gbps for p in peaks]
    ys = [y for _, y in points] + [p.tensor_tflops for p in peaks]
    low_x, high_x = min(xs) / 8, max(xs) * 8
    extra = []
    for n, found in enumerate(peaks):
        ridge = found.tensor_tflops * 1e3 / found.read_gbps
        roof_x = [low_x, ridge, high_x]
        roof_y = [low_x * found.read_gbps / 1e3, found.tensor_tflops, found.tensor_tflops]
        basis = "measured" if found.basis == "measured" else (found.source or "").rsplit(" ", 2)[0]
        label = f"{found.tensor_tflops:,.0f} TFLOP/s matmul,\n{found.read_gbps:,.0f} GB/s read ({basis})"
        style_n = ("-", "--", ":")[n % 3]
        (roof,) = ax.plot(roof_x, roof_y, color=GUIDE_COLOUR, linestyle=style_n, linewidth=1.2, label=label)
        ax.annotate(
            f"ridge {ridge:,.0f}",
            (ridge, found.tensor_tflops),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=7,
            color=NOTE_COLOUR,
        )
        extra.append(roof)
    for item in drawn:
        kwargs = line_style(item, style)
        ax.plot(
            [p[0] for p in item.points],
            [p[1] for p in item.points],
            linestyle="none",
            marker=kwargs["marker"],
            markersize=8,
            color=kwargs["color"],
        )

    # Colour and marker already say which cell a point is: kernels are named only where a cell has several.
    def cell(row: Row) -> tuple[Any, ...]:
        return (row.variant, row.batch, row.heads, row.kv_heads, row.seq, row.head_dim, row.mode)

    per_cell = Counter(cell(row) for item in drawn for _x, _y, row in item.points)
    if len(points) <= NAMED_POINTS:
        named = 0
        for item in drawn:
            for (x, y, row), name in zip(item.points, item.labels, strict=True):
                if per_cell[cell(row)] < 2:
                    continue
                ax.annotate(
                    name if len(name) <= 28 else name[:27] + "…",
                    (x, y),
                    textcoords="offset points",
                    xytext=(6, (-3, 7, -13)[named % 3]),  # neighbours' labels step apart
                    fontsize=7,
                    color=line_style(item, style)["color"],
                )
                named += 1
    ax.set_xlim(low_x, high_x)
    ax.set_ylim(min(ys) / 4, max(ys) * 2)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte read and written, Nsight Compute)")
    ax.set_ylabel("TFLOP/s (the kernel's share of the step's FLOPs / its time)")
    notes = [
        "a kernel's FLOPs: the step's analytic FLOPs split across its kernels by tensor-pipe-active time",
        "times are Nsight Compute's (each kernel replayed, by default at base clocks)",
    ]
    if unplaced:
        notes.append(f"{unplaced} kernel(s) without FLOPs (no matmul work on the tensor pipe) are not drawn")
    return finish(plot, TITLE, style, drawn, notes, extra)
