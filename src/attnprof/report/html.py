"""The HTML report: one self-contained page (CSS inline, plots embedded as base64 SVG, no script, no
external resource) from a results file's header and rows. Formatting only.

The comparison and at-a-glance tables are `report.tables`' cells, the kernel tables
`report.analysis_tables`' cells, every text escaped with `html.escape`. Trace links are relative
to the report's folder, so the report and the run folder can move together.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from attnprof.report.analysis_tables import KERNEL_COLUMNS, kernel_rows
from attnprof.report.formatting import fmt_number
from attnprof.report.results_file import ResultsFile
from attnprof.report.tables import (
    GLANCE_FITTED,
    SHAPE_COLUMNS,
    UNRELIABLE,
    compare_groups,
    glance_rows,
    per_step,
    shape_rows,
)

TOP_KERNELS = 10
PERFETTO = "https://ui.perfetto.dev"
#: Columns of the generic results table, for rows without a shape (e.g. `model`): field and header.
GENERIC_COLUMNS = (
    ("variant", "variant"),
    ("seq", "seq"),
    ("mode", "mode"),
    ("status", "status"),
    ("latency_us", "latency µs"),
    ("attention_gpu_pct", "attention % of GPU time"),
    ("kernels_per_forward", "kernels/fwd"),
    ("gpu_time_us", "GPU µs"),
    ("cpu_time_us", "CPU µs"),
    ("peak_memory_mib", "peak MiB"),
    ("finding_ids", "findings"),
)
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
"""


@dataclass(frozen=True)
class PlotImage:
    """One plot to embed: its name, its title, and the SVG bytes."""

    name: str
    title: str
    svg: bytes


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _cell(text: str) -> str:
    numeric = text.replace(",", "").replace(".", "", 1).replace("%", "").strip().lstrip("~-").isdigit()
    return f'<td class="num">{_e(text)}</td>' if numeric else f"<td>{_e(text)}</td>"


def html_table(headers: Sequence[str] | None, rows: list[list[str]], css_class: str = "") -> str:
    """A table of escaped text cells (numbers right-aligned); no header row when `headers` is None."""
    head = "" if headers is None else "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr></thead>"
    body = "".join("<tr>" + "".join(_cell(str(c)) for c in row) + "</tr>" for row in rows)
    attribute = f" class='{css_class}'" if css_class else ""
    return f"<table{attribute}>{head}<tbody>{body}</tbody></table>"


def _pairs(items: list[tuple[str, Any]]) -> str:
    """A key/value table: keys as row headers."""
    body = "".join(f"<tr><th>{_e(key)}</th><td>{_e(_plain(value))}</td></tr>" for key, value in items)
    return f"<table class='pairs'><tbody>{body}</tbody></table>"


def _cell_name(row: dict[str, Any]) -> str:
    """`1x4x256x64 fwd+bwd` (shape, and the mode when it is not fwd), or `seq 4096` without a shape."""
    label = str(row.get("shape") or (f"seq {row['seq']}" if row.get("seq") is not None else "?"))
    mode = row.get("mode") or "fwd"
    return label if mode == "fwd" else f"{label} {mode}"


def _status_word(row: dict[str, Any]) -> str:
    return str(row.get("status", "")).partition(":")[0]


def environment_section(header: dict[str, Any]) -> str:
    """The environment, then the run's config and ceiling, as key/value tables."""
    env = header.get("environment") or {}
    parts = ["<h2 id='environment'>Environment</h2>"]
    if env:
        parts.append(_pairs(list(env.items())))
    else:
        parts.append("<p class='note'>The results file records no environment.</p>")
    config = header.get("config") or {}
    if config:
        keep = ("device", "dtype", "causal", "modes", "baseline", "schedule", "region", "seed")
        parts += ["<h3>Config</h3>", _pairs([(key, config[key]) for key in keep if key in config])]
    ceiling = header.get("ceiling") or {}
    if ceiling:
        items: list[tuple[str, Any]] = [("matmul ceiling", f"{fmt_number(ceiling.get('tflops'))} TFLOP/s")]
        if ceiling.get("read_gbps") is not None:
            items.append(("read bandwidth", f"{fmt_number(ceiling['read_gbps'])} GB/s"))
        if ceiling.get("bandwidth_gbps") is not None:
            items.append(("copy bandwidth (read + write)", f"{fmt_number(ceiling['bandwidth_gbps'])} GB/s"))
        keys = ("method", "read_method", "source", "measured_at", "reason")
        items += [(key, ceiling[key]) for key in keys if ceiling.get(key)]
        parts += ["<h3>Ceiling</h3>", _pairs(items)]
    return "\n".join(parts)


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "n/a" if value is None else str(value)


