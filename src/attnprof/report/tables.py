"""Tables for `list` and `compare`, rendered with tabulate from typed rows (`results.schema.Row`); the
comparison table's metric columns are `report.columns`'. Formatting only.

Every renderer takes `width`: None (`--wide`, and always for markdown) gives the full tables;
a number fits every line of the `table` style to it (see `report.layout`): low-value columns
are dropped, long text is wrapped, and reasons and finding messages move below the tables,
with the finding ids left in them; fitted, only the `problem` findings show (see `report.impact`).
`compare` ends with "What to look at", the findings that cost the most.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnprof.report.columns import BANDWIDTH_HEADER, KERNEL_LEGEND, KERNEL_MARK, Cell, placed
from attnprof.report.contended import legend
from attnprof.report.counters_tables import counters_section
from attnprof.report.formatting import fmt_count, fmt_number
from attnprof.report.impact import finding_line, left_out, shown, shown_ids, unit_of, what_to_look_at
from attnprof.report.layout import Column, bullets, fitted_columns, limit, table, wrap
from attnprof.results.schema import Row

UNRELIABLE = (
    "~x? marks an unreliable speed-up: the variant's or the baseline's timing was still unstable "
    "(IQR over 10% of the median) after a re-time, or timed while other processes held the CPU"
)

LIST_COLUMNS = (
    Column("variant", narrow=16),
    Column("runs here"),
    Column("why not", narrow=10, wide=40),
    Column("from", narrow=10),
    Column("description", narrow=20, wide=60),
)

GLANCE_COLUMNS = (
    Column("variant", narrow=16),
    Column("shape"),
    Column("kernels/fwd", drop=2),
    Column("GPU µs/fwd", drop=3),
    Column("CPU µs/fwd", drop=1),
    Column("what the trace revealed", narrow=30, wide=90),
)


def variant_list_table(entries: list[dict[str, Any]], fmt: str, width: int | None = None) -> str:
    """`attnprof list`: name, availability here, reason, source, description."""
    rows = [
        [e["name"], "yes" if e["available"] else "no", e["reason"] or "", e["source"], e["description"]]
        for e in entries
    ]
    return table(LIST_COLUMNS, rows, fmt, width)


def _status_word(row: Row) -> str:
    return row.status.partition(":")[0]


def variant_label(row: Row, rows: list[Row]) -> str:
    """The variant's name, with `(rank R)` when its cell has a row from several ranks (a collective variant
    under torchrun)."""
    if row.rank is None:
        return row.variant
    twins = [r for r in rows if r.variant == row.variant and _shape_mode(r) == _shape_mode(row)]
    return f"{row.variant} (rank {row.rank})" if len(twins) > 1 else row.variant


def per_step(columns: tuple[Column, ...], modes: set[str]) -> tuple[Column, ...]:
    """The columns with `/fwd` read as `/step` when a backward mode is among `modes`: a row's counts
    and times there are of the whole timed step (forward, backward, or both), not of a forward."""
    if modes <= {"fwd"}:
        return columns
    return tuple(replace(c, header=c.header.replace("/fwd", "/step")) for c in columns)


def _shape_cells(rows: list[Row], full: bool, problems_only: bool = False) -> list[tuple[Column, Cell]]:
    """The comparison table's columns and cells: its own (variant, status, findings) and the metric columns
    `report.columns` places in it."""
    own: list[tuple[Column, Cell]] = [
        (Column("variant", narrow=16), lambda r: variant_label(r, rows)),
        (Column("status", wide=36), lambda r: r.status if full else _status_word(r)),
        (Column("findings", narrow=30, wide=40), lambda r: shown_ids(r, 0 if problems_only else None)),
    ]
    return placed("compare", own)


def shape_columns(rows: list[Row]) -> tuple[Column, ...]:
    """The comparison table's columns for these rows (`per_step` by their modes): when one of them is
    memory-bound (decode), its achieved bandwidth is the figure to read, so that column is the last to give
    way to a width."""
    columns = per_step(tuple(c for c, _ in _shape_cells(rows, full=False)), {row.mode or "fwd" for row in rows})
    if any(row.bound == "memory" for row in rows):
        columns = tuple(replace(c, drop=99) if c.header == BANDWIDTH_HEADER else c for c in columns)
    return columns


def shape_rows(rows: list[Row], full: bool, problems_only: bool = False) -> list[list[str]]:
    """The comparison table's cells (`shape_columns`) for the rows of one shape; `full` keeps each
    status's reason in its cell, else only the status word; `problems_only` leaves the info findings out.
    A row that never ran shows its variant and status only."""
    cells = _shape_cells(rows, full, problems_only)
    body = []
    for row in rows:
        ran = row.status == "ok" or row.forwards is not None
        body.append([cell(row) if ran or c.header in ("variant", "status") else "" for c, cell in cells])
    return body


def shape_table(rows: list[Row], fmt: str, width: int | None = None, keep: list[int] | None = None) -> str:
    """One comparison table for the rows of one shape; fitted, the reasons of rows that are not ok
    follow it as bullets. A legend follows when a speed-up is unreliable or a latency contended, and one for
    each reference raised above a measured ceiling (`reference_legend`). `keep`: the columns every shape's
    table of the output keeps (`compare_report`); None: this table's own fit."""
    width = limit(width, fmt)
    body = shape_rows(rows, full=width is None, problems_only=width is not None)
    notes = reason_bullets(rows, width) if width is not None else []
    notes += legends(rows, width)
    columns = shape_columns(rows)
    if width is not None and keep is None:
        keep = fitted_columns(columns, body, width)
    if kernel_shown(body, keep):
        notes += wrap(KERNEL_LEGEND, width)
    return "\n".join([table(columns, body, fmt, width, keep)] + (["", *notes] if notes else []))


