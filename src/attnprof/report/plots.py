"""Plots of results rows (matplotlib, the `plot` extra): one function per plot, rows in, figure out.

Only ok rows are drawn (see `plot_style` for series, colours and the legend). A plot with nothing to
show raises `NothingToPlot` with the reason in one line; `figures` collects those as skip reasons.
`write_figures` writes PNG and SVG files, never over an existing one; `svg_bytes` gives the SVG the
HTML report embeds. matplotlib is imported inside functions and draws through Agg, never a GUI.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnprof.errors import MissingExtraError, OutputError
from attnprof.files import create_new
from attnprof.report.formatting import fmt_number
from attnprof.report.plot_roofline import TITLE as ROOFLINE_TITLE
from attnprof.report.plot_roofline import roofline_figure
from attnprof.report.plot_style import (
    GUIDE_COLOUR,
    NOTE_COLOUR,
    NothingToPlot,
    Series,
    Style,
    canvas,
    dodge_note,
    dodged,
    finish,
    line_style,
    log_axis,
    number,
    ok_rows,
    seq_axis,
    series,
    style_for,
    tick,
)
from attnprof.results.schema import Row

#: Every plot, in the order they are drawn: file stem and title.
PLOTS = {
    "bars": "Latency by variant",
    "latency": "Latency against sequence length",
    "throughput": "Throughput against sequence length",
    "memory": "Peak memory against sequence length",
    "kernels": "Kernels per forward against sequence length",
    "gpu_vs_cpu": "GPU time against CPU time per forward",
    "roofline": ROOFLINE_TITLE,
}
#: The most shape × mode cells drawn as bar charts (a sweep has more: its latency plot draws them).
MAX_BAR_PANELS = 8
FORMATS = ("png", "svg")
DPI = 150
INSTALL = "attnprof plot needs matplotlib: pip install 'attnprof[plot]'"


def matplotlib_available() -> None:
    """Raise MissingExtraError (exit 2) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError(INSTALL) from None


def _seq_series(rows: list[Row], value: Callable[[Row], Any], what: str) -> list[Series]:
    """The series of `value` against seq; NothingToPlot when no ok row has it, or all at one seq."""
    drawn = series(rows, _seq, value)
    if not drawn:
        raise NothingToPlot(f"no ok row has {what}")
    seqs = {point[0] for item in drawn for point in item.points}
    if len(seqs) < 2:
        raise NothingToPlot(f"every row with {what} has the same sequence length ({tick(seqs.pop())})")
    return drawn


def _lines(ax: Any, drawn: list[Series], style: Style, dodge: bool = True) -> None:
    """One line per series; against sequence length (`dodge`) with each variant's points shifted sideways."""
    for item in drawn:
        xs = dodged(item, style) if dodge else [p[0] for p in item.points]
        ax.plot(xs, [p[1] for p in item.points], **line_style(item, style))


def _seqs(drawn: list[Series]) -> list[float]:
    return [point[0] for item in drawn for point in item.points]


def _seq(row: Row) -> int | None:
    return row.seq


def _spread(points: list[tuple[float, float, Row]]) -> list[list[float]]:
    """Bars below and above each point to the 25th and 75th percentile of its row's latency (none when missing)."""
    below = [max(y - (number(row.latency_p25_us) or y), 0.0) for _x, y, row in points]
    above = [max((number(row.latency_p75_us) or y) - y, 0.0) for _x, y, row in points]
    return [below, above]


def latency_figure(rows: list[Row], style: Style) -> Any:
    """Median latency against seq, log-log, with 25th-75th percentile bars; hollow markers: unstable."""
    drawn = _seq_series(rows, lambda row: row.latency_us, "a latency")
    plot = canvas()
    ax = plot.axes[0]
    unstable = False
    for item in drawn:
        kwargs = line_style(item, style)
        xs, ys = dodged(item, style), [p[1] for p in item.points]
        ax.errorbar(xs, ys, yerr=_spread(item.points), capsize=2, **kwargs)
        shaky = [(x, p[1]) for x, p in zip(xs, item.points, strict=True) if p[2].unstable]
        unstable = unstable or bool(shaky)
        if shaky:
            ax.plot(
                [x for x, _y in shaky],
                [y for _x, y in shaky],
                linestyle="none",
                marker=kwargs["marker"],
                markersize=7,
                markerfacecolor="white",
                markeredgecolor=kwargs["color"],
                zorder=3,
            )
    seq_axis(ax, _seqs(drawn))
    log_axis(ax, "y")
    ax.set_ylabel("latency (µs, median of the timed calls)")
    notes = ["bars: 25th to 75th percentile of the timed calls"]
    if unstable:
        notes.append("hollow markers: unstable timing (IQR over 10% of the median, also when re-timed)")
    return finish(plot, PLOTS["latency"], style, drawn, notes + dodge_note(style), [])


