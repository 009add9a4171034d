"""FP8 on the GPU (run on the H200): the `torch._scaled_mm` ceiling, and an fp8 cell of a built-in-free
stand-in variant through the whole cell pipeline (quantize phase, accuracy, row fields)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _fp8_capable(), reason="needs an sm_89+ GPU")
@pytest.mark.parametrize("dtype", ["fp8", "fp8_e5m2"])
def test_the_fp8_matmul_ceiling_is_measured_with_scaled_mm_and_beats_bf16(dtype, tmp_path):
    from attnprof.profiling import ceiling

    ceiling.forget()
    path = tmp_path / "ceilings.json"
    fp8 = ceiling.device_ceiling("cuda", dtype, path=path)
    bf16 = ceiling.device_ceiling("cuda", "bf16", path=path)
    assert fp8.source == "measured" and "torch._scaled_mm" in (fp8.method or "")
    assert fp8.tflops is not None and bf16.tflops is not None
    assert fp8.tflops > 1.3 * bf16.tflops  # H200: about 2x (dense fp8 ~1979, bf16 ~989 TFLOP/s datasheet)
    ceiling.forget()
    assert ceiling.device_ceiling("cuda", dtype, path=path).source == "cached"


@pytest.mark.skipif(not _fp8_capable(), reason="needs an sm_89+ GPU")
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_an_fp8_cell_runs_end_to_end_with_its_quantize_phase_and_accuracy(mode, tmp_path):
    from attnprof.config import MeasureOptions, parse_config
    from attnprof.pipeline.cell import run_cell
    from attnprof.pipeline.rows import cell_row
    from attnprof.registry import RunSpec, Variant

    def forward(q, k, v, causal, state):
        dq, dk, dv = (
            d.to(torch.bfloat16) + (s - s.detach()) for d, s in zip(state.inputs.dequantized(), (q, k, v), strict=True)
        )
        return torch.nn.functional.scaled_dot_product_attention(dq, dk, dv, is_causal=causal)

    variant = Variant(name="fp8-standin", description="", forward=forward, dtypes=("fp8",), fp8_scaling="per-head")
    config = parse_config({"device": "cuda", "dtype": "fp8", "output_dir": str(tmp_path), "shapes": [
        {"batch": 1, "heads": 8, "seq": 1024, "head_dim": 128}]})
    spec = RunSpec("cuda", "fp8", 1, 8, 1024, 128, mode=mode)
    result = run_cell(variant, spec, config, MeasureOptions())
    assert result.status == "ok", result.reason
    row = cell_row(result)
    assert row.fp8_scaling == "per-head" and row.output_dtype == "bf16"
    assert row.quantize_ms is not None and row.quantize_ms > 0
    assert row.sqnr_db is not None and row.sqnr_db > 20 and row.rel_error_vs_bf16 is not None
    assert row.passed


def test_sdpa_fp8_runs_on_fa3_or_says_why_not(tmp_path):
    """torch's quantized SDPA: a checked forward where FlashAttention-3 is installed, else the cell's skip reason."""
    import importlib.util

    from attnprof.config import MeasureOptions, parse_config
    from attnprof.pipeline.cell import run_cell
    from attnprof.pipeline.rows import cell_row
    from attnprof.registry import RunSpec
    from attnprof.variants import builtin_variants

    variant = {v.name: v for v in builtin_variants()}["sdpa-fp8"]
    shape = {"batch": 1, "heads": 16, "kv_heads": 4, "seq": 2048, "head_dim": 128}
    config = parse_config({"device": "cuda", "dtype": "fp8", "output_dir": str(tmp_path), "shapes": [shape]})
    row = cell_row(run_cell(variant, RunSpec("cuda", "fp8", **shape), config, MeasureOptions()))
    if importlib.util.find_spec("flash_attn_interface") is None:
        assert row.status.startswith("skipped: needs FlashAttention-3 (flash_attn_interface"), row.status
        return
    assert row.status == "ok", row.reason
    assert row.fp8_scaling == "per-head" and row.output_dtype == "bf16" and row.passed and row.sqnr_db > 20
    import torch.nn.attention as attention

    assert attention.current_flash_attention_impl() is None  # FA3 switched off again after the cell
