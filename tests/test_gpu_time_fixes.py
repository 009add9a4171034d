"""On a CUDA GPU: `analyze --time-fixes` times what the findings propose at the traced shapes. An eager bf16
attention against SDPA's fused backends (flash, cuDNN, memory-efficient; the fastest is the fix, each named in
evidence), the checked-in H200 dense-mask trace against is_causal (and flex's BlockMask), SDPA pinned to its
math backend against the fused ones, and its FP32 GEMMs against the same GEMMs in bf16.

Run on the device with `python -m pytest -m gpu tests/test_gpu_time_fixes.py`. Skipped without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MASKS = Path(__file__).parent / "data" / "h200" / "masks"
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


def _analyzed(cli, trace: Path) -> tuple[dict, str]:
    result = cli("analyze", str(trace), "--time-fixes", "--time-fixes-budget", "30", "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def _finding(document: dict, finding_id: str) -> dict:
    return next(f for f in document["findings"] if f["id"] == finding_id)


def _timed(f: dict) -> dict:
    ev = f["evidence"]
    assert ev["impact_basis"].startswith("timed"), f["message"]
    assert ev["timed_before_us"] > 0 and ev["timed_after_us"] > 0
    assert f["impact_us"] == pytest.approx(max(ev["timed_before_us"] - ev["timed_after_us"], 0.0), abs=2e-3)
    return ev


def test_an_eager_attention_is_timed_against_each_fused_backend(cli, tmp_path):
    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, SEQ, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def eager():
        scores = torch.matmul(q, k.transpose(-2, -1)) * DIM**-0.5
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    document, stderr = _analyzed(cli, _capture(eager, tmp_path / "eager.json"))
    ev = _timed(_finding(document, "unfused-attention"))
    assert ev["timed_alternative"] in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
    for backend in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
        assert backend in ev["timed_alternatives"]  # each fused backend timed, or its reason given
    # at 1,024 tokens in bf16 a fused kernel beats the eager matmul → softmax → matmul
    assert ev["timed_after_us"] < ev["timed_before_us"]
    assert "on cuda" in stderr


def test_the_h200_dense_mask_is_timed_against_is_causal(cli):
    document, _ = _analyzed(cli, MASKS / "dense-mask.json.gz")
    f = _finding(document, "dense-mask")
    ev = _timed(f)
    assert ev["timed_alternative"] in ("sdpa is_causal", "flex BlockMask")
    assert "sdpa is_causal" in ev["timed_alternatives"] and "flex BlockMask" in ev["timed_alternatives"]
    assert ev["timed_after_us"] < ev["timed_before_us"]  # half the blocks skipped at 2,048 tokens


def test_the_math_backend_and_its_fp32_gemms_are_timed_against_the_fused_backends_and_bf16(cli):
    document, _ = _analyzed(cli, MASKS / "sdpa-math-bf16.json.gz")
    fallback = _timed(_finding(document, "backend-fallback"))
    assert (
        fallback["timed_alternative"].startswith("sdpa-") and fallback["timed_after_us"] < fallback["timed_before_us"]
    )
    gemms = _timed(_finding(document, "fp32-cuda-cores"))
    assert gemms["timed_alternative"] == "bf16 GEMM" and gemms["timed_after_us"] < gemms["timed_before_us"]
