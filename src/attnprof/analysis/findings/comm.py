"""Findings on communication: collective kernels that compute does not hide (see `analysis.instance.comm`)."""

from __future__ import annotations

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, NoImpact, listed, us

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `comm-exposed` fires when the exposed communication time per forward exceeds this share of its GPU time.
COMM_EXPOSED_SHARE = 0.10


def _exposed(ctx: FindingContext) -> float | NoImpact:
    """The communication time per instance that no compute on another stream hides."""
    exposed = ctx.comm.exposed_us if ctx.comm is not None else None
    return NoImpact("no-device-work") if exposed is None else exposed


@RULES.rule(
    "comm-exposed",
    severity="problem",
    summary=f"Communication (NCCL kernels) that no compute hides exceeds {COMM_EXPOSED_SHARE:.0%} of the forward's "
    "GPU time.",
    paragraph=f"""
    Communication kernels (NCCL: all-gather, all-reduce, send/recv of K/V blocks in context-parallel attention)
    ran inside the forward, and the part of their time during which no compute kernel ran on another stream
    exceeds {COMM_EXPOSED_SHARE:.0%} of the forward's GPU time: for that long every forward, the GPU only
    waits on the interconnect. The message gives the kernels, their time, the share of it hidden under
    compute, and the exposed time against the forward's GPU time. Overlap the communication with compute that
    does not depend on it (issue it on its own stream ahead of time, as ring attention does with the next K/V
    block), send less (fewer or larger collectives, a smaller dtype), or split the work over fewer ranks at
    this size.
    """,
    impact=_exposed,
)
def _comm_exposed(ctx: FindingContext) -> str | None:
    comm = ctx.comm
    if comm is None or comm.exposed_us is None or not ctx.gpu_time_us:
        return None
    share = comm.exposed_us / ctx.gpu_time_us
    if share <= COMM_EXPOSED_SHARE:
        return None
    hidden = "n/a" if comm.overlap_pct is None else f"{comm.overlap_pct:.0f}%"
    return (
        f"{comm.kernels_per_forward} communication kernel(s) per {ctx.unit} ({listed(comm.kernels, 2)}) run for "
        f"{us(comm.comm_time_us or 0.0)}, {hidden} of it under compute on another stream: {us(comm.exposed_us)} "
        f"exposed, {100 * share:.0f}% of the {ctx.unit}'s {us(ctx.gpu_time_us)} GPU time "
        f"(limit {100 * COMM_EXPOSED_SHARE:.0f}%)."
    )
