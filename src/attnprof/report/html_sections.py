"""The HTML report's reading sections: the headline (the fastest variant of each shape × mode, how much
slower the runner-up and the slowest are and their costliest finding, the cell's costliest problem
findings), the comparison tables (a sweep's pivot tables first, its per-point tables folded) and the
findings grouped by id. Formatting only: the cells are `report.tables`' and `report.sweep_tables`' texts,
every text escaped."""

from __future__ import annotations

from collections.abc import Callable

from attnprof.analysis.findings.judge import CPU_CONTENTION
from attnprof.report.columns import KERNEL_LEGEND, ratio_text, speedup_text
from attnprof.report.contended import marked, warning
from attnprof.report.formatting import fmt_number
from attnprof.report.html_parts import (
    SPEED_TIMES,
    cell_name,
    drop_empty,
    dropped_note,
    esc,
    finding_link,
    html_table,
    plain,
    severity_badge,
    status_word,
    text_cell,
)
from attnprof.report.ranking import INFO, PROBLEM, costliest_problem, impact_text, rank_key, ranked
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
    compare_groups,
    kernel_shown,
    legends,
    shape_columns,
    shape_rows,
    variant_label,
)
from attnprof.results.schema import Row

#: The problem findings the headline names per shape × mode.
HEADLINE_FINDINGS = 3
#: Findings the headline's warning line already states for every row they are on: not listed again there.
IN_WARNING = frozenset({CPU_CONTENTION})
#: What the ratio of a slower variant's time to the fastest's is of, by its `sweep_tables.SPEED_KEYS` name.
RATIO_OF = {"latency_us": "latency", "gpu_time_us": "GPU time", "cpu_time_us": "CPU time"}
SHAKY_RATIO = (
    "~x? marks a ratio from a latency (the variant's or the fastest's) that was still unstable "
    "(IQR over 10% of the median) after a re-time, or timed while other processes held the CPU"
)
#: The cells a findings entry names before "and N more".
LISTED_CELLS = 6
#: Columns of the generic results table, for rows without a shape (e.g. `model`): header and value.
GENERIC_COLUMNS: tuple[tuple[str, Callable[[Row], object]], ...] = (
    ("variant", lambda row: row.variant),
    ("seq", lambda row: row.seq),
    ("mode", lambda row: row.mode),
    ("status", lambda row: row.status),
    ("latency µs", lambda row: row.latency_us),
    ("attention % of GPU time", lambda row: row.attention_gpu_pct),
    ("kernels/fwd", lambda row: row.kernels_per_forward),
    ("GPU µs", lambda row: row.gpu_time_us),
    ("CPU µs", lambda row: row.cpu_time_us),
    ("peak MiB", lambda row: row.peak_memory_mib),
    ("findings", lambda row: " ".join(row.finding_ids)),
)


# ------------------------------------------------------------------ 1. the headline