def reference_legend(rows: list[Row]) -> list[str]:
    """The raised references the rows' percentages divide by (`pipeline.references`), each once: a best
    achieved figure above the ceiling measured on the device, which every row of that device divides by."""
    notes = [note for row in rows for note in (row.peak_reference_note, row.read_bandwidth_note) if note]
    return list(dict.fromkeys(notes))


def kernel_shown(body: list[list[str]], keep: list[int] | None = None) -> bool:
    """True when a cell of the table's `body` (its columns `keep`, None: all) holds a figure by kernel time,
    marked: the table then needs `KERNEL_LEGEND`."""
    return any(cell.endswith(KERNEL_MARK) for line in body for i, cell in enumerate(line) if keep is None or i in keep)


def legends(rows: list[Row], width: int | None, unreliable: str = UNRELIABLE) -> list[str]:
    """The legend lines of a table of these rows: the contention mark's (`report.contended`) when a row is
    contended, `unreliable` when a speed-up is unreliable, and each raised reference (`reference_legend`)."""
    lines = []
    contended = legend(rows)
    if contended:
        lines += wrap(contended, width)
    if any(row.speedup_reliable is False for row in rows):
        lines += wrap(unreliable, width)
    for note in reference_legend(rows):
        lines += wrap(note, width)
    return lines


def reason_bullets(rows: list[Row], width: int) -> list[str]:
    """One bullet per distinct reason a row is not ok, naming its variants once each (a `variant` and a
    `status` per row)."""
    grouped: dict[str, dict[str, None]] = {}
    for row in rows:
        if row.status != "ok":
            grouped.setdefault(row.status, {})[variant_label(row, rows)] = None
    return [bullets([f"{', '.join(names)}: {status}" for status, names in grouped.items()], width)] if grouped else []


def glance_rows(results: list[Row], fitted: bool, problems_only: bool = False) -> list[list[str]]:
    """The at-a-glance cells (`GLANCE_COLUMNS`), one row per entry; `fitted` puts finding ids and
    status words where the full table has finding messages and whole statuses; `problems_only`
    leaves the info findings out."""
    body = []
    for row in results:
        if row.forwards is None:
            status = _status_word(row) if fitted else row.status
            body.append([variant_label(row, results), _shape_mode(row), "", "", "", status])
            continue
        findings = shown(row.findings, 0 if problems_only else None)
        revealed = " ".join(f.id for f in findings) if fitted else "; ".join(f.message for f in findings)
        body.append(
            [
                variant_label(row, results),
                _shape_mode(row),
                fmt_count(row.kernels_per_forward),
                fmt_number(row.gpu_time_us),
                fmt_number(row.cpu_time_us),
                revealed or "nothing unusual",
            ]
        )
    return body


