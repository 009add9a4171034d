"""Fitting text to a width: tables that drop and narrow columns, wrapped bullets, and the profiler's table.

`table(columns, rows, fmt, width)` renders with tabulate. `width=None` (`--wide`) and markdown give
the full table, as it always was; a width gives the `table` style fitted to it. When the full
table is too wide, its droppable columns that are n/a in every row go first; then columns go in
their `Column.drop` order until the rest fits with each column at its floor (header wrapped to
its longest word, cells wrapped or cut to `Column.narrow`), and the most wanted of the dropped
ones come back while they still fit. The widest columns give way first. A `left out:` line under
the table names what it dropped. Long words (paths, kernel names) break after a `/`, `_` or `-`.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from tabulate import tabulate

from attnprof.report.formatting import table_style

BREAK_AFTER = "/_-"
NO_BREAK = "\u00a0"  # textwrap breaks only at ASCII whitespace
GAP = 2  # tabulate's "simple" style puts two spaces between columns
MISSING = ("", "n/a")
HEADER_BREAKS = re.compile(r"[ \t]+|(?<=\w{3}/)(?=\w{3})")  # where a header may wrap (not at NO_BREAK)
LAST_RESORT = 10  # the narrowest a narrowable column is wrapped to when nothing is left to drop


@dataclass(frozen=True)
class Column:
    """One table column and how it may give way to a width.

    `drop`: when the table does not fit, columns are dropped in increasing `drop` order (None:
    never dropped). `narrow`: the narrowest width its cells may be wrapped to (None: never
    narrowed); `cut`: narrowed by cutting each line with "…" instead of wrapping. `wide`: the
    wrap width of the full (`--wide`) table, as it always was.
    """

    header: str
    drop: int | None = None
    narrow: int | None = None
    cut: bool = False
    wide: int | None = None


class _Wrapper(textwrap.TextWrapper):
    """Breaks a word longer than a line after its last `/`, `_` or `-` that fits on the current line;
    without one, starts it on a line of its own (and breaks it there at the width if it must)."""

    def _handle_long_word(self, reversed_chunks: list[str], cur_line: list[str], cur_len: int, width: int) -> None:
        space_left = max(width - cur_len, 1)
        chunk = reversed_chunks[-1]
        end = max(chunk.rfind(sep, 1, space_left) for sep in BREAK_AFTER) + 1
        if end <= 0:
            if cur_line:
                return  # textwrap ends the line and comes back with the word at the start of the next
            end = space_left
        cur_line.append(chunk[:end])
        reversed_chunks[-1] = chunk[end:]


def _glue(text: str) -> str:
    """Joins a lone symbol (`±`, `/`, `=`) to the word after it with a no-break space."""
    return re.sub(r"(?<=\s)([^\w\s]) ", "\\1" + NO_BREAK, text)


def wrap(text: str, width: int | None, first: str = "", rest: str = "") -> list[str]:
    """`text` as lines of at most `width` characters (None: its own lines), the first line starting with
    `first` and every other with `rest`; a word is split only when it is longer than a line, and a
    lone symbol (`±`, `/`, `=`) stays with the word after it."""
    lines: list[str] = []
    for n, paragraph in enumerate(text.splitlines() or [""]):
        lead = first if n == 0 else rest
        if width is None:
            lines.append(lead + paragraph)
            continue
        wrapper = _Wrapper(width, initial_indent=lead, subsequent_indent=rest, break_on_hyphens=False)
        lines += [line.replace(NO_BREAK, " ") for line in wrapper.wrap(_glue(paragraph))] or [lead.rstrip()]
    return lines


def bullets(items: Sequence[str], width: int | None) -> str:
    """`- item` lines, each wrapped to `width` with its continuation lines indented under the text."""
    return "\n".join(line for item in items for line in wrap(item, width, "- ", "  "))


def _cut(text: str, width: int) -> str:
    return "\n".join(line if len(line) <= width else line[: width - 1] + "…" for line in text.splitlines())


def _text_width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _natural(column: Column, cells: list[str]) -> int:
    """The width tabulate gives the column: its widest line, at least the header plus its padding."""
    return max([len(column.header) + GAP if column.header else 0] + [_text_width(c) for c in cells])


def _floor(column: Column, cells: list[str], last_resort: bool) -> int:
    """The narrowest the column may be made: its header wrapped to its longest word (`kernels/fwd`
    also breaks after its `/`, `TFLOP/s` does not), its cells wrapped or cut to `narrow` when it
    has one; as a last resort (nothing left to drop), to LAST_RESORT."""
    widest = max((_text_width(c) for c in cells), default=0)
    cells_floor = widest if column.narrow is None else min(widest, LAST_RESORT if last_resort else column.narrow)
    header_floor = max((len(word) + GAP for word in HEADER_BREAKS.split(_glue(column.header))), default=0)
    return min(_natural(column, cells), max(cells_floor, header_floor))


def _shrink(widths: dict[int, int], floors: dict[int, int], excess: int) -> None:
    """Take `excess` characters off the widest columns, none below its floor."""
    while excess > 0:
        room = [i for i in widths if widths[i] > floors[i]]
        if not room:
            return
        widest = max(room, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1


def _is_empty(rows: list[list[str]], i: int) -> bool:
    return bool(rows) and all(row[i] in MISSING for row in rows)


def _cell(column: Column, text: str, width: int) -> str:
    if _text_width(text) <= width:
        return text
    return _cut(text, width) if column.cut else "\n".join(wrap(text, width))


def _header(column: Column, width: int) -> str:
    return "\n".join(wrap(column.header, width - GAP)) if column.header else ""


def _render(
    columns: Sequence[Column], rows: list[list[str]], kept: list[int], width: int, last_resort: bool = False
) -> str:
    """The kept columns at their natural widths, less what `width` needs from the widest of them
    (down to their floors); what wrapping leaves unused goes back to the columns furthest below
    their natural width (a cut column uses all it gets)."""
    cells = {i: [row[i] for row in rows] for i in kept}
    natural = {i: _natural(columns[i], cells[i]) for i in kept}
    widths = dict(natural)
    floors = {i: _floor(columns[i], cells[i], last_resort) for i in kept}
    _shrink(widths, floors, sum(widths.values()) + GAP * (len(kept) - 1) - width)
    used = {
        i: max(
            [_text_width(_header(columns[i], widths[i])) + GAP]
            + [_text_width(_cell(columns[i], c, widths[i])) for c in cells[i]]
        )
        for i in kept
    }
    slack = width - sum(used.values()) - GAP * (len(kept) - 1)
    for i in sorted(kept, key=lambda i: natural[i] - used[i], reverse=True):
        extra = max(0, min(slack, natural[i] - used[i]))
        used[i] += extra
        slack -= extra
    body = [[_cell(columns[i], row[i], used[i]) for i in kept] for row in rows]
    headers = [_header(columns[i], used[i]) for i in kept]
    return tabulate(body, headers=headers if any(headers) else (), tablefmt="simple", disable_numparse=True)


def _fit(
    columns: Sequence[Column], rows: list[list[str]], width: int, keep: list[int] | None = None
) -> tuple[str, list[int]]:
    """The table fitted to `width`, and the indices of the columns it left out.

    When the full table does not fit, its droppable columns that are n/a throughout go; then the
    others in `drop` order until the rest fits at their floors, and the most wanted of those put
    back while it still fits (`fitted_columns`). When nothing is left to drop, wrapping goes down to
    LAST_RESORT. `keep`: the columns to keep, decided for several tables at once (`fitted_columns`).
    """
    kept = fitted_columns(columns, rows, width) if keep is None else list(keep)
    fits = _text_width(_render(columns, rows, kept, width)) <= width
    text = _render(columns, rows, kept, width, last_resort=not fits)
    return text, [i for i in range(len(columns)) if i not in kept]


def fitted_columns(columns: Sequence[Column], rows: list[list[str]], width: int) -> list[int]:
    """The indices of the columns a table of these rows keeps at `width` (see `_fit`). Given the rows of
    several tables with these columns, the columns all of them can keep (pass it to `table` as `keep`)."""

    def fits(kept: list[int]) -> bool:
        return _text_width(_render(columns, rows, kept, width)) <= width

    kept = list(range(len(columns)))
    droppable = sorted((i for i, c in enumerate(columns) if c.drop is not None), key=lambda i: columns[i].drop or 0)
    full = sum(_natural(c, [row[i] for row in rows]) for i, c in enumerate(columns)) + GAP * (len(columns) - 1)
    if full > width:
        kept = [i for i in kept if not (i in droppable and _is_empty(rows, i))]
    dropped: list[int] = []
    for i in (i for i in droppable if i in kept):
        if fits(kept):
            break
        kept.remove(i)
        dropped.append(i)
    for i in reversed(dropped[:-1]):
        if fits(sorted(kept + [i])):
            kept = sorted(kept + [i])
    return kept


def limit(width: int | None, fmt: str) -> int | None:
    """The width the output must fit: `width` in the table style, None (no limit) in markdown."""
    return width if fmt == "table" else None


def table(
    columns: Sequence[Column],
    rows: list[list[str]],
    fmt: str,
    width: int | None = None,
    keep: list[int] | None = None,
) -> str:
    """The rows under the columns' headers: in full for markdown or `width=None`, else fitted to `width`
    with a wrapped note naming the columns left out. `keep`: the columns to keep, decided for several
    tables at once so that all of them leave out the same ones (`fitted_columns`)."""
    fit_to = limit(width, fmt)
    if fit_to is None:
        wide = [c.wide for c in columns] if fmt == "table" and any(c.wide for c in columns) else None
        headers = [c.header for c in columns]
        return tabulate(
            rows,
            headers=() if fmt == "table" and not any(headers) else headers,
            tablefmt=table_style(fmt),
            maxcolwidths=wide,
            disable_numparse=True,
        )
    text, dropped = _fit(columns, rows, fit_to, keep)
    notes = []
    empty = [columns[i].header for i in dropped if _is_empty(rows, i)]
    squeezed = [columns[i].header for i in dropped if not _is_empty(rows, i)]
    if empty:
        notes.append(f"{', '.join(empty)} (n/a throughout)")
    if squeezed:
        notes.append(f"{', '.join(squeezed)} (no room at {fit_to} columns)")
    return "\n".join([text] + _left_out(notes, fit_to))


def _left_out(notes: list[str], width: int) -> list[str]:
    """The wrapped `left out: ...` line under a fitted table; none when nothing was left out."""
    return wrap(f"left out: {'; '.join(notes)}; --wide shows every column", width) if notes else []


def fit_profiler_table(text: str, width: int | None, keep: Sequence[str]) -> str:
    """torch.profiler's `key_averages().table()` text fitted to `width`: its name column (cut with "…"
    to at most 40 characters) and as many of the columns named in `keep`, in that order of
    preference, as fit, in their original order; unchanged when it fits or `width` is None."""
    lines = text.splitlines()
    if width is None or _text_width(text.rstrip()) <= width:
        return text
    rules = [i for i, line in enumerate(lines) if line.strip() and set(line.strip()) <= {"-", " "}]
    if not rules or rules[0] + 1 >= len(lines):
        return "\n".join(line for text_line in lines for line in wrap(text_line, width))
    spans = [m.span() for m in re.finditer(r"-+", lines[rules[0]])]
    names = [lines[rules[0] + 1][start:end].strip() for start, end in spans]
    name_width = min(spans[0][1] - spans[0][0], 40, width)
    chosen, used = [0], name_width
    for i in (names.index(header) for header in keep if header in names[1:]):
        if used + GAP + spans[i][1] - spans[i][0] <= width:
            chosen.append(i)
            used += GAP + spans[i][1] - spans[i][0]
    chosen.sort()
    out = []
    for n, line in enumerate(lines):
        if rules[0] <= n <= rules[-1]:
            name = _cut(line[spans[0][0] : spans[0][1]].strip(), name_width)
            cells = [name.rjust(name_width)] + [line[spans[i][0] : spans[i][1]] for i in chosen[1:]]
            out.append((" " * GAP).join(cells).rstrip())
        else:
            out += wrap(line, width)
    left_out = [names[i] for i in range(1, len(spans)) if i not in chosen]
    out += _left_out([f"{', '.join(left_out)} (no room at {width} columns)"] if left_out else [], width)
    return "\n".join(out)