def bars_figure(rows: list[Row], style: Style) -> Any:
    """Per shape × mode, one horizontal bar per variant: its median latency, fastest at the top, with
    25th-75th percentile whiskers and the speed-up over the baseline; rows that did not run are named
    below the bars with their status."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = _bar_groups(rows)
    if not groups:
        raise NothingToPlot("no ok row has a latency")
    if len(groups) > MAX_BAR_PANELS:
        raise NothingToPlot(
            f"{len(groups)} shape × mode cells, more than {MAX_BAR_PANELS} bar charts; the latency plot draws them"
        )
    columns = 1 if len(groups) == 1 else 2
    heights = [0.5 + 0.32 * _bar_rows(group) for group in groups]
    row_heights = [max(heights[i : i + columns]) for i in range(0, len(groups), columns)]
    figure: Any = Figure(
        figsize=(9.0 if columns == 1 else 7.5 * columns, 1.2 + sum(row_heights) + 0.55 * len(row_heights)),
        layout="constrained",
    )
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(row_heights), columns, height_ratios=row_heights)
    unstable = False
    for index, group in enumerate(groups):
        ax = figure.add_subplot(grid[index // columns, index % columns])
        unstable = _bar_panel(ax, group, style) or unstable
    notes = ["bars: median latency, fastest at the top; whiskers: 25th to 75th percentile; speed-up over the baseline"]
    if any(not number(r.latency_us) for group in groups for r in group):
        notes.append("not run: the variants of that cell without a latency, by status")
    if unstable:
        notes.append("hatched: unstable timing (IQR over 10% of the median, also when re-timed)")
    figure.suptitle(PLOTS["bars"] + (f"\n{style.common}" if style.common else ""), fontsize=12)
    figure.supxlabel("\n".join(notes), fontsize=8, color=NOTE_COLOUR, x=0.01, ha="left")
    return figure


def _bar_panel(ax: Any, group: list[Row], style: Style) -> bool:
    """One shape × mode: a bar per variant with a latency, fastest at the top, labelled with the latency
    and speed-up, and one last row naming the others by status. True when a bar is unstable (hatched)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    from attnprof.report.columns import speedup_text
    from attnprof.report.tables import cell_label, variant_label

    timed = [(row, value) for row in group if (value := number(row.latency_us))]
    timed.sort(key=lambda hit: hit[1])
    ran, values = [row for row, _ in timed], [value for _, value in timed]
    idle: dict[str, list[str]] = {}
    for row in group:
        if not number(row.latency_us):
            word = row.status.partition(":")[0]
            idle.setdefault("no latency" if word in ("", "ok") else word, []).append(variant_label(row, group))
    spread = _spread([(0.0, v, r) for v, r in zip(values, ran, strict=True)])
    bars = ax.barh(
        range(len(ran)),
        values,
        xerr=spread,
        color=[style.colours.get(r.variant, GUIDE_COLOUR) for r in ran],
        error_kw={"capsize": 2, "elinewidth": 1, "ecolor": "#333333"},
        height=0.7,
    )
    unstable = False
    for bar, row in zip(bars, ran, strict=True):
        if row.unstable:
            bar.set_hatch("///")
            bar.set_edgecolor("white")
            unstable = True
    top = max(v + above for v, above in zip(values, spread[1], strict=True))
    for y, (value, row, above) in enumerate(zip(values, ran, spread[1], strict=True)):
        speedup = speedup_text(row)
        text = f"{fmt_number(value)} µs" + ("" if speedup == "n/a" else f"  {speedup}")
        ax.text(value + above + top * 0.015, y, text, va="center", fontsize=8)
    labels = [variant_label(r, group) for r in ran]
    if idle:
        text = "; ".join(f"{word}: {', '.join(names)}" for word, names in idle.items())
        ax.text(top * 0.015, len(ran), text, va="center", fontsize=8, color="#777777")
        labels.append("not run")
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.32)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(tick))
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(cell_label(group[0]), fontsize=10)
    ax.set_xlabel("median latency (µs)", fontsize=9)
    return unstable


def _bar_rows(group: list[Row]) -> int:
    """The rows of one bar panel: a bar per variant with a latency, and one for all the others."""
    timed = sum(1 for r in group if number(r.latency_us))
    return timed + (timed < len(group))


