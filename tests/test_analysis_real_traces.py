"""The analysis on small real traces from an H200 (torch 2.11, cuDNN 9.19); see their README.

Numbers that torch's own key_averages() printed for the same runs are checked exactly.
"""

from __future__ import annotations

import pytest
from tracegen import REAL_TRACES

from attnprof.analysis import analyze_trace, dispatched_backend, load_trace

pytestmark = pytest.mark.skipif(not (REAL_TRACES / "naive.json.gz").exists(), reason="real traces not present")
GPU_WIDENING_US = 0.002  # Kineto widens each GPU annotation by 1 ns each side; key_averages() does not see it


def analysis(name: str):
    return analyze_trace(REAL_TRACES / f"{name}.json.gz")


def region_ranges(name: str, gpu: bool) -> list[float]:
    """Durations of the `attnprof` ranges (CPU, or GPU per stream) as key_averages() counts them."""
    trace = load_trace(REAL_TRACES / f"{name}.json.gz")
    table, widening = (trace.gpu_annotations, GPU_WIDENING_US) if gpu else (trace.annotations, 0.0)
    return [max(table.dur[i] - widening, 0.0) for i, n in enumerate(table.name) if trace.names[n] == "attnprof"]


def test_naive_has_five_kernels_and_the_hidden_memcpy():
    a = analysis("naive")
    assert (a.forwards, a.kernels_per_forward, a.memcpy_per_forward) == (3, 5, 1)
    assert a.launch_apis == {"cuLaunchKernelEx": 2, "cudaLaunchKernel": 3, "cudaMemcpyAsync": 1}
    assert "aten::masked_fill → aten::clone → aten::copy_" in a.finding("hidden-memcpy").message
    assert a.input_dtype == "bf16" and a.annotation_mismatches == 0
    assert dispatched_backend(a) is None


def test_inplace_drops_the_memcpy():
    a = analysis("inplace")
    assert (a.kernels_per_forward, a.memcpy_per_forward) == (5, 0)
    assert a.finding("hidden-memcpy") is None


def test_math_backend_matches_key_averages():
    a = analysis("sdpa_math")
    assert a.kernels_per_forward == 20
    assert a.self_device_time_total_us == pytest.approx(674.496, abs=1e-3)  # "Self CUDA time total: 674.496us"
    assert a.launch_apis == {"cudaLaunchKernel": 18, "cudaLaunchKernelExC": 2}
    assert {"fp32-cuda-cores", "mask-rebuilt", "safe-softmax"} <= set(a.finding_ids)
    assert dispatched_backend(a) == "math"
    cpu, gpu = region_ranges("sdpa_math", gpu=False), region_ranges("sdpa_math", gpu=True)
    assert len(cpu) == 3 and sum(cpu) == pytest.approx(1935.697, abs=1e-3)  # 1.936 ms
    assert sum(gpu) / len(gpu) == pytest.approx(531.839, abs=1e-2)  # "CUDA time avg 531.839us"


def test_efficient_is_one_fused_kernel():
    a = analysis("sdpa_efficient")
    assert a.kernels_per_forward == 1 and dispatched_backend(a) == "efficient"
    assert a.finding("single-fused-kernel") is not None
    kernel = a.kernels[0]
    assert kernel.achieved_occupancy_pct == 6.0 and kernel.theoretical_occupancy_pct == 25.0
    assert a.transposes_per_forward == 4 and a.finding("metadata-transposes") is not None


def test_flash_splits_kv_at_this_shape():
    a = analysis("sdpa_flash")
    assert a.kernels_per_forward == 2 and dispatched_backend(a) == "flash"
    assert a.finding("single-fused-kernel") is None
    main = a.kernels[0]
    assert main.short_name == "flash_fwd_splitkv_kernel" and main.theoretical_occupancy_pct == 12.5
    assert main.achieved_occupancy_pct is None and "shared memory" in main.occupancy_note


def test_cudnn_matches_key_averages():
    a = analysis("sdpa_cudnn")
    assert (a.kernels_per_forward, a.memset_per_forward) == (1, 1)
    assert a.launch_apis == {"cuLaunchKernelEx": 1, "cudaMemsetAsync": 1}
    assert a.self_device_time_total_us == pytest.approx(38.240, abs=1e-3)  # "Self CUDA time total: 38.240us"
    assert dispatched_backend(a) == "cudnn"
    assert a.finding("occupancy-unreported") is not None and a.finding("cpu-bound") is not None
    assert sum(region_ranges("sdpa_cudnn", gpu=False)) == pytest.approx(415.675, abs=1e-3)  # CPU total 415.675us
    assert sum(region_ranges("sdpa_cudnn", gpu=True)) == pytest.approx(86.335, abs=1e-3)  # CUDA total 86.335us
    assert a.device == {"name": "NVIDIA H200", "compute_capability": "9.0", "num_sms": 132}


def test_two_streams():
    a = analysis("twostream")
    assert a.kernels_per_forward == 3 and a.annotation_mismatches == 0
    assert len(region_ranges("twostream", gpu=True)) == 6  # one per stream and forward
