"""Tests of `triton-flash-fp8` on CPU.

Without triton (CI): its registration, skip reasons, the launcher's argument checks, `prepare_inputs`, and a
whole cell through attnprof's pipeline with a stand-in kernel (float32 attention on the dequantized inputs).
With triton: the kernel itself under the Triton interpreter (`interp_fp8_runner.py`; it runs fp8 dots, its
fp32 -> fp8 cast is replaced there by torch's), checked by attnprof's fp8 check against float64 of the
dequantized inputs, and one cell through the pipeline with the real kernel. GPU: test_triton_fp8_gpu.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import attnprof_triton
import pytest
import torch
from attnprof_triton import _fp8_variant
from attnprof_triton._fp8_variant import check_launch, keys_contiguous, make_fp8_variant

from attnprof import RunSpec
from attnprof.profiling.fp8 import FP8_THRESHOLDS, Fp8State, quantize_inputs
from attnprof.profiling.inputs import make_inputs
from attnprof.registry import FP8_NEEDS_CUDA

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def spec(**overrides) -> RunSpec:
    fields = dict(device="cuda", dtype="fp8", batch=1, heads=4, seq=128, head_dim=64, kv_heads=2, causal=True)
    fields.update(overrides)
    return RunSpec(**fields)


# --- registration and skip reasons ---------------------------------------------------------------------------


def test_registered_beside_triton_flash_from_the_one_entry_point():
    registered = []
    attnprof_triton.register_variants(registered.append)
    assert [v.name for v in registered] == ["triton-flash", "triton-flash-fp8"]
    fp8 = registered[1]
    assert fp8.dtypes == ("fp8",) and fp8.devices == ("cuda",) and fp8.layout == "bhsd"
    assert (fp8.fp8_scaling, fp8.fp8_output) == ("per-head", "bf16")
    assert fp8.has_backward is False and fp8.prepare_inputs is not None and fp8.setup is not None
    assert fp8.masks == frozenset(attnprof_triton.MASKS) and fp8.unequal_lengths


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_the_backward_modes_are_skipped_saying_why(mode):
    reason = make_fp8_variant().unavailable_reason(spec(mode=mode))
    assert reason == "no backward (an fp8 forward kernel: it saves no softmax statistics and has no fp8 backward)"


def test_other_dtypes_and_the_cpu_are_skipped():
    variant = make_fp8_variant()
    assert variant.unavailable_reason(spec(dtype="bf16")) == "needs dtype fp8 (got bf16)"
    assert variant.unavailable_reason(spec(dtype="fp8_e5m2")) == "needs dtype fp8 (got fp8_e5m2)"
    assert variant.unavailable_reason(spec(device="cpu")) == FP8_NEEDS_CUDA


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (dict(head_dim=32), "head_dim must be 64, 128 or 256 (got 32)"),
        (dict(head_dim=80), "head_dim must be 64, 128 or 256 (got 80)"),
        (dict(heads=6, kv_heads=4), "heads (6) must be a multiple of kv_heads (4)"),
    ],
)
def test_check_reasons(overrides, expected):
    assert _fp8_variant.check_fp8(spec(**overrides)) == expected


def test_without_triton_it_says_so(monkeypatch):
    monkeypatch.setattr(attnprof_triton, "triton_missing", lambda: "needs triton: No module named 'triton'")
    assert _fp8_variant.check_fp8(spec()) == "needs triton: No module named 'triton'"


@pytest.mark.parametrize(("capability", "reason"), [
    ((7, 5), "needs fp8 tensor cores: compute capability 8.9 or newer (got 7.5)"),
    ((8, 6), "needs fp8 tensor cores: compute capability 8.9 or newer (got 8.6)"),
    ((8, 9), None),
    ((9, 0), None),
])
def test_the_gpu_needs_fp8_tensor_cores(monkeypatch, capability, reason):
    monkeypatch.setattr(attnprof_triton, "triton_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert _fp8_variant.check_fp8(spec()) == reason


# --- the launcher's checks and the inputs' layout ------------------------------------------------------------


def quantized(**overrides):
    cell = spec(device="cpu", **overrides)
    q, k, v = make_inputs(cell, seed=0)
    return quantize_inputs(q, k, v, "fp8", "per-head"), (q, k, v)


def test_per_head_quantization_gives_the_descales_the_kernel_indexes():
    inputs, _ = quantized(batch=2, heads=4, kv_heads=2)
    check_launch(inputs.q, inputs.k, inputs.v, inputs.descale_q, inputs.descale_k, inputs.descale_v)
    assert tuple(inputs.descale_q.shape) == (2, 4) and tuple(inputs.descale_k.shape) == (2, 2)


def test_the_launcher_refuses_what_the_kernel_cannot_read():
    inputs, sources = quantized(batch=2, heads=4, kv_heads=2)
    args = [inputs.q, inputs.k, inputs.v, inputs.descale_q, inputs.descale_k, inputs.descale_v]

    def refused(position, value, match):
        bad = list(args)
        bad[position] = value
        with pytest.raises(ValueError, match=match):
            check_launch(*bad)

    refused(0, sources[0], r"q, k, v must be float8_e4m3fn \(got q bfloat16, k float8_e4m3fn, v float8_e4m3fn\)")
    refused(3, inputs.descale_q.reshape(-1), r"descale_q must be contiguous float32 of shape \[2, 4\]")
    refused(4, torch.ones(1), r"descale_k must be contiguous float32 of shape \[2, 2\] .*got float32 \[1\]")
    refused(5, inputs.descale_v.double(), r"descale_v .*got float64 \[2, 2\]")
    refused(3, torch.ones(4, 2).t(), r"descale_q must be contiguous")
    refused(2, inputs.v[:, :, :-1], r"expected 4-d q and k, v alike")
    refused(1, inputs.k[:, :1].repeat(1, 3, 1, 1), r"expected 4-d q and k, v alike")
    three = [t[:, :3] for t in (inputs.q,)] + [inputs.k[:, :2], inputs.v[:, :2]]
    with pytest.raises(ValueError, match="3 query heads cannot share 2 key/value heads"):
        check_launch(*three, inputs.descale_q[:, :3].contiguous(), inputs.descale_k, inputs.descale_v)


def test_v_is_laid_out_keys_contiguous_once_untimed():
    inputs, sources = quantized()
    state = Fp8State(inputs, attnprof_triton.TritonState("causal", (64, 64)))
    prepared = make_fp8_variant().prepare_inputs(spec(device="cpu"), state, *sources, 0)
    operands = prepared.state
    assert operands.tiles == attnprof_triton.TritonState("causal", (64, 64))
    assert operands.v.stride(2) == 1 and torch.equal(operands.v.float(), inputs.v.float())
    assert keys_contiguous(operands.v) is operands.v  # the launcher copies nothing more


# --- a whole cell with a stand-in kernel (no triton needed) --------------------------------------------------


def stand_in_attention(q, k, v, descale_q, descale_k, descale_v, mask="causal", config=None):
    """What `_fp8.attention_fp8` computes, in float32 on CPU, after the launcher's own checks."""
    from attnprof.profiling.correctness import reference_attention

    check_launch(q, k, v, descale_q, descale_k, descale_v)
    assert v.stride(2) == 1, "the variant passes V keys-contiguous"
    deq = [t.float() * d[:, :, None, None] for t, d in ((q, descale_q), (k, descale_k), (v, descale_v))]
    return reference_attention(*deq, mask == "causal", mask=mask).to(torch.bfloat16)


