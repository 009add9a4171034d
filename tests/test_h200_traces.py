"""attnprof's analysis of real traces captured by `attnprof compare configs/h200.yaml` on an H200.

torch 2.11.0+cu130, cuDNN 9.19, triton 3.6, bf16, causal, schedule wait=1 warmup=1 active=3
(see docs/validation.md). Each row pins what the trace really holds per forward, so a change in
attribution or in a finding shows up here on a CPU-only machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprof.analysis import analyze_trace, dispatched_backend

DATA = Path(__file__).parent / "data" / "h200"
BLOG, LONG, GQA = "8x16x1024x64", "4x16x8192x128", "4x32x8192x128-kv8"

# (shape, variant): kernels, memcpy, memset per forward; launch APIs per forward; aten::transpose per forward
COUNTS = {
    (BLOG, "naive"): (
        5,
        1,
        1,
        {"cuLaunchKernelEx": 2, "cudaLaunchKernel": 3, "cudaMemcpyAsync": 1, "cudaMemsetAsync": 1},
        1,
    ),
    (BLOG, "inplace"): (5, 0, 1, {"cuLaunchKernelEx": 2, "cudaLaunchKernel": 3, "cudaMemsetAsync": 1}, 1),
    (BLOG, "sdpa-math"): (20, 0, 0, {"cudaLaunchKernel": 18, "cudaLaunchKernelExC": 2}, 1),
    (BLOG, "sdpa-efficient"): (1, 0, 0, {"cudaLaunchKernel": 1}, 4),
    (BLOG, "sdpa-flash"): (1, 0, 0, {"cudaLaunchKernel": 1}, 4),
    (BLOG, "sdpa-cudnn"): (1, 0, 1, {"cuLaunchKernelEx": 1, "cudaMemsetAsync": 1}, 0),
    (BLOG, "sdpa"): (1, 0, 1, {"cuLaunchKernelEx": 1, "cudaMemsetAsync": 1}, 0),
    (BLOG, "flex"): (1, 0, 0, {"cuLaunchKernel": 1}, 0),
    (BLOG, "compiled"): (3, 0, 1, {"cuLaunchKernel": 1, "cuLaunchKernelEx": 2, "cudaMemsetAsync": 1}, 0),
    (BLOG, "triton-flash"): (1, 0, 0, {"cuLaunchKernelEx": 1}, 0),
    (BLOG, "flash-attn"): (1, 0, 0, {"cudaLaunchKernelExC": 1}, 0),  # FA4 (CuTe DSL), [B, S, H, D] inputs
    # [4, 16, 8192, 8192] scores have more than 2**31 elements: ATen splits each elementwise op in two
    (LONG, "naive"): (
        11,
        1,
        2,
        {"cuLaunchKernelEx": 2, "cudaLaunchKernel": 9, "cudaMemcpyAsync": 1, "cudaMemsetAsync": 2},
        1,
    ),
    (LONG, "inplace"): (11, 0, 2, {"cuLaunchKernelEx": 2, "cudaLaunchKernel": 9, "cudaMemsetAsync": 2}, 1),
    (LONG, "sdpa-math"): (51, 0, 0, {"cudaLaunchKernel": 49, "cudaLaunchKernelExC": 2}, 1),
    (LONG, "sdpa-efficient"): (1, 0, 0, {"cudaLaunchKernel": 1}, 4),
    (LONG, "sdpa-flash"): (1, 0, 0, {"cudaLaunchKernel": 1}, 4),
    (LONG, "sdpa-cudnn"): (1, 0, 1, {"cuLaunchKernelEx": 1, "cudaMemsetAsync": 1}, 0),
    (LONG, "flex"): (1, 0, 0, {"cuLaunchKernel": 1}, 0),
    (LONG, "triton-flash"): (1, 0, 0, {"cuLaunchKernelEx": 1}, 0),
    (LONG, "flash-attn"): (1, 0, 0, {"cudaLaunchKernelExC": 1}, 0),
    (GQA, "flash-attn"): (1, 0, 0, {"cudaLaunchKernelExC": 1}, 0),
    (GQA, "naive"): (
        21,
        1,
        2,
        {"cuLaunchKernelEx": 2, "cudaLaunchKernel": 19, "cudaMemcpyAsync": 1, "cudaMemsetAsync": 2},
        1,
    ),
    (GQA, "sdpa-math"): (89, 0, 0, {"cudaLaunchKernel": 87, "cudaLaunchKernelExC": 2}, 1),
    (GQA, "sdpa-cudnn"): (1, 0, 1, {"cuLaunchKernelEx": 1, "cudaMemsetAsync": 1}, 0),
}

# findings that must appear, and findings that must not
FINDINGS = {
    "naive": (
        {"hidden-memcpy", "metadata-transposes"},
        {"fp32-cuda-cores", "safe-softmax", "mask-rebuilt", "single-fused-kernel"},
    ),
    "inplace": ({"metadata-transposes"}, {"hidden-memcpy", "fp32-cuda-cores", "single-fused-kernel"}),
    "sdpa-math": (
        {"fp32-cuda-cores", "mask-rebuilt", "safe-softmax", "metadata-transposes"},
        {"hidden-memcpy", "single-fused-kernel"},
    ),
    "sdpa-efficient": (
        {"single-fused-kernel", "metadata-transposes", "low-occupancy-by-design"},
        {"hidden-memcpy", "mask-rebuilt"},
    ),
    "sdpa-flash": (
        {"single-fused-kernel", "metadata-transposes", "low-occupancy-by-design"},
        {"hidden-memcpy", "fp32-cuda-cores"},
    ),
    "sdpa-cudnn": (
        {"single-fused-kernel", "occupancy-unreported", "low-occupancy-by-design"},
        {"metadata-transposes", "hidden-memcpy"},
    ),
    "flex": ({"single-fused-kernel"}, {"hidden-memcpy", "mask-rebuilt", "metadata-transposes"}),
    "triton-flash": ({"single-fused-kernel"}, {"hidden-memcpy", "metadata-transposes"}),
    "flash-attn": ({"single-fused-kernel", "occupancy-unreported"}, {"hidden-memcpy", "metadata-transposes"}),
}


def analysed(shape: str, variant: str):
    return analyze_trace(DATA / shape / f"{variant}.json.gz", dtype="bf16")


@pytest.mark.parametrize("shape, variant", sorted(COUNTS))
def test_counts_per_forward(shape: str, variant: str) -> None:
    kernels, memcpy, memset, apis, transposes = COUNTS[shape, variant]
    a = analysed(shape, variant)
    assert a.forwards == 3
    assert (a.kernels_per_forward, a.memcpy_per_forward, a.memset_per_forward) == (kernels, memcpy, memset)
    assert a.launch_apis == apis
    assert a.transposes_per_forward == transposes
    assert a.gpu_time_us > 0 and a.cpu_time_us > 0 and a.kernel_time_us <= a.gpu_time_us + 0.01


@pytest.mark.parametrize("shape", [BLOG, LONG])
@pytest.mark.parametrize("variant", sorted(FINDINGS))
def test_findings(shape: str, variant: str) -> None:
    present, absent = FINDINGS[variant]
    ids = set(analysed(shape, variant).finding_ids)
    assert present <= ids, ids
    assert not (absent & ids), ids


def test_the_blog_findings_in_detail() -> None:
    naive = analysed(BLOG, "naive")
    assert "aten::masked_fill" in naive.finding("hidden-memcpy").message
    math = analysed(BLOG, "sdpa-math")
    assert "sm80_xmma_gemm_f32f32" in math.finding("fp32-cuda-cores").message
    flash = analysed(BLOG, "sdpa-flash")
    [kernel] = [k for k in flash.kernels if k.kind == "kernel"]
    assert kernel.short_name == "flash_fwd_kernel" and kernel.tensor_cores is True
    assert kernel.achieved_occupancy_pct == 13.0 and kernel.theoretical_occupancy_pct == 12.5
    cudnn = analysed(BLOG, "sdpa-cudnn")
    [kernel] = [k for k in cudnn.kernels if k.kind == "kernel"]
    assert kernel.launch_api == "cuLaunchKernelEx" and kernel.achieved_occupancy_pct is None
    assert kernel.theoretical_occupancy_pct == 18.75 and "wgmma" in kernel.name
    assert "cpu-bound" in cudnn.finding_ids  # the fat CPU bar: more host time than device time per forward


@pytest.mark.parametrize(
    "shape, variant, backend",
    [
        (BLOG, "sdpa", "cudnn"),
        (BLOG, "sdpa-math", "math"),
        (BLOG, "sdpa-flash", "flash"),
        (BLOG, "sdpa-efficient", "efficient"),
        (LONG, "sdpa-cudnn", "cudnn"),
        (BLOG, "naive", None),
    ],
)
def test_dispatched_backend(shape: str, variant: str, backend: str | None) -> None:
    assert dispatched_backend(analysed(shape, variant)) == backend
