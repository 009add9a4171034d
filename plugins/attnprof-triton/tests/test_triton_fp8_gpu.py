"""triton-flash-fp8 on a CUDA GPU with fp8 tensor cores (run on the H200: `python -m pytest -m gpu`).

The kernel against float64 of its dequantized inputs with attnprof's fp8 check (the e4m3 limit of
`profiling.fp8.FP8_THRESHOLDS`, and an SQNR floor), autotuned and at every configuration the tuner may pick;
one launch per forward; and cells through attnprof's pipeline and CLI, with their quantize phase. The CPU
checks (the interpreter, the host logic) are in test_triton_fp8.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from attnprof import RunSpec
from attnprof.profiling.correctness import check_fp8_output
from attnprof.profiling.fp8 import Fp8State, quantize_inputs
from attnprof.profiling.inputs import make_inputs


def _fp8_gpu() -> bool:
    return (torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
            and torch.cuda.get_device_capability() >= (8, 9))


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _fp8_gpu(), reason="needs triton and a GPU with fp8 (sm_89+)")]

SQNR_FLOOR_DB = 25.0  # the e4m3 limit (8e-2) is about 22 dB; a torch emulation of the kernel gave 32 to 38 dB


def _spec(batch, heads, kv_heads, seq, head_dim, mask, q_len=None, mode="fwd") -> RunSpec:
    return RunSpec(device="cuda", dtype="fp8", batch=batch, heads=heads, kv_heads=kv_heads, seq=seq,
                   head_dim=head_dim, mask=mask, q_len=q_len, mode=mode)


def _quantized(rs: RunSpec, seed: int = 0):
    q, k, v = make_inputs(rs, seed=seed)
    return quantize_inputs(q, k, v, "fp8", "per-head"), (q, k, v)


def _checked(out, inputs, sources, mask: str):
    assert out.dtype == torch.bfloat16 and out.shape == sources[0].shape
    return check_fp8_output(out.double(), inputs, sources, mask == "causal", mask=mask)


CASES = [  # (batch, heads, kv_heads, seq, head_dim, mask, q_len)
    (1, 8, 8, 1024, 64, "causal", None),
    (1, 8, 8, 1024, 64, "none", None),
    (2, 16, 4, 2048, 128, "causal", None),
    (1, 8, 2, 777, 128, "none", None),
    (1, 4, 1, 1000, 256, "causal", None),
    (1, 8, 2, 2048, 128, "sliding_window:256", None),
    (1, 8, 2, 4096, 128, "none", 1),
    (1, 8, 2, 4096, 128, "causal", 333),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(str(x) for x in c if x is not None))
def test_gpu_fp8_kernel_autotuned_within_the_fp8_limit(case):
    from attnprof_triton import _fp8

    *shape, mask, q_len = case
    rs = _spec(*shape, mask, q_len)
    inputs, sources = _quantized(rs)
    out = _fp8.attention_fp8(inputs.q, inputs.k, inputs.v, inputs.descale_q, inputs.descale_k, inputs.descale_v,
                             mask=mask)
    check = _checked(out, inputs, sources, mask)
    assert check.passed, check.reason
    assert check.fp8.sqnr_db > SQNR_FLOOR_DB, check.fp8


@pytest.mark.parametrize("mask", ["causal", "none"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_fp8_every_config(mask, head_dim):
    """Each configuration the autotuner may pick for one-byte elements compiles and is right."""
    from attnprof_triton import _fp8, _kernel

    rs = _spec(1, 8, 2, 1000, head_dim, mask)
    inputs, sources = _quantized(rs, seed=1)
    tried = 0
    for cfg in _kernel.autotune_space(rs.seq, head_dim, elem=1):
        try:
            out = _fp8.attention_fp8(inputs.q, inputs.k, inputs.v, inputs.descale_q, inputs.descale_k,
                                     inputs.descale_v, mask=mask, config=cfg)
        except Exception as exc:  # out of shared memory on a smaller GPU: the autotuner skips these too
            if "OutOfResources" in type(exc).__name__ or "out of resource" in str(exc):
                continue
            raise
        tried += 1
        check = _checked(out, inputs, sources, mask)
        assert check.passed and check.fp8.sqnr_db > SQNR_FLOOR_DB, (str(cfg), check.reason, check.fp8)
    assert tried >= 4


def test_gpu_fp8_reads_each_heads_own_descale():
    """Heads 3e4 apart in magnitude: right with per-head descales, far off with another head's."""
    from attnprof_triton import _fp8

    rs = _spec(1, 4, 2, 1024, 128, "causal")
    q, k, v = make_inputs(rs, seed=2)
    factors = torch.tensor([0.01, 1.0, 30.0, 300.0], device="cuda")
    q, k, v = ((t.float() * factors[: t.shape[1], None, None]).to(t.dtype) for t in (q, k, v))
    inputs = quantize_inputs(q, k, v, "fp8", "per-head")
    args = (inputs.q, inputs.k, inputs.v, inputs.descale_q)
    right = _checked(_fp8.attention_fp8(*args, inputs.descale_k, inputs.descale_v), inputs, (q, k, v), "causal")
    assert right.passed, right.reason
    flipped = inputs.descale_k.flip(1).contiguous()
    wrong = _checked(_fp8.attention_fp8(*args, flipped, inputs.descale_v), inputs, (q, k, v), "causal")
    assert not wrong.passed