def _bar_groups(rows: list[Row]) -> list[list[Row]]:
    """The rows of each shape × mode (file order) where at least one ok row has a latency."""
    groups: dict[tuple[Any, Any], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.shape or row.seq, row.mode or "fwd"), []).append(row)
    return [group for group in groups.values() if any(number(r.latency_us) for r in ok_rows(group))]


def throughput_figure(rows: list[Row], style: Style) -> Any:
    """TFLOP/s against seq and, in a second panel, the % of the measured matmul ceiling (when known)."""
    drawn = _seq_series(rows, lambda row: row.tflops, "a TFLOP/s figure")
    percent = series(rows, _seq, lambda row: row.pct_of_peak)
    plot = canvas(panels=2 if percent else 1, width=12.0 if percent else 9.0)
    _lines(plot.axes[0], drawn, style)
    values = [p[1] for item in drawn for p in item.points]
    if max(values) / min(values) > 20:
        plot.axes[0].set_yscale("log")  # labelled by log_axis once the limits are final
    else:
        plot.axes[0].set_ylim(bottom=0)
    plot.axes[0].set_ylabel("TFLOP/s (analytic attention FLOPs / latency)")
    notes = []
    if percent:
        _lines(plot.axes[1], percent, style)
        highest = max(p[1] for item in percent for p in item.points)
        plot.axes[1].set_ylim(0, 105 if highest > 50 else highest * 1.3)  # low percentages not squashed
        plot.axes[1].set_ylabel("% of the measured matmul ceiling")
        ceilings = sorted({fmt_number(p[2].peak_tflops) for item in percent for p in item.points})
        notes.append(
            f"ceiling: a dense matmul in the same dtype, measured on the device: {', '.join(ceilings)} TFLOP/s"
        )
    reasons = sorted({r.pct_of_peak_note for r in ok_rows(rows) if r.pct_of_peak_note and r.pct_of_peak is None})
    if reasons:
        notes.append("% of the ceiling is n/a for some rows: " + "; ".join(reasons))
    notes += [f"FLOPs: {text}" for text in sorted({r.flops_convention for r in ok_rows(rows) if r.flops_convention})]
    for ax in plot.axes:
        seq_axis(ax, _seqs(drawn))
    if max(values) / min(values) > 20:
        log_axis(plot.axes[0], "y")
    return finish(plot, PLOTS["throughput"], style, drawn, notes + dodge_note(style), [])


def memory_figure(rows: list[Row], style: Style) -> Any:
    """Peak extra memory against seq, log-log, with a dashed S² guide: naive's scores grow quadratically."""
    drawn = _seq_series(rows, lambda row: row.peak_memory_mib, "a peak memory (measured on CUDA only)")
    plot = canvas()
    ax = plot.axes[0]
    _lines(ax, drawn, style)
    extra = []
    largest = max(drawn, key=lambda item: (len(item.points), item.points[-1][1]))
    if len(largest.points) > 1:
        x0, y0, x1 = largest.points[0][0], largest.points[0][1], largest.points[-1][0]
        xs = [x0 * (x1 / x0) ** (i / 20) for i in range(21)]
        (guide,) = ax.plot(
            xs, [y0 * (x / x0) ** 2 for x in xs], color=GUIDE_COLOUR, linestyle="--", linewidth=1, label="∝ S² guide"
        )
        extra.append(guide)
    seq_axis(ax, _seqs(drawn))
    log_axis(ax, "y")
    ax.set_ylabel("peak extra memory per call (MiB)")
    notes = ["device memory one call allocates above what was held before it (bwd, fwd+bwd: the whole step)"]
    if extra:
        notes.append(f"∝ S² guide: starts at {largest.variant}'s first point and grows with the square of S")
    return finish(plot, PLOTS["memory"], style, drawn, notes + dodge_note(style), extra)


def kernels_figure(rows: list[Row], style: Style) -> Any:
    """Kernels launched per forward against seq."""
    from matplotlib.ticker import MaxNLocator

    drawn = _seq_series(rows, lambda row: row.kernels_per_forward, "a kernel count (GPU runs only)")
    plot = canvas()
    ax = plot.axes[0]
    _lines(ax, drawn, style)
    seq_axis(ax, _seqs(drawn))
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("kernels per forward (median over profiled forwards)")
    notes = ["a bwd or fwd+bwd row counts the backward's kernels too"] if "mode" in style.varying else []
    return finish(plot, PLOTS["kernels"], style, drawn, notes + dodge_note(style), [])


