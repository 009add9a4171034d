"""Are a variant's gradients right? dq, dk and dv (and a `sinks` cell's dsinks, the gradient of its sink
logits) against float64 autograd on the same inputs.

The reference is `correctness.reference_attention` in float64, differentiated by autograd with the
same `grad_out` the variant's backward got (rounded to the working dtype, as the variant saw it).
Each gradient gets its own relative Frobenius error ‖g − ref‖ / ‖ref‖ and must stay within the
dtype's `GRAD_THRESHOLDS` (dsinks too: one number per head, the sum over the head's rows of minus the sink's
weight times (dO·O), an error like dq's). The limits are looser than the forward's: a backward recomputes the
softmax and chains five matmuls, and dk/dv sum over every query row in the working dtype. Measured
on CPU with torch 2.13 (standard-normal inputs, D 16 to 128, S up to 1024, causal and not, GQA):
`sdpa-math` gave at most 1.7e-3 (bf16), 2.2e-4 (fp16), 5.3e-7 (fp32) and `naive`, which rounds the
scores to the working dtype, 6.6e-3 (bf16), 8.2e-4 (fp16), 5.1e-7 (fp32). The limits sit 6 to 8 times
above the worst low-precision figure (fp32: 40 times, room for a GPU's reordered sums), while a wrong
mask, scale or a dropped term gives 0.1 and more.

Big shapes: dk and dv depend on every query row, so the forward check's row subset does not apply.
Above `GRAD_REFERENCE_LIMIT` scores the reference runs on a slice instead: the first and last batch
element and up to `SUBSET_HEADS` evenly spaced key/value heads, each with all the query heads of its
group (GQA) and all rows, fewer when even that is over the limit (at least one batch element and one
key/value head). Batches and heads are independent, so the slice's gradients are exact. The slice's
reference then runs a few query heads at a time (`reference_grads`), so that even one group at
S=32k (8 query heads: 64 GiB of float64 scores with their graph) stays within memory. NaN and
Inf are looked for in the whole gradients. A head's dsinks sums over every batch element: it is checked
on a slice only when the slice keeps every batch element (the scope says when it was not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnprof.masks import Mask
from attnprof.profiling.correctness import (
    _spaced,
    nonfinite_reason,
    reference_attention,
    relative_error,
    threshold_for,
)
from attnprof.profiling.inputs import to_bhsd

#: fp8: against float64 autograd on the bf16 sources, so quantization is included; not yet measured on a
#: GPU (no fp8 backward runs on CPU): set at 3x the forward's worst error against those sources (6.1e-2, 1.25e-1).
GRAD_THRESHOLDS = {"bf16": 5e-2, "fp16": 5e-3, "fp32": 2e-5, "fp8": 2e-1, "fp8_e5m2": 4e-1}
GRAD_REFERENCE_LIMIT = 1 << 24  # scores in the float64 reference with its graph (about 0.5 GiB)
SUBSET_HEADS = 4
GRAD_NAMES = ("dq", "dk", "dv")
SINK_GRAD_NAME = "dsinks"


@dataclass(frozen=True)
class GradCheck:
    """The verdict on dq, dk and dv (and dsinks with sinks): each one's relative error, pass/fail, why it
    failed, the limit, and what the errors were computed on (`scope`: 'full' or the slice)."""

    rel_errors: dict[str, float | None] = field(default_factory=dict)
    passed: bool = False
    reason: str | None = None
    threshold: float | None = None
    scope: str = "full"


def grad_threshold_for(dtype: str) -> float:
    """The gradients' relative-error limit for `bf16`, `fp16`, `fp32`, `fp8` or `fp8_e5m2`."""
    return threshold_for(dtype, GRAD_THRESHOLDS)