def comparison_section(rows: list[dict[str, Any]], baseline: str | None) -> str:
    """One comparison table per shape and mode, then the at-a-glance table; rows without a shape
    (e.g. `model`) get one table of their fields instead."""
    parts = ["<h2 id='comparison'>Comparison</h2>"]
    if not rows:
        return parts[0] + "<p class='note'>The results file holds no rows.</p>"
    if not all(row.get("shape") for row in rows):
        present = [(key, name) for key, name in GENERIC_COLUMNS if any(row.get(key) is not None for row in rows)]
        body = [[_plain(row.get(key)) if key != "status" else _status_word(row) for key, _ in present] for row in rows]
        return "\n".join(parts + [html_table([name for _, name in present], body)])
    for title, group in compare_groups(rows, baseline):
        columns = per_step(SHAPE_COLUMNS, {row.get("mode") or "fwd" for row in group})
        parts += [f"<h3>{_e(title)}</h3>", html_table([c.header for c in columns], shape_rows(group, full=False))]
        if any(row.get("speedup_reliable") is False for row in group):
            parts.append(f"<p class='note'>{_e(UNRELIABLE)}</p>")
    glance = per_step(GLANCE_FITTED, {row.get("mode") or "fwd" for row in rows})
    parts += ["<h3>At a glance</h3>", html_table([c.header for c in glance], glance_rows(rows, fitted=True))]
    return "\n".join(parts)


def not_ok_section(rows: list[dict[str, Any]]) -> str:
    """Every skipped or failed cell with its reason (empty when every row is ok)."""
    bad = [row for row in rows if _status_word(row) != "ok"]
    if not bad:
        return ""
    body = [
        [str(r.get("variant")), _cell_name(r), _status_word(r), str(r.get("reason") or r.get("status"))] for r in bad
    ]
    return "\n".join(
        [
            "<h2 id='not-ok'>Skipped and failed</h2>",
            "<p class='note'>Left out of the plots and of the kernel tables.</p>",
            html_table(("variant", "cell", "status", "reason"), body),
        ]
    )


