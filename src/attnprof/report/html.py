"""The HTML report: one self-contained page (CSS inline, plots embedded as base64 SVG, no script, no
external resource) from a results file's header and rows. Formatting only.

The page leads with what matters and ends with where it was measured:

1. the headline: per shape × mode, the fastest variant, its latency, TFLOP/s, % of peak and speed-up,
   and the costliest problem findings of that cell;
2. the plots (latency bars per shape × mode first, then the lines against sequence length);
3. the comparison tables (a sweep's pivot tables first, its per-point tables folded), without the
   columns that are n/a in every row;
4. the findings, grouped by id: one entry per (variant, id) with the cells it fired on, its severity
   and impact; info findings folded;
5. top kernels, the kernel counters of rows that have them (Nsight Compute, `--ncu`), skipped and
   failed cells, trace links;
6. the environment (fields not recorded left out), the config and the ceiling.

Table cells are `report.tables`' and `report.sweep_tables`' texts, the kernel tables
`report.analysis_tables`', the counters tables `report.counters_tables`', every text escaped with
`html.escape`. Trace links are relative to the report's folder, so the report and the run folder can
move together.
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
from attnprof.report.counters_tables import (
    COUNTER_COLUMNS,
    ceilings_line,
    counters_facts,
    counters_heading,
    kernel_cells,
    shown_kernels,
)
from attnprof.report.formatting import fmt_number
from attnprof.report.layout import MISSING
from attnprof.report.ranking import INFO, PROBLEM, impact_text, rank_key, ranked, row_findings, severity
from attnprof.report.results_file import ResultsFile
from attnprof.report.sweep_tables import (
    Fired,
    basis_words,
    fired_once,
    pivot_cells,
    pivot_title,
    speed_basis,
    sweep_groups,
)
from attnprof.report.tables import (
    UNRELIABLE,
    compare_groups,
    shape_columns,
    shape_rows,
    speedup_text,
    variant_label,
)

TOP_KERNELS = 10
#: The problem findings the headline names per shape × mode.
HEADLINE_FINDINGS = 3
#: The cells a findings entry names before "and N more".
LISTED_CELLS = 6
#: More trace links than this fold under one line.
FOLDED_TRACES = 12
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
#: Columns the comparison tables keep even when every row is n/a there.
ALWAYS_SHOWN = ("variant", "status", "speed-up")
CONFIG_KEYS = ("device", "dtype", "causal", "mask", "score_mod", "modes", "baseline", "schedule", "region", "seed")
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


def drop_empty(
    headers: Sequence[str], rows: list[list[str]], keep: Sequence[str] = ALWAYS_SHOWN
) -> tuple[list[str], list[list[str]], list[str]]:
    """The headers and rows without the columns that are n/a (or empty) in every row, and the headers
    of those dropped; a column named in `keep` stays."""
    empty = [
        i for i, header in enumerate(headers) if header not in keep and rows and all(r[i] in MISSING for r in rows)
    ]
    kept = [i for i in range(len(headers)) if i not in empty]
    return [headers[i] for i in kept], [[row[i] for i in kept] for row in rows], [headers[i] for i in empty]


def _dropped_note(dropped: list[str]) -> str:
    return f"<p class='note'>Left out, n/a in every row: {_e(', '.join(dropped))}.</p>" if dropped else ""


def _pairs(items: list[tuple[str, Any]]) -> str:
    """A key/value table: keys as row headers; a list value gets one line per item."""
    body = "".join(f"<tr><th>{_e(key)}</th><td>{_value_html(value)}</td></tr>" for key, value in items)
    return f"<table class='pairs'><tbody>{body}</tbody></table>"


def _value_html(value: Any) -> str:
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return "<br>".join(_e(_plain(v)) for v in value)
    return _e(_plain(value))


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    return "n/a" if value is None else str(value)


def _cell_name(row: dict[str, Any]) -> str:
    """`1x4x256x64 fwd+bwd` (shape, and the mode when it is not fwd), or `seq 4096` without a shape."""
    label = str(row.get("shape") or (f"seq {row['seq']}" if row.get("seq") is not None else "?"))
    mode = row.get("mode") or "fwd"
    return label if mode == "fwd" else f"{label} {mode}"


def _status_word(row: dict[str, Any]) -> str:
    return str(row.get("status", "")).partition(":")[0]


def _severity_badge(word: str) -> str:
    return f"<span class='sev {_e(word)}'>{_e(word)}</span>"


def _finding_link(finding_id: str) -> str:
    return f"<a href='#finding-{_e(finding_id)}'><code>{_e(finding_id)}</code></a>"


# ------------------------------------------------------------------ 1. the headline


def _cells(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows of each shape × mode with their title; rows without a shape are one cell per seq and mode."""
    if all(row.get("shape") for row in rows):
        return compare_groups(rows, None)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(_cell_name(row), []).append(row)
    return list(grouped.items())


