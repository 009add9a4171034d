"""The HTML report's reference sections: the plots, each variant's top kernels, the kernel counters
(Nsight Compute), skipped and failed cells, trace links, and the environment, config and ceiling.
Formatting only: the kernel tables are `report.analysis_tables`', the counters tables
`report.counters_tables`', every text escaped. Trace links are relative to the report's folder, so the
report and the run folder can move together."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from attnprof.analysis.findings.counters import RULES as COUNTER_RULES
from attnprof.profiling.ceiling import Ceiling
from attnprof.report.analysis_tables import KERNEL_COLUMNS, kernel_rows
from attnprof.report.counters_tables import (
    COUNTER_COLUMNS,
    Counted,
    ceilings_line,
    counted,
    counters_facts,
    counters_heading,
    kernel_cells,
    shown_kernels,
)
from attnprof.report.formatting import fmt_number
from attnprof.report.html_parts import cell_name, esc, finding_link, html_table, pairs, plain, status_word
from attnprof.results.files import ResultsFile
from attnprof.results.schema import Document, Row

TOP_KERNELS = 10
#: More trace links than this fold under one line.
FOLDED_TRACES = 12
PERFETTO = "https://ui.perfetto.dev"
CONFIG_KEYS = ("device", "dtype", "causal", "mask", "score_mod", "modes", "baseline", "schedule", "region", "seed")


@dataclass(frozen=True)
class PlotImage:
    """One plot to embed: its name, its title, and the SVG bytes."""

    name: str
    title: str
    svg: bytes


def plots_section(images: list[PlotImage], notes: list[str]) -> str:
    """Every plot embedded as a base64 SVG data URI, and why the others were left out."""
    parts = ["<h2 id='plots'>Plots</h2>"]
    for image in images:
        data = base64.b64encode(image.svg).decode("ascii")
        parts.append(
            f"<figure id='plot-{esc(image.name)}'><img alt='{esc(image.title)}' "
            f"src='data:image/svg+xml;base64,{data}'><figcaption>{esc(image.title)}</figcaption></figure>"
        )
    if len(notes) == 1 or (notes and not images):
        parts.append("<ul class='note'>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    elif notes:
        items = "".join(f"<li>{esc(n)}</li>" for n in notes)
        parts.append(
            f"<details class='note'><summary>{len(notes)} plots not drawn, and why</summary><ul>{items}</ul></details>"
        )
    return "\n".join(parts)


# ------------------------------------------------------------------ 5. kernels, skipped and failed, traces


def not_ok_section(rows: list[Row]) -> str:
    """Every skipped or failed cell with its reason (empty when every row is ok)."""
    bad = [row for row in rows if status_word(row) != "ok"]
    if not bad:
        return ""
    body = [[r.variant, cell_name(r), status_word(r), str(r.reason or r.status)] for r in bad]
    return "\n".join(
        [
            "<h2 id='not-ok'>Skipped and failed</h2>",
            "<p class='note'>Left out of the plots and of the kernel tables.</p>",
            html_table(("variant", "cell", "status", "reason"), body),
        ]
    )


def _by_variant(rows: list[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row.variant, []).append(row)
    return grouped


def kernels_section(rows: list[Row]) -> str:
    """Per variant and cell, the kernels that took the most time per forward, with decoded names and
    occupancy; the longest cell of each variant is open, the others fold."""
    parts = ["<h2 id='kernels'>Top kernels</h2>"]
    headers = [c.header for c in KERNEL_COLUMNS] + ["library", "occupancy note"]
    for variant, group in _by_variant(rows).items():
        cells = [row for row in group if row.kernels]
        if not cells:
            continue
        parts.append(f"<h3>{esc(variant)}</h3>")
        largest = max(cells, key=lambda row: row.seq or 0)
        for row in cells:
            kernels = sorted(row.kernels, key=lambda k: -(k.time_us or 0))
            top = kernels[:TOP_KERNELS]
            body = [
                cells_ + [k.library or "", k.occupancy_note or ""]
                for cells_, k in zip(kernel_rows(top, "markdown"), top, strict=True)
            ]
            more = len(kernels) - len(top)
            tail = f"<p class='note'>{more} more, each taking less time.</p>" if more > 0 else ""
            opened = " open" if row is largest else ""
            summary = f"{cell_name(row)}: {len(kernels)} distinct kernels, memcpy and memset, by time per forward"
            table = html_table(headers, body, "kernels")
            parts.append(f"<details{opened}><summary>{esc(summary)}</summary>{table}{tail}</details>")
    if len(parts) == 1:
        parts.append("<p class='note'>No kernels in these rows (CPU runs launch none).</p>")
    return "\n".join(parts)


def _counters_notes(shown: Counted, one_ceiling: bool) -> list[str]:
    """A row's facts under the counters table, its match with the trace, and the counters' notes."""
    counters = shown.counters
    notes = [counters_facts(counters, ceilings=not one_ceiling)]
    if counters.match is not None:
        notes.append(counters.match.text + ".")
    return notes + shown.occupancy_measured + counters.notes


def counters_section(rows: list[Row]) -> str:
    """The rows with hardware counters (Nsight Compute, `--ncu`) in one table: each row's kernels of the step
    it shows, their counters and place on the roofline; then per row its facts, notes and the counter
    findings it raised (linked to the Findings section), and every kernel of a report of several steps,
    folded. "" when no row has counters."""
    label = {id(row): f"{row.variant} · {cell_name(row)}" for row in rows}
    counted_rows = [(row, shown) for row in rows if (shown := counted(label[id(row)], row.counters)) is not None]
    if not counted_rows:
        return ""
    unit = "step" if any((row.mode or "fwd") != "fwd" for row, _ in counted_rows) else "forward"
    parts = [
        "<h2 id='counters'>Kernel counters</h2>",
        f"<p class='note'>{esc(counters_heading('markdown', None, unit)[-1])} The roofline plot places each "
        "kernel: <a href='#plot-roofline'>Plots</a>.</p>",
    ]
    shared = {ceilings_line(shown.counters) for _, shown in counted_rows}
    one_ceiling = len(shared) == 1
    if one_ceiling:
        line = next(iter(shared))
        parts.append(f"<p>{esc(line[0].upper() + line[1:])}.</p>")
    headers = ["variant · cell"] + [c.header for c in COUNTER_COLUMNS[1:]]
    body = [
        [shown.label, *kernel_cells(k, p)] for _, shown in counted_rows for k, p in shown_kernels(shown.counters, False)
    ]
    parts.append(html_table(headers, body, "counters"))
    counter_ids = set(COUNTER_RULES.ids())
    items = []
    for row, shown in counted_rows:
        notes = _counters_notes(shown, one_ceiling)
        ids = [f.id for f in row.findings if f.id in counter_ids]
        found = f" Counter findings: {', '.join(finding_link(i) for i in ids)}." if ids else ""
        every = shown_kernels(shown.counters, every=True)
        folded = ""
        if len(every) > len(shown_kernels(shown.counters, every=False)):
            table = html_table(headers[1:], [kernel_cells(k, p) for k, p in every], "counters")
            folded = f"<details><summary>every kernel of its report ({len(every)})</summary>{table}</details>"
        items.append(f"<li><b>{esc(shown.label)}</b>: {esc(' '.join(notes))}{found}{folded}</li>")
    parts.append("<ul class='note'>" + "".join(items) + "</ul>")
    return "\n".join(parts)


def trace_file(trace: str, results_path: Path, files: dict[str, str] | None) -> Path | None:
    """The trace file a row names, if it exists: under the results file's folder as the run wrote it
    (`files.dir`), beside the results file, or as given (absolute, or relative to the working folder)."""
    given = Path(trace)
    candidates = [given] if given.is_absolute() else []
    if not given.is_absolute():
        folder = (files or {}).get("dir")
        if folder and given.is_relative_to(folder):
            candidates.append(results_path.parent / given.relative_to(folder))
        candidates += [results_path.parent / given, given]
    return next((path for path in candidates if path.is_file()), None)


def traces_section(rows: list[Row], results: ResultsFile, report_path: Path) -> str:
    """One link per profiled cell to its trace, relative to the report; a trace not found is named."""
    traced = [(row, row.trace) for row in rows if row.trace]
    if not traced:
        return ""
    body = []
    for row, trace in traced:
        found = trace_file(trace, results.path, results.header.files)
        if found is None:
            link = f"{esc(trace)} <span class='warn'>(not found)</span>"
        else:
            href = Path(os.path.relpath(found.resolve(), report_path.resolve().parent)).as_posix()
            link = f"<a href='{esc(quote(href))}'>{esc(found.name)}</a>"
        body.append(f"<tr><td>{esc(row.variant)}</td><td>{esc(cell_name(row))}</td><td>{link}</td></tr>")
    note = (
        f"Open a trace in <a href='{PERFETTO}'>{PERFETTO}</a> (Open trace file) or in chrome://tracing; "
        "the .json.gz files load as they are."
    )
    table = (
        "<table><thead><tr><th>variant</th><th>cell</th><th>trace</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )
    if len(body) > FOLDED_TRACES:
        table = f"<details><summary>{len(body)} trace files</summary>{table}</details>"
    return "\n".join(["<h2 id='traces'>Traces</h2>", f"<p class='note'>{note}</p>", table])


# ------------------------------------------------------------------ 6. environment, config, ceiling


def _environment(header: Document) -> list[str]:
    env = header.environment
    if not env:
        return ["<p class='note'>The results file records no environment.</p>"]
    recorded = [(key, value) for key, value in env.items() if value is not None]
    missing = [key for key, value in env.items() if value is None]
    parts = [pairs(recorded)]
    if missing and str(env.get("device") or "").startswith("cpu"):
        parts.append(f"<p class='note'>A CPU run: no GPU, CUDA or driver fields ({len(missing)} left out).</p>")
    elif missing:
        parts.append(f"<p class='note'>Not recorded: {esc(', '.join(missing))}.</p>")
    return parts


def _config(header: Document, rows: list[Row]) -> list[str]:
    """The config as written (`config.Config`'s dict): its settings, shapes, variant patterns, exclusions
    and sweep axes, then the variants the rows hold."""
    config = {name: None for name in (*CONFIG_KEYS, "shapes", "variants", "exclude", "sweep")} | (header.config or {})
    items: list[tuple[str, Any]] = [(key, config[key]) for key in CONFIG_KEYS if config[key] is not None]
    if config["shapes"]:
        items.append(("shapes", list(config["shapes"])))
    if config["variants"]:
        items.append(("variants (patterns)", config["variants"]))
    if config["exclude"]:
        items.append(("exclude", list(config["exclude"])))
    axes = {k: v for k, v in (config["sweep"] or {}).items() if v is not None}
    if axes:
        items.append(("sweep axes", "; ".join(f"{k}: {plain(v)}" for k, v in axes.items())))
    ran = list(dict.fromkeys(row.variant for row in rows))
    if ran:
        items.append(("variants in the results", ", ".join(ran)))
    return ["<h3>Config</h3>", pairs(items)] if items else []


def _ceiling_items(written: dict[str, Any]) -> list[tuple[str, Any]]:
    """The ceiling as written (`profiling.ceiling.Ceiling`'s dict), typed, in words; a dict it cannot
    type is shown as written."""
    try:
        ceiling = msgspec.convert(written, Ceiling, strict=False)
    except msgspec.ValidationError:
        return [(key, value) for key, value in written.items() if value is not None]
    items: list[tuple[str, Any]] = [("matmul ceiling", f"{fmt_number(ceiling.tflops)} TFLOP/s")]
    if ceiling.read_gbps is not None:
        items.append(("read bandwidth", f"{fmt_number(ceiling.read_gbps)} GB/s"))
    if ceiling.bandwidth_gbps is not None:
        items.append(("copy bandwidth (read + write)", f"{fmt_number(ceiling.bandwidth_gbps)} GB/s"))
    words = [
        ("method", ceiling.method),
        ("read_method", ceiling.read_method),
        ("source", ceiling.source),
        ("measured_at", ceiling.measured_at),
        ("reason", ceiling.reason),
    ]
    return items + [(key, value) for key, value in words if value]


def _ceiling(header: Document, rows: list[Row]) -> list[str]:
    """The run's ceiling (one dtype), its ceilings by dtype, or, for a results stream whose first line
    was written before the ceiling was measured, the ceiling each row was divided by."""
    if header.ceiling:
        return ["<h3>Ceiling</h3>", pairs(_ceiling_items(header.ceiling))]
    if header.ceilings:
        parts = ["<h3>Ceilings</h3>"]
        for dtype, ceiling in header.ceilings.items():
            parts += [f"<p class='meta'>{esc(dtype)}</p>", pairs(_ceiling_items(ceiling))]
        return parts
    by_dtype: dict[str, set[float]] = {}
    for row in rows:
        if row.peak_tflops is not None:
            by_dtype.setdefault(str(row.dtype), set()).add(float(row.peak_tflops))
    reasons = sorted({row.pct_of_peak_note for row in rows if row.pct_of_peak_note})
    if not by_dtype:
        why = f": {'; '.join(reasons)}" if reasons else ""
        return ["<h3>Ceiling</h3>", f"<p class='note'>No matmul ceiling in these results{esc(why)}.</p>"]
    items = [
        (f"matmul ceiling, {dtype}", ", ".join(f"{fmt_number(v)} TFLOP/s" for v in sorted(values)))
        for dtype, values in by_dtype.items()
    ]
    note = "read from the rows (each row's % of peak divides by it); the file's header does not record it"
    return ["<h3>Ceiling</h3>", pairs(items), f"<p class='note'>{esc(note)}.</p>"]


def environment_section(header: Document, rows: list[Row]) -> str:
    """Where it was measured: the environment (fields not recorded left out), the config (shapes,
    variants, sweep axes) and the matmul ceiling."""
    parts = ["<h2 id='environment'>Environment, config and ceiling</h2>"]
    return "\n".join(parts + _environment(header) + _config(header, rows) + _ceiling(header, rows))
