"""analysis.timeline: the per-thread order and the sweeps that attribution runs, against the plain
per-forward algorithms they replace (`_reference_*` below, as forwards.py wrote them), on random ops
and calls with ties, zero durations, ns-close ends and ops that do not nest."""

from __future__ import annotations

import random
from array import array

import pytest

from attnprof.analysis.attribution import timeline as tl
from attnprof.analysis.base import EPS


def _reference_order(threads, ts, dur, thread):
    """sorted_by_thread: a thread's rows by start, then longest first, then table order."""
    return sorted((i for i, t in enumerate(threads) if t == thread), key=lambda i: (ts[i], -dur[i]))


def _reference_parents(ops, ends):
    stack, found = [], []
    for i, end in zip(ops, ends, strict=True):
        while stack and end > stack[-1][1] + EPS:
            stack.pop()
        found.append(stack[-1][0] if stack else -1)
        stack.append((i, end))
    return found


def _reference_innermost(ops, starts, ends, call_starts, call_ends):
    stack, found, j = [], [], 0
    for t0, t1 in zip(call_starts, call_ends, strict=True):
        while j < len(ops) and starts[j] <= t0 + EPS:
            while stack and ends[j] > stack[-1][1] + EPS:
                stack.pop()
            stack.append((ops[j], ends[j]))
            j += 1
        while stack and stack[-1][1] + EPS < t1:
            stack.pop()
        found.append(stack[-1][0] if stack else -1)
    return found


def _times(rng: random.Random, n: int) -> tuple[array, array]:
    grid = rng.choice([1.0, 0.001, 0.0007])  # coarse ties, and ends within EPS of each other
    ts = array("d", (round(rng.uniform(0, 30) / grid) * grid for _ in range(n)))
    dur = array("d", (round(rng.choice([0.0, rng.uniform(0, 12)]) / grid) * grid for _ in range(n)))
    return ts, dur


@pytest.mark.parametrize("seed", range(5))
def test_timeline_order_is_start_then_longest_then_table_order(seed):
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.randint(0, 40)
        ts, dur = _times(rng, n)
        threads = array("i", (rng.choice([0, 0, 0, 1]) for _ in range(n)))
        for thread in (0, 1):
            line = tl.table_timeline(threads, ts, dur, thread)
            want = _reference_order(threads, ts, dur, thread)
            assert list(line.rows) == want
            assert list(line.starts) == [ts[i] for i in want]
            assert list(line.ends) == [ts[i] + dur[i] for i in want]


def test_a_table_already_in_order_is_used_as_it_is():
    ts, dur = array("d", [1.0, 1.0, 2.0, 5.0]), array("d", [4.0, 1.0, 0.5, 0.0])
    line = tl.table_timeline(array("i", [3, 3, 3, 3]), ts, dur, 3)
    assert isinstance(line.rows, range) and line.starts is ts
    assert list(line.ends) == [5.0, 2.0, 2.5, 5.0]


@pytest.mark.parametrize("seed", range(5))
def test_inside_keeps_the_rows_within_the_window(seed):
    rng = random.Random(100 + seed)
    for _ in range(300):
        n = rng.randint(0, 30)
        ts, dur = _times(rng, n)
        line = tl.table_timeline(array("i", [0] * n), ts, dur, 0)
        start = rng.uniform(0, 30)
        end = start + rng.uniform(0, 15)
        rows, starts, ends = line.inside(start, end)
        want = [i for i in line.rows if start - EPS <= ts[i] <= end + EPS and ts[i] + dur[i] <= end + EPS]
        assert rows == want
        assert (list(starts), list(ends)) == ([ts[i] for i in want], [ts[i] + dur[i] for i in want])


@pytest.mark.parametrize("seed", range(10))
def test_sweeps_match_the_per_forward_algorithms(seed):
    rng = random.Random(200 + seed)
    for _ in range(400):
        ts, dur = _times(rng, rng.randint(0, 14))
        line = tl.table_timeline(array("i", [0] * len(ts)), ts, dur, 0)
        ops, starts, ends = list(line.rows), list(line.starts), list(line.ends)
        call_ts, call_dur = _times(rng, rng.randint(0, 8))
        calls = sorted(range(len(call_ts)), key=call_ts.__getitem__)
        call_starts = [call_ts[c] for c in calls]
        call_ends = [call_ts[c] + call_dur[c] for c in calls]
        want = (_reference_parents(ops, ends), _reference_innermost(ops, starts, ends, call_starts, call_ends))
        assert tl.parents(ops, ends) == want[0]
        assert tl.innermost(ops, starts, ends, call_starts, call_ends) == want[1]


def _reference_ends(up):
    """The position after each op's last descendant (ops in pre-order)."""
    ends = []
    for i in range(len(up)):
        j = i + 1
        while j < len(up) and i in _ancestors(up, j):
            j += 1
        ends.append(j)
    return ends


def _ancestors(up, j):
    found = []
    while up[j] >= 0:
        j = up[j]
        found.append(j)
    return found


@pytest.mark.parametrize("seed", range(3))
def test_subtrees_match_the_parents_by_position(seed):
    rng = random.Random(300 + seed)
    paths = {"one sweep": 0, "two sweeps": 0}
    original = tl.subtrees
    swept: list[int] = []
    for _ in range(400):
        ts, dur = _times(rng, rng.randint(0, 14))
        line = tl.table_timeline(array("i", [0] * len(ts)), ts, dur, 0)
        ops, starts, ends = [r + 100 for r in line.rows], list(line.starts), list(line.ends)
        call_ts, call_dur = _times(rng, rng.randint(0, 8))
        calls = sorted(range(len(call_ts)), key=call_ts.__getitem__)
        call_starts = [call_ts[c] for c in calls]
        call_ends = [call_ts[c] + call_dur[c] for c in calls]
        up = [ops.index(p) if p >= 0 else -1 for p in _reference_parents(ops, ends)]
        want = (up, _reference_ends(up), _reference_innermost(ops, starts, ends, call_starts, call_ends))
        assert tl.subtrees(ends) == want[:2]
        swept.clear()
        tl.subtrees = lambda *args: swept.append(1) or original(*args)  # type: ignore[assignment]
        try:
            assert tl.subtrees_and_innermost(ops, starts, ends, call_starts, call_ends) == want
        finally:
            tl.subtrees = original
        paths["two sweeps" if swept else "one sweep"] += 1
    assert paths["one sweep"] and paths["two sweeps"]  # both ways were taken
