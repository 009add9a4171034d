"""How every view shows a row timed while other processes held the CPU (`Row.contended`, after re-timing): a
mark on its latency (`MARK`, like the `~` of an unreliable speed-up), a legend under each table that has
one, a warning line at the top of `run`, `compare`, `sweep` and `model` (the CLI prints it) and a line in
the HTML report's headline. Formatting only: whether a row is contended is the row's own field.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnprof.profiling.contention import CONTENTION_LIMIT
from attnprof.results.schema import Row

#: The mark before a contended row's latency (and the figures from it) in a table.
MARK = "!"
LEGEND = (
    f"{MARK} marks a latency timed while other processes held the CPU (over a quarter of it, or samples on a "
    "scheduler tick), even after waiting for calm and re-timing: it measures that load too, and so do its "
    "TFLOP/s and speed-ups (see the cpu-contention finding)"
)


def contended(rows: Sequence[Row]) -> list[Row]:
    """The rows whose kept timing was contended."""
    return [row for row in rows if row.contended]


def marked(row: Row, text: str) -> str:
    """`text` with `MARK` before it when the row is contended."""
    return f"{MARK}{text}" if row.contended else text


def legend(rows: Sequence[Row]) -> str | None:
    """`LEGEND` when a row is contended, else None."""
    return LEGEND if contended(rows) else None


def warning(rows: Sequence[Row]) -> str | None:
    """`warning: 12 of 25 timed rows ...`: how many rows are contended and the most other processes took,
    for the top of a command's output; None when none is."""
    found = contended(rows)
    if not found:
        return None
    timed = sum(1 for row in rows if row.latency_us is not None)
    share = max((row.cpu_contention or 0.0 for row in found), default=0.0)
    ticks = sorted({row.quantized_tick_ms for row in found if row.quantized_tick_ms is not None})
    signs = [f"up to {share:.0%} of it"] if share > CONTENTION_LIMIT else []
    if ticks:
        signs.append(f"samples on a {', '.join(f'{t:.3g}' for t in ticks)} ms scheduler tick")
    how = f" ({'; '.join(signs)})" if signs else ""
    return (
        f"warning: {len(found)} of {timed} timed rows were timed while other processes held the CPU{how}, "
        f"even after re-timing: their latencies (marked {MARK}), TFLOP/s and speed-ups measure that load too. "
        "Time again on a quiet machine."
    )
