"""Findings on the backward phase: the helper work around a fused backward, what each costs per step.

Read from `ForwardMetrics.backward_roles` (see `analysis.phases`) only. Ids are a stable JSON contract:

- ``bwd-dot-do-o``        the dO·O preprocessing kernel (rowsum of dO * O) before the fused backward kernel
- ``bwd-dq-convert``      dQ accumulated in fp32, then converted to the input dtype by a separate kernel
- ``bwd-memsets``         memsets in the backward: buffers zeroed before the kernel that uses them, and the op
- ``grad-accumulation``   kernels of AccumulateGrad that add the new gradients into an existing ``.grad``
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.findings.forward import FindingContext
    from attnprof.analysis.instance.phases import Work


@dataclass(frozen=True)
class _Role:
    """One role's facts per step: medians over the instances of its count and time, its share of
    the backward's kernel time, and every event of the role."""

    count: int
    time: float
    share: float
    works: list[Work]

    def cost(self, what: str) -> str:
        """ "N what per step, T us per step"."""
        return f"{self.count} {what} per step, {self.time:,.1f} us per step"

    def names(self) -> str:
        """The two commonest short names."""
        return ", ".join(name for name, _ in Counter(w.name for w in self.works).most_common(2))


def _role(ctx: FindingContext, role: str) -> _Role | None:
    """The facts of one role; None when no instance has any."""
    per_step = [m.backward_roles.get(role, []) for m in ctx.per_forward]
    count = median_count([len(w) for w in per_step])
    if not count:
        return None
    time = median([sum(w.time_us for w in works) for works in per_step])
    backward = median([m.phases["backward"].kernel_time_us if m.phases else 0.0 for m in ctx.per_forward])
    share = 100.0 * time / backward if backward else 0.0
    return _Role(count, time, share, [w for works in per_step for w in works])


def _dot_do_o(r: _Role) -> str:
    return (
        f"The backward runs a dO·O preprocessing kernel ({r.names()}) before the fused backward kernel: "
        f"{r.cost('kernel(s)')} ({r.share:.0f}% of the backward's kernel time); it computes the row sums of "
        "dO * O that the softmax gradient needs."
    )


def _dq_convert(r: _Role) -> str:
    return (
        f"The fused backward accumulates dQ in fp32 and converts it with a separate kernel ({r.names()}): "
        f"{r.cost('kernel(s)')} ({r.share:.0f}% of the backward's kernel time)."
    )


def _memsets(r: _Role) -> str:
    sizes = sorted({w.nbytes for w in r.works if w.nbytes >= 0})
    size = f", {_list_bytes(sizes)}" if sizes else ""
    ops = Counter(w.op for w in r.works if w.op)
    under = f", launched under {', '.join(op for op, _ in ops.most_common(2))}" if ops else ""
    return (
        f"The backward zeroes buffers before the kernels that use them (counters or accumulators): "
        f"{r.cost('memset(s)')}{size}{under}."
    )


def _grad_accumulation(r: _Role) -> str:
    return (
        f"AccumulateGrad adds the new gradients into an existing .grad ({r.names()}): {r.cost('kernel(s)')} "
        f"({r.share:.0f}% of the backward's kernel time); .grad was not reset to None before the backward "
        "(zero_grad(set_to_none=True) or torch.autograd.grad avoid them)."
    )


#: finding id -> (role in ForwardMetrics.backward_roles, its message)
_RULES = {
    "bwd-dot-do-o": ("dot-do-o", _dot_do_o),
    "bwd-dq-convert": ("convert-dq", _dq_convert),
    "bwd-memsets": ("memset", _memsets),
    "grad-accumulation": ("grad-accumulation", _grad_accumulation),
}
BACKWARD_FINDING_IDS = tuple(_RULES)


def backward_findings(ctx: FindingContext) -> list[tuple[str, str]]:
    """(id, message) of each backward finding the evidence supports, in BACKWARD_FINDING_IDS order."""
    found = []
    for finding_id, (role, message) in _RULES.items():
        facts = _role(ctx, role)
        if facts is not None:
            found.append((finding_id, message(facts)))
    return found


def _list_bytes(sizes: list[int]) -> str:
    shown = [f"{s / 1024:,.0f} KB" if s >= 1024 else f"{s} B" for s in sizes[:3]]
    return "sizes " + ", ".join(shown) if len(sizes) > 1 else shown[0] + " each"