@pytest.fixture
def stand_in_kernel(monkeypatch):
    fake = SimpleNamespace(
        attention_fp8=stand_in_attention,
        launched_config=lambda q, k, mask: SimpleNamespace(block_m=64, block_n=32),
    )
    monkeypatch.setitem(sys.modules, "attnprof_triton._fp8", fake)
    monkeypatch.setattr(attnprof_triton, "_fp8", fake, raising=False)


@pytest.mark.parametrize("mask", ["causal", "none", "sliding_window:48"])
def test_a_cell_through_the_pipeline_with_the_stand_in(stand_in_kernel, monkeypatch, tmp_path, mask):
    """Setup, the per-head quantize phase, prepare_inputs, the timed forward and the fp8 check, end to end on
    CPU (the CUDA-only skip lifted)."""
    from attnprof import Variant
    from attnprof.config import MeasureOptions, parse_config
    from attnprof.pipeline.cell import run_cell
    from attnprof.pipeline.rows import cell_row

    monkeypatch.setattr(Variant, "unavailable_reason", lambda self, spec: None)
    shape = {"batch": 1, "heads": 4, "kv_heads": 2, "seq": 128, "head_dim": 64}
    config = parse_config({"device": "cpu", "dtype": "fp8", "output_dir": str(tmp_path), "shapes": [shape]})
    cell = spec(device="cpu", mask=mask)
    row = cell_row(run_cell(make_fp8_variant(), cell, config, MeasureOptions(min_time_s=0.02, clocks=False)))
    assert row.status == "ok", row.reason
    assert (row.fp8_scaling, row.output_dtype) == ("per-head", "bf16")
    assert row.quantize_ms and row.quantize_ms > 0 and row.latency_us
    # exact attention on the dequantized inputs, rounded to bf16: far inside the fp8 limit
    assert row.passed and row.rel_error is not None and row.rel_error < 1e-2 and row.sqnr_db > 40
    assert row.executed_flops is not None and row.executed_flops >= row.flops  # triton-flash's tiles at 64 x 32


