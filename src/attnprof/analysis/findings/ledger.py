"""Findings on the attention ledger and on where the instances stalled.

Read from `ForwardMetrics.stalls` and `.attention` and the summarised ledger only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, NoImpact, us
from attnprof.analysis.instance.stalls import GPU_IDLE_SHARE  # `gpu-idle`'s threshold, where the gaps are kept
from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.instance.stalls import Gap, Stalls

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `attention-overhead` fires when the overhead's time exceeds this share of the attention calls' own time.
OVERHEAD_SHARE = 0.10
SHOWN = 3  # chains, gaps and overhead kinds named in a message

#: Why a sync follows a memcpy of this kind.
_WHY = {
    "HtoD": " (a copy from pageable host memory, e.g. torch.tensor(..., device=...), waits for the device)",
    "DtoH": " (the CPU reads a result back: .item(), .tolist(), a data-dependent branch)",
}


def _sync_bubbles(ctx: FindingContext) -> float | NoImpact:
    """The device idle time the syncs cause per instance: from each sync's start until the first device
    work after it returns, less the time the device ran anything meanwhile (not the CPU's wait)."""
    stalls = [m.stalls for m in ctx.per_forward if m.stalls is not None]
    return median([s.sync_bubble_us for s in stalls]) if stalls else NoImpact("no-device-work")


def _idle(ctx: FindingContext) -> float | NoImpact:
    """The device's idle time within the span of its work per instance (the typical instance's)."""
    typical = _typical_idle(ctx)
    return NoImpact("no-device-work") if typical is None else typical.idle_us


def _overhead(ctx: FindingContext) -> float | NoImpact:
    """The device time of the work beside the attention calls that exists only to feed them, per instance."""
    return ctx.attention.overhead_us if ctx.attention is not None else NoImpact("no-device-work")


@RULES.rule(
    "host-sync",
    severity="problem",
    summary="A sync inside the forward blocked the CPU until the device caught up: the op chain and the wait.",
    paragraph="""
    Inside the forward, the CPU stopped until the GPU had finished everything queued before it: a
    cudaStreamSynchronize, cudaDeviceSynchronize or a blocking memcpy. The usual causes are .item(), .tolist()
    or a Python branch on a tensor's value (a copy back to the host), and torch.tensor(..., device="cuda") or
    .to("cuda") from pageable memory (a copy to the device that waits). While the CPU waits it queues no
    work, so once the GPU drains its queue it idles until the CPU catches up, and the launch pipeline that
    hides the CPU's cost is lost at every sync. The message names each sync with its op chain (innermost
    first), the memcpy it followed, how often it ran and how long the CPU waited per forward. Keep values on
    the device (torch.where instead of a branch, no .item() in the forward), build constant tensors once
    outside the forward, or copy from pinned memory with non_blocking=True. The wait itself costs nothing
    while the GPU is busy; what the sync costs is the bubble after it, the GPU idle until the CPU has
    queued work again, which the message gives per forward.
    """,
    impact=_sync_bubbles,
)
def _host_sync(ctx: FindingContext) -> str | None:
    stalls = [m.stalls for m in ctx.per_forward if m.stalls is not None]
    with_sync = sum(1 for s in stalls if s.syncs)
    if not with_sync:
        return None
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0] * len(stalls))
    waits: dict[tuple, list[float]] = defaultdict(lambda: [0.0] * len(stalls))
    for k, s in enumerate(stalls):
        for sync in s.syncs:
            key = (sync.api, sync.chain, sync.memcpy)
            counts[key][k] += 1
            waits[key][k] += sync.wait_us
    ranked = sorted(counts, key=lambda key: -median(waits[key]))
    unit = ctx.unit
    n = median_count([len(s.syncs) for s in stalls]) or max(len(s.syncs) for s in stalls)
    total = median([s.sync_wait_us for s in stalls])
    bubble = median([s.sync_bubble_us for s in stalls])
    parts = []
    for key in ranked[:SHOWN]:
        api, chain, memcpy = key
        where = " ← ".join(chain) if chain else "no op (directly in the region)"
        after = f", after a {memcpy}{_WHY.get(memcpy[7:11], '')}" if memcpy else ""
        parts.append(
            f"{api} under {where}{after}: {median_count(counts[key]) or 1}x, {us(median(waits[key]))} per {unit}"
        )
    if len(ranked) > SHOWN:
        parts.append(f"and {len(ranked) - SHOWN} more")
    return (
        f"{ctx.every(with_sync, len(stalls)).capitalize()} blocks the CPU until the device catches up "
        f"({n} sync(s), the CPU waiting {us(total)} per {unit}, the GPU then idle {us(bubble)} per {unit} "
        "until the CPU queued work again): " + "; ".join(parts) + "."
    )


