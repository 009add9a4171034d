"""`attnprof report`: one self-contained HTML page for any results file (compare, run, sweep, model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnprof.cli import common as c
from attnprof.cli.plot_cmd import ResultsArg

ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="The HTML file to write (never replaced if it exists). Default: report.html (report-2.html, ...) "
        "beside the results file.",
        show_default=False,
    ),
]


@c.handle_errors
def report_command(results: ResultsArg, output: ReportOpt = None) -> None:
    """Write one self-contained HTML report: headline, plots, tables, findings, kernels and traces.

    It leads with the fastest variant of each shape and mode and its costliest findings, then the plots, the
    comparison tables, the findings grouped by id, each variant's top kernels, skipped and failed cells and
    trace links; the environment, config and ceiling come last.

    The page works offline: CSS inline, plots embedded, no script, nothing fetched; it prints its path.

    Without matplotlib the plots are left out (pip install 'attnprof\\[plot]').
    """
    from attnprof.errors import MissingExtraError, OutputError
    from attnprof.files import create_new
    from attnprof.report.html import PlotImage, report_html
    from attnprof.report.plots import PLOTS, figures, svg_bytes
    from attnprof.results.files import load_results

    loaded = load_results(results)
    if loaded.truncated:
        c.note(f"{results}: its last line was cut short (an interrupted sweep); reporting the rows before it")
    images: list[PlotImage] = []
    notes: list[str] = []
    try:
        drawn, skipped = figures(loaded.rows)
        images = [PlotImage(name, PLOTS[name], svg_bytes(fig)) for name, fig in drawn.items()]
        notes = [f"{name}: left out, {reason}" for name, reason in skipped.items()]
    except MissingExtraError:
        notes = ["no plots: matplotlib is not installed (pip install 'attnprof[plot]')"]
        c.note(notes[0])
    target = output if output is not None else loaded.path.parent / "report.html"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {target.parent}: {exc.strerror or exc}") from None
    page = report_html(loaded, target, images, notes)

    def write(temporary: Path) -> None:
        temporary.write_text(page, encoding="utf-8")

    written = create_new(target, write, numbered=output is None)
    c.emit(str(written))
