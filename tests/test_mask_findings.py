"""dense-mask, mask-build and backend-fallback: on the real H200 traces of tests/data/h200/masks (and the
older real traces that pass no mask), and on synthetic traces for what the real ones do not show."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracegen import BF16, CUDNN, FILL, WHERE, TraceBuilder, build, fused_forward, math_forward

from attnprof.analysis import analyze_trace
from attnprof.analysis.findings.masks import _numbered

DATA = Path(__file__).parent / "data" / "h200"
MASKS = DATA / "masks"
FLEX = "triton_tem_fused_flex_attention_0"
NEW = ("dense-mask", "mask-build", "backend-fallback")


def message(analysis, finding_id: str) -> str:
    finding = analysis.finding(finding_id)
    assert finding is not None, f"{finding_id} missing; found {analysis.finding_ids}"
    assert "\n" not in finding.message and finding.message.endswith(".")
    return finding.message


@pytest.fixture(scope="module")
def real():
    cache: dict[str, object] = {}

    def analysed(path: str):
        if path not in cache:
            cache[path] = analyze_trace(DATA / path)
        return cache[path]

    return analysed


# ---------------------------------------------------------------- the real traces


def test_dense_mask_on_the_real_dense_mask_trace(real):
    text = message(real("masks/dense-mask.json.gz"), "dense-mask")
    assert text.startswith("Every forward passes a dense mask to scaled_dot_product_attention: call 1 (cudnn) got a "
                           "boolean mask (per its Input type)")
    assert "converting it takes 12.5 us per forward" in text
    assert "vectorized_elementwise_kernel<FillFunctor> x2, elementwise_kernel<where_kernel_impl>" in text
    assert "beside the attention's own 401.9 us" in text and "is_causal=True" in text


def test_dense_mask_names_a_model_s_alike_calls_once():
    """A GPT-2 written by hand (tests/data/h200-fixes): its four layers' calls alike, named together."""
    text = message(analyze_trace(DATA.parent / "h200-fixes" / "gpt2-dense-mask.json.gz"), "dense-mask")
    assert text.startswith("Every forward passes a dense mask to scaled_dot_product_attention: calls 1-4 (cudnn) each "
                           "got a boolean mask (per its Input type); converting each takes 5.7 us per forward")
    assert "beside each call's own 58.2 us." in text and "call 2" not in text and "more" not in text


@pytest.mark.parametrize(("positions", "text"), [([0, 1, 2, 3], "1-4"), ([0, 2, 4], "1, 3 and 5"), ([1, 2], "2-3")])
def test_call_numbers_read_as_a_range_or_a_list(positions, text):
    assert _numbered(positions) == text


def test_mask_build_on_the_real_rebuilt_block_mask(real):
    text = message(real("masks/flex-mask-rebuilt.json.gz"), "mask-build")
    assert text.startswith("Every forward builds a BlockMask (create_block_mask run eagerly: 65 ops")
    assert "11,185.7 us of host time and 321.3 us of device time per forward" in text
    assert "121.3x and 3.5x the attention calls' own 92.2 us" in text


def test_mask_build_on_a_models_compiled_block_mask(real):
    text = message(real("model/llama2l-flex_attention.json.gz"), "mask-build")
    assert text.startswith("Every forward builds a BlockMask (create_block_mask compiled")
    assert "of host time and 20.1 us of device time per forward" in text


@pytest.mark.parametrize("trace", ["masks/sdpa-math-bf16.json.gz", "masks/decode-math.json.gz"])
def test_backend_fallback_on_the_real_math_traces(real, trace):
    text = message(real(trace), "backend-fallback")
    assert text.startswith("Every forward runs SDPA's math backend on the GPU with 16-bit inputs")
    assert "call 1 on bfloat16 inputs (per its Input type)" in text
    time = "1,725.0 us per forward in 20 kernels" if "bf16" in trace else "6,199.9 us per forward in 16 kernels"
    assert time in text


def test_backend_fallback_in_a_training_step(real):
    text = message(real("training/fwd+bwd/8x16x1024x64/sdpa-math.json.gz"), "backend-fallback")
    assert text.startswith("Every step runs SDPA's math backend") and "per step" in text


@pytest.mark.parametrize(
    ("trace", "absent"),
    [
        ("masks/is-causal.json.gz", NEW),
        ("masks/flex-mask-once.json.gz", NEW),
        ("masks/flex-mask-rebuilt.json.gz", ("dense-mask", "backend-fallback")),
        ("masks/dense-mask.json.gz", ("mask-build", "backend-fallback")),
        ("masks/sdpa-math-bf16.json.gz", ("dense-mask", "mask-build")),  # its causal mask is mask-rebuilt's
        ("masks/decode-flash.json.gz", NEW),
        ("masks/decode-efficient-repeat-kv.json.gz", NEW),
        ("8x16x1024x64/sdpa.json.gz", NEW),
        ("8x16x1024x64/sdpa-efficient.json.gz", NEW),
        ("8x16x1024x64/flex.json.gz", NEW),
        ("8x16x1024x64/naive.json.gz", NEW),
        ("model/llama2l-sdpa-record_shapes.json.gz", NEW),
        ("model/llama2l-eager.json.gz", NEW),  # its dense mask costs 1% of the attention's time
    ],
)
def test_silent_where_the_trace_does_not_support_them(real, trace, absent):
    found = set(real(trace).finding_ids)
    assert not found & set(absent), found