def _cells(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """The rows of each shape × mode with their title; rows without a shape are one cell per seq and mode."""
    if all(row.shape for row in rows):
        return compare_groups(rows, None)
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(cell_name(row), []).append(row)
    return list(grouped.items())


def by_time(group: list[Row]) -> tuple[list[Row], str]:
    """The ok rows of the group that have a time, fastest first, and which time that is (latency, else GPU
    time, else CPU time, as speed-ups are computed)."""
    key = speed_basis(group)
    time = SPEED_TIMES[key]
    timed = [(row, value) for row in group if row.status == "ok" and (value := time(row))]
    return [row for row, _ in sorted(timed, key=lambda hit: hit[1])], key


def _slower_line(role: str, row: Row, best: Row, group: list[Row], key: str) -> tuple[str, bool]:
    """`runner-up: sdpa-flash, 1.31x the winner's latency; costliest finding: memory-bound, 203 µs (35%)`
    as a list item, and whether its ratio is marked unreliable (from an unstable or contended latency)."""
    time = SPEED_TIMES[key]
    shaky = key == "latency_us" and any(r.unstable or r.contended for r in (row, best))
    ratio = ratio_text((time(row) or 0.0) / (time(best) or 1.0), reliable=not shaky)
    text = f"{role}: {esc(variant_label(row, group))}, {esc(ratio)} the winner's {RATIO_OF[key]}; "
    finding = costliest_problem(row, leave_out=IN_WARNING)
    if finding is None:
        text += "no problem finding"
    else:
        cost = impact_text(finding)
        text += f"costliest finding: {finding_link(finding.id)}" + (
            f", <span class='meta'>{esc(cost)}</span>" if cost else ""
        )
    return f"<li class='{role}'>{text}</li>", shaky


def _slower(timed: list[Row], group: list[Row], key: str) -> tuple[str, bool]:
    """Why the others are slower: over the timed rows, fastest first (`by_time`), the runner-up's line and
    the slowest's when there are 3 or more ("" with fewer than 2); and whether a ratio is marked unreliable."""
    if len(timed) < 2:
        return "", False
    picked = [("runner-up", timed[1])] + ([("slowest", timed[-1])] if len(timed) > 2 else [])
    lines = [_slower_line(role, row, timed[0], group, key) for role, row in picked]
    return "<ul>" + "".join(line for line, _ in lines) + "</ul>", any(shaky for _, shaky in lines)


def _headline_findings(group: list[Row]) -> str:
    """The costliest problem findings of one cell, across its variants: `variant: id (impact)`."""
    found = [(f, row) for row in group for f in row.findings if f.severity == PROBLEM and f.id not in IN_WARNING]
    found.sort(key=lambda hit: rank_key(hit[0]))
    if not found:
        infos = sum(len(row.findings) for row in group)
        return "<span class='note'>no problem found" + (f" ({infos} info findings below)" if infos else "") + "</span>"
    items = []
    for finding, row in found[:HEADLINE_FINDINGS]:
        cost = impact_text(finding)
        items.append(
            f"<li>{esc(variant_label(row, group))}: {finding_link(finding.id)}"
            + (f" <span class='meta'>{esc(cost)}</span>" if cost else "")
            + "</li>"
        )
    more = len(found) - HEADLINE_FINDINGS
    tail = f"<li class='note'>{more} more below</li>" if more > 0 else ""
    return f"<ul>{''.join(items)}{tail}</ul>"


def headline_section(rows: list[Row], baseline: str | None) -> str:
    """One row per shape × mode: the fastest variant, its time, TFLOP/s, % of peak and speed-up; the
    runner-up and (with 3 or more timed variants) the slowest, each with its time over the fastest's and
    its costliest problem finding; and the cell's costliest problem findings. Columns n/a in every row are
    left out. A warning line leads it when a row was timed while other processes held the CPU
    (`report.contended`)."""
    parts = ["<h2 id='headline'>Headline</h2>"]
    if not rows:
        return parts[0] + "<p class='note'>The results file holds no rows.</p>"
    contended = warning(rows)
    if contended:
        parts.append(f"<p class='warn'>{esc(contended)}</p>")
    bases = set()
    body: list[tuple[list[str], str, str]] = []
    shaky = False
    for title, group in _cells(rows):
        timed, key = by_time(group)
        bases.add(basis_words(key, group))
        findings = _headline_findings(group)
        slower, shaky_here = _slower(timed, group, key)
        shaky = shaky or shaky_here
        if not timed:
            body.append(([title, "none ran", "", "", "", ""], slower, findings))
            continue
        best = timed[0]
        time = fmt_number(SPEED_TIMES[key](best))
        time = marked(best, time) if key == "latency_us" else time
        texts = [title, variant_label(best, group), time, fmt_number(best.tflops), fmt_number(best.pct_of_peak)]
        body.append((texts + [speedup_text(best)], slower, findings))
    time_header = next(iter(bases)) if len(bases) == 1 else "time µs"
    versus = f"speed-up vs {baseline}" if baseline else "speed-up"
    headers = ["shape × mode", "fastest", time_header, "TFLOP/s", "% of peak", versus]
    kept, cells, dropped = drop_empty(headers, [text for text, _, _ in body], keep=("shape × mode", "fastest"))
    any_slower = any(slower for _, slower, _ in body)
    head = "".join(f"<th>{esc(h)}</th>" for h in kept)
    head += ("<th>runner-up and slowest</th>" if any_slower else "") + "<th>costliest problem findings</th>"
    lines = []
    for row_cells, (_, slower, findings) in zip(cells, body, strict=True):
        tds = [f"<td>{esc(row_cells[0])}</td>", f"<td class='fastest'>{esc(row_cells[1])}</td>"]
        tds += [text_cell(text) for text in row_cells[2:]]
        tds += [f"<td class='slower'>{slower}</td>"] if any_slower else []
        lines.append("<tr>" + "".join(tds) + f"<td>{findings}</td></tr>")
    parts.append(f"<table class='headline'><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>")
    notes = []
    if len(bases) > 1:
        notes.append("the time is the one speed-ups use: latency, else GPU time, else CPU time")
    elif not time_header.startswith("latency"):
        notes.append(f"no latency in these rows: the fastest is the one with the least {time_header}")
    if shaky:
        notes.append(SHAKY_RATIO)
    if "% of peak" in kept:
        notes.append("% of peak: of the measured matmul ceiling (see the environment at the end)")
    notes.append("findings ranked by the time at stake per forward or step where they state it, largest first")
    parts.append(f"<p class='note'>{esc('; '.join(notes))}.</p>{dropped_note(dropped)}")
    return "\n".join(parts)


# ------------------------------------------------------------------ 3. the comparison tables


def _findings_column(row: Row) -> str:
    """The row's problem finding ids, costliest first, and how many info findings it has besides."""
    found = ranked(row.findings)
    problems = [f.id for f in found if f.severity == PROBLEM]
    infos = len(found) - len(problems)
    return " ".join(problems) + (f" (+{infos} info)" if infos else "")


def _shape_table(group: list[Row]) -> str:
    columns = shape_columns(group)
    headers = [c.header for c in columns]
    body = shape_rows(group, full=False)
    at = headers.index("findings")
    for line, row in zip(body, group, strict=True):
        line[at] = _findings_column(row)
    kept, cells, dropped = drop_empty(headers, body)
    return html_table(kept, cells) + dropped_note(dropped)


def _generic_table(rows: list[Row]) -> str:
    """One table of the rows' fields, for rows without a shape; the columns no row has are left out."""
    values = [[get(row) for _, get in GENERIC_COLUMNS] for row in rows]
    present = [i for i in range(len(GENERIC_COLUMNS)) if any(line[i] is not None for line in values)]
    body = [
        [status_word(row) if GENERIC_COLUMNS[i][0] == "status" else plain(line[i]) for i in present]
        for row, line in zip(rows, values, strict=True)
    ]
    return html_table([GENERIC_COLUMNS[i][0] for i in present], body)


def comparison_section(rows: list[Row], baseline: str | None) -> str:
    """One comparison table per shape and mode, without the columns n/a in every row; for a sweep (a
    length with several values at one point of the other axes) its pivot tables first and the
    per-point tables folded. Rows without a shape (e.g. `model`) get one table of their fields."""
    parts = ["<h2 id='comparison'>Comparison</h2>"]
    if not rows:
        return parts[0] + "<p class='note'>The results file holds no rows.</p>"
    if not all(row.shape for row in rows):
        return "\n".join(parts + [_generic_table(rows)])
    pivot, groups = sweep_groups(rows)
    pivots = [] if pivot is None else [(group, *pivot_cells(group, pivot)) for group in groups]
    swept = any(len(headers) > 3 for _, headers, _ in pivots)  # variant, a value of the pivot each, findings
    tables = []
    points = compare_groups(rows, baseline)
    for title, group in points:
        tables += [f"<h3>{esc(title)}</h3>", _shape_table(group)]
        tables += [f"<p class='note'>{esc(line)}</p>" for line in legends(group, None)]
        if kernel_shown(shape_rows(group, full=False)):
            tables.append(f"<p class='note'>{esc(KERNEL_LEGEND)}</p>")
    if not swept or pivot is None:
        return "\n".join(parts + tables)
    parts.append(
        "<p class='note'>Each cell: the median latency in µs and the speed-up over the baseline at that point "
        "(without a latency, the time named in the title). Every point in full follows, folded.</p>"
    )
    for group, pivot_headers, pivot_body in pivots:
        parts += [f"<h3>{esc(pivot_title(group, pivot, baseline))}</h3>", html_table(pivot_headers, pivot_body)]
    parts += [f"<p class='note'>{esc(line)}</p>" for line in legends(rows, None)]
    parts.append(f"<details><summary>Every point in full ({len(points)} tables)</summary>{''.join(tables)}</details>")
    return "\n".join(parts)


# ------------------------------------------------------------------ 4. the findings, grouped by id


def _cells_text(entry: Fired) -> str:
    """The cells one (variant, id) fired on, each with its impact when it has one."""
    if len(entry.hits) == entry.ok_rows and entry.ok_rows > 2:
        return f"every cell ({entry.ok_rows})"
    hits = sorted(entry.hits, key=lambda hit: rank_key(hit[0]))
    costs = any(impact_text(f) for f, _row in hits)
    named = [cell_name(row) + (f": {impact_text(f) or 'n/a'}" if costs else "") for f, row in hits[:LISTED_CELLS]]
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
        same = len({f.message for f, _row in entry.hits}) == 1
        where = (
            "" if same or len(entry.hits) == 1 else f" <span class='meta'>(at {esc(cell_name(entry.top_row))})</span>"
        )
        cost = impact_text(entry.top)
        impact = f"<td class='num'>{esc(('up to ' if len(entry.hits) > 1 else '') + cost if cost else 'n/a')}</td>"
        rows.append(
            f"<tr data-finding='{esc(finding_id)}' data-variant='{esc(entry.variant)}'>"
            f"<td>{esc(entry.variant)}</td><td>{esc(_cells_text(entry))}</td>{impact if costs else ''}"
            f"<td>{esc(entry.top.message)}{where}</td></tr>"
        )
    headers = ["variant", "cells"] + (["impact"] if costs else []) + ["what the trace shows"]
    head = "<thead><tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr></thead>"
    return (
        f"<section class='finding' id='finding-{esc(finding_id)}'>"
        f"<h3><code>{esc(finding_id)}</code> {severity_badge(word)}</h3>"
        + (f"<p class='summary'>{esc(summary)}</p>" if summary else "")
        + f"<table class='findings'>{head}<tbody>{''.join(rows)}</tbody></table></section>"
    )


def findings_section(rows: list[Row]) -> str:
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
            f"{esc(names)}</summary>{inner}</details>"
        )
    return "\n".join(parts)
