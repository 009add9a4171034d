"""`attnprof explain`: what a kernel name says (`analysis.names.KernelExplanation`), part by part.
Formatting only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnprof.report.layout import Column, table

if TYPE_CHECKING:
    from attnprof.analysis.names import KernelExplanation

EXPLAIN_COLUMNS = (Column(""), Column("", narrow=20))
PART_COLUMNS = (Column("part", narrow=12), Column("meaning", narrow=20))


def _tensor_cores_text(value: bool | None) -> str:
    return "yes" if value is True else "no" if value is False else "? (the name does not tell)"


def _impl_text(impl: str) -> str:
    """The implementation as a trace's attention_impl names it; cuDNN's version is not in a kernel's name."""
    if impl.startswith("cuDNN "):
        return impl + " (a trace's attention_impl adds cuDNN's version, which the name does not carry)"
    return impl


def render_explanation(explanation: KernelExplanation, fmt: str = "table", width: int | None = None) -> str:
    """The facts of a kernel name, then one row per part, fitted to `width` (None: in full)."""
    facts: list[list[str]] = [
        ["kernel", explanation.short_name or explanation.name],
        ["family", explanation.family],
        ["library", explanation.library or "n/a"],
        ["what it is", explanation.meaning or "not decoded: no rule matches this name"],
        ["tensor cores", _tensor_cores_text(explanation.tensor_cores)],
    ]
    if explanation.backend:
        facts.append(["SDPA backend", explanation.backend])
    if explanation.impl:
        facts.append(["attention implementation", _impl_text(explanation.impl)])
    out = [table(EXPLAIN_COLUMNS, facts, fmt, width)]
    rows = [[token, meaning] for token, meaning in explanation.parts]
    if rows:
        out += ["", table(PART_COLUMNS, rows, fmt, width)]
    return "\n".join(out)
