"""Per-phase facts of one region instance: forward work and autograd backward work.

`Forward.backward_device` (see `analysis.backward`) splits an instance's device work: the rest is
the forward phase. `phase_metrics` counts each phase; `backward_roles` names the helper work
around a fused backward that findings report; `cpu_work_us` is the CPU time of an instance
without the time its thread sat blocked waiting for the autograd engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnprof.analysis.attribution.backward import ACCUMULATE_GRAD
from attnprof.analysis.attribution.forward import Forward
from attnprof.analysis.base import KERNEL, MEMCPY, MEMSET
from attnprof.analysis.short_names import short_kernel_name
from attnprof.analysis.trace.tables import ParsedTrace

PHASES = ("forward", "backward")
#: Backward helper kernels by role, matched on the kernel name: FlashAttention's and cuDNN's
#: `*dot_do_o*` and `*convert_dq*`; FlexAttention's is the Inductor reduction (`triton_per_`/`triton_red_`)
#: fused into its backward, which computes the same rowsum(dO * O) before the backward template kernel.
ROLE_PATTERNS = {
    "dot-do-o": re.compile(r"dot_do_o|^triton_(?:per|red)_fused\w*flex_attention_backward"),
    "convert-dq": re.compile(r"convert_dq"),
}


@dataclass(slots=True)
class PhaseMetrics:
    """The device work of one phase of one instance (zero counts and times when it has none)."""

    kernels: int = 0
    memcpy: int = 0
    memset: int = 0
    kernel_time_us: float = 0.0
    gpu_time_us: float = 0.0  # first start to last end of the phase's work


@dataclass(frozen=True, slots=True)
class Work:
    """One device event of a backward role: its short name, duration, bytes (-1: none) and the
    innermost op that launched it ("" when none)."""

    name: str
    time_us: float
    nbytes: int = -1
    op: str = ""


def _phase(trace: ParsedTrace, events: list[int]) -> PhaseMetrics:
    dev = trace.device
    counts = [0, 0, 0]  # by kind: KERNEL, MEMCPY, MEMSET
    kernel_time, start, end = 0.0, float("inf"), float("-inf")
    for e in events:
        kind, ts, dur = dev.kind[e], dev.ts[e], dev.dur[e]
        counts[kind] += 1
        if kind == KERNEL:
            kernel_time += dur
        start, end = min(start, ts), max(end, ts + dur)
    return PhaseMetrics(
        kernels=counts[KERNEL],
        memcpy=counts[MEMCPY],
        memset=counts[MEMSET],
        kernel_time_us=kernel_time,
        gpu_time_us=end - start if events else 0.0,
    )


def phase_metrics(trace: ParsedTrace, fwd: Forward) -> dict[str, PhaseMetrics]:
    """{"forward": ..., "backward": ...} for one instance with device events traced."""
    backward = [e for e in fwd.device if e in fwd.backward_device]
    forward = [e for e in fwd.device if e not in fwd.backward_device]
    return {"forward": _phase(trace, forward), "backward": _phase(trace, backward)}


def _top_op(fwd: Forward, op: int) -> int:
    while fwd.op_parent.get(op, -1) >= 0:
        op = fwd.op_parent[op]
    return op


def backward_roles(trace: ParsedTrace, fwd: Forward) -> dict[str, list[Work]]:
    """The backward phase's helper work by role (empty without backward work): "dot-do-o" and
    "convert-dq" kernels (by name), "memset" (every memset), "grad-accumulation" (kernels launched
    under an AccumulateGrad op)."""
    if not fwd.backward_device:
        return {}
    dev, names, ops = trace.device, trace.names, trace.cpu_ops
    roles: dict[str, list[Work]] = {"dot-do-o": [], "convert-dq": [], "memset": [], "grad-accumulation": []}
    for e in fwd.device:
        if e not in fwd.backward_device:
            continue
        name = names[dev.name[e]]
        call = fwd.device_launch.get(e)
        op = fwd.launch_op.get(call, -1) if call is not None else -1
        op_name = names[ops.name[op]] if op >= 0 else ""
        if dev.kind[e] == MEMSET:
            roles["memset"].append(Work(name, dev.dur[e], dev.nbytes[e], op_name))
            continue
        if dev.kind[e] != KERNEL:
            continue
        work = Work(short_kernel_name(name), dev.dur[e], op=op_name)
        for role, pattern in ROLE_PATTERNS.items():
            if pattern.search(name):
                roles[role].append(work)
        if op >= 0 and ACCUMULATE_GRAD in names[ops.name[_top_op(fwd, op)]]:
            roles["grad-accumulation"].append(work)
    return roles


def backward_outside_region(trace: ParsedTrace, fwd: Forward) -> bool:
    """True when some backward op of the instance started after the region ended."""
    return bool(fwd.backward_tops) and any(trace.cpu_ops.ts[t] > fwd.end for t in fwd.backward_tops)


def cpu_work_us(trace: ParsedTrace, fwd: Forward) -> float:
    """The instance's CPU time without the wait inside the autograd engine: the region's wall
    time, less the span its thread was blocked while backward ops ran on other threads inside it,
    plus the time those backward ops (and any outside the region) were busy. Without backward
    work: the region's wall time."""
    if not fwd.backward_tops:
        return fwd.cpu_time_us
    ops = trace.cpu_ops
    spans = sorted(
        (ops.ts[t], ops.ts[t] + ops.dur[t])
        for t in fwd.backward_tops
        if ops.thread[t] != fwd.thread or ops.ts[t] > fwd.end
    )
    if not spans:
        return fwd.cpu_time_us
    busy, open_start, open_end = 0.0, spans[0][0], spans[0][1]
    for start, end in spans[1:]:
        if start > open_end:
            busy += open_end - open_start
            open_start = start
        open_end = max(open_end, end)
    busy += open_end - open_start
    inside = [(s, e) for s, e in spans if s <= fwd.end]
    blocked = 0.0
    if inside:
        blocked = max(0.0, min(fwd.end, max(e for _, e in inside)) - max(fwd.start, inside[0][0]))
    return fwd.cpu_time_us - blocked + busy


def instance_unit(phases: Mapping[str, Mapping[str, Any]] | None) -> str:
    """What tables and findings call one instance of a region: "step" when its phases (the low
    medians over the instances, as the analysis reports them) show backward device work (training
    steps, fwd+bwd and bwd cells), else "forward"."""
    backward = (phases or {}).get("backward") or {}
    return "step" if any(backward.get(key) for key in ("kernels", "memcpy", "memset")) else "forward"
