"""Findings from hardware counters: what Nsight Compute measured inside the attention kernels.

Read from `FindingContext.counters` only (`analysis.counters.roofline.StepCounters`: one step's counted
kernels with their roofline placements, the step's compulsory bytes and the ceilings); without counters
(every trace analysis, and a row without `--ncu`) none of them fires. Times are the kernels' durations
under Nsight Compute, which replays each kernel (by default with the clocks held at base), so they may
differ from the trace's; an impact's share is of the step's kernel time under Nsight Compute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import (
    FindingContext,
    FindingRegistry,
    NoImpact,
    Said,
    listed,
    numbers,
    work_numbers,
)

if TYPE_CHECKING:
    from attnprof.analysis.counters.kernel import KernelCounters
    from attnprof.analysis.counters.roofline import KernelPlacement, StepCounters

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `tensor-pipe-underused` fires on a compute-bound kernel whose tensor pipe is active less than this (percent).
TENSOR_PIPE_LOW_PCT = 50.0
#: `dram-bound` fires at this DRAM throughput, percent of the GPU's peak (or on a memory-bound placement).
DRAM_BOUND_PCT = 60.0
#: `l2-thrash` fires below this L2 hit rate (percent) ...
L2_HIT_LOW_PCT = 90.0
#: ... when the step's DRAM traffic is at least this many times its compulsory bytes.
TRAFFIC_RATIO_HIGH = 2.0
#: `stall-dominated` fires when one reason holds this share of a kernel's warp stalls (percent).
STALL_DOMINANT_PCT = 40.0
#: Kernels under this share of the step's time are left to the others (a small helper kernel).
MIN_TIME_SHARE = 0.05


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f} MB"


def _judged(step: StepCounters) -> list[tuple[KernelCounters, KernelPlacement]]:
    """The step's kernels that take at least `MIN_TIME_SHARE` of its time, with their placements."""
    total = step.time_us
    return [(k, p) for k, p in step.pairs() if total > 0 and (k.duration_us or 0.0) >= MIN_TIME_SHARE * total]


def _excess_share(step: StepCounters) -> float | None:
    """The share of the step's DRAM bytes above its compulsory bytes (0 when at or below); None unknown."""
    ratio = step.traffic_ratio
    return None if ratio is None else max(0.0, 1.0 - 1.0 / ratio) if ratio > 0 else 0.0


# --------------------------------------------------------------------------- tensor pipe


def _underused(step: StepCounters) -> list[tuple[KernelCounters, KernelPlacement]]:
    return [
        (k, p)
        for k, p in step.pairs()
        if p.bound == "compute" and k.tensor_pipe_pct is not None and k.tensor_pipe_pct < TENSOR_PIPE_LOW_PCT
    ]


def _tensor_time_lost(ctx: FindingContext) -> float | NoImpact:
    """The flagged kernels' time under Nsight Compute less the time their share of the FLOPs takes at the
    matmul ceiling."""
    step = ctx.counters
    if step is None or step.peaks is None:
        return NoImpact("needs-peaks")
    peak = step.peaks.tensor_tflops * 1e12
    return sum((k.duration_us or 0.0) - (p.flops or 0.0) / peak * 1e6 for k, p in _underused(step))


@RULES.rule(
    "tensor-pipe-underused",
    severity="problem",
    summary=f"A compute-bound attention kernel keeps its tensor pipe busy less than {TENSOR_PIPE_LOW_PCT:.0f}% of "
    "the time (Nsight Compute).",
    paragraph=f"""
    Nsight Compute measured the kernel's tensor pipe (warpgroup MMA, wgmma, on Hopper; mma before it) active
    in less than {TENSOR_PIPE_LOW_PCT:.0f}% of the cycles its SMs were active, while its arithmetic intensity
    (its share of the step's FLOPs over the DRAM bytes it moved) puts it above the ridge point: its bytes do
    not bound it, so the matrix units wait on something else. The message gives the utilisation, the
    kernel's place on the roofline and its largest warp-stall reasons, which say what the warps waited for:
    barriers between the softmax and the matmuls (a pipeline that does not overlap them), shared-memory
    pressure, or dependencies a deeper software pipeline would hide. Fixes are in the kernel: larger tiles,
    more pipeline stages, warp specialisation (producer and consumer warps), or a backend whose kernel does
    these (cuDNN and FlashAttention 3 on Hopper). The impact is the kernel's time less what its FLOPs take at
    the matmul ceiling; the judge then weighs it against the best implementation known at the shape, as
    memory-bound.
    """,
    impact=_tensor_time_lost,
)
def _tensor_pipe_underused(ctx: FindingContext) -> Said | None:
    step = ctx.counters
    if step is None:
        return None
    found = _underused(step)
    if not found:
        return None
    parts = []
    for k, p in found:
        stalls = ", ".join(f"{s.label} {s.share_pct:.0f}%" for s in k.stalls)
        parts.append(
            f"{k.short_name}'s tensor pipe ({k.tensor_pipe}) was active {k.tensor_pipe_pct:.1f}% of its active "
            f"cycles while {p.text} (intensity {p.intensity or 0.0:,.0f} FLOP/byte)"
            + (f"; its warps stalled most on {stalls}" if stalls else "")
        )
    flops, time_us = sum(p.flops or 0.0 for _, p in found), sum(k.duration_us or 0.0 for k, _ in found)
    return "; ".join(parts) + ".", work_numbers(0.0, flops, time_us) | numbers(kernels=len(found))