# --- the kernel under the Triton interpreter -----------------------------------------------------------------

# (id, batch, heads, kv_heads, seq, q_len, head_dim, mask, (BLOCK_M, BLOCK_N, warps, stages)): lengths that are
# multiples of the tiles and not, BLOCK_M > BLOCK_N, GQA groups of 1, 2 and 4, every mask kind, decode.
KERNEL_SHAPES = [
    ("causal-64", 1, 2, 2, 64, None, 32, "causal", (32, 16, 4, 1)),
    ("none-64", 1, 2, 2, 64, None, 32, "none", (32, 16, 4, 1)),
    ("causal-gqa2-ragged", 2, 4, 2, 70, None, 32, "causal", (32, 32, 4, 1)),
    ("none-gqa4-ragged", 1, 4, 1, 45, None, 16, "none", (16, 16, 4, 1)),
    ("causal-d64", 1, 2, 1, 96, None, 64, "causal", (32, 32, 4, 1)),
    ("sliding_window:20", 1, 4, 2, 77, None, 16, "sliding_window:20", (32, 16, 4, 1)),
    ("documents:4", 1, 4, 2, 96, None, 16, "documents:4", (16, 16, 4, 1)),
    ("prefix:30", 1, 4, 2, 77, None, 16, "prefix:30", (32, 16, 4, 1)),
    ("decode-causal-23/77", 1, 4, 2, 77, 23, 32, "causal", (16, 16, 4, 1)),
    ("decode-none-1/50", 1, 4, 1, 50, 1, 32, "none", (16, 16, 4, 1)),
]
KERNEL_CASES = [
    dict(id=i, batch=b, heads=h, kv_heads=kv, seq=s, q_len=ql, head_dim=d, mask=m, config=c, seed=3)
    for i, b, h, kv, s, ql, d, m, c in KERNEL_SHAPES
] + [
    # heads whose magnitudes differ by 3e4: one per-tensor scale would leave the small ones a few fp8 levels
    dict(id="per-head-spread", batch=1, heads=4, kv_heads=2, seq=70, head_dim=32, mask="none",
         config=(32, 16, 4, 1), seed=3, head_scales=[0.01, 1, 30, 300]),
]
# The same inputs with k's descales of the other heads: the kernel must read its own head's.
WRONG_DESCALE = dict(KERNEL_CASES[-1], id="wrong-head-descale", descale_k_heads_reversed=True)
CELL_CASE = dict(id="cell", cell=True, batch=1, heads=4, kv_heads=2, seq=64, head_dim=64, mask="causal", seed=0)


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory) -> dict:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    cases = [*KERNEL_CASES, WRONG_DESCALE, dict(CELL_CASE, tmp=str(tmp_path_factory.mktemp("cell")))]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("interp_fp8_runner.py"))],
                          input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    if "__skip__" in results:
        pytest.skip(results["__skip__"])
    return results


@needs_triton
@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c["id"] for c in KERNEL_CASES])
def test_interpreter_kernel_within_the_fp8_limit_of_float64(interp_results, case):
    result = interp_results[case["id"]]
    assert "error" not in result, result["error"]
    assert result["threshold"] == FP8_THRESHOLDS["fp8"]
    assert result["passed"], result["reason"]
    # measured 0.4e-2 to 2.2e-2 (SQNR 33 to 49 dB); the limit is 8e-2
    assert result["rel_error"] < 4e-2 and result["sqnr_db"] > 28


@needs_triton
def test_interpreter_kernel_reads_each_heads_own_descale(interp_results):
    right, wrong = interp_results["per-head-spread"], interp_results["wrong-head-descale"]
    assert "error" not in wrong, wrong["error"]
    assert right["passed"] and not wrong["passed"] and wrong["rel_error"] > 0.5


@needs_triton
def test_interpreter_cell_through_the_pipeline_with_its_quantize_phase(interp_results):
    row = interp_results["cell"]
    assert row["status"] == "ok", row["reason"]
    assert (row["fp8_scaling"], row["output_dtype"]) == ("per-head", "bf16")
    assert row["quantize_ms"] > 0 and row["latency_us"] > 0
    assert row["passed"] and row["sqnr_db"] > 28 and row["rel_error_vs_bf16"] < FP8_THRESHOLDS["fp8"]
