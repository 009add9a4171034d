"""What every plot shares: rows grouped into series, one style per results file, the figure layout,
the axes and the legend. matplotlib is imported inside functions only.

Rows that share a variant and every shape field but `seq` form one series (one line). Colour follows
the variant, marker the shape (all fields but seq and mode; the variant when every row has one
shape), line style the mode, so a variant looks the same in every plot of a file; the legend names
each once, in three groups. Lines that would lie on top of each other (naive and inplace) stay
apart: each variant's points are shifted sideways by a few per cent of the sequence length
(`dodge`), and every plot that does it says so. Log axes carry labelled ticks in 1-2-5 steps
(`log_axis`); the sequence-length axis is log2 with a tick at every length drawn, and at every power
of two between them when the lengths are powers of two (`seq_axis`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from attnprof.results.schema import Row

#: The fields besides `variant` and `seq` that tell two rows' series apart.
SERIES_FIELDS = ("mode", "device", "dtype", "causal", "batch", "heads", "kv_heads", "head_dim")
LINE_STYLES: dict[str, Any] = {"fwd": "-", "bwd": "--", "fwd+bwd": ":"}
MARKERS = "osD^v<>pPX*h"
#: The spread of the series' sideways shifts, in octaves of the sequence length: ±0.05 octave, at most ±3.5%.
DODGE_OCTAVES = 0.1
DODGE_NOTE = (
    "points are shifted sideways by up to {pct:.1f}% of the sequence length so that lines that overlap stay "
    "apart; the ticks are at the true lengths"
)
NOTE_COLOUR = "#444444"
GUIDE_COLOUR = "#888888"


class NothingToPlot(Exception):
    """A plot that would be empty; the message says why, in one line."""


@dataclass
class Series:
    """The ok rows of one variant at one shape but for `seq`: the points of one line, in seq order."""

    variant: str
    key: tuple[Any, ...]  # the SERIES_FIELDS values
    points: list[tuple[float, float, Row]] = field(default_factory=list)  # (x, y, row)
    labels: list[str] = field(default_factory=list)  # a name per point, where a plot names them (the roofline)

    @property
    def mode(self) -> Any:
        """The series' mode (fwd, bwd, fwd+bwd), or None when the rows have none."""
        return self.key[0]

    @property
    def shape(self) -> tuple[Any, ...]:
        """Every series field but the mode: what the marker stands for."""
        return self.key[1:]


@dataclass(frozen=True)
class Style:
    """How every series of one results file is drawn: colour per variant, marker per shape, line style
    per mode; the series fields that vary, and the ones that do not, said once in the title."""

    colours: dict[str, Any]
    markers: dict[tuple[Any, ...], str]
    varying: tuple[str, ...]
    common: str
    variant_markers: dict[str, str] = field(default_factory=dict)  # set when the marker follows the variant
    dodges: dict[str, float] = field(default_factory=dict)  # each variant's sideways shift, a factor on x


def ok_rows(rows: Iterable[Row]) -> list[Row]:
    """The rows that ran and passed: the only ones plotted."""
    return [row for row in rows if row.status.partition(":")[0] == "ok"]


def number(value: Any) -> float | None:
    """A finite number, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def series_key(row: Row) -> tuple[Any, ...]:
    """The row's SERIES_FIELDS values; `kv_heads` only when it differs from `heads` (GQA)."""
    kv_heads = row.kv_heads if row.kv_heads != row.heads else None
    return (row.mode, row.device, row.dtype, row.causal, row.batch, row.heads, kv_heads, row.head_dim)


def describe(fields: dict[str, Any]) -> str:
    """`b4 h32 kv8 d128 · causal · bf16 · fwd+bwd · cuda:0` for the given series fields (None left out)."""
    fields = dict.fromkeys(SERIES_FIELDS) | fields
    shape = " ".join(
        f"{prefix}{fields[name]}"
        for name, prefix in (("batch", "b"), ("heads", "h"), ("kv_heads", "kv"), ("head_dim", "d"))
        if fields[name] is not None
    )
    words = [shape] if shape else []
    if fields["causal"] is not None:
        words.append("causal" if fields["causal"] else "full")
    words += [str(fields[name]) for name in ("dtype", "mode", "device") if fields[name] is not None]
    return " · ".join(words)


def _palette(count: int) -> list[Any]:
    """Distinct colours: tab10, or for more variants tab20's dark shades first, then its light ones."""
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(10)]
    tab20 = colormaps["tab20"]
    return [tab20(i) for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]


