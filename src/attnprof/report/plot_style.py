"""What every plot shares: rows grouped into series, one style per results file, the figure layout,
the axes and the legend. matplotlib is imported inside functions only.

Rows that share a variant and every shape field but `seq` form one series (one line). Colour follows
the variant, marker the shape (all fields but seq and mode), line style the mode, so a variant has
the same colour in every plot of a file; the legend names each once, in three groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: The fields besides `variant` and `seq` that tell two rows' series apart.
SERIES_FIELDS = ("mode", "device", "dtype", "causal", "batch", "heads", "kv_heads", "head_dim")
LINE_STYLES: dict[str, Any] = {"fwd": "-", "bwd": "--", "fwd+bwd": ":"}
MARKERS = "osD^v<>pPX*h"
NOTE_COLOUR = "#444444"
GUIDE_COLOUR = "#888888"

Row = dict[str, Any]


class NothingToPlot(Exception):
    """A plot that would be empty; the message says why, in one line."""


@dataclass
class Series:
    """The ok rows of one variant at one shape but for `seq`: the points of one line, in seq order."""

    variant: str
    key: tuple[Any, ...]  # the SERIES_FIELDS values
    points: list[tuple[float, float, Row]] = field(default_factory=list)  # (x, y, row)

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


def ok_rows(rows: Iterable[Row]) -> list[Row]:
    """The rows that ran and passed: the only ones plotted."""
    return [row for row in rows if str(row.get("status", "")).partition(":")[0] == "ok"]


def number(value: Any) -> float | None:
    """A finite number, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _key(row: Row) -> tuple[Any, ...]:
    """The row's SERIES_FIELDS values; `kv_heads` only when it differs from `heads` (GQA)."""
    kv_heads = row.get("kv_heads") if row.get("kv_heads") != row.get("heads") else None
    return tuple(kv_heads if f == "kv_heads" else row.get(f) for f in SERIES_FIELDS)


def describe(fields: dict[str, Any]) -> str:
    """`b4 h32 kv8 d128 · causal · bf16 · fwd+bwd · cuda:0` for the given series fields (None left out)."""
    shape = " ".join(
        f"{prefix}{fields[name]}"
        for name, prefix in (("batch", "b"), ("heads", "h"), ("kv_heads", "kv"), ("head_dim", "d"))
        if fields.get(name) is not None
    )
    words = [shape] if shape else []
    if fields.get("causal") is not None:
        words.append("causal" if fields["causal"] else "full")
    words += [str(fields[name]) for name in ("dtype", "mode", "device") if fields.get(name) is not None]
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
    variants = list(dict.fromkeys(str(row.get("variant")) for row in rows))
    palette = _palette(len(variants))
    keys = list(dict.fromkeys(_key(row) for row in rows))
    varying = tuple(f for i, f in enumerate(SERIES_FIELDS) if len({k[i] for k in keys}) > 1)
    shapes = list(dict.fromkeys(k[1:] for k in keys))
    constant = {f: keys[0][i] for i, f in enumerate(SERIES_FIELDS) if f not in varying} if keys else {}
    return Style(
        colours={name: palette[i % len(palette)] for i, name in enumerate(variants)},
        markers={shape: MARKERS[i % len(MARKERS)] for i, shape in enumerate(shapes)},
        varying=varying,
        common=describe(constant),
    )


def series(rows: list[Row], x: Callable[[Row], Any], y: Callable[[Row], Any]) -> list[Series]:
    """One series per variant and shape (every field but seq) of the ok rows whose x and y are > 0,
    each in seq order."""
    grouped: dict[tuple[Any, ...], Series] = {}
    for row in ok_rows(rows):
        xv, yv = number(x(row)), number(y(row))
        if xv is None or yv is None or xv <= 0 or yv <= 0:
            continue
        key = _key(row)
        variant = str(row.get("variant"))
        grouped.setdefault((variant, *key), Series(variant, key)).points.append((xv, yv, row))
    for item in grouped.values():
        item.points.sort(key=lambda point: (number(point[2].get("seq")) or 0, point[0]))
    return list(grouped.values())


def line_style(item: Series, style: Style) -> dict[str, Any]:
    """matplotlib keyword arguments for one series: its variant's colour, shape's marker, mode's line."""
    return {
        "color": style.colours[item.variant],
        "linestyle": LINE_STYLES.get(str(item.mode), "-"),
        "marker": style.markers.get(item.shape, "o"),
        "linewidth": 1.6,
        "markersize": 5,
    }


def tick(value: float, _position: Any = None) -> str:
    """A readable tick: 0.05, 12, 1,000, 20k, 3M."""
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e5:
        return f"{value / 1e3:g}k"
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


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


def seq_axis(ax: Any, seqs: Iterable[float]) -> None:
    """Log2 x axis with a tick at every sequence length drawn."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = sorted(set(seqs))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    ax.set_xlabel("sequence length (tokens)")
    if len(ticks) > 7:
        ax.tick_params(axis="x", labelrotation=45)


def log_axis(ax: Any, which: str) -> None:
    """A log scale on the `x` or `y` axis of `ax`, with plain tick labels (1,000 rather than 10³)."""
    from matplotlib.ticker import FuncFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
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
    group("variant", [(v, Line2D([], [], color=style.colours[v], linewidth=2.5)) for v in variants])
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
