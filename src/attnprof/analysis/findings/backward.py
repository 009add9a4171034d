"""Findings on the backward phase: the helper work around a fused backward, what each costs per step.

Read from `ForwardMetrics.backward_roles` (see `analysis.instance.phases`) only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, NoImpact
from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.instance.phases import Work

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()


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
    """The facts of one role in ForwardMetrics.backward_roles; None when no instance has any."""
    per_step = [m.backward_roles.get(role, []) for m in ctx.per_forward]
    count = median_count([len(w) for w in per_step])
    if not count:
        return None
    time = median([sum(w.time_us for w in works) for works in per_step])
    backward = median([m.phases["backward"].kernel_time_us if m.phases else 0.0 for m in ctx.per_forward])
    share = 100.0 * time / backward if backward else 0.0
    return _Role(count, time, share, [w for works in per_step for w in works])


@RULES.rule(
    "bwd-dot-do-o",
    severity="info",
    summary="The dO·O preprocessing kernel (row sums of dO * O) before the fused backward kernel.",
    paragraph="""
    Before its main kernel, a fused attention backward (FlashAttention-2 and its relatives) runs a small kernel
    that computes D = rowsum(dO * O) for every query row: the softmax gradient needs it, and computing it once
    up front keeps it out of the main kernel's inner loop. It reads O and dO once more from memory, so its cost
    grows with batch x heads x seq x head_dim, not with seq squared; the message gives its time and its share of
    the backward's kernel time. It is part of the algorithm, not something to remove; it matters only when that
    share is large (short sequences, where the main kernel is small).
    """,
)
def _dot_do_o(ctx: FindingContext) -> str | None:
    r = _role(ctx, "dot-do-o")
    if r is None:
        return None
    return (
        f"The backward runs a dO·O preprocessing kernel ({r.names()}) before the fused backward kernel: "
        f"{r.cost('kernel(s)')} ({r.share:.0f}% of the backward's kernel time); it computes the row sums of "
        "dO * O that the softmax gradient needs."
    )


@RULES.rule(
    "bwd-dq-convert",
    severity="info",
    summary="dQ accumulated in fp32, then converted to the input dtype by a separate kernel.",
    paragraph="""
    The fused backward walks the key blocks in parallel, so several thread blocks add into the same rows of
    dQ; it accumulates them in an fp32 buffer (atomic adds keep the sum accurate) and a separate kernel then
    converts that buffer to the inputs' dtype. The conversion reads the fp32 dQ and writes it again at half
    the size: a memory-bound pass whose cost grows with batch x heads x seq x head_dim. The message gives its
    time and its share of the backward's kernel time. It is the design of the kernel, not a fault, and it
    matters only when that share is large.
    """,
)
def _dq_convert(ctx: FindingContext) -> str | None:
    r = _role(ctx, "convert-dq")
    if r is None:
        return None
    return (
        f"The fused backward accumulates dQ in fp32 and converts it with a separate kernel ({r.names()}): "
        f"{r.cost('kernel(s)')} ({r.share:.0f}% of the backward's kernel time)."
    )


@RULES.rule(
    "bwd-memsets",
    severity="info",
    summary="Memsets in the backward: buffers zeroed before the kernel that uses them, and the op.",
    paragraph="""
    The backward zeroes buffers before the kernels that use them: the fp32 dQ accumulator that blocks add into,
    counters and semaphores that order the blocks of a deterministic or split-K backward. Each memset is a
    launch and a pass over its buffer; usually they are small next to the backward kernel, and the message
    gives their number, time, sizes and the op they ran under so that a large one stands out. They come with
    the backend's algorithm; nothing to fix unless their time is a visible share of the step.
    """,
)
def _memsets(ctx: FindingContext) -> str | None:
    r = _role(ctx, "memset")
    if r is None:
        return None
    sizes = sorted({w.nbytes for w in r.works if w.nbytes >= 0})
    size = f", {_list_bytes(sizes)}" if sizes else ""
    ops = Counter(w.op for w in r.works if w.op)
    under = f", launched under {', '.join(op for op, _ in ops.most_common(2))}" if ops else ""
    return (
        f"The backward zeroes buffers before the kernels that use them (counters or accumulators): "
        f"{r.cost('memset(s)')}{size}{under}."
    )


def _list_bytes(sizes: list[int]) -> str:
    shown = [f"{s / 1024:,.0f} KB" if s >= 1024 else f"{s} B" for s in sizes[:3]]
    return "sizes " + ", ".join(shown) if len(sizes) > 1 else shown[0] + " each"


def _accumulation_time(ctx: FindingContext) -> float | NoImpact:
    """The device time per step of the kernels AccumulateGrad launched."""
    r = _role(ctx, "grad-accumulation")
    return NoImpact("no-device-work") if r is None else r.time


@RULES.rule(
    "grad-accumulation",
    severity="problem",
    summary="Kernels of AccumulateGrad that add the new gradients into an existing .grad.",
    paragraph="""
    AccumulateGrad launched kernels that add the new gradients into a .grad that already existed, because
    .grad was not reset to None before this backward. With no .grad, autograd stores the new gradient as
    it is, with no kernel; with one, every parameter or input gradient costs an extra elementwise add that
    reads and writes the whole gradient. The message gives the kernels, their time and their share of the
    backward's kernel time. Unless you mean to accumulate (gradient accumulation over micro-batches), call
    optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0) or model.zero_grad(set_to_none=True)
    before the backward, or take the gradients with torch.autograd.grad.
    """,
    impact=_accumulation_time,
)
def _grad_accumulation(ctx: FindingContext) -> str | None:
    r = _role(ctx, "grad-accumulation")
    if r is None:
        return None
    return (
        f"AccumulateGrad adds the new gradients into an existing .grad ({r.names()}): {r.cost('kernel(s)')} "
        f"({r.share:.0f}% of the backward's kernel time); .grad was not reset to None before the backward "
        "(zero_grad(set_to_none=True) or torch.autograd.grad avoid them)."
    )