def style_for(rows: list[Row]) -> Style:
    """The drawing style of these rows: built from all of them, so every plot of a file agrees."""
    rows = ok_rows(rows)
    variants = list(dict.fromkeys(row.variant for row in rows))
    palette = _palette(len(variants))
    keys = list(dict.fromkeys(series_key(row) for row in rows))
    varying = tuple(f for i, f in enumerate(SERIES_FIELDS) if len({k[i] for k in keys}) > 1)
    shapes = list(dict.fromkeys(k[1:] for k in keys))
    constant = {f: keys[0][i] for i, f in enumerate(SERIES_FIELDS) if f not in varying} if keys else {}
    return Style(
        colours={name: palette[i % len(palette)] for i, name in enumerate(variants)},
        markers={shape: MARKERS[i % len(MARKERS)] for i, shape in enumerate(shapes)},
        varying=varying,
        common=describe(constant),
        variant_markers={name: MARKERS[i % len(MARKERS)] for i, name in enumerate(variants)} if len(shapes) < 2 else {},
        dodges=dodges(variants),
    )


def dodges(variants: list[str]) -> dict[str, float]:
    """Each variant's sideways shift, as a factor on the sequence length: spread evenly over
    ±DODGE_OCTAVES/2 octaves in the order the variants first appear (none for one variant)."""
    if len(variants) < 2:
        return {name: 1.0 for name in variants}
    step = DODGE_OCTAVES / (len(variants) - 1)
    return {name: 2 ** ((i - (len(variants) - 1) / 2) * step) for i, name in enumerate(variants)}


def dodge_note(style: Style) -> list[str]:
    """The note a plot with dodged points carries (none when nothing moved)."""
    widest = max(style.dodges.values(), default=1.0)
    return [DODGE_NOTE.format(pct=(widest - 1) * 100)] if widest > 1 else []


def dodged(item: Series, style: Style) -> list[float]:
    """The series' x values shifted by its variant's dodge."""
    factor = style.dodges.get(item.variant, 1.0)
    return [point[0] * factor for point in item.points]


def series(rows: list[Row], x: Callable[[Row], Any], y: Callable[[Row], Any]) -> list[Series]:
    """One series per variant and shape (every field but seq) of the ok rows whose x and y are > 0,
    each in seq order."""
    grouped: dict[tuple[Any, ...], Series] = {}
    for row in ok_rows(rows):
        xv, yv = number(x(row)), number(y(row))
        if xv is None or yv is None or xv <= 0 or yv <= 0:
            continue
        key = series_key(row)
        variant = row.variant
        grouped.setdefault((variant, *key), Series(variant, key)).points.append((xv, yv, row))
    for item in grouped.values():
        item.points.sort(key=lambda point: (number(point[2].seq) or 0, point[0]))
    return list(grouped.values())


def line_style(item: Series, style: Style) -> dict[str, Any]:
    """matplotlib keyword arguments for one series: its variant's colour, shape's marker, mode's line."""
    return {
        "color": style.colours[item.variant],
        "linestyle": LINE_STYLES.get(str(item.mode), "-"),
        "marker": style.variant_markers.get(item.variant) or style.markers.get(item.shape, "o"),
        "linewidth": 1.6,
        "markersize": 5,
    }


def tick(value: float, _position: Any = None) -> str:
    """A readable tick: 0.05, 1.5, 12, 1,000, 1,500, 200k, 3M."""
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e5:
        return f"{value / 1e3:g}k"
    return f"{value:,.0f}" if value >= 1 and value == round(value) else f"{value:.3g}"


@dataclass
class Canvas:
    """A figure drawn by Agg (no GUI, no pyplot state): the plot's panels on the left, the legend's
    column on the right, so neither the title nor the legend ever covers a line."""

    figure: Any
    main: Any
    side: Any
    axes: list[Any]


def canvas(panels: int = 1, width: float = 9.0, height: float = 5.6, legend_width: float = 2.6) -> Canvas:
    """A new canvas with `panels` axes side by side, each with a light grid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure: Any = Figure(figsize=(width + legend_width, height), layout="constrained")
    FigureCanvasAgg(figure)
    main, side = figure.subfigures(1, 2, width_ratios=[width, legend_width])
    axes = [main.add_subplot(1, panels, i + 1) for i in range(panels)]
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    return Canvas(figure, main, side, axes)


def seq_ticks(seqs: Iterable[float]) -> list[float]:
    """The sequence lengths drawn, and when they are all powers of two every power of two between
    the shortest and the longest (512, 2,048 and 8,192 get 1,024 and 4,096 between them)."""
    drawn = sorted({round(s) for s in seqs if s > 0})
    if drawn and all(s & (s - 1) == 0 for s in drawn):
        low, high = drawn[0].bit_length() - 1, drawn[-1].bit_length() - 1
        return [float(2**k) for k in range(low, high + 1)]
    return [float(s) for s in drawn]


def seq_axis(ax: Any, seqs: Iterable[float]) -> None:
    """Log2 x axis labelled at `seq_ticks`, with room for the dodged points at either end."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = seq_ticks(seqs)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    ax.set_xlim(ticks[0] / 2**0.25, ticks[-1] * 2**0.25)
    ax.set_xlabel("sequence length (tokens)")
    if len(ticks) > 6:
        ax.tick_params(axis="x", labelrotation=45)


