"""The HTML report: one self-contained page (CSS inline, plots embedded as base64 SVG, no script, no
external resource) from a results file's header and rows. Formatting only.

The page leads with what matters and ends with where it was measured:

1. the headline: per shape × mode, the fastest variant, its latency, TFLOP/s, % of peak and speed-up,
   the runner-up's and the slowest's time over it and costliest finding, and the costliest problem
   findings of that cell;
2. the plots (latency bars per shape × mode first, then the lines against sequence length);
3. the comparison tables (a sweep's pivot tables first, its per-point tables folded), without the
   columns that are n/a in every row;
4. the findings, grouped by id: one entry per (variant, id) with the cells it fired on, its severity
   and impact; info findings folded;
5. top kernels, the kernel counters of rows that have them (Nsight Compute, `--ncu`), skipped and
   failed cells, trace links;
6. the environment (fields not recorded left out), the config and the ceiling.

This module assembles the page; the sections are `report.html_sections` (headline, comparison,
findings) and `report.html_details` (plots, kernels, counters, skipped and failed, traces, environment),
on `report.html_parts`' shared pieces. Table cells are `report.tables`' and `report.sweep_tables`' texts,
the kernel tables `report.analysis_tables`', the counters tables `report.counters_tables`', every text
escaped with `html.escape`. Trace links are relative to the report's folder, so the report and the run
folder can move together.
"""

from __future__ import annotations

from pathlib import Path

from attnprof.report.html_details import (
    PERFETTO,
    PlotImage,
    counters_section,
    environment_section,
    kernels_section,
    not_ok_section,
    plots_section,
    traces_section,
)
from attnprof.report.html_parts import esc, status_word
from attnprof.report.html_sections import comparison_section, findings_section, headline_section
from attnprof.results.files import ResultsFile
from attnprof.results.schema import Document

__all__ = ["PERFETTO", "PlotImage", "counters_section", "report_html"]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f;
       margin: 0 auto; padding: 1.5em 2em 4em; max-width: 1400px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05em; margin: 1.4em 0 0.4em; } nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.4em 0 1em; font-size: 13px; }
th, td { border: 1px solid #d9d9de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f5; } table.pairs th { font-weight: 600; white-space: nowrap; }
td:first-child, li { overflow-wrap: anywhere; } table.kernels td:first-child { min-width: 16em; }
tr:nth-child(even) td { background: #fafafc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.meta, .note { color: #555; } .warn { color: #a04000; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; } details { margin: 0.3em 0; } summary { cursor: pointer; }
li { margin: 0.2em 0; }
table.headline { font-size: 14px; } table.headline td.fastest { font-weight: 600; }
table.headline ul { margin: 0; padding-left: 1.1em; }
.sev { display: inline-block; padding: 0 0.45em; border-radius: 3px; font-size: 11px; font-weight: 600;
       text-transform: uppercase; letter-spacing: 0.03em; vertical-align: 1px; }
.sev.problem { background: #fde2d4; color: #8a2c00; } .sev.info { background: #e6edf5; color: #35506b; }
section.finding { margin: 1.2em 0 1.6em; } section.finding h3 { margin-bottom: 0.1em; }
section.finding p.summary { margin: 0.1em 0 0.4em; color: #333; }
table.findings td:nth-child(2) { min-width: 14em; } table.findings td:nth-child(3) { min-width: 8em; }
table.counters td:first-child { min-width: 9em; overflow-wrap: normal; }
table.counters td:nth-child(2) { min-width: 12em; max-width: 20em; overflow-wrap: anywhere; }
"""


def _where(header: Document) -> str:
    """`on NVIDIA H200 (cuda:0), torch 2.11.0+cu130` or `on cpu (AMD EPYC, 2 cores), torch 2.13.0+cpu`."""
    env = {name: None for name in ("device", "gpu_name", "cpu_count", "cpu_model", "torch")} | header.environment
    device = env["device"] or (header.config or {}).get("device")
    if not device:
        return ""
    if env["gpu_name"]:
        text = f"on {env['gpu_name']} ({device})"
    else:
        cores = f", {env['cpu_count']} cores" if env["cpu_count"] else ""
        text = f"on {device}" + (f" ({env['cpu_model']}{cores})" if env["cpu_model"] else "")
    return text + (f", torch {env['torch']}" if env["torch"] else "")


def report_html(results: ResultsFile, report_path: Path, images: list[PlotImage], plot_notes: list[str]) -> str:
    """The whole page for a results file: the headline, plots, comparison tables, findings by id, top
    kernels, skipped and failed cells, trace links, then the environment, config and ceiling."""
    header, rows = results.header, results.rows
    baseline = (header.config or {}).get("baseline")
    counts = {word: sum(status_word(r) == word for r in rows) for word in ("ok", "skipped", "failed")}
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    meta = [
        f"{esc(header.command or 'results')} of {esc(header.created or 'an unknown date')}",
        esc(_where(header)),
        f"attnprof {esc(header.attnprof_version or '?')}",
        f"{len(rows)} cells ({esc(summary or 'none')})",
        f"from <span class='mono'>{esc(results.path.name)}</span>",
    ]
    warnings = []
    if header.interrupted:
        warnings.append("The run was interrupted: only the cells that finished are here.")
    if results.truncated:
        warnings.append("The results stream's last line was cut short; the rows before it are here.")
    sections = [
        ("headline", "headline", headline_section(rows, baseline)),
        ("plots", "plots", plots_section(images, plot_notes)),
        ("comparison", "comparison", comparison_section(rows, baseline)),
        ("findings", "findings", findings_section(rows)),
        ("kernels", "top kernels", kernels_section(rows)),
        ("counters", "kernel counters", counters_section(rows)),
        ("not-ok", "skipped and failed", not_ok_section(rows)),
        ("traces", "traces", traces_section(rows, results, report_path)),
        ("environment", "environment", environment_section(header, rows)),
    ]
    nav = "".join(f"<a href='#{anchor}'>{esc(name)}</a>" for anchor, name, text in sections if text)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            "<html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>attnprof report: {esc(results.path.name)}</title><style>{CSS}</style></head><body>",
            "<h1>attnprof report</h1>",
            f"<p class='meta'>{' · '.join(m for m in meta if m)}</p>",
            *(f"<p class='warn'>{esc(w)}</p>" for w in warnings),
            f"<nav>{nav}</nav>",
            *(text for _anchor, _name, text in sections if text),
            "</body></html>",
        ]
    )
