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

from bisect import bisect_right
from collections import defaultdict
from itertools import compress
from operator import or_
from typing import TYPE_CHECKING

from attnprof.analysis.attribution.forward import launch_name_ids
from attnprof.analysis.attribution.timeline import Timelines, innermost, parents, timeline
from attnprof.analysis.base import EPS

if TYPE_CHECKING:
    from attnprof.analysis.attribution.forward import Forward
    from attnprof.analysis.trace.tables import ParsedTrace

ENGINE_PREFIX = "autograd::engine::evaluate_function:"
ACCUMULATE_GRAD = "AccumulateGrad"


def backward_ops(trace: ParsedTrace) -> list[int]:
    """The ops of the autograd engine's backward pass, in table order (one pass over the ops)."""
    ops = trace.cpu_ops
    engine = {i for i, name in enumerate(trace.names) if name.startswith(ENGINE_PREFIX)}
    if not engine and max(ops.fwd_tid, default=-1) <= 0:  # a forward-only trace: no pass over the ops
        return []
    backward = map(or_, map((0).__lt__, ops.fwd_tid), map(engine.__contains__, ops.name))
    return list(compress(range(len(ops)), backward))


def _outermost(trace: ParsedTrace, candidates: list[int]) -> list[int]:
    """The candidates not nested in another candidate of their thread, by thread then start."""
    ops = trace.cpu_ops
    line = timeline(list(candidates), ops.ts, ops.dur)
    order = sorted(range(len(line.rows)), key=[ops.thread[i] for i in line.rows].__getitem__)
    kept: list[int] = []
    last_thread, last_limit = -1, 0.0
    for p in order:
        i = line.rows[p]
        thread = ops.thread[i]
        if kept and thread == last_thread and line.ends[p] <= last_limit:
            continue
        kept.append(i)
        last_thread, last_limit = thread, line.ends[p] + EPS
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
        j = bisect_right(self.seq_starts[seq], ops.ts[op] + EPS) - 1
        return self.by_seq[seq][j] if j >= 0 else None

    def inside(self, op: int, linked: int | None) -> int | None:
        """Rule 2: the instance whose time range holds `op` (on another thread), or None."""
        ops = self.trace.cpu_ops
        start, end = ops.ts[op], ops.ts[op] + ops.dur[op]
        k = bisect_right(self.starts, start + EPS) - 1
        if k < 0:
            return None
        f = self.forwards[k]
        if f.thread == ops.thread[op] or end > f.end + EPS:
            return None
        if linked is not None and ops.thread[linked] != f.thread:
            return None
        return k


def _add_calls(trace: ParsedTrace, fwd: Forward, tops: list[int], calls: list[int], launch_ids: dict[int, str]) -> None:
    """Give `fwd` its backward ops and their calls; its calls and launches stay in time order."""
    rt = trace.runtime
    fwd.backward_tops = tops
    fwd.backward_calls = set(calls)
    known = set(fwd.calls)
    fwd.calls.extend(c for c in calls if c not in known)
    fwd.calls.sort(key=rt.ts.__getitem__)
    known = set(fwd.launches)
    fwd.launches.extend(c for c in calls if c not in known and rt.name[c] in launch_ids)
    fwd.launches.sort(key=rt.ts.__getitem__)


def attach_backward(
    trace: ParsedTrace,
    forwards: list[Forward],
    notes: list[str],
    timelines: Timelines | None = None,
    launch_ids: dict[int, str] | None = None,
) -> None:
    """Find each instance's backward ops (see the module docstring) and add their ops, runtime
    calls and launches to the instance; `Forward.backward_calls` marks which calls they are.
    `timelines` and `launch_ids` (`forward.launch_name_ids`) are shared with the caller when given."""
    ops = trace.cpu_ops
    timelines = Timelines(trace) if timelines is None else timelines
    launch_ids = launch_name_ids(trace) if launch_ids is None else launch_ids
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
    tops_of: dict[int, list[int]] = defaultdict(list)
    calls_of: dict[int, list[int]] = defaultdict(list)
    for top in sorted(owner, key=ops.ts.__getitem__):
        k = owner[top]
        thread, t0, t1 = ops.thread[top], ops.ts[top], ops.ts[top] + ops.dur[top]
        calls, call_starts, call_ends = timelines.calls(thread).inside(t0, t1)
        op_list, op_starts, op_ends = timelines.ops(thread).inside(t0, t1)
        forwards[k].add_parents(zip(op_list, parents(op_list, op_ends), strict=True))
        launch_op = innermost(op_list, op_starts, op_ends, call_starts, call_ends)
        forwards[k].launch_op.update(zip(calls, launch_op, strict=True))
        tops_of[k].append(top)
        calls_of[k].extend(calls)
    for k, tops_k in tops_of.items():
        _add_calls(trace, forwards[k], tops_k, calls_of[k], launch_ids)
    _note(trace, forwards, notes, launch_ids)


def _note(trace: ParsedTrace, forwards: list[Forward], notes: list[str], launch_ids: dict[int, str]) -> None:
    """Say which backward work was counted, and how many launches of other threads were not."""
    ops, rt = trace.cpu_ops, trace.runtime
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
        if k >= 0 and rt.ts[i] <= forwards[k].end and rt.name[i] in launch_ids:
            left_out += 1
    if left_out:
        notes.append(
            f"{left_out} launch call(s) by other threads ran while the region ran but belong to no "
            "backward op linked to it: not counted"
        )
