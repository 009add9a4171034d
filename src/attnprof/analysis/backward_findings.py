"""Findings on the backward phase: the helper work around a fused backward, what each costs per step.

Read from `ForwardMetrics.backward_roles` (see `analysis.phases`) only. Ids are a stable JSON contract:

- ``bwd-dot-do-o``        the dO·O preprocessing kernel (rowsum of dO * O) before the fused backward kernel
- ``bwd-dq-convert``      dQ accumulated in fp32, then converted to the input dtype by a separate kernel
- ``bwd-memsets``         memsets in the backward: buffers zeroed before the kernel that uses them, and the op
- ``grad-accumulation``   kernels of AccumulateGrad that add the new gradients into an existing ``.grad``
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.findings import FindingContext
    from attnprof.analysis.phases import Work

BACKWARD_FINDING_IDS = ("bwd-dot-do-o", "bwd-dq-convert", "bwd-memsets", "grad-accumulation")


def _role(ctx: FindingContext, role: str) -> tuple[int, float, float, list[Work]] | None:
    """Count and time per step (medians over the instances), the share of the backward's kernel
    time, and every event of one role; None when no instance has any."""
    per_step = [m.backward_roles.get(role, []) for m in ctx.per_forward]
    count = median_count([len(w) for w in per_step])
    if not count:
        return None
    time = median([sum(w.time_us for w in works) for works in per_step])
    backward = median([m.phases["backward"].kernel_time_us if m.phases else 0.0 for m in ctx.per_forward])
    share = 100.0 * time / backward if backward else 0.0
    return count, time, share, [w for works in per_step for w in works]


def _names(works: list[Work]) -> str:
    names = Counter(w.name for w in works)
    return ", ".join(name for name, _ in names.most_common(2))


def _cost(count: int, time: float, what: str) -> str:
    return f"{count} {what} per step, {time:,.1f} us per step"


def backward_findings(ctx: FindingContext) -> list[tuple[str, str]]:
    """(id, message) of each backward finding the evidence supports, in BACKWARD_FINDING_IDS order."""
    found = []
    role = _role(ctx, "dot-do-o")
    if role:
        count, time, share, works = role
        found.append(("bwd-dot-do-o", (
            f"The backward runs a dO·O preprocessing kernel ({_names(works)}) before the fused backward kernel: "
            f"{_cost(count, time, 'kernel(s)')} ({share:.0f}% of the backward's kernel time); it computes the "
            "row sums of dO * O that the softmax gradient needs.")))
    role = _role(ctx, "convert-dq")
    if role:
        count, time, share, works = role
        found.append(("bwd-dq-convert", (
            f"The fused backward accumulates dQ in fp32 and converts it with a separate kernel ({_names(works)}): "
            f"{_cost(count, time, 'kernel(s)')} ({share:.0f}% of the backward's kernel time).")))
    role = _role(ctx, "memset")
    if role:
        count, time, _, works = role
        sizes = sorted({w.nbytes for w in works if w.nbytes >= 0})
        size = f", {_list_bytes(sizes)}" if sizes else ""
        ops = Counter(w.op for w in works if w.op)
        under = f", launched under {', '.join(op for op, _ in ops.most_common(2))}" if ops else ""
        found.append(("bwd-memsets", (
            f"The backward zeroes buffers before the kernels that use them (counters or accumulators): "
            f"{_cost(count, time, 'memset(s)')}{size}{under}.")))
    role = _role(ctx, "grad-accumulation")
    if role:
        count, time, share, works = role
        found.append(("grad-accumulation", (
            f"AccumulateGrad adds the new gradients into an existing .grad ({_names(works)}): "
            f"{_cost(count, time, 'kernel(s)')} ({share:.0f}% of the backward's kernel time); .grad was not "
            "reset to None before the backward (zero_grad(set_to_none=True) or torch.autograd.grad avoid them).")))
    return found


def _list_bytes(sizes: list[int]) -> str:
    shown = [f"{s / 1024:,.0f} KB" if s >= 1024 else f"{s} B" for s in sizes[:3]]
    return "sizes " + ", ".join(shown) if len(sizes) > 1 else shown[0] + " each"
