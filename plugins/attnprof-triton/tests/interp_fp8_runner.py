"""Run triton-flash-fp8 cases under the Triton interpreter; used by test_triton_fp8.py.

As interp_runner.py: a fresh process with TRITON_INTERPRET=1 reads a JSON list of cases on stdin and prints
one JSON object, case id -> result or {"error": "..."}. A kernel case quantizes bf16 sources per head
(`attnprof.profiling.fp8`), launches `_fp8.attention_fp8` at the case's tiles and checks the bf16 output with
attnprof's own fp8 check (`check_fp8_output`: float64 of the dequantized inputs, the fp8 limit; and the bf16
sources). A `cell` case runs the variant through attnprof's pipeline (`run_cell`), its CUDA-only skip lifted.

The interpreter's float32 -> fp8 cast (triton 3.9's `_convert_float`) drops the carry of its rounding into the
exponent (31.99 becomes 16, 7.95 becomes 4) and wraps values past 448; `exact_fp8_casts` replaces it, for
fp8 outputs only, with torch's round-to-nearest-even cast, which is what the GPU's cvt.rn.satfinite does for
the values the kernel casts (P in (0, 448]). The fp8 dots themselves run exactly (fp8 products, fp32 sums).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from interp_runner import interpreter_problem

from attnprof import RunSpec

FP8_NAMES = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2}


def exact_fp8_casts() -> None:
    """Make the interpreter cast float32 to fp8 as torch (and the GPU) does; other casts stay its own."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(values, input_dtype, output_dtype, rounding_mode):
        target = FP8_NAMES.get(getattr(output_dtype, "name", ""))
        if target is None or values.dtype != np.float32:
            return original(values, input_dtype, output_dtype, rounding_mode)
        return torch.from_numpy(np.ascontiguousarray(values)).to(target).view(torch.uint8).numpy()

    interpreter._convert_float = convert


def _spec(case: dict, mode: str = "fwd") -> RunSpec:
    return RunSpec(device="cpu", dtype="fp8", batch=case["batch"], heads=case["heads"], seq=case["seq"],
                   head_dim=case["head_dim"], kv_heads=case["kv_heads"], mode=mode, mask=case["mask"],
                   q_len=case.get("q_len"))


def _sources(case: dict) -> tuple:
    """The case's bf16 q, k, v; with `head_scales`, head h of each scaled by head_scales[h % len]."""
    from attnprof.profiling.inputs import make_inputs

    q, k, v = make_inputs(_spec(case), seed=case["seed"])
    scales = case.get("head_scales")
    if not scales:
        return q, k, v

    def spread(t):
        factors = torch.tensor([scales[h % len(scales)] for h in range(t.shape[1])], dtype=torch.float32)
        return (t.float() * factors[None, :, None, None]).to(t.dtype)

    return spread(q), spread(k), spread(v)


def run_kernel_case(case: dict) -> dict:
    from attnprof_triton import _fp8, _kernel

    from attnprof.profiling.correctness import check_fp8_output
    from attnprof.profiling.fp8 import quantize_inputs

    q, k, v = _sources(case)
    quantized = quantize_inputs(q, k, v, "fp8", "per-head")
    descale_k = quantized.descale_k
    if case.get("descale_k_heads_reversed"):  # the wrong head's descale: the check must fail
        descale_k = descale_k.flip(1).contiguous()
    out = _fp8.attention_fp8(quantized.q, quantized.k, quantized.v, quantized.descale_q, descale_k,
                             quantized.descale_v, mask=case["mask"], config=_kernel.BlockConfig(*case["config"]))
    if out.shape != q.shape or out.dtype != torch.bfloat16:
        return {"error": f"got {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} bfloat16"}
    check = check_fp8_output(out.double(), quantized, (q, k, v), case["mask"] == "causal", mask=case["mask"])
    accuracy = check.fp8
    return {"passed": check.passed, "reason": check.reason, "rel_error": accuracy.rel_error,
            "sqnr_db": accuracy.sqnr_db, "rel_error_vs_bf16": accuracy.rel_error_vs_bf16,
            "threshold": accuracy.threshold}


def run_cell_case(case: dict, tmp: str) -> dict:
    """One cell of the variant through attnprof's pipeline (timing, the profiled loop, the check)."""
    from attnprof_triton._fp8_variant import make_fp8_variant

    from attnprof import Variant
    from attnprof.config import MeasureOptions, parse_config
    from attnprof.pipeline.cell import run_cell
    from attnprof.pipeline.rows import cell_row

    Variant.unavailable_reason = lambda self, spec: None  # fp8 and triton-flash-fp8 are CUDA-only
    shape = {k: case[k] for k in ("batch", "heads", "kv_heads", "seq", "head_dim")}
    config = parse_config({"device": "cpu", "dtype": "fp8", "output_dir": tmp, "shapes": [shape],
                           "schedule": {"wait": 0, "warmup": 1, "active": 1}})
    measure = MeasureOptions(min_time_s=0.01, contention_retimes=0, clocks=False)
    row = cell_row(run_cell(make_fp8_variant(), _spec(case), config, measure))
    return {"status": row.status, "reason": row.reason, "passed": row.passed, "fp8_scaling": row.fp8_scaling,
            "output_dtype": row.output_dtype, "quantize_ms": row.quantize_ms, "sqnr_db": row.sqnr_db,
            "rel_error_vs_bf16": row.rel_error_vs_bf16, "latency_us": row.latency_us}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1")
    problem = interpreter_problem()
    if problem:
        json.dump({"__skip__": problem}, sys.stdout)
        return
    exact_fp8_casts()
    os.environ["ATTNPROF_TRITON_AUTOTUNE"] = "0"  # the autotuner needs a GPU driver
    results = {}
    for case in json.load(sys.stdin):
        try:
            results[case["id"]] = run_cell_case(case, case["tmp"]) if case.get("cell") else run_kernel_case(case)
        except Exception as exc:  # report, keep going
            results[case["id"]] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