def _typical_idle(ctx: FindingContext) -> Stalls | None:
    """The stalls of the instance with the (low) median idle share; None when no instance idled."""
    stalls: list[Stalls] = [m.stalls for m in ctx.per_forward if m.stalls is not None and m.stalls.idle_share]
    if not stalls:
        return None
    stalls.sort(key=lambda s: s.idle_share or 0.0)
    return stalls[(len(stalls) - 1) // 2]


def _gap_text(gap: Gap) -> str:
    covered = sum(us for _, us in gap.cpu_ops)
    ops = ", ".join(f"{name} ({us(time)})" for name, time in gap.cpu_ops[:2])
    cpu = f"while the CPU ran {ops}" if ops else "while the CPU ran no op"
    if ops and gap.duration_us - covered > 1.0:
        cpu += f" and no op for {us(gap.duration_us - covered)}"
    phase = "" if gap.phase == "forward" else " of the backward"
    return f"{us(gap.duration_us)} after {gap.after} (at +{gap.offset_us:,.0f} us{phase}) {cpu}"


@RULES.rule(
    "gpu-idle",
    severity="problem",
    summary=f"The device sat idle more than {GPU_IDLE_SHARE:.0%} of the span of its work: the largest gaps and the "
    "CPU ops meanwhile.",
    paragraph=f"""
    Between the first and the last device work of the forward (each phase on its own in a training step), the
    GPU ran nothing for more than {GPU_IDLE_SHARE:.0%} of the time: the CPU did not queue work fast enough.
    The time is lost outright; a faster kernel changes nothing while the GPU waits for the next one. The
    message gives the typical instance's idle time and span, and its largest gaps: how long, after which
    kernel, and which CPU ops ran meanwhile, which points at the Python code, the synchronisation or the
    data loading that held the CPU. In analyze, with the profiler's cost per op calibrated (--calibrate-profiler),
    the idle time is judged net of the profiler's own recording, which held the CPU too. In run, compare, sweep
    and model the latency timed without the profiler bounds it: the GPU can have sat idle at most that latency
    less its busy time, which becomes the impact (info when it is not more than {GPU_IDLE_SHARE:.0%} of the
    latency). Remove syncs (see host-sync), move work off the forward's critical path,
    launch fewer kernels (a fused kernel, torch.compile), or replay the launches with CUDA graphs.
    """,
    impact=_idle,
)
def _gpu_idle(ctx: FindingContext) -> str | None:
    typical = _typical_idle(ctx)
    if typical is None:
        return None
    share = typical.idle_share or 0.0
    if share <= GPU_IDLE_SHARE:
        return None
    phases = "" if all(g.phase == "forward" for g in typical.gaps) else " (each phase on its own)"
    gaps = "; ".join(_gap_text(g) for g in typical.gaps[:SHOWN])
    return (
        f"The GPU sat idle {us(typical.idle_us)} of the {us(typical.span_us)} its work spanned "
        f"per {ctx.unit}{phases}, "
        f"{100 * share:.0f}% (more than {100 * GPU_IDLE_SHARE:.0f}%): the CPU did not keep it fed. "
        f"Largest gaps: {gaps}."
    )


@RULES.rule(
    "attention-overhead",
    severity="problem",
    summary=f"Work tied to attention beside the attention calls exceeds {OVERHEAD_SHARE:.0%} of the calls' own "
    "time, by kind.",
    paragraph=f"""
    Besides the attention calls themselves, the forward spent more than {OVERHEAD_SHARE:.0%} of their time on
    work that exists only to feed them: building the mask or BlockMask (mask-build), repeating or expanding K
    and V for grouped-query attention (kv-repeat), casting their inputs or outputs (dtype-cast) and making
    them contiguous (layout-copy). The message gives the largest kinds with their count, time and the op
    chain behind each. Most have a direct fix: pass is_causal=True or build the mask once; use
    scaled_dot_product_attention(..., enable_gqa=True) or a kernel that reads grouped K/V instead of
    repeat_interleave; keep the model's dtype throughout; lay q, k, v out as the kernel wants them.
    """,
    impact=_overhead,
)
def _attention_overhead(ctx: FindingContext) -> str | None:
    ledger = ctx.attention
    if ledger is None or not ledger.overhead or ledger.kernel_time_us <= 0:
        return None
    share = ledger.overhead_us / ledger.kernel_time_us
    if share <= OVERHEAD_SHARE:
        return None
    items = sorted(ledger.overhead, key=lambda item: -item["time_us"])
    parts = [
        f"{item['kind']} x{item['count_per_forward']} ({us(item['time_us'])}: {item['ops'][0]})"
        for item in items[:SHOWN]
        if item["ops"]
    ]
    return (
        f"Work tied to attention beside the attention calls takes {us(ledger.overhead_us)} per {ctx.unit}, "
        f"{100 * share:.0f}% of the calls' own {us(ledger.kernel_time_us)} (more than {100 * OVERHEAD_SHARE:.0f}%): "
        + "; ".join(parts)
        + "."
    )