def test_mask_rebuilt_and_mask_build_never_speak_of_the_same_trace(real):
    for trace in ("masks/sdpa-math-bf16.json.gz", "masks/flex-mask-rebuilt.json.gz"):
        found = set(real(trace).finding_ids)
        assert len(found & {"mask-rebuilt", "mask-build"}) == 1, (trace, found)


# ---------------------------------------------------------------- synthetic traces


def dense_cudnn(b: TraceBuilder, input_types: bool = True, mask: str = "bool") -> None:
    """SDPA on cuDNN given a dense mask: a boolean one converted (scalar_tensor, where) before the call."""
    t = (lambda *ts: list(ts)) if input_types else (lambda *ts: None)
    with b.op("aten::scaled_dot_product_attention", t(BF16, BF16, BF16, mask, "Scalar", "Scalar", "", "Scalar")):
        if mask == "bool":
            with b.op("aten::scalar_tensor", t("Scalar")):
                with b.op("aten::fill_", t(BF16, "Scalar")):
                    b.kernel(FILL, gpu_us=0.8, grid=(1, 1, 1))
            with b.op("aten::where", t("bool", "Scalar", BF16)):
                b.kernel(WHERE, gpu_us=11.0)
        with b.op("aten::_scaled_dot_product_cudnn_attention", t(BF16, BF16, BF16, BF16)):
            with b.op("aten::_cudnn_attention_forward", t(BF16, BF16, BF16, BF16)):
                b.memset()
                b.kernel(CUDNN, gpu_us=400.0, api="cuLaunchKernelEx", regs=168, smem=232448, grid=(132, 1, 1))


def test_dense_mask_without_record_shapes_is_found_by_its_conversion():
    text = message(analyze_trace(build(dense_cudnn, input_types=False)), "dense-mask")
    assert "call 1 (cudnn) got a boolean mask (its where kernel converts it; the trace has no Input type)" in text
    assert "converting it takes 11.8 us per forward" in text and "the attention's own 400.8 us" in text


def test_dense_mask_of_an_additive_mask_has_no_conversion():
    text = message(analyze_trace(build(dense_cudnn, mask=BF16)), "dense-mask")
    assert "got a bfloat16 (additive) mask (per its Input type); the call takes 400.8 us per forward" in text


def test_dense_mask_needs_a_mask():
    assert "dense-mask" not in analyze_trace(build(fused_forward, backend="cudnn")).finding_ids


def test_dense_mask_counts_the_instances_that_passed_one():
    b = TraceBuilder()
    for k in range(3):
        with b.step(), b.region():
            (dense_cudnn if k == 0 else lambda b: fused_forward(b, "cudnn"))(b)
    text = message(analyze_trace(b.to_dict()), "dense-mask")
    assert text.startswith("1 of 3 forwards pass a dense mask")
    assert "converting it takes 11.8 us per forward" in text and "the attention's own 400.8 us" in text


def test_backend_fallback_reads_the_dtype_hint_without_input_types():
    text = message(analyze_trace(build(math_forward, input_types=False), dtype="fp16"), "backend-fallback")
    assert "call 1 on float16 inputs (the --dtype hint)" in text


def test_backend_fallback_needs_16_bit_inputs():
    assert "backend-fallback" not in analyze_trace(build(math_forward, input_types=False), dtype="fp32").finding_ids
    assert "backend-fallback" not in analyze_trace(build(fused_forward)).finding_ids


def block_mask_step(b: TraceBuilder, rebuilt: bool = True, host_us: float = 900.0) -> None:
    """create_block_mask run eagerly (a vmapped op, comparisons, a sort), then compiled flex."""
    if rebuilt:
        with b.op("aten::arange", ["Scalar", "Scalar"]):
            b.kernel(FILL, gpu_us=0.8)
        with b.op("VmappedVmappedModIndex", ["long int"]):
            with b.op("aten::index", ["long int", ""]):
                b.kernel(FILL, gpu_us=3.0)
            b.advance(host_us)
        with b.op("aten::lt", ["long int", "long int"]):
            b.kernel(FILL, gpu_us=2.0)
        with b.op("aten::argsort", ["int", "Scalar"]):
            b.kernel(FILL, gpu_us=4.2)
    with b.op("Torch-Compiled Region: 0/0"):
        b.kernel(FLEX, gpu_us=50.0, api="cuLaunchKernel", regs=128, smem=116736, grid=(32, 2, 16))


def test_mask_build_of_a_synthetic_block_mask():
    text = message(analyze_trace(build(block_mask_step)), "mask-build")
    assert text.startswith("Every forward builds a BlockMask (create_block_mask run eagerly: 4 ops")
    assert "10.0 us of device time per forward" in text and "0.2x the attention calls' own 50.0 us" in text


def test_mask_build_absent_when_the_block_mask_is_built_once():
    assert "mask-build" not in analyze_trace(build(block_mask_step, rebuilt=False)).finding_ids


def test_mask_build_needs_every_instance():
    b = TraceBuilder()
    for k in range(3):
        with b.step(), b.region():
            block_mask_step(b, rebuilt=k == 0)
    assert "mask-build" not in analyze_trace(b.to_dict()).finding_ids