#: The at-a-glance columns of a fitted table: the last one holds finding ids.
GLANCE_FITTED = GLANCE_COLUMNS[:-1] + (replace(GLANCE_COLUMNS[-1], header="findings"),)


def glance_table(results: list[Row], fmt: str, width: int | None = None) -> str:
    """One row per variant: kernels/forward, GPU and CPU time, and what the trace revealed; fitted, the
    column holds the finding ids and the messages follow as wrapped bullets."""
    width = limit(width, fmt)
    fitted = width is not None
    body = glance_rows(results, fitted, problems_only=fitted)
    modes = {row.mode or "fwd" for row in results}
    if not fitted:
        return table(per_step(GLANCE_COLUMNS, modes), body, fmt)
    shapes = len({_shape_mode(row) for row in results})
    messages = [
        finding_line(f, unit_of(r), f"{variant_label(r, results)}{' @ ' + _shape_mode(r) if shapes > 1 else ''}")
        for r in results
        for f in shown(r.findings, width)
    ]
    columns = per_step(GLANCE_FITTED, modes)
    notes = (["", bullets(messages, width)] if messages else []) + left_out(results, width)
    return "\n".join([table(columns, body, fmt, width), *notes])


def cell_label(row: Row) -> str:
    """`8x16x1024x64 bf16 causal fwd+bwd`: shape, dtype, masking and mode of a row. A sized mask is in the
    shape (`4x16x4096x64 sw256`), so its masking word is `masked`."""
    sized = row.mask not in (None, "", "causal", "none")
    masking = "masked" if sized else "causal" if row.causal else "full"
    return f"{row.shape} {row.dtype} {masking} {row.mode or 'fwd'}"


def cell_title(row: Row, rows: list[Row] | None = None) -> str:
    """`8x16x1024x64 bf16 causal fwd+bwd on cuda:0`: `cell_label` and the device of a row (every device of
    `rows`, when they ran on several: the ranks of a torchrun run)."""
    return f"{cell_label(row)} on {', '.join(dict.fromkeys(str(r.device) for r in rows or [row]))}"


def _shape_mode(row: Row) -> str:
    """The shape, with the mode after it when it is not the default `fwd`."""
    mode = row.mode or "fwd"
    return str(row.shape) if mode == "fwd" else f"{row.shape} {mode}"


def compare_groups(rows: list[Row], baseline: str | None) -> list[tuple[str, list[Row]]]:
    """The rows of each shape and mode, in file order, with the title of their comparison table."""
    groups = []
    for shape, mode in dict.fromkeys((r.shape, r.mode) for r in rows):
        group = [r for r in rows if r.shape == shape and r.mode == mode]
        title = cell_title(group[0], group) + (f", speed-up vs {baseline}" if baseline else "")
        groups.append((title, group))
    return groups


def compare_report(rows: list[Row], fmt: str, baseline: str | None, width: int | None = None) -> str:
    """`attnprof compare`: a titled table per shape, then the at-a-glance table. Fitted to a width, the
    shapes' tables all leave out the same columns: those that the widest of them needs to drop."""
    heading = "###" if fmt == "markdown" else "=="
    width = limit(width, fmt)
    groups = compare_groups(rows, baseline)
    keep = None
    if width is not None:  # one choice of columns for every shape's table, made on all their rows
        every = [cells for _, group in groups for cells in shape_rows(group, full=False, problems_only=True)]
        keep = fitted_columns(shape_columns(rows), every, width)
    parts = []
    for title, group in groups:
        parts += ["", *wrap(f"{heading} {title}", width), "", shape_table(group, fmt, width, keep)]
    parts += ["", f"{heading} at a glance", "", glance_table(rows, fmt, width)]
    shapes = len({_shape_mode(r) for r in rows})
    counters = counters_section(
        [(variant_label(r, rows) + (f" @ {_shape_mode(r)}" if shapes > 1 else ""), r.counters) for r in rows],
        fmt,
        width,
        "step" if any(unit_of(r) == "step" for r in rows) else "forward",
    )
    if counters:
        parts += ["", *counters]
    look = what_to_look_at(
        [(f"{variant_label(r, rows)}, {cell_label(r)}", unit_of(r), r.findings) for r in rows], fmt, width
    )
    return "\n".join(parts + (["", look] if look else []))
