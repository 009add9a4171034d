"""Findings on the attention ledger and on where the instances stalled.

Read from `ForwardMetrics.stalls` and `.attention` and the summarised ledger only. Ids are a stable
JSON contract:

- ``host-sync``           a sync inside the instance that blocked the CPU until the device caught up:
                          the op chain that caused it (innermost first) and how long the CPU waited
- ``gpu-idle``            the device sat idle for more than `GPU_IDLE_SHARE` of its span (per phase,
                          see `analysis.stalls`): the largest gaps and the CPU ops that ran meanwhile
- ``attention-overhead``  the overhead ledger's time exceeds `OVERHEAD_SHARE` of attention's own time
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from attnprof.analysis.instance.stalls import GPU_IDLE_SHARE
from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.findings.forward import FindingContext
    from attnprof.analysis.instance.stalls import Gap, Stalls

OVERHEAD_SHARE = 0.10
LEDGER_FINDING_IDS = ("host-sync", "gpu-idle", "attention-overhead")
SHOWN = 3  # chains, gaps and overhead kinds named in a message


def _us(value: float) -> str:
    return f"{value:,.1f} us"


#: Why a sync follows a memcpy of this kind.
_WHY = {
    "HtoD": " (a copy from pageable host memory, e.g. torch.tensor(..., device=...), waits for the device)",
    "DtoH": " (the CPU reads a result back: .item(), .tolist(), a data-dependent branch)",
}


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
    total = median([sum(x.wait_us for x in s.syncs) for s in stalls])
    parts = []
    for key in ranked[:SHOWN]:
        api, chain, memcpy = key
        where = " ← ".join(chain) if chain else "no op (directly in the region)"
        after = f", after a {memcpy}{_WHY.get(memcpy[7:11], '')}" if memcpy else ""
        parts.append(
            f"{api} under {where}{after}: {median_count(counts[key]) or 1}x, {_us(median(waits[key]))} per {unit}"
        )
    if len(ranked) > SHOWN:
        parts.append(f"and {len(ranked) - SHOWN} more")
    return (
        f"{ctx.every(with_sync, len(stalls)).capitalize()} blocks the CPU until the device catches up "
        f"({n} sync(s), the CPU waiting {_us(total)} per {unit}): " + "; ".join(parts) + "."
    )


def _gap_text(gap: Gap) -> str:
    covered = sum(us for _, us in gap.cpu_ops)
    ops = ", ".join(f"{name} ({_us(us)})" for name, us in gap.cpu_ops[:2])
    cpu = f"while the CPU ran {ops}" if ops else "while the CPU ran no op"
    if ops and gap.duration_us - covered > 1.0:
        cpu += f" and no op for {_us(gap.duration_us - covered)}"
    phase = "" if gap.phase == "forward" else " of the backward"
    return f"{_us(gap.duration_us)} after {gap.after} (at +{gap.offset_us:,.0f} us{phase}) {cpu}"


def _gpu_idle(ctx: FindingContext) -> str | None:
    stalls: list[Stalls] = [m.stalls for m in ctx.per_forward if m.stalls is not None and m.stalls.idle_share]
    if not stalls:
        return None
    stalls.sort(key=lambda s: s.idle_share or 0.0)
    typical = stalls[(len(stalls) - 1) // 2]  # the instance with the (low) median share
    share = typical.idle_share or 0.0
    if share <= GPU_IDLE_SHARE:
        return None
    phases = "" if all(g.phase == "forward" for g in typical.gaps) else " (each phase on its own)"
    gaps = "; ".join(_gap_text(g) for g in typical.gaps[:SHOWN])
    return (
        f"The GPU sat idle {_us(typical.idle_us)} of the {_us(typical.span_us)} its work spanned "
        f"per {ctx.unit}{phases}, "
        f"{100 * share:.0f}% (more than {100 * GPU_IDLE_SHARE:.0f}%): the CPU did not keep it fed. "
        f"Largest gaps: {gaps}."
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
        f"{item['kind']} x{item['count_per_forward']} ({_us(item['time_us'])}: {item['ops'][0]})"
        for item in items[:SHOWN]
        if item["ops"]
    ]
    return (
        f"Work tied to attention beside the attention calls takes {_us(ledger.overhead_us)} per {ctx.unit}, "
        f"{100 * share:.0f}% of the calls' own {_us(ledger.kernel_time_us)} (more than {100 * OVERHEAD_SHARE:.0f}%): "
        + "; ".join(parts)
        + "."
    )


_RULES = {"host-sync": _host_sync, "gpu-idle": _gpu_idle, "attention-overhead": _attention_overhead}


def ledger_findings(ctx: FindingContext) -> list[tuple[str, str]]:
    """(id, message) of each ledger finding the evidence supports, in LEDGER_FINDING_IDS order."""
    found = []
    for finding_id in LEDGER_FINDING_IDS:
        message = _RULES[finding_id](ctx)
        if message is not None:
            found.append((finding_id, message))
    return found
