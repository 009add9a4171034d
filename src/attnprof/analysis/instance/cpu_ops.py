"""The ops of a CPU-only trace by self CPU time, as torch.profiler's `key_averages()` table counts them.

Per instance (`op_times`): for each op name, its calls, its self CPU time (each op's duration less its
direct children's) and its CPU total (every call's whole duration, nested calls of the same name
included, as key_averages adds them), and with record_shapes its commonest `Input Dims`. Over the
instances (`top_cpu_ops`): calls are low medians, times medians, and the names ordered by self CPU
time; `self_cpu_pct` is of the instance's CPU time (its region's wall time, so the ops' shares add up
to less than 100 where Python ran between them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from attnprof.analysis.attribution.forward import Forward
from attnprof.analysis.trace.decoding import input_type_value
from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.stats import median, median_count

TOP_OPS = 20  # the names kept, by self CPU time


@dataclass(slots=True)
class OpTimes:
    """One op name in one instance: its calls, self CPU time, CPU total and `Input Dims` ids (-1: none)."""

    calls: int = 0
    self_us: float = 0.0
    total_us: float = 0.0
    dims: Counter | None = None


@dataclass
class CpuOpStats:
    """One op name over the instances (see the module docstring)."""

    name: str
    calls_per_forward: int
    self_cpu_us: float
    self_cpu_pct: float | None
    cpu_total_us: float
    input_shapes: str | None  # its commonest recorded input shapes, e.g. "2x32x64, 192x64"; None without


def op_times(trace: ParsedTrace, fwd: Forward) -> dict[int, OpTimes]:
    """The `OpTimes` of one instance's ops, by name id."""
    ops = trace.cpu_ops
    dur, name, dims = ops.dur, ops.name, ops.input_dims
    order = list(fwd.ops)
    total = [dur[op] for op in order]
    own = list(total)
    if fwd.op_tree is not None and len(fwd.op_tree[0]) == len(order):  # each op's parent by position
        for i, up in enumerate(fwd.op_tree[0]):
            if up >= 0:
                own[up] -= total[i]
    else:
        at = {op: i for i, op in enumerate(order)}
        for i, op in enumerate(order):
            up = at.get(fwd.op_parent.get(op, -1), -1)
            if up >= 0:
                own[up] -= total[i]
    found: dict[int, OpTimes] = {}
    for i, op in enumerate(order):
        times = found.get(name[op])
        if times is None:
            times = found[name[op]] = OpTimes()
        times.calls += 1
        times.self_us += max(0.0, own[i])
        times.total_us += total[i]
        if dims[op] >= 0:
            if times.dims is None:
                times.dims = Counter()
            times.dims[dims[op]] += 1
    return found


def _shapes(trace: ParsedTrace, dims_id: int) -> str | None:
    """The tensor inputs of one recorded `Input Dims` as "2x32x64, 192x64" (scalars left out)."""
    value = input_type_value(trace.input_dims[dims_id])
    if not isinstance(value, list):
        return None
    tensors = ["x".join(map(str, d)) for d in value if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    return ", ".join(tensors) or None


def top_cpu_ops(trace: ParsedTrace, per_instance: list[dict[int, OpTimes]], cpu_times: list[float]) -> list[CpuOpStats]:
    """The `TOP_OPS` op names with the most self CPU time over the instances (see the module docstring)."""
    names = sorted(set().union(*per_instance))
    cpu_time = median(cpu_times) if cpu_times else 0.0
    stats = []
    empty = OpTimes()
    for nid in names:
        found = [times.get(nid, empty) for times in per_instance]
        self_us = median([t.self_us for t in found])
        dims: Counter = Counter()
        for t in found:
            if t.dims:
                dims.update(t.dims)
        stats.append(
            CpuOpStats(
                name=trace.names[nid],
                calls_per_forward=median_count([t.calls for t in found]),
                self_cpu_us=self_us,
                self_cpu_pct=100.0 * self_us / cpu_time if cpu_time > 0 else None,
                cpu_total_us=median([t.total_us for t in found]),
                input_shapes=_shapes(trace, dims.most_common(1)[0][0]) if dims else None,
            )
        )
    stats.sort(key=lambda s: (-s.self_cpu_us, s.name))
    return stats[:TOP_OPS]
