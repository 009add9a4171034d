"""Attribute autograd backward work to the region instance whose forward created it.

A backward op is an outermost op (on its thread) of the autograd engine: `Fwd thread id` > 0
(Kineto sets it only on backward ops) or a name starting `autograd::engine::evaluate_function:`
(AccumulateGrad nodes carry no sequence number). It belongs to an instance when:

1. linked: its `Sequence number` matches a forward op of the instance (the latest forward op
   with that number that started before it), wherever and whenever it ran; when it started after
   the region ended it is "outside the region" (`.backward()` called after the region);
2. inside: otherwise, it runs entirely inside the instance's time range on another thread, and
   the forward op it links to (if any) ran on the region's thread (a region around only the
   backward);
3. following: an engine op without a sequence number (AccumulateGrad) follows the instance of
   the previous backward op with one on its thread, unless rule 2 places it.

Work on other threads that no such rule links (an unrelated thread launching kernels while the
region runs) is not counted; a note says how many launches were left out. The device work of a
backward op is found by correlation, like the forward's: the runtime calls on its thread inside
its range; `find_forwards` then correlates them with the rest.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import TYPE_CHECKING

from attnprof.analysis import forwards as fw

if TYPE_CHECKING:
    from attnprof.analysis.forwards import Forward
    from attnprof.analysis.trace import ParsedTrace

ENGINE_PREFIX = "autograd::engine::evaluate_function:"
ACCUMULATE_GRAD = "AccumulateGrad"


def backward_ops(trace: ParsedTrace) -> list[int]:
    """The ops of the autograd engine's backward pass, in table order (one pass over the ops)."""
    ops = trace.cpu_ops
    engine = {i for i, name in enumerate(trace.names) if name.startswith(ENGINE_PREFIX)}
    if not engine and max(ops.fwd_tid, default=-1) <= 0:  # a forward-only trace: no pass over the ops
        return []
    return [i for i, (tid, name) in enumerate(zip(ops.fwd_tid, ops.name, strict=True)) if tid > 0 or name in engine]


def _outermost(trace: ParsedTrace, candidates: list[int]) -> list[int]:
    """The candidates not nested in another candidate of their thread, by thread then start."""
    ops = trace.cpu_ops
    candidates = sorted(candidates, key=lambda i: (ops.thread[i], ops.ts[i], -ops.dur[i]))
    kept: list[int] = []
    for i in candidates:
        if (
            kept
            and ops.thread[kept[-1]] == ops.thread[i]
            and (ops.ts[i] + ops.dur[i] <= ops.ts[kept[-1]] + ops.dur[kept[-1]] + fw.EPS)
        ):
            continue
        kept.append(i)
    return kept


class _Linker:
    """Finds the instance (index into the forwards) that a backward op belongs to."""

    def __init__(self, trace: ParsedTrace, forwards: list[Forward], backward: set[int]) -> None:
        ops = trace.cpu_ops
        self.trace, self.forwards = trace, forwards
        by_seq: dict[int, list[int]] = defaultdict(list)
        for i, seq in enumerate(ops.seq):
            if seq >= 0 and i not in backward:
                by_seq[seq].append(i)
        for idx in by_seq.values():
            idx.sort(key=ops.ts.__getitem__)
        self.by_seq = by_seq
        self.seq_starts = {s: [ops.ts[i] for i in idx] for s, idx in by_seq.items()}
        self.owner = {i: k for k, f in enumerate(forwards) for i in f.ops if ops.seq[i] >= 0}
        self.starts = [f.start for f in forwards]  # forwards are sorted by start

    def forward_op(self, op: int) -> int | None:
        """The forward op that `op`'s sequence number links to, or None."""
        ops = self.trace.cpu_ops
        seq = ops.seq[op]
        if seq < 0 or seq not in self.by_seq:
            return None
        j = bisect_right(self.seq_starts[seq], ops.ts[op] + fw.EPS) - 1
        return self.by_seq[seq][j] if j >= 0 else None

    def inside(self, op: int, linked: int | None) -> int | None:
        """Rule 2: the instance whose time range holds `op` (on another thread), or None."""
        ops = self.trace.cpu_ops
        start, end = ops.ts[op], ops.ts[op] + ops.dur[op]
        k = bisect_right(self.starts, start + fw.EPS) - 1
        if k < 0:
            return None
        f = self.forwards[k]
        if f.thread == ops.thread[op] or end > f.end + fw.EPS:
            return None
        if linked is not None and ops.thread[linked] != f.thread:
            return None
        return k


def _nested(trace: ParsedTrace, by_thread: dict[int, list[int]], starts: dict[int, list[float]], top: int) -> list[int]:
    """`top` and the ops of its thread inside its range, sorted by start (outermost first)."""
    ops = trace.cpu_ops
    thread, t0, t1 = ops.thread[top], ops.ts[top], ops.ts[top] + ops.dur[top]
    idx, st = by_thread[thread], starts[thread]
    return [
        i
        for i in idx[bisect_left(st, t0 - fw.EPS) : bisect_right(st, t1 + fw.EPS)]
        if ops.ts[i] + ops.dur[i] <= t1 + fw.EPS
    ]


