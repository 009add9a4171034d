"""On a CUDA GPU: unfused-attention on an eager bf16 attention with its GEMM kernels' time and shape,
mask-convert on an FP32 mask cast to bf16 before every SDPA call with its device time, and neither on
SDPA given is_causal=True.

Run on the device with `python -m pytest -m gpu tests/test_gpu_fusion_findings.py`. Skipped without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprof.analysis import analyze_trace

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BATCH, HEADS, SEQ, DIM = 2, 8, 1024, 64


def _capture(fn, path: Path) -> Path:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            record_shapes=True,
            schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        ) as prof:
            for _ in range(5):
                with record_function("attention"):
                    fn()
                prof.step()
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def qkv():
    torch.manual_seed(0)
    return [torch.randn(BATCH, HEADS, SEQ, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3)]


def test_eager_attention_on_the_gpu_is_unfused_with_its_gemms_and_shape(qkv, tmp_path):
    q, k, v = qkv

    def eager():
        scores = torch.matmul(q, k.transpose(-2, -1)) * DIM**-0.5
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    f = analyze_trace(_capture(eager, tmp_path / "eager.json")).finding("unfused-attention")
    assert f is not None and f.severity == "problem"
    ev = f.evidence
    assert ev["time_base"] == "device" and ev["calls"] == 1 and ev["impact_basis"] == "estimated"
    assert 0 < ev["gemm_us"] < ev["time_us"]
    assert f.impact_us == pytest.approx(ev["saved_us"], abs=1e-3) and f.impact_us > 0
    assert (ev["batch"], ev["heads"], ev["queries"], ev["keys"], ev["head_dim"]) == (BATCH, HEADS, SEQ, SEQ, DIM)
    assert f"--dtype bf16 --batch {BATCH} --heads {HEADS} --seq {SEQ} --head-dim {DIM}" in f.message


def test_an_fp32_mask_cast_before_each_sdpa_call_is_a_conversion_with_device_time(qkv, tmp_path):
    import torch.nn.functional as F

    q, k, v = qkv
    additive = torch.zeros(1, 1, SEQ, SEQ, device="cuda").masked_fill(
        torch.ones(SEQ, SEQ, dtype=torch.bool, device="cuda").triu(1), float("-inf")
    )

    def cast_every_call():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=additive.to(torch.bfloat16))

    analysis = analyze_trace(_capture(cast_every_call, tmp_path / "cast.json"))
    f = analysis.finding("mask-convert")
    assert f is not None and f.severity == "problem"
    assert f.evidence["conversions"] == 1
    assert f.evidence["device_us"] is not None and f.evidence["device_us"] > 0
    assert f"of 1x1x{SEQ}x{SEQ}, float → c10::BFloat16 x1 per forward, before call 1" in f.message
    assert analysis.finding("unfused-attention") is None


def test_sdpa_with_is_causal_is_neither(qkv, tmp_path):
    import torch.nn.functional as F

    analysis = analyze_trace(
        _capture(lambda: F.scaled_dot_product_attention(*qkv, is_causal=True), tmp_path / "c.json")
    )
    assert analysis.finding("unfused-attention") is None
    assert analysis.finding("mask-convert") is None
