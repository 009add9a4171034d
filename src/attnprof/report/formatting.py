"""Cell formatting shared by every table: numbers, counts and the two table styles."""

from __future__ import annotations

from typing import Any

STYLES = {"table": "simple", "markdown": "github"}


def table_style(fmt: str) -> str:
    """The tabulate style for `table` or `markdown`; ValueError for anything else."""
    try:
        return STYLES[fmt]
    except KeyError:
        raise ValueError(f"unknown table format {fmt!r}; expected one of {', '.join(STYLES)}") from None


def fmt_number(value: Any, digits: int = 1) -> str:
    """A number for a table cell; missing values read `n/a`, never 0."""
    if value is None or value == "":
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        if digits == 0 or abs(value) >= 1000 or value.is_integer():
            return f"{value:,.0f}"
        if 0 < abs(value) < 1:
            return f"{value:.3g}"
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_count(value: Any) -> str:
    """A per-forward count: whole numbers without decimals, medians of halves with one."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return fmt_number(value, 1)
