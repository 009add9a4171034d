"""Per-thread timelines: the rows of a CPU-side table on one thread, sorted once by start (the
longest first among equal starts, then in table order), with their starts and ends.

`attribute.py` and `backward.py` walk ops and runtime calls thread by thread, inside time windows;
`Timelines` sorts each (table, thread) once, on first use, and both read the same sequences. They
are built with C-level `sort`, `map` and `compress`, never with a Python key per row, and kept
compact: a table that is one thread already in order is used as it is (a `range` over its rows
and its own `ts` column); otherwise rows, starts and ends are `array`s.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from operator import add, eq, ge, le, lt
from typing import TYPE_CHECKING, Any

from attnprof.analysis.base import EPS

if TYPE_CHECKING:
    from attnprof.analysis.trace.tables import ParsedTrace

_OPEN = float("inf")  # the end of the stack's bottom entry: nothing ends after it


@dataclass(slots=True)
class Timeline:
    """The rows of one thread by start, then longest first (then table order); `starts[p]` and
    `ends[p]` are the start and end (ts + dur) of row `rows[p]`."""

    rows: Sequence[int]
    starts: Sequence[float]
    ends: Sequence[float]

    def window(self, start: float, end: float) -> tuple[int, int]:
        """Positions `lo, hi`: the rows starting within [start - EPS, end + EPS]."""
        return bisect_left(self.starts, start - EPS), bisect_right(self.starts, end + EPS)

    def inside(self, start: float, end: float) -> tuple[list[int], Sequence[float], Sequence[float]]:
        """The rows that start and end within [start - EPS, end + EPS], by start, with their
        starts and ends."""
        lo, hi = self.window(start, end)
        rows, starts, ends = list(self.rows[lo:hi]), self.starts[lo:hi], self.ends[lo:hi]
        limit = end + EPS
        if not ends or max(ends) <= limit:  # all of them (the common case)
            return rows, starts, ends
        keep = [e <= limit for e in ends]
        return list(compress(rows, keep)), list(compress(starts, keep)), list(compress(ends, keep))


def _in_order(ts: Any, dur: Any) -> bool:
    """True when rows 0..n-1 are already sorted by start, then longest first."""
    if all(map(lt, ts, islice(ts, 1, None))):  # no two start together (the common case): no ties to order
        return True
    if not all(map(le, ts, islice(ts, 1, None))):
        return False
    ties = list(compress(range(1, len(ts)), map(eq, ts, islice(ts, 1, None))))
    return all(map(ge, map(dur.__getitem__, map((-1).__add__, ties)), map(dur.__getitem__, ties)))


def timeline(rows: list[int], ts: Any, dur: Any) -> Timeline:
    """`rows` (ascending table indices) sorted by start, longest first among equal starts."""
    rows.sort(key=ts.__getitem__)  # stable: equal starts keep table order
    starts = array("d", map(ts.__getitem__, rows))
    ties = list(compress(range(1, len(starts)), map(eq, starts, islice(starts, 1, None))))
    p = 0
    while p < len(ties):  # runs of equal starts: longest first, table order among equal durations
        first, last = ties[p] - 1, ties[p]
        while p + 1 < len(ties) and ties[p + 1] == last + 1:
            p += 1
            last = ties[p]
        run = rows[first : last + 1]
        run.sort(key=lambda i: -dur[i])
        rows[first : last + 1] = run
        p += 1
    ends = array("d", map(add, starts, map(dur.__getitem__, rows)))
    return Timeline(array("q", rows), starts, ends)


def table_timeline(threads: Any, ts: Any, dur: Any, thread: int) -> Timeline:
    """The timeline of `thread` in a table with these columns."""
    if threads.count(thread) == len(threads) and _in_order(ts, dur):  # the whole table, in order
        return Timeline(range(len(ts)), ts, array("d", map(add, ts, dur)))
    return timeline(list(compress(range(len(threads)), map(thread.__eq__, threads))), ts, dur)


class Timelines:
    """The ops and runtime calls of each thread of a trace, each sorted once, on first use."""

    def __init__(self, trace: ParsedTrace) -> None:
        self.trace = trace
        self._ops: dict[int, Timeline] = {}
        self._calls: dict[int, Timeline] = {}

    def ops(self, thread: int) -> Timeline:
        """The cpu ops of `thread`."""
        return self._line(self._ops, self.trace.cpu_ops, thread)

    def calls(self, thread: int) -> Timeline:
        """The runtime and driver calls of `thread`."""
        return self._line(self._calls, self.trace.runtime, thread)

    @staticmethod
    def _line(cache: dict[int, Timeline], table: Any, thread: int) -> Timeline:
        line = cache.get(thread)
        if line is None:
            line = cache[thread] = table_timeline(table.thread, table.ts, table.dur, thread)
        return line


def parents(rows: Sequence[int], ends: Sequence[float]) -> list[int]:
    """The enclosing row of each row (by start, with their ends; -1: none): the last earlier row
    still open, where a row closes once a later one ends more than EPS after it."""
    return rows_at(rows, subtrees(ends)[0])


def rows_at(rows: Sequence[int], positions: Iterable[int]) -> list[int]:
    """The rows at these positions in `rows` (position -1: -1, none)."""
    by_position = list(rows)
    by_position.append(-1)
    return list(map(by_position.__getitem__, positions))


def innermost(
    ops: Sequence[int],
    op_starts: Sequence[float],
    op_ends: Sequence[float],
    call_starts: Sequence[float],
    call_ends: Sequence[float],
) -> list[int]:
    """For each call (by start, with its start and end), the innermost of `ops` (by start, with
    their starts and ends) around it; -1 for none. One sweep over ops and calls together, keeping
    the stack of open ops: O(ops + calls)."""
    result: list[int] = []
    stack, limits = [-1], [_OPEN]  # open ops and their end + EPS, above a bottom entry
    j = 0
    for t0, t1 in zip(call_starts, call_ends, strict=True):
        k = bisect_right(op_starts, t0 + EPS, j)  # the ops that started by then
        for p in range(j, k):
            end = op_ends[p]
            while end > limits[-1]:
                limits.pop()
                stack.pop()
            stack.append(ops[p])
            limits.append(end + EPS)
        j = k
        while limits[-1] < t1:
            limits.pop()
            stack.pop()
        result.append(stack[-1])
    return result


def subtrees(ends: Sequence[float]) -> tuple[list[int], list[int]]:
    """`parents` by position: for rows by start with these ends, the position of each row's
    enclosing row (-1: none) and the end of its subtree (the position after its last descendant:
    the position of the row that closed it, else the number of rows)."""
    n = len(ends)
    up: list[int] = []
    stop = [n] * n
    stack, limits = [-1], [_OPEN]  # open positions and their end + EPS, above a bottom entry
    for p, end in enumerate(ends):
        while end > limits[-1]:
            limits.pop()
            stop[stack.pop()] = p
        up.append(stack[-1])
        stack.append(p)
        limits.append(end + EPS)
    return up, stop


def subtrees_and_innermost(
    ops: Sequence[int],
    op_starts: Sequence[float],
    op_ends: Sequence[float],
    call_starts: Sequence[float],
    call_ends: Sequence[float],
) -> tuple[list[int], list[int], list[int]]:
    """`subtrees(op_ends)` and `innermost(ops, ..., call_ends)` in one sweep.

    `innermost` keeps the same stack of open ops as `subtrees`, except that a call also closes the
    ops that ended before it did; in a trace whose ops nest, what it keeps is always the bottom of
    `subtrees`' stack (a length `k`). Where an op starts inside a call and ends inside an op that
    call closed (no nesting), that stops holding: the two sweeps then run apart.
    """
    n = len(ops)
    up: list[int] = []
    stop = [n] * n
    found_inner: list[int] = []  # positions (-1: none)
    stack, limits = [-1], [_OPEN]  # open positions and their end + EPS, above a bottom entry
    k = 1  # innermost's stack: stack[:k]
    bounds = [t + EPS for t in call_starts]
    bounds.append(_OPEN)
    c = 0
    bound = bounds[0]  # the start (+ EPS) of the next call
    for p, start, end in zip(range(n), op_starts, op_ends, strict=True):
        if bound < start:  # calls that started before this op: resolve them first
            while bounds[c] < start:
                t1 = call_ends[c]
                while limits[k - 1] < t1:
                    k -= 1
                found_inner.append(stack[k - 1])
                c += 1
            bound = bounds[c]
        while end > limits[-1]:
            limits.pop()
            stop[stack.pop()] = p
        if len(stack) > k:  # it nests in an op that a call closed: no common stack
            return (*subtrees(op_ends), innermost(ops, op_starts, op_ends, call_starts, call_ends))
        up.append(stack[-1])
        stack.append(p)
        limits.append(end + EPS)
        k = len(stack)
    for t1 in call_ends[c:]:
        while limits[k - 1] < t1:
            k -= 1
        found_inner.append(stack[k - 1])
    return up, stop, rows_at(ops, found_inner)