# --------------------------------------------------------------------------- DRAM


def _dram_bound(step: StepCounters) -> list[tuple[KernelCounters, KernelPlacement]]:
    return [
        (k, p)
        for k, p in _judged(step)
        if (k.dram_pct_of_peak is not None and k.dram_pct_of_peak >= DRAM_BOUND_PCT) or p.bound == "memory"
    ]


def _excess_time(step: StepCounters, kernels: list[tuple[KernelCounters, KernelPlacement]]) -> float | NoImpact:
    """The kernels' time times the share of DRAM bytes above the compulsory ones (which come from the shapes)."""
    excess = _excess_share(step)
    if excess is None:
        return NoImpact("needs-record-shapes")
    return sum((k.duration_us or 0.0) * excess for k, _ in kernels)


def _dram_time_lost(ctx: FindingContext) -> float | NoImpact:
    """The flagged kernels' time (under Nsight Compute) times the share of the step's DRAM bytes above its
    compulsory bytes: what the traffic beyond Q, K, V and O (and their gradients) once each costs at the rate
    the kernels moved it."""
    step = ctx.counters
    return NoImpact("no-device-work") if step is None else _excess_time(step, _dram_bound(step))


def _traffic(step: StepCounters) -> str:
    """`the step moves 2,392 MB against the 604 MB it must (4.0x)`, or "" without compulsory bytes."""
    nbytes, ratio = step.dram_bytes, step.traffic_ratio
    if nbytes is None or ratio is None or step.compulsory_bytes is None:
        return ""
    must = _mb(step.compulsory_bytes)
    return f"the {step.unit} moves {_mb(nbytes)} through DRAM against the {must} it must ({ratio:.1f}x)"


@RULES.rule(
    "dram-bound",
    severity="problem",
    summary=f"An attention kernel's DRAM traffic bounds it: DRAM at {DRAM_BOUND_PCT:.0f}% of peak or more, or below "
    "the ridge (Nsight Compute).",
    paragraph=f"""
    Nsight Compute measured the kernel's DRAM throughput at {DRAM_BOUND_PCT:.0f}% or more of the GPU's peak, or
    its arithmetic intensity (its share of the step's FLOPs over the DRAM bytes it moved) below the ridge
    point: it is as fast as its DRAM traffic allows. The message gives the bytes, the throughput, the placement
    and how the step's DRAM traffic compares with the bytes it must move (Q, K, V and the output, and in a
    backward their gradients, once each). Traffic well above them means data read more than once (K and V
    evicted from L2 between the query tiles that reuse them, a mask or scores written out and read back):
    cut the re-reads. Traffic at the compulsory bytes leaves only fewer bytes: a KV cache in fp8, fewer KV
    heads, more queries per read of the cache. The impact is the kernels' time spent on the traffic above
    the compulsory bytes (none when there is none).
    """,
    impact=_dram_time_lost,
)
def _dram(ctx: FindingContext) -> str | None:
    step = ctx.counters
    if step is None:
        return None
    found = _dram_bound(step)
    if not found:
        return None
    parts = []
    for k, p in found:
        rate = f"{k.dram_gbps:,.0f} GB/s" if k.dram_gbps is not None else "n/a GB/s"
        peak = f", {k.dram_pct_of_peak:.0f}% of peak DRAM throughput" if k.dram_pct_of_peak is not None else ""
        moved = f"moves {_mb(k.dram_bytes)} at {rate}" if k.dram_bytes is not None else f"runs DRAM at {rate}"
        parts.append(f"{k.short_name} {moved}{peak}, {p.text}")
    traffic = _traffic(step)
    return "; ".join(parts) + (f"; {traffic}" if traffic else "") + "."


# --------------------------------------------------------------------------- L2


def _thrashing(step: StepCounters) -> list[tuple[KernelCounters, KernelPlacement]]:
    ratio, nbytes = step.traffic_ratio, step.dram_bytes
    if ratio is None or ratio < TRAFFIC_RATIO_HIGH or not nbytes:
        return []
    return [
        (k, p)
        for k, p in _judged(step)
        if k.l2_hit_rate_pct is not None
        and k.l2_hit_rate_pct < L2_HIT_LOW_PCT
        and (k.dram_bytes or 0.0) >= 0.25 * nbytes
    ]


