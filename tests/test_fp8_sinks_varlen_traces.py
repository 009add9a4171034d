"""`analyze` on H200 traces of the workloads of issue 34 (tests/data/h200-fp8-sinks-varlen, written by `attnprof
sweep`/`compare` on 2026-12-03): triton-flash-fp8's forward, triton-flash with attention sinks in a training step,
and a packed batch of 64 sequences (about 239 tokens each) run three ways: triton-flash with cu_seqlens, flex with
a document mask, and the padded dense SDPA a user would otherwise write."""

from __future__ import annotations

from pathlib import Path

from attnprof.analysis import analyze_trace

DATA = Path(__file__).parent / "data" / "h200-fp8-sinks-varlen"
PACKED = "1x32x15294x128-kv8-varlen64x-239_bf16_causal"


def _analysis(name: str):
    return analyze_trace(DATA / f"{name}.json.gz")


def _ids(analysis) -> set[str]:
    return set(analysis.finding_ids)


def test_triton_flash_fp8_is_one_fused_fp8_kernel():
    analysis = _analysis("triton-flash-fp8_1x64x8192x128-kv8_fp8_causal_cuda0")
    (call,) = analysis.attention.calls
    assert (call.op, call.backend, call.phase) == ("_attn_fwd_fp8", "triton", "forward")
    assert analysis.kernels_per_forward == 1 and "single-fused-kernel" in _ids(analysis)
    assert 1400 < call.time_us < 1700  # 1x64x8192x128/kv8 causal: about 1.5 ms on the H200


def test_a_sinks_training_step_has_its_forward_and_backward_calls_and_the_dsinks_ops():
    analysis = _analysis("triton-flash_1x64x8192x64-kv8-sinks_bf16_causal_fwd+bwd_cuda0")
    forward, backward = analysis.attention.calls
    assert (forward.op, forward.phase) == ("FlashAttention", "forward")
    assert (backward.op, backward.phase) == ("FlashAttentionBackward", "backward")
    assert backward.time_us > 2 * forward.time_us
    # the forward, delta, dK/dV and dQ kernels, and the elementwise ops that sum dsinks per head
    assert analysis.kernels_per_forward == 12


def test_a_packed_batch_three_ways():
    triton = _analysis(f"triton-flash_{PACKED}_cuda0")
    flex = _analysis(f"flex_{PACKED}_cuda0")
    padded = _analysis(f"padded-sdpa_{PACKED}_cuda0")
    (t_call,), (f_call,), (p_call,) = (a.attention.calls for a in (triton, flex, padded))
    assert (t_call.op, t_call.backend) == ("_attn_fwd", "triton") and triton.kernels_per_forward == 1
    assert f_call.backend == "flex" and flex.kernels_per_forward == 1
    # padding the 64 sequences to the longest: copies around one dense cuDNN call over the padded batch
    assert p_call.backend == "cudnn" and padded.kernels_per_forward == 8 and "hidden-memcpy" in _ids(padded)
    assert t_call.time_us < f_call.time_us < p_call.time_us


def test_a_packed_training_step_links_the_backward_to_its_forward():
    analysis = _analysis(f"triton-flash_{PACKED}_fwd+bwd_cuda0")
    forward, backward = analysis.attention.calls
    assert (forward.phase, backward.phase) == ("forward", "backward") and backward.backend == "triton"
    assert analysis.kernels_per_forward == 4  # forward, delta, dK/dV, dQ