def _prepared(rs: RunSpec):
    from attnprof_triton._fp8_variant import make_fp8_variant

    variant = make_fp8_variant()
    assert variant.unavailable_reason(rs) is None
    tiles = variant.setup(rs)  # autotunes: every launch before the measured region
    inputs, sources = _quantized(rs)
    state = variant.prepare_inputs(rs, Fp8State(inputs, tiles), *sources, 0)
    return variant, state, inputs, sources


def test_gpu_fp8_variant_one_kernel_per_forward_tuned_in_setup():
    from attnprof_triton import _fp8
    from torch.profiler import ProfilerActivity, profile

    rs = _spec(2, 8, 2, 1024, 128, "causal")
    variant, state, inputs, sources = _prepared(rs)
    config = _fp8.launched_config(inputs.q, inputs.k, "causal")
    assert config is not None and state.state.tiles.forward_tiles == (config.block_m, config.block_n)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = variant.forward(*sources, True, state)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    assert kernels == [kernels[0]] and "_attn_fwd_fp8" in kernels[0], kernels
    assert _checked(out, inputs, sources, "causal").passed


def _cell(rs: RunSpec, tmp_path):
    from attnprof_triton._fp8_variant import make_fp8_variant

    from attnprof.config import MeasureOptions, parse_config
    from attnprof.pipeline.cell import run_cell
    from attnprof.pipeline.rows import cell_row

    shape = {"batch": rs.batch, "heads": rs.heads, "kv_heads": rs.n_kv_heads, "seq": rs.seq, "head_dim": rs.head_dim}
    config = parse_config({"device": "cuda", "dtype": "fp8", "output_dir": str(tmp_path), "shapes": [shape]})
    from attnprof.profiling.ceiling import RunCeiling

    # the run's fp8 ceiling (torch._scaled_mm), as compare measures it: TFLOP/s and % of peak need it
    return cell_row(run_cell(make_fp8_variant(), rs, config, MeasureOptions(), RunCeiling.start("cuda:0", "fp8")))


def test_gpu_fp8_cell_through_the_pipeline_with_its_quantize_phase(tmp_path):
    row = _cell(_spec(1, 16, 4, 4096, 128, "causal"), tmp_path)
    assert row.status == "ok", row.reason
    assert (row.fp8_scaling, row.output_dtype) == ("per-head", "bf16")
    assert row.quantize_ms and row.quantize_ms > 0 and row.latency_us and row.tflops
    assert row.passed and row.sqnr_db > SQNR_FLOOR_DB and row.rel_error_vs_bf16 is not None
    assert row.peak_tflops and row.pct_of_peak is not None  # against the fp8 matmul ceiling
    assert row.executed_flops and row.executed_flops >= row.flops


def test_gpu_fp8_backward_cell_is_skipped_saying_why(tmp_path):
    from attnprof_triton._fp8_variant import BACKWARD_REFUSAL

    row = _cell(_spec(1, 16, 4, 4096, 128, "causal", mode="bwd"), tmp_path)
    assert row.status.startswith("skipped") and row.reason == f"no backward ({BACKWARD_REFUSAL})"


def test_gpu_fp8_attnprof_run_cli(tmp_path):
    """`attnprof run --variant triton-flash-fp8 --dtype fp8`: the row's quantize phase beside its latency."""
    from attnprof.plugins import load_variants

    if "triton-flash-fp8" not in load_variants(refresh=True).registry:
        pytest.skip("attnprof-triton is not installed as a plugin here (pip install -e plugins/attnprof-triton)")
    command = [sys.executable, "-m", "attnprof", "run", "--variant", "triton-flash-fp8", "--dtype", "fp8",
               "--device", "cuda", "--batch", "1", "--heads", "16", "--kv-heads", "4", "--seq", "4096",
               "--head-dim", "128", "--causal", "--mode", "fwd", "--format", "json", "--output-dir", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(proc.stdout)["results"]
    assert row["variant"] == "triton-flash-fp8" and row["status"] == "ok", row.get("reason")
    assert row["fp8_scaling"] == "per-head" and row["quantize_ms"] > 0 and row["passed"]
