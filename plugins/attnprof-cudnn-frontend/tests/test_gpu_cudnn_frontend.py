"""cudnn-fe and cudnn-fe-fp8 on a GPU with nvidia-cudnn-frontend installed (run on the H200: `-m gpu`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cudnn")

import attnprof_cudnn_frontend as fe  # noqa: E402

from attnprof import RunSpec  # noqa: E402
from attnprof.config import MeasureOptions, parse_config  # noqa: E402
from attnprof.pipeline.cell import run_cell  # noqa: E402
from attnprof.pipeline.rows import cell_row  # noqa: E402
from attnprof.profiling.ceiling import RunCeiling  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cell(name: str, dtype: str, mode: str, tmp_path, seq: int = 2048):
    variant = {v.name: v for v in fe.make_variants()}[name]
    shape = {"batch": 1, "heads": 16, "kv_heads": 4, "seq": seq, "head_dim": 128}
    config = parse_config({"device": "cuda", "dtype": dtype, "output_dir": str(tmp_path), "shapes": [shape]})
    spec = RunSpec("cuda", dtype, mode=mode, **shape)
    reason = variant.unavailable_reason(spec)
    if reason:
        pytest.skip(reason)
    # the run's ceiling in the cell's dtype (torch._scaled_mm for fp8), as compare measures it
    return cell_row(run_cell(variant, spec, config, MeasureOptions(), RunCeiling.start("cuda:0", dtype)))


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_cudnn_fe_bf16_runs_and_matches_float64(mode, tmp_path):
    row = _cell("cudnn-fe", "bf16", mode, tmp_path)
    assert row.status == "ok", row.reason
    assert row.passed and row.latency_us and row.tflops


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_cudnn_fe_fp8_runs_with_its_quantize_phase_and_accuracy(mode, tmp_path):
    row = _cell("cudnn-fe-fp8", "fp8", mode, tmp_path)
    assert row.status == "ok", row.reason
    assert row.fp8_scaling == "per-tensor" and row.output_dtype == "fp8"
    assert row.quantize_ms and row.sqnr_db and row.sqnr_db > 20 and row.rel_error_vs_bf16 is not None
    assert row.peak_tflops and row.pct_of_peak is not None
    assert row.passed


def test_fp8_forward_is_faster_than_bf16_at_16k(tmp_path):
    bf16 = _cell("cudnn-fe", "bf16", "fwd", tmp_path / "bf16", seq=16384)
    fp8 = _cell("cudnn-fe-fp8", "fp8", "fwd", tmp_path / "fp8", seq=16384)
    assert bf16.latency_us and fp8.latency_us and fp8.latency_us < bf16.latency_us
    # % of peak: each against its own dtype's matmul ceiling (torch._scaled_mm for fp8)
    assert fp8.peak_tflops and bf16.peak_tflops and fp8.peak_tflops > 1.3 * bf16.peak_tflops