#: The mantissas of a log axis' labelled ticks: 1-2-5 steps, decades when those are too many, and
#: finer steps when a narrow range would get fewer than three.
LOG_STEPS = ((1.0, 2.0, 5.0), (1.0,), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0))
MAX_LOG_TICKS = 10
MIN_LOG_TICKS = 3


def log_ticks(low: float, high: float) -> list[float]:
    """The labelled ticks of a log axis from `low` to `high`: 1-2-5 steps (1, 2, 5, 10, 20, ...); decades
    when 1-2-5 gives more than MAX_LOG_TICKS; 1-1.5-2-3-4-5-7 when it gives fewer than MIN_LOG_TICKS;
    empty when even those give fewer than two (the caller then keeps matplotlib's own)."""
    import math

    if not 0 < low < high:
        return []

    def within(mantissas: tuple[float, ...]) -> list[float]:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        values = (m * 10.0**e for e in range(first, last + 1) for m in mantissas)
        return [float(f"{v:.6g}") for v in values if low * (1 - 1e-9) <= v <= high * (1 + 1e-9)]

    ticks = within(LOG_STEPS[0])
    if len(ticks) > MAX_LOG_TICKS:
        ticks = within(LOG_STEPS[1])
    elif len(ticks) < MIN_LOG_TICKS:
        ticks = within(LOG_STEPS[2])
    return ticks if len(ticks) >= 2 else []


def log_axis(ax: Any, which: str) -> None:
    """A log scale on the `x` or `y` axis of `ax`, labelled at `log_ticks` over its current limits (so
    call it once the data and limits are set), with plain labels (1,000 rather than 10³)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    ticks = log_ticks(*sorted(ax.get_xlim() if which == "x" else ax.get_ylim()))
    if ticks:
        axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(tick))
    axis.set_minor_formatter(FuncFormatter(lambda _v, _p: ""))


def finish(canvas: Canvas, title: str, style: Style, drawn: list[Series], notes: list[str], extra: list[Any]) -> Any:
    """Title (with what every row shares), the notes under the panels, and the legend: the variants by
    colour, then the shapes by marker and the modes by line style where they differ, then `extra`
    (labelled artists such as a guide line). Returns the figure."""
    from matplotlib.lines import Line2D

    canvas.main.suptitle(title + (f"\n{style.common}" if style.common else ""), fontsize=12)
    if notes:
        canvas.main.text(0.01, 0.0, "\n".join(notes), fontsize=8, va="top", ha="left", color=NOTE_COLOUR)
    handles: list[Any] = []
    labels: list[str] = []
    headings: list[int] = []

    def group(heading: str, entries: list[tuple[str, Any]]) -> None:
        headings.append(len(labels))
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(heading)
        for label, handle in entries:
            handles.append(handle)
            labels.append(label)

    variants = list(dict.fromkeys(item.variant for item in drawn))
    group(
        "variant",
        [
            (v, Line2D([], [], color=style.colours[v], linewidth=2.5, marker=style.variant_markers.get(v)))
            for v in variants
        ],
    )
    if any(f in style.varying for f in SERIES_FIELDS[1:]):
        shapes = list(dict.fromkeys(item.shape for item in drawn))
        group("shape", [(shape_label(style, shape), marker(style, shape)) for shape in shapes])
    if "mode" in style.varying:
        modes = list(dict.fromkeys(item.mode for item in drawn))
        group("mode", [(str(m), Line2D([], [], color="black", linestyle=LINE_STYLES.get(str(m), "-"))) for m in modes])
    if extra:
        group("reference", [(artist.get_label(), artist) for artist in extra])
    legend = canvas.side.legend(handles, labels, loc="upper left", fontsize=8, frameon=False, handlelength=2.5)
    for index in headings:
        legend.get_texts()[index].set_fontweight("bold")
    return canvas.figure


def shape_label(style: Style, shape: tuple[Any, ...]) -> str:
    """The shape fields that differ between the file's series, e.g. `b4 h32 kv8 d128`."""
    return describe({f: shape[i] for i, f in enumerate(SERIES_FIELDS[1:]) if f in style.varying})


def marker(style: Style, shape: tuple[Any, ...]) -> Any:
    """A legend handle for one shape: its marker in black, no line."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color="black", linestyle="none", marker=style.markers.get(shape, "o"), markersize=6)
