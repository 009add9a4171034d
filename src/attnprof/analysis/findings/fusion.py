"""Findings on attention that runs unfused: eager `matmul → softmax → matmul`, on the GPU or the CPU.

Read from each instance's attention ledger (`FindingContext.ledgers`: the device one, or a CPU-only
trace's timed on the CPU): its eager calls, their time, the time of their matrix products
(`CallFacts.gemm_time_us`) and, with record_shapes, their shape (`CallFacts.traffic`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, Numbers, Said, numbers, us
from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.instance.bandwidth import Traffic
    from attnprof.analysis.instance.ledger import CallFacts

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
EAGER = "eager"
#: How the saving is known: the finding's estimate, until the judge replaces it with a timed one.
ESTIMATED = "estimated"


def _eager_calls(ctx: FindingContext) -> list[list[CallFacts]]:
    """Each instance's forward eager calls (those with a ledger)."""
    return [[c for c in ledger.forward_calls if c.backend == EAGER] for ledger in ctx.ledgers() if ledger is not None]


def _saving(calls: list[CallFacts]) -> float:
    """The eager calls' time less their matrix products' (what fusing saves, estimated)."""
    return sum(c.time_us - (c.gemm_time_us or 0.0) for c in calls)


def _fusion_saving(ctx: FindingContext) -> float:
    """Estimated, not timed: the eager calls' time per instance (their device time, or their CPU time in a
    CPU-only trace) less that of their matrix products (GEMM kernels, or GEMM ops on the CPU), which a
    fused kernel computes too, taken at the rate the calls' own GEMMs reached. What is left is the
    scaling, masking, softmax, casts and copies, and the scores they write and read back. A causal fused
    kernel also skips the masked blocks, which this leaves out."""
    per = [calls for calls in _eager_calls(ctx) if calls]
    return median([_saving(calls) for calls in per]) if per else 0.0


def _shape(traffic: Traffic) -> tuple[str, Numbers, int | None]:
    """The call's shape in words, by name, and its head dim (from its FLOPs: 4·D per pair, None where
    the heads are not recorded apart from the batch)."""
    rows = traffic.batch * (traffic.q_heads or 1)
    pairs = rows * traffic.queries * traffic.keys
    head_dim = traffic.flops // (4 * pairs) if traffic.q_heads and pairs else None
    heads = f", {traffic.q_heads} heads" if traffic.q_heads else " (batch x heads)"
    dim = f", head dim {head_dim}" if head_dim else ""
    text = f"batch {traffic.batch}{heads}, {traffic.queries:,} queries x {traffic.keys:,} keys{dim}"
    found = numbers(
        batch=traffic.batch,
        heads=traffic.q_heads or None,
        queries=traffic.queries,
        keys=traffic.keys,
        head_dim=head_dim,
    )
    return text, found, head_dim


def _how_to_time(ctx: FindingContext, traffic: Traffic | None, head_dim: int | None, on_cpu: bool) -> str:
    """How to get a timed figure for the fused alternative: an `attnprof compare` at the call's shape
    where the trace recorded it, else what to profile again."""
    if traffic is None or not traffic.q_heads or head_dim is None or traffic.queries != traffic.keys:
        return (
            "To time it instead, profile with record_shapes=True (the calls' shapes) and run the fused "
            "scaled_dot_product_attention at that shape beside the eager code (attnprof compare --variants "
            "'naive,sdpa*' at the same batch, heads, seq and head dim)"
        )
    device = " --device cpu" if on_cpu else ""
    dtype = f" --dtype {ctx.dtype}" if ctx.dtype in ("bf16", "fp16", "fp32") else ""
    return (
        f"To time it at this shape: attnprof compare --variants 'naive,sdpa*'{device}{dtype} "
        f"--batch {traffic.batch} --heads {traffic.q_heads} --seq {traffic.queries} --head-dim {head_dim}"
    )


@RULES.rule(
    "unfused-attention",
    severity="problem",
    summary="Attention runs unfused (matmul → softmax → matmul): the calls, their time and what fusing would "
    "save (estimated).",
    paragraph="""
    The attention is written out as separate ops: a batched matmul for the scores (Q @ K^T), scaling and
    masking, a softmax, often casts, and a second matmul (P @ V). Each writes its batch x heads x seq x seq
    result to memory and the next reads it back, and each is an op on the CPU and a kernel launch on
    the GPU. A fused kernel (scaled_dot_product_attention on its flash, cuDNN or memory-efficient
    backend, a CPU flash kernel, or FlexAttention) does the same two matrix products with the scores
    kept on chip, and with is_causal=True also skips the masked blocks. The message counts the calls
    per instance, their time (device time; CPU time in a CPU-only trace), the time of their matrix
    products and the shape where record_shapes recorded it. Its impact is an estimate: the calls' time
    less that of their GEMMs, which a fused kernel still computes (taken at the rate the calls' own GEMMs
    reached). analyze --time-fixes (and attnprof model) times the fused call at the recorded shape instead,
    per fused backend, and the measured saving replaces the estimate, labelled timed; the message also gives
    the attnprof compare command that times it. Replace the eager code by
    torch.nn.functional.scaled_dot_product_attention (in transformers, attn_implementation="sdpa");
    torch.compile of the eager code fuses the softmax and its neighbours but keeps the two matmuls and
    the scores between them, so a compiled eager call is still one.
    """,
    impact=_fusion_saving,
)
def _unfused_attention(ctx: FindingContext) -> Said | None:
    per = _eager_calls(ctx)
    with_calls = [calls for calls in per if calls]
    if not with_calls:
        return None
    on_cpu = all(m.attention is None for m in ctx.per_forward)
    unit, side = ctx.unit, "CPU" if on_cpu else "device"
    count = median_count([len(calls) for calls in with_calls]) or len(with_calls[0])
    total = median([sum(c.time_us for c in calls) for calls in with_calls])
    gemm = median([sum(c.gemm_time_us or 0.0 for c in calls) for calls in with_calls])
    saved = median([_saving(calls) for calls in with_calls])
    first = with_calls[0][0]
    verb = "runs" if len(with_calls) == len(ctx.per_forward) else "run"
    message = (
        f"{ctx.every(len(with_calls)).capitalize()} {verb} attention unfused: {count} {first.op} call(s) taking "
        f"{us(total)} of {side} time per {unit}, their matrix products {us(gemm)} of it"
    )
    evidence = numbers(
        calls=count, time_us=total, gemm_us=gemm, saved_us=saved, impact_basis=ESTIMATED, time_base=side.lower()
    )
    head_dim = None
    if first.traffic is not None:
        text, found, head_dim = _shape(first.traffic)
        message += f" (shape: {text})"
        evidence |= found
    estimate = (
        f" A fused kernel keeps the scores on chip: fusing would save about {us(saved)} per {unit} (estimated, "
        "not timed: the calls' time less their matrix products'). "
        f"{_how_to_time(ctx, first.traffic, head_dim, on_cpu)}."
    )
    # the judge puts a timed saving in place of this sentence (findings.timed_fixes)
    return message + "." + estimate, evidence | {"estimate_sentence": estimate}