def _l2_time_lost(ctx: FindingContext) -> float | NoImpact:
    """The flagged memory-bound kernels' time (under Nsight Compute) times the share of the step's DRAM bytes
    above its compulsory bytes; none is measured for a compute-bound kernel, whose extra traffic overlaps its
    math."""
    step = ctx.counters
    if step is None:
        return NoImpact("no-device-work")
    memory_bound = [(k, p) for k, p in _thrashing(step) if p.bound == "memory"]
    return _excess_time(step, memory_bound) if memory_bound else NoImpact("compute-bound")


@RULES.rule(
    "l2-thrash",
    severity="problem",
    summary=f"L2 hit rate below {L2_HIT_LOW_PCT:.0f}% while the step's DRAM traffic is {TRAFFIC_RATIO_HIGH:g}x its "
    "compulsory bytes or more (Nsight Compute).",
    paragraph=f"""
    A fused attention kernel reads each K and V tile once per query tile; when the query tiles that share a
    head run at the same time, those reads hit L2 and DRAM sees each tile about once. Nsight Compute measured
    an L2 hit rate below {L2_HIT_LOW_PCT:.0f}% for this kernel while the step's DRAM traffic was
    {TRAFFIC_RATIO_HIGH:g} times the bytes it must move (Q, K, V and the output, and in a backward their
    gradients, once each) or more: tiles are evicted before the next reader comes. Launch the blocks so that
    those sharing K and V run together (the query-tile index fastest in the grid, heads of a GQA group
    adjacent), shrink the working set (smaller key tiles, fewer pipeline stages in flight), or keep the
    grid persistent so each SM walks the keys of one head. The impact is measured for a memory-bound
    kernel (its time spent on the extra traffic); a compute-bound one hides most of it under its math, and
    the message says so.
    """,
    impact=_l2_time_lost,
)
def _l2_thrash(ctx: FindingContext) -> str | None:
    step = ctx.counters
    if step is None:
        return None
    found = _thrashing(step)
    if not found:
        return None
    parts = []
    for k, p in found:
        read = _mb(k.dram_read_bytes) if k.dram_read_bytes is not None else "n/a"
        written = _mb(k.dram_write_bytes) if k.dram_write_bytes is not None else "n/a"
        hidden = "; compute-bound, it hides most of that traffic under its math" if p.bound == "compute" else ""
        parts.append(
            f"{k.short_name} hit L2 on {k.l2_hit_rate_pct:.1f}% of its sector lookups and read {read} from DRAM "
            f"(wrote {written}){hidden}"
        )
    return "; ".join(parts) + f"; {_traffic(step)}."


# --------------------------------------------------------------------------- warp stalls


def _dominated(step: StepCounters) -> list[KernelCounters]:
    return [k for k, _ in _judged(step) if k.stalls and k.stalls[0].share_pct >= STALL_DOMINANT_PCT]


@RULES.rule(
    "stall-dominated",
    severity="info",
    summary=f"One warp-stall reason holds {STALL_DOMINANT_PCT:.0f}% or more of an attention kernel's stalls, named "
    "in plain words (Nsight Compute).",
    paragraph=f"""
    Nsight Compute samples what each warp waits for when it does not issue. When one reason holds
    {STALL_DOMINANT_PCT:.0f}% or more of a kernel's stalls (the issuing warp left out), it says where the
    kernel's time goes: long scoreboard is waiting on global memory (loads not prefetched far enough
    ahead), barrier is block-wide syncs (warps of a block waiting for the slowest, e.g. between the softmax
    and the next matmul), MIO throttle is shared-memory pressure (too many shared-memory or special
    instructions queued), short scoreboard is waiting on shared memory or special-function results
    (exp2 in the softmax), wait is fixed-latency dependencies, math pipe throttle is a saturated math pipe,
    not selected is a warp that could issue but another did (enough warps: not a stall of its own), no
    instruction is the instruction cache, lg throttle is the global memory queue full, and gmma is waiting
    on warpgroup MMA results. A fact that points at the fix, not a cost by itself.
    """,
)
def _stall_dominated(ctx: FindingContext) -> str | None:
    step = ctx.counters
    if step is None:
        return None
    found = _dominated(step)
    if not found:
        return None
    parts = []
    for k in found:
        top, rest = k.stalls[0], k.stalls[1:]
        then = f"; then {listed([f'{s.label} {s.share_pct:.0f}%' for s in rest], 2)}" if rest else ""
        parts.append(f"{k.short_name}: {top.share_pct:.0f}% of its warp stalls are {top.label}, {top.words}{then}")
    return "; ".join(parts) + "."
