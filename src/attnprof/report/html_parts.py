"""What every section of the HTML report shares: escaping, tables of escaped text cells (numbers
right-aligned), dropping the columns n/a in every row, key/value tables, and the names of a row's cell,
status and findings. Formatting only."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

from attnprof.report.layout import MISSING
from attnprof.results.schema import Row

#: Columns the comparison tables keep even when every row is n/a there.
ALWAYS_SHOWN = ("variant", "status", "speed-up")
#: The time a speed-up is computed from, by its `sweep_tables.SPEED_KEYS` name.
SPEED_TIMES: dict[str, Callable[[Row], float | None]] = {
    "latency_us": lambda row: row.latency_us,
    "gpu_time_us": lambda row: row.gpu_time_us,
    "cpu_time_us": lambda row: row.cpu_time_us,
}


def esc(value: Any) -> str:
    """The value as escaped HTML text ("" for None)."""
    return html.escape("" if value is None else str(value))


def text_cell(text: str) -> str:
    """One `<td>`: right-aligned when the text is a number (`1,234.5`, `12%`, `~3`)."""
    numeric = text.replace(",", "").replace(".", "", 1).replace("%", "").strip().lstrip("~-").isdigit()
    return f'<td class="num">{esc(text)}</td>' if numeric else f"<td>{esc(text)}</td>"


def html_table(headers: Sequence[str] | None, rows: list[list[str]], css_class: str = "") -> str:
    """A table of escaped text cells (numbers right-aligned); no header row when `headers` is None."""
    head = "" if headers is None else "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>"
    body = "".join("<tr>" + "".join(text_cell(str(c)) for c in row) + "</tr>" for row in rows)
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


def dropped_note(dropped: list[str]) -> str:
    """The note under a table that left columns out ("" when none was)."""
    return f"<p class='note'>Left out, n/a in every row: {esc(', '.join(dropped))}.</p>" if dropped else ""


def pairs(items: list[tuple[str, Any]]) -> str:
    """A key/value table: keys as row headers; a list value gets one line per item."""
    body = "".join(f"<tr><th>{esc(key)}</th><td>{_value_html(value)}</td></tr>" for key, value in items)
    return f"<table class='pairs'><tbody>{body}</tbody></table>"


def _value_html(value: Any) -> str:
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return "<br>".join(esc(plain(v)) for v in value)
    return esc(plain(value))


def plain(value: Any) -> str:
    """A value as text: a dict as `k=v, ...` (None left out), a list comma-separated, None as n/a."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return ", ".join(plain(v) for v in value)
    return "n/a" if value is None else str(value)


def cell_name(row: Row) -> str:
    """`1x4x256x64 fwd+bwd` (shape, and the mode when it is not fwd), or `seq 4096` without a shape."""
    label = str(row.shape or (f"seq {row.seq}" if row.seq is not None else "?"))
    mode = row.mode or "fwd"
    return label if mode == "fwd" else f"{label} {mode}"


def status_word(row: Row) -> str:
    """`ok`, `skipped` or `failed`: the status without its reason."""
    return row.status.partition(":")[0]


def severity_badge(word: str) -> str:
    """A finding's severity as a coloured badge."""
    return f"<span class='sev {esc(word)}'>{esc(word)}</span>"


def finding_link(finding_id: str) -> str:
    """The finding id, linked to its entry in the Findings section."""
    return f"<a href='#finding-{esc(finding_id)}'><code>{esc(finding_id)}</code></a>"