def fastest(group: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The ok row of the group with the least time, and which time that is (latency, else GPU time,
    else CPU time, as speed-ups are computed)."""
    key = speed_basis(group)
    timed = [row for row in group if row.get("status") == "ok" and row.get(key)]
    return (min(timed, key=lambda row: row[key]) if timed else None), key


def _headline_findings(group: list[dict[str, Any]]) -> str:
    """The costliest problem findings of one cell, across its variants: `variant: id (impact)`."""
    found = [(f, row) for row in group for f in row_findings(row) if severity(f) == PROBLEM]
    found.sort(key=lambda hit: rank_key(hit[0]))
    if not found:
        infos = sum(len(row_findings(row)) for row in group)
        return "<span class='note'>no problem found" + (f" ({infos} info findings below)" if infos else "") + "</span>"
    items = []
    for finding, row in found[:HEADLINE_FINDINGS]:
        cost = impact_text(finding)
        items.append(
            f"<li>{_e(variant_label(row, group))}: {_finding_link(finding['id'])}"
            + (f" <span class='meta'>{_e(cost)}</span>" if cost else "")
            + "</li>"
        )
    more = len(found) - HEADLINE_FINDINGS
    tail = f"<li class='note'>{more} more below</li>" if more > 0 else ""
    return f"<ul>{''.join(items)}{tail}</ul>"


def headline_section(rows: list[dict[str, Any]], baseline: str | None) -> str:
    """One row per shape × mode: the fastest variant, its time, TFLOP/s, % of peak and speed-up, and the
    cell's costliest problem findings. Columns n/a in every row are left out."""
    parts = ["<h2 id='headline'>Headline</h2>"]
    if not rows:
        return parts[0] + "<p class='note'>The results file holds no rows.</p>"
    bases = set()
    body: list[tuple[list[str], str]] = []
    for title, group in _cells(rows):
        best, key = fastest(group)
        bases.add(basis_words(key, group))
        findings = _headline_findings(group)
        if best is None:
            body.append(([title, "none ran", "", "", "", ""], findings))
            continue
        body.append(
            (
                [
                    title,
                    variant_label(best, group),
                    fmt_number(best.get(key)),
                    fmt_number(best.get("tflops")),
                    fmt_number(best.get("pct_of_peak")),
                    speedup_text(best),
                ],
                findings,
            )
        )
    time_header = next(iter(bases)) if len(bases) == 1 else "time µs"
    versus = f"speed-up vs {baseline}" if baseline else "speed-up"
    headers = ["shape × mode", "fastest", time_header, "TFLOP/s", "% of peak", versus]
    kept, cells, dropped = drop_empty(headers, [text for text, _ in body], keep=("shape × mode", "fastest"))
    head = "".join(f"<th>{_e(h)}</th>" for h in kept) + "<th>costliest problem findings</th>"
    lines = []
    for row_cells, (_, findings) in zip(cells, body, strict=True):
        tds = [f"<td>{_e(row_cells[0])}</td>", f"<td class='fastest'>{_e(row_cells[1])}</td>"]
        tds += [_cell(text) for text in row_cells[2:]]
        lines.append("<tr>" + "".join(tds) + f"<td>{findings}</td></tr>")
    parts.append(f"<table class='headline'><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>")
    notes = []
    if len(bases) > 1:
        notes.append("the time is the one speed-ups use: latency, else GPU time, else CPU time")
    elif not time_header.startswith("latency"):
        notes.append(f"no latency in these rows: the fastest is the one with the least {time_header}")
    if "% of peak" in kept:
        notes.append("% of peak: of the measured matmul ceiling (see the environment at the end)")
    notes.append("findings ranked by the time at stake per forward or step where they state it, largest first")
    parts.append(f"<p class='note'>{_e('; '.join(notes))}.</p>{_dropped_note(dropped)}")
    return "\n".join(parts)


# ------------------------------------------------------------------ 3. the comparison tables


def _findings_column(row: dict[str, Any]) -> str:
    """The row's problem finding ids, costliest first, and how many info findings it has besides."""
    found = ranked(row_findings(row))
    problems = [f["id"] for f in found if severity(f) == PROBLEM]
    infos = len(found) - len(problems)
    return " ".join(problems) + (f" (+{infos} info)" if infos else "")


def _shape_table(group: list[dict[str, Any]]) -> str:
    columns = shape_columns(group)
    headers = [c.header for c in columns]
    body = shape_rows(group, full=False)
    at = headers.index("findings")
    for line, row in zip(body, group, strict=True):
        line[at] = _findings_column(row)
    kept, cells, dropped = drop_empty(headers, body)
    return html_table(kept, cells) + _dropped_note(dropped)


def comparison_section(rows: list[dict[str, Any]], baseline: str | None) -> str:
    """One comparison table per shape and mode, without the columns n/a in every row; for a sweep (a
    length with several values at one point of the other axes) its pivot tables first and the
    per-point tables folded. Rows without a shape (e.g. `model`) get one table of their fields."""
    parts = ["<h2 id='comparison'>Comparison</h2>"]
    if not rows:
        return parts[0] + "<p class='note'>The results file holds no rows.</p>"
    if not all(row.get("shape") for row in rows):
        present = [(key, name) for key, name in GENERIC_COLUMNS if any(row.get(key) is not None for row in rows)]
        body = [[_plain(row.get(key)) if key != "status" else _status_word(row) for key, _ in present] for row in rows]
        return "\n".join(parts + [html_table([name for _, name in present], body)])
    pivot, groups = sweep_groups(rows)
    swept = pivot is not None and any(len({row.get(pivot) for row in group}) > 1 for group in groups)
    tables = []
    points = compare_groups(rows, baseline)
    for title, group in points:
        tables += [f"<h3>{_e(title)}</h3>", _shape_table(group)]
        if any(row.get("speedup_reliable") is False for row in group):
            tables.append(f"<p class='note'>{_e(UNRELIABLE)}</p>")
    if not swept or pivot is None:
        return "\n".join(parts + tables)
    parts.append(
        "<p class='note'>Each cell: the median latency in µs and the speed-up over the baseline at that point "
        "(without a latency, the time named in the title). Every point in full follows, folded.</p>"
    )
    for group in groups:
        pivot_headers, pivot_body = pivot_cells(group, pivot)
        parts += [f"<h3>{_e(pivot_title(group, pivot, baseline))}</h3>", html_table(pivot_headers, pivot_body)]
    if any(row.get("speedup_reliable") is False for row in rows):
        parts.append(f"<p class='note'>{_e(UNRELIABLE)}</p>")
    parts.append(f"<details><summary>Every point in full ({len(points)} tables)</summary>{''.join(tables)}</details>")
    return "\n".join(parts)


# ------------------------------------------------------------------ 4. the findings, grouped by id


def _cells_text(entry: Fired) -> str:
    """The cells one (variant, id) fired on, each with its impact when it has one."""
    if len(entry.hits) == entry.ok_rows and entry.ok_rows > 2:
        return f"every cell ({entry.ok_rows})"
    hits = sorted(entry.hits, key=lambda hit: rank_key(hit[0]))
    costs = any(impact_text(f) for f, _row in hits)
    named = [_cell_name(row) + (f": {impact_text(f) or 'n/a'}" if costs else "") for f, row in hits[:LISTED_CELLS]]
    more = len(hits) - LISTED_CELLS
    return ("; " if costs else ", ").join(named) + (f" and {more} more" if more > 0 else "")


def _finding_group(finding_id: str, entries: list[Fired]) -> str:
    """One finding id: its severity and summary, then one row per variant it fired for."""
    from attnprof.analysis.findings import FINDINGS

    summary = FINDINGS.get(finding_id).summary if finding_id in FINDINGS else ""
    word = entries[0].severity
    costs = any(impact_text(entry.top) for entry in entries)
    rows = []
    for entry in entries:
        same = len({f.get("message") for f, _row in entry.hits}) == 1
        where = (
            "" if same or len(entry.hits) == 1 else f" <span class='meta'>(at {_e(_cell_name(entry.top_row))})</span>"
        )
        cost = impact_text(entry.top)
        impact = f"<td class='num'>{_e(('up to ' if len(entry.hits) > 1 else '') + cost if cost else 'n/a')}</td>"
        rows.append(
            f"<tr data-finding='{_e(finding_id)}' data-variant='{_e(entry.variant)}'>"
            f"<td>{_e(entry.variant)}</td><td>{_e(_cells_text(entry))}</td>{impact if costs else ''}"
            f"<td>{_e(entry.top.get('message'))}{where}</td></tr>"
        )
    headers = ["variant", "cells"] + (["impact"] if costs else []) + ["what the trace shows"]
    head = "<thead><tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr></thead>"
    return (
        f"<section class='finding' id='finding-{_e(finding_id)}'>"
        f"<h3><code>{_e(finding_id)}</code> {_severity_badge(word)}</h3>"
        + (f"<p class='summary'>{_e(summary)}</p>" if summary else "")
        + f"<table class='findings'>{head}<tbody>{''.join(rows)}</tbody></table></section>"
    )


def findings_section(rows: list[dict[str, Any]]) -> str:
    """Every finding id, costliest first, with one entry per variant: the cells it fired on, its impact
    (the time per forward or step at stake, and its share of the cell's time) and its message. The
    info findings, facts with nothing to fix, follow folded."""
    parts = ["<h2 id='findings'>Findings</h2>"]
    by_id: dict[str, list[Fired]] = {}
    for entry in fired_once(rows):
        by_id.setdefault(entry.finding_id, []).append(entry)
    if not by_id:
        return parts[0] + "<p class='note'>No findings.</p>"
    problems = {i: e for i, e in by_id.items() if e[0].severity != INFO}
    infos = {i: e for i, e in by_id.items() if e[0].severity == INFO}
    parts.append(
        "<p class='note'>One entry per variant and finding, costliest first. Impact: the time per forward "
        "(per step with a backward) at stake, and its share of the cell's time, where the finding states "
        "it.</p>"
    )
    parts += [_finding_group(i, e) for i, e in problems.items()]
    if not problems:
        parts.append("<p class='note'>No problem found.</p>")
    if infos:
        names = ", ".join(infos)
        inner = "".join(_finding_group(i, e) for i, e in infos.items())
        parts.append(
            f"<details id='info-findings'><summary>{len(infos)} info findings, facts with nothing to fix: "
            f"{_e(names)}</summary>{inner}</details>"
        )
    return "\n".join(parts)


# ------------------------------------------------------------------ 5. kernels, skipped and failed, traces


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


def plots_section(images: list[PlotImage], notes: list[str]) -> str:
    """Every plot embedded as a base64 SVG data URI, and why the others were left out."""
    parts = ["<h2 id='plots'>Plots</h2>"]
    for image in images:
        data = base64.b64encode(image.svg).decode("ascii")
        parts.append(
            f"<figure id='plot-{_e(image.name)}'><img alt='{_e(image.title)}' "
            f"src='data:image/svg+xml;base64,{data}'><figcaption>{_e(image.title)}</figcaption></figure>"
        )
    if len(notes) == 1 or (notes and not images):
        parts.append("<ul class='note'>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    elif notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in notes)
        parts.append(
            f"<details class='note'><summary>{len(notes)} plots not drawn, and why</summary><ul>{items}</ul></details>"
        )
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


def counters_section(rows: list[dict[str, Any]]) -> str:
    """The rows with hardware counters (Nsight Compute, `--ncu`) in one table: each row's kernels of the step
    it shows, their counters and place on the roofline; then per row its facts, notes and the counter
    findings it raised (linked to the Findings section), and every kernel of a report of several steps,
    folded. "" when no row has counters."""
    counted = [row for row in rows if row.get("counters")]
    if not counted:
        return ""
    unit = "step" if any((r.get("mode") or "fwd") != "fwd" for r in counted) else "forward"
    parts = [
        "<h2 id='counters'>Kernel counters</h2>",
        f"<p class='note'>{_e(counters_heading('markdown', None, unit)[-1])} The roofline plot places each "
        "kernel: <a href='#plot-roofline'>Plots</a>.</p>",
    ]
    shared = {ceilings_line(row["counters"]) for row in counted}
    one_ceiling = len(shared) == 1
    if one_ceiling:
        line = next(iter(shared))
        parts.append(f"<p>{_e(line[0].upper() + line[1:])}.</p>")
    headers = ["variant · cell"] + [c.header for c in COUNTER_COLUMNS[1:]]
    label = {id(row): f"{row.get('variant')} · {_cell_name(row)}" for row in counted}
    body = [[label[id(row)], *kernel_cells(k, p)] for row in counted for k, p in shown_kernels(row["counters"], False)]
    parts.append(html_table(headers, body, "counters"))
    items = []
    for row in counted:
        counters = row["counters"]
        notes = [counters_facts(counters, ceilings=not one_ceiling)]
        if counters.get("match"):
            notes.append(counters["match"]["text"] + ".")
        notes += list(counters.get("occupancy_measured") or []) + list(counters.get("notes") or [])
        ids = [f["id"] for f in counters.get("findings") or []]
        found = f" Counter findings: {', '.join(_finding_link(i) for i in ids)}." if ids else ""
        every = shown_kernels(counters, every=True)
        folded = ""
        if len(every) > len(shown_kernels(counters, every=False)):
            table = html_table(headers[1:], [kernel_cells(k, p) for k, p in every], "counters")
            folded = f"<details><summary>every kernel of its report ({len(every)})</summary>{table}</details>"
        items.append(f"<li><b>{_e(label[id(row)])}</b>: {_e(' '.join(notes))}{found}{folded}</li>")
    parts.append("<ul class='note'>" + "".join(items) + "</ul>")
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
    table = (
        "<table><thead><tr><th>variant</th><th>cell</th><th>trace</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )
    if len(body) > FOLDED_TRACES:
        table = f"<details><summary>{len(body)} trace files</summary>{table}</details>"
    return "\n".join(["<h2 id='traces'>Traces</h2>", f"<p class='note'>{note}</p>", table])


# ------------------------------------------------------------------ 6. environment, config, ceiling


def _environment(header: dict[str, Any]) -> list[str]:
    env = header.get("environment") or {}
    if not env:
        return ["<p class='note'>The results file records no environment.</p>"]
    recorded = [(key, value) for key, value in env.items() if value is not None]
    missing = [key for key, value in env.items() if value is None]
    parts = [_pairs(recorded)]
    if missing and str(env.get("device") or "").startswith("cpu"):
        parts.append(f"<p class='note'>A CPU run: no GPU, CUDA or driver fields ({len(missing)} left out).</p>")
    elif missing:
        parts.append(f"<p class='note'>Not recorded: {_e(', '.join(missing))}.</p>")
    return parts


def _config(header: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    config = header.get("config") or {}
    items: list[tuple[str, Any]] = [(key, config[key]) for key in CONFIG_KEYS if config.get(key) is not None]
    if config.get("shapes"):
        items.append(("shapes", list(config["shapes"])))
    if config.get("variants"):
        items.append(("variants (patterns)", config["variants"]))
    if config.get("exclude"):
        items.append(("exclude", list(config["exclude"])))
    axes = {k: v for k, v in (config.get("sweep") or {}).items() if v is not None}
    if axes:
        items.append(("sweep axes", "; ".join(f"{k}: {_plain(v)}" for k, v in axes.items())))
    ran = list(dict.fromkeys(str(row.get("variant")) for row in rows))
    if ran:
        items.append(("variants in the results", ", ".join(ran)))
    return ["<h3>Config</h3>", _pairs(items)] if items else []


def _ceiling_items(ceiling: dict[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = [("matmul ceiling", f"{fmt_number(ceiling.get('tflops'))} TFLOP/s")]
    if ceiling.get("read_gbps") is not None:
        items.append(("read bandwidth", f"{fmt_number(ceiling['read_gbps'])} GB/s"))
    if ceiling.get("bandwidth_gbps") is not None:
        items.append(("copy bandwidth (read + write)", f"{fmt_number(ceiling['bandwidth_gbps'])} GB/s"))
    keys = ("method", "read_method", "source", "measured_at", "reason")
    return items + [(k, ceiling[k]) for k in keys if ceiling.get(k)]


def _ceiling(header: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The run's ceiling (one dtype), its ceilings by dtype, or, for a results stream whose first line
    was written before the ceiling was measured, the ceiling each row was divided by."""
    if header.get("ceiling"):
        return ["<h3>Ceiling</h3>", _pairs(_ceiling_items(header["ceiling"]))]
    if header.get("ceilings"):
        parts = ["<h3>Ceilings</h3>"]
        for dtype, ceiling in header["ceilings"].items():
            parts += [f"<p class='meta'>{_e(dtype)}</p>", _pairs(_ceiling_items(ceiling))]
        return parts
    by_dtype: dict[str, set[float]] = {}
    for row in rows:
        if row.get("peak_tflops") is not None:
            by_dtype.setdefault(str(row.get("dtype")), set()).add(float(row["peak_tflops"]))
    reasons = sorted({str(row["pct_of_peak_note"]) for row in rows if row.get("pct_of_peak_note")})
    if not by_dtype:
        why = f": {'; '.join(reasons)}" if reasons else ""
        return ["<h3>Ceiling</h3>", f"<p class='note'>No matmul ceiling in these results{_e(why)}.</p>"]
    items = [
        (f"matmul ceiling, {dtype}", ", ".join(f"{fmt_number(v)} TFLOP/s" for v in sorted(values)))
        for dtype, values in by_dtype.items()
    ]
    note = "read from the rows (each row's % of peak divides by it); the file's header does not record it"
    return ["<h3>Ceiling</h3>", _pairs(items), f"<p class='note'>{_e(note)}.</p>"]


def environment_section(header: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """Where it was measured: the environment (fields not recorded left out), the config (shapes,
    variants, sweep axes) and the matmul ceiling."""
    parts = ["<h2 id='environment'>Environment, config and ceiling</h2>"]
    return "\n".join(parts + _environment(header) + _config(header, rows) + _ceiling(header, rows))


def _where(header: dict[str, Any]) -> str:
    """`on NVIDIA H200 (cuda:0), torch 2.11.0+cu130` or `on cpu (AMD EPYC, 2 cores), torch 2.13.0+cpu`."""
    env = header.get("environment") or {}
    device = env.get("device") or (header.get("config") or {}).get("device")
    if not device:
        return ""
    if env.get("gpu_name"):
        text = f"on {env['gpu_name']} ({device})"
    else:
        cores = f", {env['cpu_count']} cores" if env.get("cpu_count") else ""
        text = f"on {device}" + (f" ({env['cpu_model']}{cores})" if env.get("cpu_model") else "")
    return text + (f", torch {env['torch']}" if env.get("torch") else "")


def report_html(results: ResultsFile, report_path: Path, images: list[PlotImage], plot_notes: list[str]) -> str:
    """The whole page for a results file: the headline, plots, comparison tables, findings by id, top
    kernels, skipped and failed cells, trace links, then the environment, config and ceiling."""
    header, rows = results.header, results.rows
    baseline = (header.get("config") or {}).get("baseline")
    counts = {word: sum(_status_word(r) == word for r in rows) for word in ("ok", "skipped", "failed")}
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    meta = [
        f"{_e(header.get('command') or 'results')} of {_e(header.get('created') or 'an unknown date')}",
        _e(_where(header)),
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
    nav = "".join(f"<a href='#{anchor}'>{_e(name)}</a>" for anchor, name, text in sections if text)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            "<html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>attnprof report: {_e(results.path.name)}</title><style>{CSS}</style></head><body>",
            "<h1>attnprof report</h1>",
            f"<p class='meta'>{' · '.join(m for m in meta if m)}</p>",
            *(f"<p class='warn'>{_e(w)}</p>" for w in warnings),
            f"<nav>{nav}</nav>",
            *(text for _anchor, _name, text in sections if text),
            "</body></html>",
        ]
    )
