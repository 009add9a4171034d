"""Findings on an fp8 cell against bf16 at the same shape: FP8 that does not pay.

Read from `FindingContext.fp8_vs_bf16` only (`registry.Fp8AgainstBf16`): the fastest bf16 row of the same
shape and mode in the same run, which a trace alone does not have. These findings reach a row through the
judge (`judge.judge_fp8`) after the run, when its rows are known (`pipeline.fp8_compare`); the context's
instance time (`gpu_time_us`) is the fp8 row's latency.
"""

from __future__ import annotations

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, NoImpact, Said, numbers

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `fp8-not-faster` fires when the fp8 latency is above the best bf16 latency by more than this share (timing
#: noise between two cells of one run stays under it).
SLOWER_MARGIN = 0.02


def _time_over_bf16(ctx: FindingContext) -> float | NoImpact:
    """The fp8 latency per instance above the fastest bf16 latency at the same shape in the same run: what
    running that bf16 variant instead would save."""
    against = ctx.fp8_vs_bf16
    if against is None:
        return NoImpact("needs-alternative")
    return max(0.0, against.fp8_latency_us - against.bf16_latency_us)


@RULES.rule(
    "fp8-not-faster",
    severity="problem",
    summary="An fp8 cell was slower than the fastest bf16 cell of the same shape and mode in the same run.",
    paragraph=f"""
    FP8 halves the bytes of q, k and v and doubles the tensor cores' peak, so an fp8 attention kernel is
    expected to beat bf16 at the same shape; this cell's latency (timed without the profiler, the
    quantization of q, k and v outside it and shown as its own phase) was more than {SLOWER_MARGIN:.0%}
    above that of the fastest bf16 variant the same run timed at the same shape and mode. On Hopper this
    is what cuDNN's fp8 backward does at long sequences (its own published H200 figures: 370 TFLOP/s fp8
    against 581 bf16 at 32k, causal). The message names the bf16 variant and both latencies; the impact is
    the difference, what that bf16 variant would save. Keep bf16 for that mode and shape, or try another
    fp8 implementation or scaling (per-head descales cost an extra multiply per tile in some kernels).
    """,
    impact=_time_over_bf16,
)
def _fp8_not_faster(ctx: FindingContext) -> Said | None:
    against = ctx.fp8_vs_bf16
    if against is None or against.fp8_latency_us <= (1.0 + SLOWER_MARGIN) * against.bf16_latency_us:
        return None
    ratio = against.fp8_latency_us / against.bf16_latency_us
    values = numbers(
        fp8_latency_us=against.fp8_latency_us,
        bf16_latency_us=against.bf16_latency_us,
        bf16_variant=against.bf16_variant,
        slower_ratio=ratio,
    )
    return (
        f"{against.fp8_dtype} took {against.fp8_latency_us:,.1f} µs, {ratio:.2f}x the "
        f"{against.bf16_latency_us:,.1f} µs of {against.bf16_variant} in bf16 at the same shape and mode in this run.",
        values,
    )