def _parents(trace: ParsedTrace, fwd: Forward, op_list: list[int]) -> None:
    """Record the enclosing op of each op of one backward op's tree (the backward op: -1)."""
    ops = trace.cpu_ops
    stack: list[int] = []
    for i in op_list:
        while stack and ops.ts[i] + ops.dur[i] > ops.ts[stack[-1]] + ops.dur[stack[-1]] + fw.EPS:
            stack.pop()
        fwd.op_parent[i] = stack[-1] if stack else -1
        stack.append(i)


def _add_calls(trace: ParsedTrace, fwd: Forward, tops: list[int], calls: list[int]) -> None:
    """Give `fwd` its backward ops and their calls; its calls and launches stay in time order."""
    rt, names = trace.runtime, trace.names
    fwd.backward_tops = tops
    fwd.backward_calls = set(calls)
    known = set(fwd.calls)
    fwd.calls.extend(c for c in calls if c not in known)
    fwd.calls.sort(key=rt.ts.__getitem__)
    known = set(fwd.launches)
    fwd.launches.extend(c for c in calls if c not in known and fw.launch_kind(names[rt.name[c]]) is not None)
    fwd.launches.sort(key=rt.ts.__getitem__)


def attach_backward(trace: ParsedTrace, forwards: list[Forward], notes: list[str]) -> None:
    """Find each instance's backward ops (see the module docstring) and add their ops, runtime
    calls and launches to the instance; `Forward.backward_calls` marks which calls they are."""
    ops, rt = trace.cpu_ops, trace.runtime
    candidates = backward_ops(trace) if forwards else []
    tops = _outermost(trace, candidates)
    linker = _Linker(trace, forwards, set(candidates)) if tops else None
    owner: dict[int, int] = {}
    current: dict[int, int | None] = {}
    for top in sorted(tops, key=ops.ts.__getitem__):
        if linker is None:
            break
        thread = ops.thread[top]
        linked = linker.forward_op(top)
        k = linker.owner.get(linked) if linked is not None else None
        if k is None:
            k = linker.inside(top, linked)
        if ops.seq[top] >= 0:
            current[thread] = k
        elif k is None:
            k = current.get(thread)
        if k is not None:
            owner[top] = k
    threads = {ops.thread[t] for t in owner}
    op_threads = fw.sorted_by_thread(ops.thread, ops.ts, ops.dur, threads)
    op_starts = {t: [ops.ts[i] for i in idx] for t, idx in op_threads.items()}
    rt_threads = fw.sorted_by_thread(rt.thread, rt.ts, rt.dur, threads)
    rt_starts = {t: [rt.ts[i] for i in idx] for t, idx in rt_threads.items()}
    tops_of: dict[int, list[int]] = defaultdict(list)
    calls_of: dict[int, list[int]] = defaultdict(list)
    for top in sorted(owner, key=ops.ts.__getitem__):
        k = owner[top]
        thread, t0, t1 = ops.thread[top], ops.ts[top], ops.ts[top] + ops.dur[top]
        idx, st = rt_threads.get(thread, []), rt_starts.get(thread, [])
        calls = [
            c
            for c in idx[bisect_left(st, t0 - fw.EPS) : bisect_right(st, t1 + fw.EPS)]
            if rt.ts[c] + rt.dur[c] <= t1 + fw.EPS
        ]
        op_list = _nested(trace, op_threads, op_starts, top)
        _parents(trace, forwards[k], op_list)
        forwards[k].launch_op.update(fw.innermost_ops(forwards[k], trace, calls, op_list))
        tops_of[k].append(top)
        calls_of[k].extend(calls)
    for k, tops_k in tops_of.items():
        _add_calls(trace, forwards[k], tops_k, calls_of[k])
    _note(trace, forwards, notes)


def _note(trace: ParsedTrace, forwards: list[Forward], notes: list[str]) -> None:
    """Say which backward work was counted, and how many launches of other threads were not."""
    ops, rt, names = trace.cpu_ops, trace.runtime, trace.names
    with_backward = [f for f in forwards if f.backward_tops]
    if with_backward:
        notes.append(
            "backward work is counted under phases.backward: autograd ops linked to the region's "
            "forward ops by sequence number, or running on another thread inside the region"
        )
    outside = sum(1 for f in with_backward if any(ops.ts[t] > f.end for t in f.backward_tops))
    if outside:
        notes.append(
            f"the backward of {outside} of {len(forwards)} region instance(s) ran after the region "
            "ended (.backward() outside it); linked by sequence number, it is still counted"
        )
    region_threads = {f.thread for f in forwards}
    if not set(rt.thread) - region_threads:
        return
    counted = set().union(*(f.calls for f in forwards)) if forwards else set()
    starts = [f.start for f in forwards]
    left_out = 0
    for i, thread in enumerate(rt.thread):
        if thread in region_threads or i in counted:
            continue
        k = bisect_right(starts, rt.ts[i]) - 1
        if k >= 0 and rt.ts[i] <= forwards[k].end and fw.launch_kind(names[rt.name[i]]) is not None:
            left_out += 1
    if left_out:
        notes.append(
            f"{left_out} launch call(s) by other threads ran while the region ran but belong to no "
            "backward op linked to it: not counted"
        )
