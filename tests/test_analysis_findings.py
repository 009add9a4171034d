"""Findings: each id fires on its evidence and stays silent without it."""

from __future__ import annotations

import pytest
from tracegen import (
    BF16,
    CUDNN,
    FILL,
    FLASH,
    GEMM_BF16,
    MUL,
    TraceBuilder,
    build,
    fused_forward,
    math_forward,
    naive_forward,
)

from attnprof.analysis import FINDING_IDS, analyze_trace


def ids(analysis):
    return set(analysis.finding_ids)


def message(analysis, finding_id):
    finding = analysis.finding(finding_id)
    assert finding is not None, f"{finding_id} missing; found {analysis.finding_ids}"
    assert "\n" not in finding.message and finding.message.endswith(".")
    return finding.message


def test_ids_are_the_documented_contract():
    assert FINDING_IDS == ("hidden-memcpy", "fp32-cuda-cores", "mask-rebuilt", "safe-softmax", "single-fused-kernel",
                           "unfused-attention", "dense-mask", "mask-build", "backend-fallback", "mask-convert",
                           "low-occupancy-by-design", "occupancy-unreported", "cpu-bound", "metadata-transposes",
                           "cpu-contention", "comm-exposed", "bwd-dot-do-o",
                           "bwd-dq-convert", "bwd-memsets", "grad-accumulation", "host-sync",
                           "gpu-idle", "attention-overhead", "memory-bound", "bandwidth-bound",
                           "tensor-pipe-underused", "dram-bound", "l2-thrash", "stall-dominated", "throttled",
                           "fp8-not-faster")


def test_a_clean_forward_has_no_findings():
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.region():
                with b.op("aten::mm", [BF16, BF16]):
                    b.kernel(GEMM_BF16, gpu_us=400.0, regs=64, block=(256, 1, 1), grid=(512, 1, 1))
                with b.op("aten::relu", [BF16]):
                    b.kernel(MUL, gpu_us=50.0, grid=(8192, 1, 1))
    analysis = analyze_trace(b.to_dict())
    assert analysis.findings == []


# ---------------------------------------------------------------- hidden-memcpy

def test_hidden_memcpy_names_the_op_chain():
    text = message(analyze_trace(build(naive_forward)), "hidden-memcpy")
    assert text.startswith("Every forward runs 1 device-to-device memcpy")
    assert "aten::masked_fill → aten::clone → aten::copy_" in text
    assert "6.9 us" in text and "out-of-place aten::masked_fill" in text


def test_hidden_memcpy_absent_for_inplace_and_for_host_copies():
    assert "hidden-memcpy" not in ids(analyze_trace(build(naive_forward, inplace=True)))
    b = TraceBuilder()
    with b.step():
        with b.region():
            with b.op("aten::to"):
                b.memcpy("HtoD")
            b.kernel(MUL)
    analysis = analyze_trace(b.to_dict())
    assert analysis.memcpy_per_forward == 1 and "hidden-memcpy" not in ids(analysis)


def test_hidden_memcpy_in_some_forwards_says_how_many():
    b = TraceBuilder()
    for k in range(3):
        with b.step():
            with b.region():
                naive_forward(b, inplace=k != 1)
    assert message(analyze_trace(b.to_dict()), "hidden-memcpy").startswith("1 of 3 forwards run 1")


# ---------------------------------------------------------------- fp32-cuda-cores

def test_fp32_cuda_cores_from_record_shapes():
    analysis = analyze_trace(build(math_forward))
    assert analysis.input_dtype == "bf16"
    text = message(analysis, "fp32-cuda-cores")
    assert text.startswith("2 GEMM kernel(s) per forward run in FP32 on CUDA cores")
    assert "sm80_xmma_gemm_f32f32" in text and "bfloat16" in text
    assert "Input type of aten::scaled_dot_product_attention" in text
    assert "3 upcast copies per forward" in text


def test_fp32_cuda_cores_in_fewer_than_half_the_forwards_says_in_how_many():
    b = TraceBuilder()
    for k in range(3):
        with b.step():
            with b.region():
                (math_forward if k == 1 else naive_forward)(b)
    text = message(analyze_trace(b.to_dict(), dtype="bf16"), "fp32-cuda-cores")
    assert text.startswith("In 1 of 3 forwards, GEMM kernels ran in FP32 on CUDA cores"), text
    assert "x0" not in text and "0 GEMM" not in text
    assert "all inside the attention calls (math)" in text  # placed by its launches, not by a median of zeros