def grad_subset(
    batch: int, heads: int, kv_heads: int, seq: int, *, limit: int = GRAD_REFERENCE_LIMIT, max_heads: int = SUBSET_HEADS
) -> dict | None:
    """The batch elements and key/value heads the gradient reference runs on, or None for all."""
    if batch * heads * seq * seq <= limit:
        return None
    per_pair = (heads // kv_heads) * seq * seq  # scores of one batch element and one kv head's group
    room = max(1, limit // per_pair)
    batches = sorted({0, batch - 1})
    if room < len(batches):
        batches = [0]
    count = max(1, min(max_heads, room // len(batches)))
    return {"batches": batches, "kv_heads": _spaced(kv_heads, count)}


def reference_grads(
    q: Any,
    k: Any,
    v: Any,
    grad_out: Any,
    causal: bool,
    limit: int | None = None,
    mask: Mask | str | None = None,
    score_mod: str | None = None,
    head_ids: list[int] | None = None,
    total_heads: int | None = None,
    sinks: Any = None,
    seq_lens: list[int] | tuple[int, ...] | None = None,
) -> tuple[Any, ...]:
    """(dq, dk, dv), and dsinks after them when `sinks` is given (one logit per head of q), of float64
    attention on [B, H, S, D] inputs (K/V with H or fewer heads, GQA), against `grad_out`, on their device.
    With `limit`, the query heads go through in chunks of at most `limit` scores (at least one head each),
    and each key/value head's dk and dv add up over its group's chunks: the same gradients, with the float64
    graph of one chunk alive at a time (one head at S=32k is 8 GiB of scores). `mask`, `score_mod`,
    `head_ids` (the query heads' absolute indices, for ALiBi) and a packed batch's `seq_lens` as in
    `reference_attention`."""
    import torch

    batch, heads, seq, _ = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    per_head = batch * seq * k.shape[2]
    ids = head_ids if head_ids is not None else list(range(heads))
    score = {"mask": mask, "score_mod": score_mod, "total_heads": total_heads or heads, "seq_lens": seq_lens}
    if limit is None or heads * per_head <= limit:
        return _reference_grads(q, k, v, grad_out, causal, score | {"head_ids": ids}, sinks)
    chunk = max(1, min(group, limit // per_head))
    dq = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    dsinks = None if sinks is None else torch.empty(sinks.shape, dtype=torch.float64, device=q.device)
    for j in range(kv_heads):
        for first in range(j * group, (j + 1) * group, chunk):
            h = slice(first, min(first + chunk, (j + 1) * group))
            part = score | {"head_ids": ids[h]}
            kv = (k[:, j : j + 1], v[:, j : j + 1])
            got = _reference_grads(q[:, h], *kv, grad_out[:, h], causal, part, None if sinks is None else sinks[h])
            dq[:, h] = got[0]
            dk[:, j : j + 1] += got[1]
            dv[:, j : j + 1] += got[2]
            if dsinks is not None:
                dsinks[h] = got[3]
    return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)


def _reference_grads(
    q: Any, k: Any, v: Any, grad_out: Any, causal: bool, score: dict[str, Any], sinks: Any = None
) -> tuple[Any, ...]:
    import torch

    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    leaves = [t.detach().to(torch.float64).requires_grad_(True) for t in inputs]
    with torch.enable_grad():
        q64, k64, v64 = leaves[:3]
        sinks64 = leaves[3] if sinks is not None else None
        out = reference_attention(q64, k64, v64, causal, device=q.device, differentiable=True, sinks=sinks64, **score)
        return torch.autograd.grad(out, leaves, grad_out.detach().to(torch.float64))


def check_grads(
    grads: tuple[Any, Any, Any],
    q: Any,
    k: Any,
    v: Any,
    grad_out: Any,
    *,
    causal: bool,
    dtype: str,
    layout: str = "bhsd",
    limit: int = GRAD_REFERENCE_LIMIT,
    mask: Mask | str | None = None,
    score_mod: str | None = None,
    sinks: Any = None,
    sink_grad: Any = None,
    seq_lens: list[int] | tuple[int, ...] | None = None,
) -> GradCheck:
    """Check a variant's (dq, dk, dv) against float64 autograd on the same q, k, v and `grad_out`
    (all in `layout`); the slice of the module docstring above `limit` scores. With `sinks` (the cell's
    sink logits, (heads,)), `sink_grad` is checked as `dsinks` beside them."""
    import torch

    grads = tuple(to_bhsd(g, layout) for g in grads)
    q, k, v, grad_out = (to_bhsd(t, layout) for t in (q, k, v, grad_out))
    threshold = grad_threshold_for(dtype)
    named = list(zip(GRAD_NAMES, grads, (q, k, v), strict=True))
    if sinks is not None:
        named.append((SINK_GRAD_NAME, sink_grad, sinks))
    for name, grad, like in named:
        if grad is None or tuple(grad.shape) != tuple(like.shape):
            got = None if grad is None else tuple(grad.shape)
            layout_note = "" if name == SINK_GRAD_NAME else " (bhsd)"
            return GradCheck({}, False, f"{name} shape {got} != expected {tuple(like.shape)}{layout_note}", threshold)
        bad = nonfinite_reason(grad)
        if bad:
            return GradCheck({}, False, bad.replace("output", name), threshold)
    batch, heads, seq, _ = q.shape
    kv_heads = k.shape[1]
    subset = grad_subset(batch, heads, kv_heads, seq, limit=limit)
    scope = "full"
    head_ids = list(range(heads))
    if subset is not None:
        group = heads // kv_heads
        b_idx = torch.tensor(subset["batches"], device=q.device)
        kv_idx = torch.tensor(subset["kv_heads"], device=q.device)
        head_ids = [h * group + g for h in subset["kv_heads"] for g in range(group)]
        h_idx = torch.tensor(head_ids, device=q.device)
        pick_q = lambda t: t.index_select(0, b_idx).index_select(1, h_idx)  # noqa: E731
        pick_kv = lambda t: t.index_select(0, b_idx).index_select(1, kv_idx)  # noqa: E731
        q, grad_out = pick_q(q), pick_q(grad_out)
        k, v = pick_kv(k), pick_kv(v)
        grads = (pick_q(grads[0]), pick_kv(grads[1]), pick_kv(grads[2]))
        scope = (
            f"slice: batches {subset['batches']}, {len(subset['kv_heads'])} of {kv_heads} kv heads "
            f"({len(h_idx)} of {heads} query heads), all rows"
        )
        if sinks is not None:
            sinks, sink_grad = sinks.index_select(0, h_idx), sink_grad.index_select(0, h_idx)
        if sinks is not None and len(subset["batches"]) < batch:
            # a head's dsinks sums over every batch element, the slice's reference over some of them
            scope += f"; {SINK_GRAD_NAME} not checked (it sums over all {batch} batch elements)"
            sink_grad = None
    refs = reference_grads(
        q,
        k,
        v,
        grad_out,
        causal,
        limit=limit,
        mask=mask,
        score_mod=score_mod,
        head_ids=head_ids,
        total_heads=heads,
        sinks=sinks,
        seq_lens=seq_lens,
    )
    errors: dict[str, float | None] = {
        name: relative_error(g, ref) for name, g, ref in zip(GRAD_NAMES, grads, refs, strict=False)
    }
    if sink_grad is not None:
        errors[SINK_GRAD_NAME] = relative_error(sink_grad, refs[3])
    over = [f"{name} {err:.1e}" for name, err in errors.items() if err is None or not err <= threshold]
    if over:
        return GradCheck(
            errors,
            False,
            f"gradient relative error {', '.join(over)} > {threshold:.0e} ({dtype} limit)",
            threshold,
            scope,
        )
    return GradCheck(errors, True, None, threshold, scope)
