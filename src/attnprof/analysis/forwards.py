"""Find the forwards in a trace and attribute CPU ops and GPU work to each, by correlation.

A forward is one CPU range of `record_function(REGION)` (a `user_annotation`), inside a
`ProfilerStep#N` range when the trace has them. Its CPU ops are the `cpu_op` events on the same
thread inside that range. Its GPU work is found by correlation, never by time: the CUDA
runtime/driver calls on that thread inside the range carry correlation ids, and exactly the
kernels, memcpys and memsets with those ids belong to the forward. Work of an earlier step that
is still running when the window opens has another step's ids, so it is never counted. The
autograd backward ops of the instance, on whatever thread (`analysis.backward`), add their calls
the same way: `Forward.backward_device` is the backward phase of its device work.

Where the trace has `gpu_user_annotation` ranges for the region (Kineto writes one per stream),
they are matched to the forward (by `External id`, else by overlap) and compared with the
correlated work; disagreements are counted, never fatal.

Which region: `find_forwards` takes a name or a glob pattern; see `analysis.regions`.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from attnprof.analysis.backward import attach_backward
from attnprof.analysis.regions import STEP_PREFIX, missing_region_error, resolve_region
from attnprof.analysis.trace import ParsedTrace
from attnprof.errors import TraceError

EPS = 0.0021  # us; Kineto widens GPU annotations by 1 ns each side and rounds to ns

#: Launch APIs by what they put on the device. Memcpy and memset variants are matched by prefix.
KERNEL_LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaLaunchHostFunc",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernelMultiDevice",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
_MEMCPY_API = re.compile(r"^(?:cuda|cu|hip)Memcpy")
_MEMSET_API = re.compile(r"^(?:cuda|cu|hip)Memset")


def launch_kind(api: str) -> str | None:
    """'kernel', 'graph', 'memcpy' or 'memset' for a launch API name; None for other calls
    (synchronization, events, attribute queries, profiler overhead)."""
    if api in KERNEL_LAUNCH_APIS:
        return "kernel"
    if api in GRAPH_LAUNCH_APIS:
        return "graph"
    if _MEMCPY_API.match(api):
        return "memcpy"
    if _MEMSET_API.match(api):
        return "memset"
    return None


@dataclass(slots=True)
class Forward:
    """One forward: its CPU range and everything attributed to it (indices into the trace's
    tables). `op_parent[i]` is the enclosing op of op `i` (-1: directly under the region);
    `launch_op[r]` is the innermost op around runtime call `r` (-1: none)."""

    thread: int
    start: float
    end: float
    ext: int
    ops: list[int] = field(default_factory=list)
    op_parent: dict[int, int] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)  # all runtime/driver calls inside
    launch_op: dict[int, int] = field(default_factory=dict)
    launches: list[int] = field(default_factory=list)  # calls that put work on the device
    device: list[int] = field(default_factory=list)  # kernels, memcpys, memsets (sorted by start)
    device_launch: dict[int, int] = field(default_factory=dict)  # device event -> its launch call
    gpu_annotations: list[int] = field(default_factory=list)
    # Backward work (see analysis.backward); shared empty defaults, replaced when there is some.
    backward_tops: Sequence[int] = ()  # outermost backward ops
    backward_calls: AbstractSet[int] = frozenset()  # runtime calls made inside them
    backward_device: AbstractSet[int] = frozenset()  # device events of those calls
    unmatched_launches: int = 0
    annotation_mismatches: int | None = None

    @property
    def cpu_time_us(self) -> float:
        """Wall time of the CPU range."""
        return self.end - self.start

    def op_chain(self, op: int) -> list[int]:
        """The ops from the top level under the region down to `op`."""
        chain = []
        while op >= 0:
            chain.append(op)
            op = self.op_parent.get(op, -1)
        return chain[::-1]


@dataclass
class Attribution:
    """The forwards of one region, with the trace they index into."""

    trace: ParsedTrace
    forwards: list[Forward]
    device_traced: bool  # the trace holds device events at all
    has_gpu_annotations: bool
    notes: list[str]

    @property
    def annotation_mismatches(self) -> int | None:
        """Device events that GPU annotations and correlation disagree on; None without annotations."""
        if not self.has_gpu_annotations:
            return None
        return sum(f.annotation_mismatches or 0 for f in self.forwards)


def sorted_by_thread(threads, ts, dur, wanted: set[int]) -> dict[int, list[int]]:
    """Indices per thread (only `wanted` threads), sorted by start then longest first."""
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(threads):
        if t in wanted:
            by_thread[t].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (ts[i], -dur[i]))
    return by_thread


def find_forwards(trace: ParsedTrace, region: str) -> Attribution:
    """Find the forwards of `region` (a name or a glob pattern, see `resolve_region`) and
    attribute ops and device work to each.

    Raises TraceError when the region is missing or none of its ranges lies in a profiled step.
    """
    names = trace.names
    name_ids = resolve_region(trace, region)
    table = trace.annotations
    region_rows = [i for i, n in enumerate(table.name) if n in name_ids] if name_ids else []
    if not region_rows and name_ids:  # older traces: record_function written as a cpu_op
        table = trace.cpu_ops
        region_rows = [i for i, n in enumerate(table.name) if n in name_ids]
    if not region_rows:
        raise missing_region_error(trace, region)

    # Outermost ranges only (a region nested in itself is one forward).
    region_rows.sort(key=lambda i: (table.thread[i], table.ts[i], -table.dur[i]))
    outer: list[int] = []
    for i in region_rows:
        if outer:
            last = outer[-1]
            if (
                table.thread[last] == table.thread[i]
                and table.ts[i] + table.dur[i] <= table.ts[last] + table.dur[last] + EPS
            ):
                continue
        outer.append(i)

    ann = trace.annotations
    steps = [i for i, n in enumerate(ann.name) if names[n].startswith(STEP_PREFIX)]
    if not steps:  # older traces wrote ProfilerStep#N as a cpu_op
        ann = trace.cpu_ops
        steps = [i for i, n in enumerate(ann.name) if names[n].startswith(STEP_PREFIX)]
    if steps and not all(names[n].startswith(STEP_PREFIX) for n in name_ids):  # steps are their own step
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
        outer = kept
    outer.sort(key=lambda i: table.ts[i])

    forwards = [
        Forward(thread=table.thread[i], start=table.ts[i], end=table.ts[i] + table.dur[i], ext=table.ext[i])
        for i in outer
    ]
    notes: list[str] = []
    _attach_ops(trace, forwards, skip_table_rows=set(region_rows) if table is trace.cpu_ops else set())
    _attach_calls(trace, forwards, notes)
    attach_backward(trace, forwards, notes)
    device_traced = len(trace.device) > 0
    if device_traced:
        _attach_device(trace, forwards)
        unmatched = sum(f.unmatched_launches for f in forwards)
        if unmatched:
            notes.append(
                f"{unmatched} launch call(s) inside the forwards have no device event in the "
                "trace (dropped by the profiler, or still running when it stopped)"
            )
    has_gann = _attach_gpu_annotations(trace, forwards, name_ids)
    return Attribution(
        trace=trace, forwards=forwards, device_traced=device_traced, has_gpu_annotations=has_gann, notes=notes
    )


def _attach_ops(trace: ParsedTrace, forwards: list[Forward], skip_table_rows: set[int]) -> None:
    ops = trace.cpu_ops
    ts, dur = ops.ts, ops.dur
    wanted = {f.thread for f in forwards}
    by_thread = sorted_by_thread(ops.thread, ts, dur, wanted)
    starts = {t: [ts[i] for i in idx] for t, idx in by_thread.items()}
    for fwd in forwards:
        idx = by_thread.get(fwd.thread, [])
        if not idx:
            continue
        st = starts[fwd.thread]
        lo, hi = bisect_left(st, fwd.start - EPS), bisect_right(st, fwd.end + EPS)
        stack: list[int] = []
        for i in idx[lo:hi]:
            if i in skip_table_rows or ts[i] + dur[i] > fwd.end + EPS:
                continue
            while stack and ts[i] + dur[i] > ts[stack[-1]] + dur[stack[-1]] + EPS:
                stack.pop()
            fwd.op_parent[i] = stack[-1] if stack else -1
            fwd.ops.append(i)
            stack.append(i)


def innermost_ops(
    fwd: Forward, trace: ParsedTrace, calls: list[int], op_list: list[int] | None = None
) -> dict[int, int]:
    """For each call (sorted by start), the innermost op of `op_list` (sorted by start; default
    `fwd.ops`) around it (-1: none).

    One sweep over ops and calls together, keeping the stack of open ops: O(ops + calls).
    """
    ops, rt = trace.cpu_ops, trace.runtime
    op_list = fwd.ops if op_list is None else op_list
    result: dict[int, int] = {}
    stack: list[int] = []
    j, n = 0, len(op_list)
    for call in calls:
        t0, t1 = rt.ts[call], rt.ts[call] + rt.dur[call]
        while j < n and ops.ts[op_list[j]] <= t0 + EPS:
            o = op_list[j]
            end = ops.ts[o] + ops.dur[o]
            while stack and end > ops.ts[stack[-1]] + ops.dur[stack[-1]] + EPS:
                stack.pop()
            stack.append(o)
            j += 1
        while stack and ops.ts[stack[-1]] + ops.dur[stack[-1]] + EPS < t1:
            stack.pop()
        result[call] = stack[-1] if stack else -1
    return result


def _attach_calls(trace: ParsedTrace, forwards: list[Forward], notes: list[str]) -> None:
    rt = trace.runtime
    names = trace.names
    wanted = {f.thread for f in forwards}
    by_thread = sorted_by_thread(rt.thread, rt.ts, rt.dur, wanted)
    starts = {t: [rt.ts[i] for i in idx] for t, idx in by_thread.items()}
    # Fallback: calls made on other threads of the same process (when the forward's thread has none).
    fallback: list[int] | None = None
    for fwd in forwards:
        idx = by_thread.get(fwd.thread)
        if idx:
            st = starts[fwd.thread]
            lo, hi = bisect_left(st, fwd.start - EPS), bisect_right(st, fwd.end + EPS)
            calls = [i for i in idx[lo:hi] if rt.ts[i] + rt.dur[i] <= fwd.end + EPS]
        elif len(rt):
            if fallback is None:
                pid = trace.threads[fwd.thread][0]
                fallback = sorted(
                    (i for i in range(len(rt)) if trace.threads[rt.thread[i]][0] == pid), key=rt.ts.__getitem__
                )
                if fallback:
                    notes.append(
                        "CUDA calls were not on the region's thread; calls of the same process "
                        "inside each forward's time range were used"
                    )
            calls = [i for i in fallback if fwd.start - EPS <= rt.ts[i] and rt.ts[i] + rt.dur[i] <= fwd.end + EPS]
        else:
            calls = []
        fwd.calls = calls
        fwd.launch_op = innermost_ops(fwd, trace, calls)
        fwd.launches = [i for i in calls if launch_kind(names[rt.name[i]]) is not None]


def _attach_device(trace: ParsedTrace, forwards: list[Forward]) -> None:
    dev, rt, names = trace.device, trace.runtime, trace.names
    by_corr: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(dev.corr):
        if c >= 0:
            by_corr[c].append(i)
    for fwd in forwards:
        seen_launch = set(fwd.launches)
        seen_corr: set[int] = set()
        launches: list[int] = []
        work: list[int] = []
        for call in fwd.calls:  # in time order: a runtime call comes before a driver call it wraps
            c = rt.corr[call]
            if c >= 0:
                if c in seen_corr:  # the same launch seen twice (runtime and driver): count it once
                    continue
                seen_corr.add(c)
            events = by_corr.get(c) if c >= 0 else None
            if events:
                work.extend(events)
                for e in events:
                    fwd.device_launch.setdefault(e, call)
                launches.append(call)
            elif call in seen_launch:
                launches.append(call)
                if launch_kind(names[rt.name[call]]) != "graph":
                    fwd.unmatched_launches += 1
        fwd.launches = launches
        fwd.device = sorted(set(work), key=dev.ts.__getitem__)
        if fwd.backward_calls:
            fwd.backward_device = {e for e in fwd.device if fwd.device_launch.get(e) in fwd.backward_calls}


def _attach_gpu_annotations(trace: ParsedTrace, forwards: list[Forward], name_ids: set[int]) -> bool:
    gann, dev = trace.gpu_annotations, trace.device
    rows = [i for i, n in enumerate(gann.name) if n in name_ids]
    if not rows:
        return False
    by_ext: dict[int, list[int]] = defaultdict(list)
    for i in rows:
        if gann.ext[i] >= 0:
            by_ext[gann.ext[i]].append(i)
    # Without External ids: per stream, the unused annotation that overlaps the forward's work most.
    ann_by_stream: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in rows:
        ann_by_stream[(gann.device[i], gann.stream[i])].append(i)
    for idx in ann_by_stream.values():
        idx.sort(key=gann.ts.__getitem__)
    ann_starts = {key: [gann.ts[i] for i in idx] for key, idx in ann_by_stream.items()}
    used: set[int] = set()
    for fwd in forwards:
        matched = by_ext.get(fwd.ext, []) if fwd.ext >= 0 else []
        if not matched and fwd.device:
            spans: dict[tuple[int, int], tuple[float, float]] = {}
            for e in fwd.device:
                key = (dev.device[e], dev.stream[e])
                lo, hi = spans.get(key, (dev.ts[e], dev.ts[e] + dev.dur[e]))
                spans[key] = (min(lo, dev.ts[e]), max(hi, dev.ts[e] + dev.dur[e]))
            matched = []
            for key, (lo, hi) in spans.items():
                idx, st = ann_by_stream.get(key, []), ann_starts.get(key, [])
                best, best_overlap = None, EPS
                for i in idx[max(bisect_left(st, lo) - 2, 0) : bisect_right(st, hi + EPS)]:
                    overlap = min(hi, gann.ts[i] + gann.dur[i]) - max(lo, gann.ts[i])
                    if i not in used and overlap > best_overlap:
                        best, best_overlap = i, overlap
                if best is not None:
                    matched.append(best)
        fwd.gpu_annotations = sorted(matched, key=gann.ts.__getitem__)
        used.update(matched)

    # Cross-check: the device work inside a forward's GPU annotations (on their streams)
    # against the work correlated to the forward.
    by_stream: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in range(len(dev)):
        by_stream[(dev.device[i], dev.stream[i])].append(i)
    stream_starts = {}
    for key, idx in by_stream.items():
        idx.sort(key=dev.ts.__getitem__)
        stream_starts[key] = [dev.ts[i] for i in idx]
    for fwd in forwards:
        if not fwd.gpu_annotations:
            fwd.annotation_mismatches = len(fwd.device) - len(fwd.backward_device)
            continue
        inside: set[int] = set()
        for a in fwd.gpu_annotations:
            key = (gann.device[a], gann.stream[a])
            idx = by_stream.get(key, [])
            st = stream_starts.get(key, [])
            lo = bisect_left(st, gann.ts[a] - EPS)
            hi = bisect_right(st, gann.ts[a] + gann.dur[a] + EPS)
            end = gann.ts[a] + gann.dur[a] + EPS
            inside.update(i for i in idx[lo:hi] if dev.ts[i] + dev.dur[i] <= end)
        if fwd.backward_device:  # Kineto's annotation covers the forward phase only
            inside -= fwd.backward_device
            fwd.annotation_mismatches = len(inside.symmetric_difference(set(fwd.device) - fwd.backward_device))
        else:
            fwd.annotation_mismatches = len(inside.symmetric_difference(fwd.device))
    return True