def test_fp32_cuda_cores_from_the_dtype_hint_only():
    data = build(math_forward, input_types=False)
    assert "fp32-cuda-cores" not in ids(analyze_trace(data))  # no dtype evidence: no finding
    text = message(analyze_trace(data, dtype="fp16"), "fp32-cuda-cores")
    assert "float16 (the --dtype hint)" in text and "aten::to/aten::_to_copy" in text


def test_fp32_cuda_cores_absent_for_fp32_inputs_and_tensor_core_gemms():
    assert "fp32-cuda-cores" not in ids(analyze_trace(build(math_forward), dtype="fp32"))
    assert "fp32-cuda-cores" not in ids(analyze_trace(build(naive_forward), dtype="bf16"))


def test_unknown_dtype_hint_is_an_error():
    from attnprof.errors import TraceError
    with pytest.raises(TraceError, match="unknown dtype hint"):
        analyze_trace(build(naive_forward), dtype="int3")


# ---------------------------------------------------------------- mask-rebuilt and safe-softmax

def test_mask_rebuilt_lists_ops_and_kernels():
    text = message(analyze_trace(build(math_forward)), "mask-rebuilt")
    assert "aten::ones x1" in text and "aten::tril x1" in text and "aten::where x1" in text
    assert "aten::scalar_tensor x1" in text
    assert "launching 4 kernels" in text and "triu_tril_kernel" in text


def test_mask_rebuilt_absent_when_the_mask_is_built_once():
    b = TraceBuilder()
    with b.op("aten::tril", ["bool", "Scalar"]):  # built once, before profiling the forwards
        b.kernel(FILL)
    for _ in range(3):
        with b.step():
            with b.region():
                naive_forward(b)
    assert "mask-rebuilt" not in ids(analyze_trace(b.to_dict()))


def test_mask_rebuilt_needs_every_forward():
    b = TraceBuilder()
    for k in range(3):
        with b.step():
            with b.region():
                if k == 0:
                    with b.op("aten::tril", ["bool", "Scalar"]):
                        b.kernel(FILL)
                naive_forward(b)
    assert "mask-rebuilt" not in ids(analyze_trace(b.to_dict()))


def test_safe_softmax_names_its_kernels():
    text = message(analyze_trace(build(math_forward)), "safe-softmax")
    assert text.startswith("aten::_safe_softmax runs in every forward and launches 3 kernels")
    assert "softmax_warp_forward" in text and "isneginf" in text and "NaN" in text


def test_safe_softmax_absent_for_plain_softmax():
    assert "safe-softmax" not in ids(analyze_trace(build(naive_forward)))


# ---------------------------------------------------------------- single-fused-kernel

@pytest.mark.parametrize("backend,short", [("flash", "flash_fwd_kernel"),
                                           ("efficient", "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"),
                                           ("cudnn", "cudnn_generated_fort_native_sdpa_sm90")])
def test_single_fused_kernel(backend, short):
    text = message(analyze_trace(build(fused_forward, backend=backend)), "single-fused-kernel")
    assert text.startswith("Each forward runs exactly one kernel") and short in text


def test_single_fused_kernel_absent_for_one_non_attention_kernel_or_two_kernels():
    b = TraceBuilder()
    with b.step():
        with b.region():
            b.kernel(GEMM_BF16, gpu_us=50.0)
    assert "single-fused-kernel" not in ids(analyze_trace(b.to_dict()))
    b = TraceBuilder()
    for k in range(2):
        with b.step():
            with b.region():
                fused_forward(b, "flash")
                if k:
                    b.kernel(MUL)
    assert "single-fused-kernel" not in ids(analyze_trace(b.to_dict()))
    assert "single-fused-kernel" not in ids(analyze_trace(build(naive_forward)))


# ---------------------------------------------------------------- occupancy findings

def test_low_occupancy_by_design_shows_the_arithmetic():
    text = message(analyze_trace(build(fused_forward, backend="flash")), "low-occupancy-by-design")
    assert "flash_fwd_kernel has 12.5% theoretical occupancy, limited by registers" in text
    assert "255 regs x 128 threads = 32,640 regs/block" in text and "2 blocks = 8 warps of 64 = 12.5%" in text