def gpu_vs_cpu_figure(rows: list[Row], style: Style) -> Any:
    """Profiler GPU time against CPU time per forward, log-log, with the diagonal where they are equal:
    below it the host takes longer than the device (launch-bound), above it the device is the limit."""
    drawn = series(rows, lambda row: row.cpu_time_us, lambda row: row.gpu_time_us)
    if not drawn:
        raise NothingToPlot("no ok row has both a GPU and a CPU time (CPU runs have no device time)")
    plot = canvas(width=7.5, height=7.0)
    ax = plot.axes[0]
    _lines(ax, drawn, style, dodge=False)
    values = [v for item in drawn for x, y, _ in item.points for v in (x, y)]
    low, high = min(values) / 1.6, max(values) * 1.6
    (diagonal,) = ax.plot(
        [low, high], [low, high], color=GUIDE_COLOUR, linestyle="--", linewidth=1, label="GPU time = CPU time"
    )
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_aspect("equal")
    ax.set_xlabel("CPU time per forward (µs, host duration of the region)")
    ax.set_ylabel("GPU time per forward (µs, device span)")
    box = {"boxstyle": "round", "facecolor": "white", "alpha": 0.8, "edgecolor": "none"}
    ax.text(0.03, 0.97, "device-bound\n(GPU time > CPU time)", transform=ax.transAxes, va="top", fontsize=9, bbox=box)
    ax.text(0.97, 0.03, "launch-bound\n(CPU time > GPU time)", transform=ax.transAxes, ha="right", fontsize=9, bbox=box)
    joined = [item for item in drawn if len(item.points) > 1]
    for item in joined:
        for x, y, row in (item.points[0], item.points[-1]):
            label = f"S={tick(number(row.seq) or 0)}"
            ax.annotate(
                label,
                (x, y),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
                color=line_style(item, style)["color"],
            )
    notes = ["a line joins one variant's rows from the shortest to the longest sequence (S)"] if joined else []
    return finish(plot, PLOTS["gpu_vs_cpu"], style, drawn, notes, [diagonal])


FIGURES: dict[str, Callable[[list[Row], Style], Any]] = {
    "bars": bars_figure,
    "latency": latency_figure,
    "throughput": throughput_figure,
    "memory": memory_figure,
    "kernels": kernels_figure,
    "gpu_vs_cpu": gpu_vs_cpu_figure,
    "roofline": roofline_figure,
}


def figures(rows: list[Row], names: Iterable[str] = PLOTS) -> tuple[dict[str, Any], dict[str, str]]:
    """The figures that have something to show, by name, and for each of the others why it was skipped.
    MissingExtraError without matplotlib."""
    matplotlib_available()
    style = style_for(rows)
    drawn: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            drawn[name] = FIGURES[name](rows, style)
        except NothingToPlot as reason:
            skipped[name] = str(reason)
    return drawn, skipped


def _save(fig: Any, target: Any, fmt: str) -> None:
    """PNG at DPI, or SVG without a creation date and with fixed ids (the same rows give the same bytes)."""
    from matplotlib import rc_context

    metadata = {"Date": None} if fmt == "svg" else None
    with rc_context({"svg.hashsalt": "attnprof"}):
        fig.savefig(target, format=fmt, dpi=DPI, bbox_inches="tight", metadata=metadata)


def write_figures(drawn: dict[str, Any], out_dir: Path, formats: Iterable[str]) -> list[Path]:
    """Write each figure as `<name>.<format>` into `out_dir` (created when needed) and return the paths.
    Never over an existing file: OutputError before anything is written when one exists."""
    targets = [(out_dir / f"{name}.{fmt}", drawn[name], fmt) for name in drawn for fmt in formats]
    taken = [path for path, _fig, _fmt in targets if path.exists()]
    if taken:
        raise OutputError(f"{taken[0]} already exists", hint="choose another -o folder, or remove the old plots")
    if targets:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    return [create_new(path, _writer(fig, fmt)) for path, fig, fmt in targets]


def _writer(fig: Any, fmt: str) -> Callable[[Path], None]:
    """What `create_new` calls with its temporary path: save the figure there in `fmt`."""
    return lambda temporary: _save(fig, temporary, fmt)


def svg_bytes(fig: Any) -> bytes:
    """The figure as SVG, in memory (what the HTML report embeds)."""
    buffer = io.BytesIO()
    _save(fig, buffer, "svg")
    return buffer.getvalue()


def left_out(rows: list[Row]) -> list[str]:
    """`variant (status word, n cells)` for the rows that are not ok: what the plots leave out."""
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        word = row.status.partition(":")[0] or "no status"
        if word != "ok":
            counts[(row.variant, word)] = counts.get((row.variant, word), 0) + 1
    return [f"{variant} ({word}, {n} cell{'s' if n > 1 else ''})" for (variant, word), n in counts.items()]
