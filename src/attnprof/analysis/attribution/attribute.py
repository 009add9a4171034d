"""Find the forwards in a trace and attribute CPU ops and GPU work to each, by correlation.

A forward is one CPU range of `record_function(REGION)` (a `user_annotation`), inside a
`ProfilerStep#N` range when the trace has them. Its CPU ops are the `cpu_op` events on the same
thread inside that range. Its GPU work is found by correlation, never by time: the CUDA
runtime/driver calls on that thread inside the range carry correlation ids, and exactly the
kernels, memcpys and memsets with those ids belong to the forward. Work of an earlier step that
is still running when the window opens has another step's ids, so it is never counted. The
autograd backward ops of the instance, on whatever thread (`attribution.backward`), add their calls
the same way: `Forward.backward_device` is the backward phase of its device work.

Where the trace has `gpu_user_annotation` ranges for the region (Kineto writes one per stream),
they are matched to the forward (by `External id`, else by overlap) and compared with the
correlated work; disagreements are counted, never fatal.

Which region: `find_forwards` takes a name or a glob pattern; see `attribution.regions`. A trace
without annotations is one window (`regions.WHOLE_TRACE`): from the first to the last op of its
busiest thread (the one whose outermost ops take the most time).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import compress

from attnprof.analysis.attribution.backward import attach_backward
from attnprof.analysis.attribution.forward import Attribution, Forward, launch_name_ids
from attnprof.analysis.attribution.gpu_annotations import attach_gpu_annotations
from attnprof.analysis.attribution.regions import STEP_PREFIX, WHOLE_TRACE, missing_region_error, resolve_region
from attnprof.analysis.attribution.timeline import Timelines, subtrees_and_innermost
from attnprof.analysis.base import EPS
from attnprof.analysis.trace.tables import CpuTable, ParsedTrace
from attnprof.errors import TraceError


def find_forwards(trace: ParsedTrace, region: str) -> Attribution:
    """Find the forwards of `region` (a name or a glob pattern, see `resolve_region`) and
    attribute ops and device work to each.

    Raises TraceError when the region is missing or none of its ranges lies in a profiled step.
    """
    name_ids = resolve_region(trace, region)
    timelines = Timelines(trace)
    notes: list[str] = []
    if region == WHOLE_TRACE and not name_ids:
        forwards = [_whole_trace(trace, timelines, notes)]
        table = trace.cpu_ops
        region_rows = []
    else:
        table = trace.annotations
        region_rows = [i for i, n in enumerate(table.name) if n in name_ids] if name_ids else []
        if not region_rows and name_ids:  # older traces: record_function written as a cpu_op
            table = trace.cpu_ops
            region_rows = [i for i, n in enumerate(table.name) if n in name_ids]
        if not region_rows:
            raise missing_region_error(trace, region)
        outer = _in_steps(trace, table, _outermost(table, region_rows), name_ids, region)
        outer.sort(key=lambda i: table.ts[i])
        forwards = [
            Forward(thread=table.thread[i], start=table.ts[i], end=table.ts[i] + table.dur[i], ext=table.ext[i])
            for i in outer
        ]
    launch_ids = launch_name_ids(trace)
    skip = set(region_rows) if table is trace.cpu_ops else set()
    _attach_ops_and_calls(trace, forwards, timelines, launch_ids, skip, notes)
    attach_backward(trace, forwards, notes, timelines, launch_ids)
    device_traced = len(trace.device) > 0
    if device_traced:
        _attach_device(trace, forwards, launch_ids)
        unmatched = sum(f.unmatched_launches for f in forwards)
        if unmatched:
            notes.append(
                f"{unmatched} launch call(s) inside the forwards have no device event in the "
                "trace (dropped by the profiler, or still running when it stopped)"
            )
    has_gann = attach_gpu_annotations(trace, forwards, name_ids)
    return Attribution(
        trace=trace, forwards=forwards, device_traced=device_traced, has_gpu_annotations=has_gann, notes=notes
    )


def _whole_trace(trace: ParsedTrace, timelines: Timelines, notes: list[str]) -> Forward:
    """One window over the busiest thread of a trace without annotations: the thread whose outermost
    ops take the most time, from its first op's start to its last op's end. Raises TraceError when the
    trace has no CPU op."""
    busiest, best = -1, -1.0
    for thread in sorted(set(trace.cpu_ops.thread)):
        line = timelines.ops(thread)
        busy, end = 0.0, float("-inf")
        for start, stop in zip(line.starts, line.ends, strict=True):
            if start >= end - EPS:  # an outermost op: nothing open around it
                busy += stop - start
                end = stop
        if busy > best:
            busiest, best = thread, busy
    if busiest < 0:
        raise TraceError("the trace has no CPU ops and no record_function annotations: nothing to analyse")
    line = timelines.ops(busiest)
    start, end = line.starts[0], max(line.ends)
    pid, tid = trace.threads[busiest]
    others = len(set(trace.cpu_ops.thread)) - 1
    notes.append(
        f"no annotations: one window over thread {tid} (pid {pid}), its {len(line.rows)} ops from the first to "
        f"the last ({end - start:,.0f} µs)"
        + (f"; {others} other thread(s) left out but for backward work linked to it" if others else "")
    )
    return Forward(thread=busiest, start=start, end=end, ext=-1)


def _outermost(table: CpuTable, rows: list[int]) -> list[int]:
    """The outermost of these region ranges (a region nested in itself is one forward), by thread
    and start."""
    rows.sort(key=lambda i: (table.thread[i], table.ts[i], -table.dur[i]))
    outer: list[int] = []
    for i in rows:
        if outer:
            last = outer[-1]
            if (
                table.thread[last] == table.thread[i]
                and table.ts[i] + table.dur[i] <= table.ts[last] + table.dur[last] + EPS
            ):
                continue
        outer.append(i)
    return outer


def _in_steps(trace: ParsedTrace, table: CpuTable, outer: list[int], name_ids: set[int], region: str) -> list[int]:
    """The region ranges that lie in a profiled step (ProfilerStep#N), all of them when the trace has
    no steps or the region is the steps themselves. Raises TraceError when none does."""
    step_ids = {i for i, n in enumerate(trace.names) if n.startswith(STEP_PREFIX)}
    ann = trace.annotations
    steps = [i for i, n in enumerate(ann.name) if n in step_ids] if step_ids else []
    if not steps and step_ids:  # older traces wrote ProfilerStep#N as a cpu_op
        ann = trace.cpu_ops
        steps = [i for i, n in enumerate(ann.name) if n in step_ids]
    if not steps or name_ids <= step_ids:  # steps are their own step
        return outer
    steps.sort(key=lambda i: ann.ts[i])
    step_starts = [ann.ts[i] for i in steps]
    kept = []
    for i in outer:
        start, end = table.ts[i], table.ts[i] + table.dur[i]
        # steps do not overlap: only the last one starting at or before the region can hold it
        j = bisect_right(step_starts, start + EPS) - 1
        if j >= 0 and ann.ts[steps[j]] + ann.dur[steps[j]] + EPS >= end:
            kept.append(i)
    if not kept:
        raise TraceError(
            f"region {region!r} appears {len(outer)} time(s) but never inside a "
            "ProfilerStep#N range: no forward ran in the profiler's active steps",
            hint="call prof.step() after each forward inside the profile() block",
        )
    return kept


def _attach_ops_and_calls(
    trace: ParsedTrace,
    forwards: list[Forward],
    timelines: Timelines,
    launch_ids: dict[int, str],
    skip: set[int],
    notes: list[str],
) -> None:
    """Each forward's ops (on its thread, inside its range, with their enclosing op), its runtime
    calls, the innermost op around each call, and which calls launch device work."""
    rt_name = trace.runtime.name
    fallback: _Fallback | None = None
    for fwd in forwards:
        line = timelines.ops(fwd.thread)
        start, end = fwd.start, fwd.end
        limit = end + EPS
        lo, hi = bisect_left(line.starts, start - EPS), bisect_right(line.starts, limit)
        rows, starts, ends = line.rows[lo:hi], line.starts[lo:hi], line.ends[lo:hi]
        ops: Sequence[int]
        if skip or (ends and max(ends) > limit):  # leave out ops that end after the forward
            keep = [e <= limit and i not in skip for i, e in zip(rows, ends, strict=True)]
            ops, starts, ends = list(compress(rows, keep)), list(compress(starts, keep)), list(compress(ends, keep))
        else:
            ops = rows if rows.__class__ is range else list(rows)  # a range holds no object per op
        fwd.ops = ops
        calls_line = timelines.calls(fwd.thread)
        if calls_line.rows:
            calls, call_starts, call_ends = calls_line.inside(start, end)
        elif len(trace.runtime):
            if fallback is None:
                fallback = _Fallback(trace, fwd.thread, notes)
            calls, call_starts, call_ends = fallback.inside(start, end)
        else:
            calls, call_starts, call_ends = [], [], []
        fwd.calls = calls
        up, stop, launch_ops = subtrees_and_innermost(ops, starts, ends, call_starts, call_ends)
        fwd.op_tree = up, stop
        fwd.launch_op = dict(zip(calls, launch_ops, strict=True))
        fwd.launches = [c for c in calls if rt_name[c] in launch_ids]


class _Fallback:
    """The runtime calls of every thread of one process, by start: used for the forwards whose own
    thread made no call (said in a note when there are any)."""

    def __init__(self, trace: ParsedTrace, thread: int, notes: list[str]) -> None:
        rt, pid = trace.runtime, trace.threads[thread][0]
        self.rt = rt
        self.calls = sorted((i for i in range(len(rt)) if trace.threads[rt.thread[i]][0] == pid), key=rt.ts.__getitem__)
        if self.calls:
            notes.append(
                "CUDA calls were not on the region's thread; calls of the same process "
                "inside each forward's time range were used"
            )

    def inside(self, start: float, end: float) -> tuple[list[int], list[float], list[float]]:
        """The calls within [start - EPS, end + EPS], with their starts and ends."""
        ts, dur = self.rt.ts, self.rt.dur
        calls = [i for i in self.calls if start - EPS <= ts[i] and ts[i] + dur[i] <= end + EPS]
        return calls, [ts[i] for i in calls], [ts[i] + dur[i] for i in calls]


def _by_corr(corr: Sequence[int]) -> dict[int, list[int]]:
    """Device event indices by correlation id (ids >= 0 only)."""
    by_corr: dict[int, list[int]] = {}
    for i, c in enumerate(corr):
        if c >= 0:
            events = by_corr.get(c)
            if events is None:
                by_corr[c] = [i]
            else:
                events.append(i)
    return by_corr


def _attach_device(trace: ParsedTrace, forwards: list[Forward], launch_ids: dict[int, str]) -> None:
    dev, rt = trace.device, trace.runtime
    by_corr = _by_corr(dev.corr)
    rt_corr, rt_name, dev_start = rt.corr, rt.name, dev.ts.__getitem__
    for fwd in forwards:
        seen_launch = set(fwd.launches)
        seen_corr: set[int] = set()
        launches: list[int] = []
        work: list[int] = []
        device_launch = fwd.device_launch
        for call in fwd.calls:  # in time order: a runtime call comes before a driver call it wraps
            c = rt_corr[call]
            events = None
            if c >= 0:
                if c in seen_corr:  # the same launch seen twice (runtime and driver): count it once
                    continue
                seen_corr.add(c)
                events = by_corr.get(c)
            if events:
                work.extend(events)
                for e in events:
                    device_launch.setdefault(e, call)
                launches.append(call)
            elif call in seen_launch:
                launches.append(call)
                if launch_ids[rt_name[call]] != "graph":
                    fwd.unmatched_launches += 1
        fwd.launches = launches
        fwd.device = sorted(set(work), key=dev_start)
        if fwd.backward_calls:
            fwd.backward_device = {e for e in fwd.device if fwd.device_launch.get(e) in fwd.backward_calls}