def _by_variant(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(str(row.get("variant")), []).append(row)
    return grouped


def findings_section(rows: list[dict[str, Any]]) -> str:
    """Per variant, each finding's id and message, with the cells it was found in."""
    parts = ["<h2 id='findings'>Findings</h2>"]
    for variant, group in _by_variant(rows).items():
        found: dict[tuple[str, str], list[str]] = {}
        for row in group:
            for finding in row.get("findings") or []:
                if isinstance(finding, dict):
                    found.setdefault((str(finding.get("id")), str(finding.get("message"))), []).append(_cell_name(row))
        if not found:
            continue
        many = len(group) > 1
        items = [
            f"<li><code>{_e(fid)}</code> {_e(message)}"
            + (f" <span class='meta'>({_e(', '.join(cells))})</span>" if many else "")
            + "</li>"
            for (fid, message), cells in found.items()
        ]
        parts.append(f"<h3>{_e(variant)}</h3><ul>{''.join(items)}</ul>")
    if len(parts) == 1:
        parts.append("<p class='note'>No findings.</p>")
    return "\n".join(parts)


def plots_section(images: list[PlotImage], notes: list[str]) -> str:
    """Every plot embedded as a base64 SVG data URI, and why the others were left out."""
    parts = ["<h2 id='plots'>Plots</h2>"]
    for image in images:
        data = base64.b64encode(image.svg).decode("ascii")
        parts.append(
            f"<figure id='plot-{_e(image.name)}'><img alt='{_e(image.title)}' "
            f"src='data:image/svg+xml;base64,{data}'><figcaption>{_e(image.title)}</figcaption></figure>"
        )
    if notes:
        parts.append("<ul class='note'>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(parts)


def kernels_section(rows: list[dict[str, Any]]) -> str:
    """Per variant and cell, the kernels that took the most time per forward, with decoded names and
    occupancy; the longest cell of each variant is open, the others fold."""
    parts = ["<h2 id='kernels'>Top kernels</h2>"]
    headers = [c.header for c in KERNEL_COLUMNS] + ["library", "occupancy note"]
    for variant, group in _by_variant(rows).items():
        cells = [row for row in group if row.get("kernels")]
        if not cells:
            continue
        parts.append(f"<h3>{_e(variant)}</h3>")
        largest = max(cells, key=lambda row: row.get("seq") or 0)
        for row in cells:
            kernels = sorted(row["kernels"], key=lambda k: -(k.get("time_us") or 0))
            top = kernels[:TOP_KERNELS]
            body = [
                cells_ + [str(k.get("library") or ""), str(k.get("occupancy_note") or "")]
                for cells_, k in zip(kernel_rows(top, "markdown"), top, strict=True)
            ]
            more = len(kernels) - len(top)
            tail = f"<p class='note'>{more} more, each taking less time.</p>" if more > 0 else ""
            opened = " open" if row is largest else ""
            summary = f"{_cell_name(row)}: {len(kernels)} distinct kernels, memcpy and memset, by time per forward"
            table = html_table(headers, body, "kernels")
            parts.append(f"<details{opened}><summary>{_e(summary)}</summary>{table}{tail}</details>")
    if len(parts) == 1:
        parts.append("<p class='note'>No kernels in these rows (CPU runs launch none).</p>")
    return "\n".join(parts)


def trace_file(trace: str, results_path: Path, files: dict[str, Any] | None) -> Path | None:
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


def traces_section(rows: list[dict[str, Any]], results: ResultsFile, report_path: Path) -> str:
    """One link per profiled cell to its trace, relative to the report; a trace not found is named."""
    traced = [row for row in rows if row.get("trace")]
    if not traced:
        return ""
    body = []
    for row in traced:
        found = trace_file(str(row["trace"]), results.path, results.header.get("files"))
        if found is None:
            link = f"{_e(row['trace'])} <span class='warn'>(not found)</span>"
        else:
            href = Path(os.path.relpath(found.resolve(), report_path.resolve().parent)).as_posix()
            link = f"<a href='{_e(quote(href))}'>{_e(found.name)}</a>"
        body.append(f"<tr><td>{_e(row.get('variant'))}</td><td>{_e(_cell_name(row))}</td><td>{link}</td></tr>")
    note = (
        f"Open a trace in <a href='{PERFETTO}'>{PERFETTO}</a> (Open trace file) or in chrome://tracing; "
        "the .json.gz files load as they are."
    )
    return "\n".join(
        [
            "<h2 id='traces'>Traces</h2>",
            f"<p class='note'>{note}</p>",
            "<table><thead><tr><th>variant</th><th>cell</th><th>trace</th></tr></thead>",
            f"<tbody>{''.join(body)}</tbody></table>",
        ]
    )


def report_html(results: ResultsFile, report_path: Path, images: list[PlotImage], plot_notes: list[str]) -> str:
    """The whole page for a results file: header, environment, comparison, skipped and failed cells,
    findings, plots, top kernels and trace links."""
    header, rows = results.header, results.rows
    counts = {word: sum(_status_word(r) == word for r in rows) for word in ("ok", "skipped", "failed")}
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    meta = [
        f"{_e(header.get('command') or 'results')} of {_e(header.get('created') or 'an unknown date')}",
        f"attnprof {_e(header.get('attnprof_version') or '?')}",
        f"{len(rows)} cells ({_e(summary or 'none')})",
        f"from <span class='mono'>{_e(results.path.name)}</span>",
    ]
    warnings = []
    if header.get("interrupted"):
        warnings.append("The run was interrupted: only the cells that finished are here.")
    if results.truncated:
        warnings.append("The results stream's last line was cut short; the rows before it are here.")
    sections = [
        ("environment", "environment", environment_section(header)),
        ("comparison", "comparison", comparison_section(rows, (header.get("config") or {}).get("baseline"))),
        ("not-ok", "skipped and failed", not_ok_section(rows)),
        ("findings", "findings", findings_section(rows)),
        ("plots", "plots", plots_section(images, plot_notes)),
        ("kernels", "top kernels", kernels_section(rows)),
        ("traces", "traces", traces_section(rows, results, report_path)),
    ]
    nav = "".join(f"<a href='#{anchor}'>{_e(name)}</a>" for anchor, name, text in sections if text)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            "<html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>attnprof report: {_e(results.path.name)}</title><style>{CSS}</style></head><body>",
            "<h1>attnprof report</h1>",
            f"<p class='meta'>{' · '.join(meta)}</p>",
            *(f"<p class='warn'>{_e(w)}</p>" for w in warnings),
            f"<nav>{nav}</nav>",
            *(text for _anchor, _name, text in sections if text),
            "</body></html>",
        ]
    )
