"""FP8 cells on CPU: the dtype in configs, sweeps and specs, the skip on CPU, quantization per tensor and
per head, the accuracy against both float64 references, and the step that quantizes outside the timed call."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from attnprof.config import parse_config
from attnprof.errors import ConfigError
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.profiling import fp8
from attnprof.profiling.correctness import check_fp8_output, reference_attention
from attnprof.profiling.steps import cell_step
from attnprof.registry import FP8_NEEDS_CUDA, RunSpec, Variant

SHAPE = {"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e5m2"])
def test_fp8_dtypes_are_config_and_sweep_values(dtype: str) -> None:
    config = parse_config({"device": "cuda", "dtype": dtype, "shapes": [SHAPE]})
    assert config.dtype == dtype
    swept = parse_config({"device": "cuda", "shapes": [SHAPE], "sweep": {"dtype": ["bf16", dtype]}})
    assert swept.sweep is not None and swept.sweep.dtype == ["bf16", dtype]


def test_an_unknown_fp8_spelling_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"device": "cuda", "dtype": "fp8_e4m3", "shapes": [SHAPE]})
    assert "dtype: Input should be 'auto', 'bf16', 'fp16', 'fp32', 'fp8' or 'fp8_e5m2'" in info.value.message


def _forward(q, k, v, causal, state):
    """A stand-in fp8 kernel: float32 math on the dequantized inputs, its gradients passed straight
    through to the bf16 sources (the leaves autograd differentiates)."""
    pairs = zip(state.inputs.dequantized(), (q, k, v), strict=True)
    dq, dk, dv = (d.float() + (s.float() - s.float().detach()) for d, s in pairs)
    return torch.nn.functional.scaled_dot_product_attention(dq, dk, dv, is_causal=causal).to(torch.bfloat16)


def fp8_variant(**kw) -> Variant:
    return Variant(name="fake-fp8", description="", forward=_forward, dtypes=("fp8", "fp8_e5m2"), **kw)


def test_an_fp8_cell_on_cpu_is_skipped_with_the_reason() -> None:
    spec = RunSpec("cpu", "fp8", **SHAPE)
    assert spec.fp8 and not RunSpec("cpu", "bf16", **SHAPE).fp8
    assert fp8_variant().unavailable_reason(spec) == FP8_NEEDS_CUDA
    plain = Variant(name="plain", description="", forward=_forward)
    assert plain.unavailable_reason(RunSpec("cuda", "fp8", **SHAPE)) == "needs dtype bf16/fp16/fp32 (got fp8)"


def test_a_variant_names_a_known_fp8_scaling() -> None:
    with pytest.raises(ValueError, match="fp8_scaling must be one of per-tensor, per-head"):
        fp8_variant(fp8_scaling="per-block")


def test_per_tensor_quantization_puts_the_largest_magnitude_on_the_formats_largest_value() -> None:
    t = torch.randn(2, 3, 32, 16, dtype=torch.bfloat16)
    for dtype, largest in (("fp8", 448.0), ("fp8_e5m2", 57344.0)):
        q8, descale = fp8.quantize(t, dtype, "per-tensor")
        assert q8.dtype == fp8.torch_fp8(dtype) and descale.shape == (1,)
        assert q8.float().abs().max().item() == largest
        assert descale.item() == pytest.approx(t.float().abs().max().item() / largest)
    q8, descale = fp8.quantize(t, "fp8", "per-tensor")
    assert fp8.relative_error(fp8.dequantize(q8, descale), t) < 0.04  # e4m3: 3 mantissa bits


def test_per_head_quantization_scales_each_batch_and_head_alone_in_either_layout() -> None:
    t = torch.randn(2, 3, 32, 16) * torch.tensor([1.0, 10.0, 100.0]).reshape(1, 3, 1, 1)
    q8, descale = fp8.quantize(t, "fp8", "per-head")
    assert descale.shape == (2, 3)
    assert torch.equal(q8.float().abs().amax(dim=(2, 3)), torch.full((2, 3), 448.0))
    bshd8, bshd_descale = fp8.quantize(t.transpose(1, 2).contiguous(), "fp8", "per-head", layout="bshd")
    assert torch.equal(bshd_descale, descale)
    assert torch.equal(bshd8.transpose(1, 2).float(), q8.float())


def test_an_all_zero_tensor_gets_descale_one() -> None:
    _, descale = fp8.quantize(torch.zeros(1, 1, 4, 4), "fp8", "per-tensor")
    assert descale.item() == 1.0


def test_sqnr_is_signal_over_noise_in_db() -> None:
    ref = torch.ones(100, dtype=torch.float64)
    assert fp8.sqnr_db(ref * 1.1, ref) == pytest.approx(20.0)  # noise 0.1 per element: 10·log10(100)
    assert fp8.sqnr_db(ref, ref) == math.inf


def _emulated_fp8_kernel(quantized: fp8.Quantized, causal: bool) -> torch.Tensor:
    """An fp8 kernel as cuDNN runs one: fp32 scores, probabilities and output cast to the format."""
    q, k, v = (t.float() for t in quantized.dequantized())
    largest = fp8.FP8_MAX[quantized.dtype]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), -math.inf)
    probs = (torch.softmax(scores, -1) * largest).to(fp8.torch_fp8(quantized.dtype)).float() / largest
    out = probs @ v
    scale_o = largest / v.abs().max()
    return (out * scale_o).to(fp8.torch_fp8(quantized.dtype)).double() / scale_o


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("scaling", ["per-tensor", "per-head"])
def test_an_emulated_fp8_kernel_passes_its_threshold_and_reports_both_references(dtype: str, scaling: str) -> None:
    generator = torch.Generator().manual_seed(0)
    sources = tuple(torch.randn(1, 2, 256, 64, generator=generator).bfloat16() for _ in range(3))
    quantized = fp8.quantize_inputs(*sources, dtype, scaling)
    check = check_fp8_output(_emulated_fp8_kernel(quantized, True), quantized, sources, causal=True)
    assert check.passed and check.threshold == fp8.FP8_THRESHOLDS[dtype]
    accuracy = check.fp8
    assert accuracy is not None and accuracy.rel_error == check.rel_error
    # the bf16 sources' reference includes the quantization error as well
    assert accuracy.rel_error < accuracy.rel_error_vs_bf16 < 3 * accuracy.threshold
    assert accuracy.sqnr_db > accuracy.sqnr_db_vs_bf16 > 15.0
    expected = fp8.relative_error(
        _emulated_fp8_kernel(quantized, True), reference_attention(*quantized.dequantized(), True)
    )
    assert accuracy.rel_error == pytest.approx(expected)


def test_a_wrong_descale_fails_the_fp8_check() -> None:
    sources = tuple(torch.randn(1, 2, 64, 16).bfloat16() for _ in range(3))
    quantized = fp8.quantize_inputs(*sources, "fp8", "per-tensor")
    out = _emulated_fp8_kernel(quantized, False) * 2.0  # the output descaled twice over
    check = check_fp8_output(out, quantized, sources, causal=False)
    assert not check.passed and "fp8 limit" in (check.reason or "")


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_the_step_quantizes_outside_the_timed_call_and_checks_against_both_references(mode: str) -> None:
    spec = RunSpec("cpu", "fp8", **SHAPE, mode=mode)
    variant = fp8_variant(fp8_scaling="per-head")
    stages: list[str] = []
    seen: list[object] = []

    def forward(q, k, v, causal, state):
        seen.append(state)
        return _forward(q, k, v, causal, state)

    variant.forward = forward

    @contextlib.contextmanager
    def stage(what: str):
        stages.append(what)
        yield

    with cell_step(variant, spec, 0, stage) as step:
        assert stages[:2] == ["input creation", "quantization"]
        assert isinstance(step.fp8, fp8.Fp8State) and step.fp8.inputs.scaling == "per-head"
        assert step.fp8.inputs.q.dtype == torch.float8_e4m3fn and step.inputs[0].dtype == torch.bfloat16
        calls_before = len(stages)
        output = step.call()
        assert len(stages) == calls_before  # the timed call quantizes nothing
        assert seen[-1] is step.fp8
        out = output.out if spec.backward else output
        check = check_fp8_output(fp8.output_values(out, None), step.fp8.inputs, step.inputs, spec.causal)
    assert check.passed and check.fp8 is not None
    result = CellResult(variant=variant.name, source="test", subject=spec, status="ok")
    result.fp8_scaling, result.output_dtype, result.check = "per-head", "bf16", check
    result.quantize_s = 0.002
    row = cell_row(result)
    assert (row.fp8_scaling, row.output_dtype, row.quantize_ms) == ("per-head", "bf16", pytest.approx(2.0))
    assert row.sqnr_db == check.fp8.sqnr_db and row.rel_error_vs_bf16 == check.fp8.rel_error_vs_bf16


def test_an_fp8_output_is_dequantized_with_its_descale() -> None:
    out = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn)
    values = fp8.output_values(out, torch.tensor([0.5]))
    assert values.dtype == torch.float64 and values.tolist() == [0.5, -1.0, 224.0]


def test_the_fp8_h200_config_puts_fp8_beside_bf16_at_cudnn_frontends_shape() -> None:
    from pathlib import Path

    from attnprof.config import load_config
    from attnprof.pipeline.sweep import sweep_specs

    config = load_config(Path(__file__).parents[1] / "configs" / "fp8-h200.yaml")
    specs, dropped = sweep_specs(config, "cuda")
    assert dropped == []
    assert {(s.batch, s.heads, s.n_kv_heads, s.head_dim, s.causal) for s in specs} == {(1, 64, 8, 128, True)}
    assert {(s.seq, s.dtype, s.mode) for s in specs} == {
        (seq, dtype, mode) for seq in (8192, 16384, 32768) for dtype in ("bf16", "fp8") for mode in ("fwd", "bwd")
    }
    assert {"cudnn-fe", "cudnn-fe-fp8", "triton-flash", "triton-flash-fp8"} <= set(config.variants)


def test_the_tables_show_the_quantization_beside_the_latency_and_the_sqnr_beside_the_error() -> None:
    from attnprof.report.columns import latency_text, output_error_text
    from attnprof.results.schema import Row

    row = Row(variant="v", dtype="fp8", latency_us=1234.0, latency_iqr_us=5.0, quantize_ms=0.25,
              rel_error=3.6e-2, sqnr_db=28.71, rel_error_vs_bf16=5.7e-2, sqnr_db_vs_bf16=24.94)
    assert latency_text(row) == "1,234 ± 5 (+ quantize 250)"  # µs, as the column
    assert output_error_text(row) == "3.6e-02, 28.7 dB (vs bf16 5.7e-02, 24.9 dB)"
    plain = Row(variant="v", dtype="bf16", latency_us=1234.0, latency_iqr_us=5.0, rel_error=1e-3)
    assert latency_text(plain) == "1,234 ± 5" and output_error_text(plain) == "1.0e-03"


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_a_whole_fp8_cell_through_the_pipeline_on_cpu(mode, tmp_path, monkeypatch) -> None:
    """The cell pipeline end to end with the stand-in fp8 kernel, its CPU skip lifted: the quantize phase, the
    check against both references, the row's fp8 fields."""
    from attnprof.config import MeasureOptions
    from attnprof.pipeline.cell import run_cell

    variant = fp8_variant(fp8_scaling="per-head")
    monkeypatch.setattr(Variant, "unavailable_reason", lambda self, spec: None)
    config = parse_config({"device": "cpu", "dtype": "fp8", "output_dir": str(tmp_path), "shapes": [SHAPE]})
    result = run_cell(variant, RunSpec("cpu", "fp8", **SHAPE, mode=mode), config, MeasureOptions())
    assert result.status == "ok", result.reason
    assert result.phases_s["quantize"] >= result.quantize_s > 0 and result.latency_us  # the phase: warm-up + repeats
    row = cell_row(result)
    assert (row.fp8_scaling, row.output_dtype) == ("per-head", "bf16") and row.quantize_ms > 0
    assert row.passed and row.rel_error is not None and row.rel_error <= fp8.FP8_THRESHOLDS["fp8"]
    assert row.sqnr_db > row.sqnr_db_vs_bf16 > 15
    if mode == "bwd":
        assert row.grad_rel_error_dq is not None and row.grad_rel_error_threshold == 2e-1


def test_the_quantization_is_timed_as_a_median_of_repeats_after_a_warm_up(monkeypatch) -> None:
    calls = []
    real = fp8.quantize
    monkeypatch.setattr(fp8, "quantize", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q = torch.randn(1, 2, 16, 8)
    quantized = fp8.quantize_inputs(q, q.clone(), q.clone(), "fp8", "per-tensor")
    assert len(calls) == 3 * (1 + fp8.QUANTIZE_REPEATS)  # q, k and v: one warm-up, then the timed repeats
    assert quantized.time_s is not None and quantized.time_s > 0


def test_the_accuracy_compares_the_output_where_the_references_are() -> None:
    """A GPU output against the CPU float64 references: moved to them, not an error (a stand-in device: meta)."""
    ref = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    out = ref + 1e-3

    class Elsewhere:  # what a CUDA tensor does here: `.detach().to(ref.device)` brings it back
        def detach(self):
            return self

        def to(self, device):
            assert device == ref.device
            return out

    accuracy = fp8.fp8_accuracy(Elsewhere(), ref, ref, "fp8")
    assert accuracy.rel_error == pytest.approx(fp8.relative_error(out, ref)) and accuracy.sqnr_db > 40
