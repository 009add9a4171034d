"""Communication in each forward: collective and point-to-point kernels next to the compute kernels,
and how much of the communication time compute hides.

A device event of a forward (see `analysis.forwards`: attributed by correlation) is communication
when its name is an NCCL (or RCCL) kernel, `ncclDevKernel_*` or `ncclKernel_*`; every other kernel
of the forward is compute (memcpy and memset are neither). Per forward, on the device timeline:

- `comm_us`: the time some communication kernel runs (the union of their intervals);
- `compute_us`: the time some compute kernel runs;
- `overlapped_us`: the communication time during which a compute kernel on another stream runs;
- `exposed_us` = `comm_us` − `overlapped_us`, and `overlap_pct` = `overlapped_us` / `comm_us`.

Each is summarised by its median over the forwards (`overlap_pct`: the median of the forwards' shares).

A CPU-only trace (gloo) has no device kernels: the communication runs on gloo's own threads. There
the forward's `c10d::*` ops are counted and nothing is timed. `comm_stats` is None when a trace shows
no communication at all.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from attnprof.analysis.attribution.forward import Attribution, Forward
from attnprof.analysis.base import KERNEL
from attnprof.analysis.short_names import short_kernel_name
from attnprof.stats import median, median_count

_COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)(?:Dev)?Kernel", re.IGNORECASE)
COMM_OP_PREFIX = "c10d::"  # the ops torch.distributed records for each collective or send/recv call

Interval = tuple[float, float]


def is_comm_kernel(name: str) -> bool:
    """True for an NCCL/RCCL kernel name (`ncclDevKernel_SendRecv(...)`, `ncclKernel_AllReduce_...`)."""
    return bool(_COMM_KERNEL.match(name))


def merged(intervals: list[Interval]) -> list[Interval]:
    """The union of `intervals` as sorted, disjoint intervals."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def total(intervals: list[Interval]) -> float:
    """The length of disjoint intervals."""
    return sum(end - start for start, end in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Where two sorted, disjoint interval lists overlap (sorted, disjoint)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_facts(comm: list[tuple[int, Interval]], compute: list[tuple[int, Interval]]) -> tuple[float, float, float]:
    """(comm_us, compute_us, overlapped_us) for (stream, interval) lists: the communication time
    during which a compute kernel runs on a stream other than the communication kernel's."""
    comm_union = merged([iv for _, iv in comm])
    compute_union = merged([iv for _, iv in compute])
    hidden: list[Interval] = []
    for stream in sorted({s for s, _ in comm}):
        mine = merged([iv for s, iv in comm if s == stream])
        others = merged([iv for s, iv in compute if s != stream])
        hidden += intersection(mine, others)
    return total(comm_union), total(compute_union), total(merged(hidden))


@dataclass(slots=True)
class ForwardComm:
    """One forward's communication: kernels and c10d ops, and its device times (None on CPU)."""

    kernels: int
    ops: int
    comm_us: float | None = None
    compute_us: float | None = None
    overlapped_us: float | None = None
    names: Counter = field(default_factory=Counter)  # comm kernel short names


@dataclass
class CommStats:
    """Communication per forward (medians over the forwards); see the module docstring."""

    source: str  # "device": NCCL kernels timed on the device; "cpu ops": c10d ops counted only
    kernels_per_forward: int | None
    ops_per_forward: int
    kernels: list[str] = field(default_factory=list)  # the communication kernels' short names
    comm_time_us: float | None = None
    compute_time_us: float | None = None
    overlapped_us: float | None = None
    exposed_us: float | None = None
    overlap_pct: float | None = None


def forward_comm(attribution: Attribution, fwd: Forward) -> ForwardComm:
    """The communication of one forward: its comm kernels against its compute kernels, and its c10d ops."""
    trace = attribution.trace
    names, ops = trace.names, trace.cpu_ops
    comm_ops = 0
    for i in fwd.ops:
        if names[ops.name[i]].startswith(COMM_OP_PREFIX) and not _under_comm_op(fwd, i, trace):
            comm_ops += 1
    if not attribution.device_traced:
        return ForwardComm(kernels=0, ops=comm_ops)
    dev = trace.device
    comm: list[tuple[int, Interval]] = []
    compute: list[tuple[int, Interval]] = []
    found: Counter = Counter()
    for e in fwd.device:
        if dev.kind[e] != KERNEL:
            continue
        span = (dev.ts[e], dev.ts[e] + dev.dur[e])
        name = names[dev.name[e]]
        if is_comm_kernel(name):
            comm.append((dev.stream[e], span))
            found[short_kernel_name(name)] += 1
        else:
            compute.append((dev.stream[e], span))
    comm_us, compute_us, overlapped = overlap_facts(comm, compute)
    return ForwardComm(len(comm), comm_ops, comm_us, compute_us, overlapped, found)


def _may_communicate(trace: Any) -> bool:
    """True when some cpu op's name starts with COMM_OP_PREFIX or some device event's name is a comm
    kernel's: one test per distinct name, so traces without communication skip the per-forward pass."""
    names = trace.names
    return any(names[n].startswith(COMM_OP_PREFIX) for n in set(trace.cpu_ops.name)) or any(
        is_comm_kernel(names[n]) for n in set(trace.device.name)
    )


def _under_comm_op(fwd: Forward, op: int, trace: Any) -> bool:
    parent = fwd.op_parent.get(op, -1)
    while parent >= 0:
        if trace.names[trace.cpu_ops.name[parent]].startswith(COMM_OP_PREFIX):
            return True
        parent = fwd.op_parent.get(parent, -1)
    return False


def comm_stats(attribution: Attribution) -> CommStats | None:
    """Communication per forward over every forward of the attribution; None when there is none."""
    if not _may_communicate(attribution.trace):
        return None  # no forward can have a comm kernel or a c10d op
    per_forward = [forward_comm(attribution, f) for f in attribution.forwards]
    if not per_forward or not any(m.kernels or m.ops for m in per_forward):
        return None
    ops = median_count([m.ops for m in per_forward])
    if not attribution.device_traced or not any(m.kernels for m in per_forward):
        return CommStats("cpu ops", 0 if attribution.device_traced else None, ops)
    shares = [100.0 * (m.overlapped_us or 0.0) / m.comm_us for m in per_forward if m.comm_us]
    names: Counter = Counter()
    for m in per_forward:
        names.update(m.names)
    return CommStats(
        source="device",
        kernels_per_forward=median_count([m.kernels for m in per_forward]),
        ops_per_forward=ops,
        comm_time_us=median([m.comm_us or 0.0 for m in per_forward]),
        compute_time_us=median([m.compute_us or 0.0 for m in per_forward]),
        overlapped_us=median([m.overlapped_us or 0.0 for m in per_forward]),
        exposed_us=median([(m.comm_us or 0.0) - (m.overlapped_us or 0.0) for m in per_forward]),
        overlap_pct=median(shares) if shares else None,
        kernels=[name for name, _ in names.most_common()],
    )
