"""`attnprof plot`: PNG and SVG plots of any results file (compare, run, sweep, model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnprof.cli import common as c
from attnprof.errors import ConfigError

ResultsArg = Annotated[
    Path, typer.Argument(help="A results file: results.json of run, compare or model, or results.jsonl of sweep.")
]
PlotDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Folder for the plots (created if needed; existing plots are never replaced). "
        "Default: a new folder `plots` (plots-2, ...) beside the results file.",
        show_default=False,
    ),
]
PlotFormatOpt = Annotated[str, typer.Option("--format", "-f", help="png, svg or both, comma-separated.")]


def plot_formats(text: str) -> list[str]:
    """The formats of `--format png,svg`; ConfigError (exit 2) for anything else."""
    from attnprof.report.plots import FORMATS

    chosen = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in FORMATS]
    if unknown or not chosen:
        raise ConfigError(f"--format {text!r}: expected {' or '.join(FORMATS)}, comma-separated (e.g. png,svg)")
    return list(dict.fromkeys(chosen))


@c.handle_errors
def plot_command(results: ResultsArg, output: PlotDirOpt = None, formats: PlotFormatOpt = "png,svg") -> None:
    """Plot a results file: latency bars; latency, throughput, memory, kernels against sequence length; GPU against CPU.

    bars: a bar chart of latency by variant per shape and mode (up to 8). The others draw one line per variant
    and shape (and mode): latency, throughput, memory, kernels and gpu_vs_cpu.

    A plot with nothing to show (one sequence length, no GPU figures in CPU rows) is skipped with a note.

    Needs matplotlib: pip install 'attnprof\\[plot]'.
    """
    from attnprof.files import unique_dir
    from attnprof.report.plots import figures, left_out, matplotlib_available, write_figures
    from attnprof.results.files import load_results

    chosen = plot_formats(formats)
    matplotlib_available()
    loaded = load_results(results)
    if loaded.truncated:
        c.note(f"{results}: its last line was cut short (an interrupted sweep); plotting the rows before it")
    drawn, skipped = figures(loaded.rows)
    for name, reason in skipped.items():
        c.note(f"{name}: skipped, {reason}")
    if not drawn:
        c.note("no plot had anything to show: nothing written")
        return
    omitted = left_out(loaded.rows)
    if omitted:
        c.note(f"not plotted (not ok): {', '.join(omitted)}")
    folder = output if output is not None else unique_dir(loaded.path.parent, "plots")
    for path in write_figures(drawn, folder, chosen):
        c.emit(str(path))
