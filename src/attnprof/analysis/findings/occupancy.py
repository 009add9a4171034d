"""Findings on occupancy: what the per-kernel occupancy figures say, and what they cannot."""

from __future__ import annotations

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, listed

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `low-occupancy-by-design` fires at or under this theoretical occupancy (percent).
LOW_OCCUPANCY_PCT = 25.0


@RULES.rule(
    "low-occupancy-by-design",
    severity="info",
    summary=f"A fused attention or GEMM kernel has theoretical occupancy of {LOW_OCCUPANCY_PCT:g}% or less, limited by "
    "registers or shared memory.",
    paragraph=f"""
    A fused attention or GEMM kernel can keep few blocks resident on each SM (theoretical occupancy of
    {LOW_OCCUPANCY_PCT:g}% or
    less) because each block holds many registers or much shared memory: its tiles of Q, K, V and the
    running softmax stay on chip instead of going back to memory. That is the design of such kernels, not a
    fault: they hide latency within a block (asynchronous copies, pipelined stages) rather than with many
    resident warps, and low occupancy is what keeping the tiles on chip costs. The message gives the
    arithmetic (registers or shared memory per block against the SM's limits for its compute capability).
    Nothing to fix; look elsewhere unless the kernel is also slow against the measured ceiling.
    """,
)
def _low_occupancy(ctx: FindingContext) -> str | None:
    low = [
        k
        for k in ctx.kernels
        if k.theoretical_occupancy_pct is not None
        and k.theoretical_occupancy_pct <= LOW_OCCUPANCY_PCT
        and k.occupancy_limiter in ("registers", "shared memory")
        and k.family in ("fused-attention", "gemm")
    ]
    if not low:
        return None
    low.sort(key=lambda k: -k.time_us)
    top = low[0]
    message = (
        f"{top.short_name} has {top.theoretical_occupancy_pct:g}% theoretical occupancy, limited by "
        f"{top.occupancy_limiter} ({top.occupancy_arithmetic}): heavy blocks that keep tiles on chip, by design"
    )
    if len(low) > 1:
        message += f"; {listed([f'{k.short_name} {k.theoretical_occupancy_pct:g}%' for k in low[1:]], 2)} likewise"
    return message + "."


@RULES.rule(
    "occupancy-unreported",
    severity="info",
    summary="A kernel whose reported achieved occupancy is 0 or missing, with the likely cause.",
    paragraph="""
    The profiler reported 0% achieved occupancy for a kernel that ran, which cannot be true. The figure is
    Kineto's estimate, not a measurement, and it fails in known ways: a block that uses more shared memory than
    the 48 KB default per-block limit the estimate assumes (common for cuDNN and FlashAttention kernels, which
    opt in to more) leaves it no resident block, and a kernel launched through the driver API (cuLaunchKernel)
    may not be covered. attnprof reports achieved occupancy as unreported (null) for it, says the likely cause,
    and gives the theoretical occupancy computed from registers, threads and shared memory instead. Nothing to
    fix in your code; for a measured figure, profile the kernel with Nsight Compute.
    """,
)
def _occupancy_unreported(ctx: FindingContext) -> str | None:
    flagged = [
        k
        for k in ctx.kernels
        if k.kind == "kernel"
        and k.achieved_occupancy_pct is None
        and k.occupancy_note
        and not k.occupancy_note.startswith(("its grid", "the trace has no occupancy"))
    ]
    if not flagged:
        return None
    flagged.sort(key=lambda k: -k.time_us)
    top = flagged[0]
    message = f"{top.short_name} reports 0% achieved occupancy; likely cause: {top.occupancy_note}"
    if top.theoretical_occupancy_pct is not None:
        message += f"; its theoretical occupancy is {top.theoretical_occupancy_pct:g}% ({top.occupancy_arithmetic})"
    if len(flagged) > 1:
        message += f"; {listed([k.short_name for k in flagged[1:]], 3)} too"
    return message + "."