def test_low_occupancy_absent_for_light_attention_kernels_and_for_elementwise():
    b = TraceBuilder()
    with b.step():
        with b.region():
            b.kernel(FLASH, regs=32, block=(128, 1, 1), gpu_us=100.0)   # 100% theoretical
            b.kernel(MUL, regs=255, block=(128, 1, 1), gpu_us=5.0)       # low, but not a GEMM/attention kernel
    analysis = analyze_trace(b.to_dict())
    assert "low-occupancy-by-design" not in ids(analysis)
    assert [k.theoretical_occupancy_pct for k in analysis.kernels] == [100.0, 12.5]


def test_occupancy_unreported_for_large_shared_memory():
    analysis = analyze_trace(build(fused_forward, backend="cudnn"))
    cudnn = next(k for k in analysis.kernels if k.name == CUDNN)
    assert cudnn.achieved_occupancy_pct is None and cudnn.theoretical_occupancy_pct == 12.5
    text = message(analysis, "occupancy-unreported")
    assert ("reports 0% achieved occupancy; likely cause: its 134,144 B of shared memory per block exceed "
            "the 48 KB default") in text
    assert "theoretical occupancy is 12.5% (240 regs x 256 threads = 61,440 regs/block" in text


def test_occupancy_unreported_for_a_driver_api_launch():
    b = TraceBuilder()
    with b.step():
        with b.region():
            b.kernel(CUDNN, api="cuLaunchKernelEx", occupancy=0, regs=128, smem=16384, block=(128, 1, 1),
                     grid=(1024, 1, 1), gpu_us=80.0)
    text = message(analyze_trace(b.to_dict()), "occupancy-unreported")
    assert "driver API (cuLaunchKernelEx)" in text and "25%" in text


def test_occupancy_unreported_silent_for_tiny_grids_and_reported_values():
    b = TraceBuilder()
    with b.step():
        with b.region():
            b.kernel(FILL, grid=(1, 1, 1), occupancy=0)  # 1 block over 132 SMs: a true ~0%
            b.kernel(GEMM_BF16, grid=(512, 1, 1), occupancy=48)
    analysis = analyze_trace(b.to_dict())
    assert "occupancy-unreported" not in ids(analysis)
    fill = next(k for k in analysis.kernels if k.name == FILL)
    assert fill.achieved_occupancy_pct is None and "rounds to 0" in fill.occupancy_note
    assert next(k for k in analysis.kernels if k.name == GEMM_BF16).achieved_occupancy_pct == 48


# ---------------------------------------------------------------- cpu-bound and metadata-transposes

def test_cpu_bound_compares_medians():
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.region():
                for _ in range(20):
                    with b.op("aten::add", pad=5.0):
                        b.kernel(MUL, gpu_us=1.0)
    analysis = analyze_trace(b.to_dict())
    assert analysis.cpu_time_us > analysis.gpu_time_us
    text = message(analysis, "cpu-bound")
    assert f"({analysis.cpu_time_us:,.1f} us)" in text and "20 launch calls" in text


def test_cpu_bound_absent_when_the_gpu_is_busy_or_unknown():
    assert "cpu-bound" not in ids(analyze_trace(build(fused_forward, backend="efficient")))
    b = TraceBuilder(device_properties=[])
    with b.step():
        with b.region():
            b.leaf("aten::mul")
    assert "cpu-bound" not in ids(analyze_trace(b.to_dict()))


def test_metadata_transposes_counts_only_those_without_launches():
    analysis = analyze_trace(build(fused_forward, backend="flash"))
    text = message(analysis, "metadata-transposes")
    assert text.startswith("4 aten::transpose ops per forward launch no kernel")
    assert "aten::_scaled_dot_product_flash_attention" in text
    assert "metadata-transposes" not in ids(analyze_trace(build(fused_forward, backend="cudnn")))
    b = TraceBuilder()
    with b.step():
        with b.region():
            with b.op("aten::transpose"):
                b.kernel(MUL)  # a transpose that does launch work is not metadata-only
    analysis = analyze_trace(b.to_dict())
    assert analysis.transposes_per_forward == 1 and "metadata-transposes" not in ids(analysis)
