"""Kernel-name decoding: every documented example, short names, unknown names, the rule file."""

from __future__ import annotations

import pytest
from tracegen import CUDNN, EFFICIENT, FLASH, GEMM_FP32, MASKED_FILL, SOFTMAX, TRIU, WHERE

from attnprof.analysis import explain_kernel, short_kernel_name
from attnprof.analysis.names import _explain_with, _load_rules, rules

FA3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
       "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, 128, "
       "cutlass::bfloat16_t, float, cutlass::arch::Sm90> > > >"
       "(flash::FlashAttnFwdSm90<>::Params)")
FA4 = "kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__tensorptrbf16gmemalign16"


@pytest.mark.parametrize("name,family,tensor_cores,library_part", [
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "fused-attention", True, "CUTLASS"),
    (EFFICIENT, "fused-attention", True, "CUTLASS"),
    (FLASH, "fused-attention", True, "FlashAttention-2"),
    (CUDNN, "fused-attention", True, "cuDNN"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_cga1x1x1_kernel0_0",
     "fused-attention", True, "cuDNN"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "gemm", True, "cuBLASLt"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "gemm", True, "cuBLAS"),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_execute_kernel__5x_cublas",
     "gemm", True, "cuBLAS"),
    (GEMM_FP32, "gemm", False, "cuBLAS"),
    ("ampere_sgemm_128x64_tn", "gemm", False, "cuBLAS"),
    ("volta_sgemm_128x32_nn", "gemm", False, "cuBLAS"),
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true>(cublasGemmSmallNParams<float>)", "gemm", False, "cuBLAS"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false>(float, float)", "gemm", False,
     "cuBLAS"),
    # a split-K GEMM's second step sums partial products: not a GEMM on CUDA cores (fp32-cuda-cores skips it)
    ("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>"
     "(cublasSplitKParams<float>, __nv_bfloat16 const*, float const*, __nv_bfloat16*)", "reduction", False, "cuBLAS"),
    ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", "gemm", True, "CUTLASS"),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x5_nn_align1>(Params)", "gemm", False, "CUTLASS"),
    ("triton_poi_fused_add_mul_0", "elementwise", False, "Triton"),
    ("triton_red_fused__softmax_1", "reduction", False, "Triton"),
    ("triton_per_fused__softmax_2", "reduction", False, "Triton"),
    ("triton_tem_fused_0", "triton-template", None, "Triton"),
    ("triton_tem_fused_flex_attention_0", "fused-attention", None, "FlexAttention"),
    ("_attn_fwd", "fused-attention", None, "Triton"),
    (FA3, "fused-attention", True, "FlashAttention-3"),
    ("void flash::flash_fwd_kernel_sm90<128>(Params)", "fused-attention", True, "FlashAttention-3"),
    (FA4, "fused-attention", True, "CuTe DSL"),
    (MASKED_FILL, "elementwise", False, "ATen"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int)",
     "elementwise", False, "ATen"),
    (TRIU, "elementwise", False, "ATen"),
    ("void cunn_SoftMaxForward<4, float, float, float, cunn::softmax::SoftMaxForwardEpilogue>"
     "(float*, float const*, int)",
     "softmax", False, "ATen"),
    (SOFTMAX, "softmax", False, "ATen"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps<float> > >(x)", "reduction",
     False, "ATen"),
    ("Memcpy DtoD (Device -> Device)", "memcpy", False, "CUDA"),
    ("Memset (Device)", "memset", False, "CUDA"),
])
def test_decodes(name, family, tensor_cores, library_part):
    expl = explain_kernel(name)
    assert expl.family == family
    assert expl.tensor_cores is tensor_cores
    assert library_part in (expl.library or "")
    assert expl.meaning
    assert expl.to_dict()["name"] == name


def _parts(name):
    return dict(explain_kernel(name).parts)


def test_fmha_parts():
    parts = _parts("fmha_cutlassF_bf16_aligned_64x64_rf_sm80")
    assert "fused multi-head attention" in parts["fmha"]
    assert "CUTLASS" in parts["cutlass"]
    assert parts["F"] == "forward pass"
    assert parts["bf16"] == "bfloat16"
    assert "aligned" in parts["aligned"]
    assert "64x64" in parts["64x64"]
    assert "register file" in parts["rf"]
    assert "sm80" in parts["sm80"] and "Ampere" in parts["sm80"]
    assert explain_kernel("fmha_cutlassF_bf16_aligned_64x64_rf_sm80").backend == "efficient"


def test_cudnn_parts():
    parts = _parts(CUDNN)
    assert "generated" in parts["cudnn_generated"]
    assert "forward" in parts["flash_fprop"]
    assert "warpgroup" in parts["wgmma"]
    assert "knob 7" in parts["7"]
    assert parts["64x128x64"] == "tile 64x128x64"
    assert "cluster" in parts["1x1x1"]
    assert "Hopper" in parts["sm90"]
    sm80 = _parts(
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_cga1x1x1_kernel0_0"
    )
    assert "warp matrix multiply" in sm80["wmma"] and "knob 6" in sm80["6"]
    assert explain_kernel(CUDNN).backend == "cudnn"


def test_gemm_instruction_parts():
    assert "16x8x16" in _parts("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn")["s16816"]
    assert "CUDA cores" in _parts(GEMM_FP32)["ffma"]
    assert _parts(GEMM_FP32)["f32f32"] == "input types: float32"


def test_flash_parts_and_backend():
    expl = explain_kernel(FLASH)
    parts = dict(expl.parts)
    assert "vendored into PyTorch" in parts["pytorch_flash"]
    assert expl.backend == "flash" and expl.short_name == "flash_fwd_kernel"
    split = explain_kernel("void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<64> >(p)")
    assert split.backend == "flash" and split.tensor_cores is False


def test_triton_parts():
    parts = _parts("triton_poi_fused_add_mul_0")
    assert parts["add_mul"] == "fused ops: add, mul"
    assert "pointwise" in parts["poi"]


# ---------------------------------------------------------------- Hopper and Blackwell libraries

#: cuBLAS's Hopper xmma naming (warpgroup MMA): not in our traces, written as cuBLAS 12 names them.
XMMA_SM90 = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize1x2x1_warpgroupsize2x1x1_"
             "execute_segment_k_off_kernel__5x_cublas")
#: The CUTLASS library's 3.x naming (cutlass_library's procedural_name), as a trace shows it.
CUTLASS3X = ("void cutlass::device_kernel<cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x128x64_"
             "1x2x1_0_tnn_align8_warpspecialized_cooperative_epi_tma>(cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_"
             "bf16_f32_bf16_bf16_128x128x64_1x2x1_0_tnn_align8_warpspecialized_cooperative_epi_tma::Params)")
#: Real names from tests/data/h200 (cuBLASLt's bf16 GEMMs and ATen's elementwise kernels on the H200).
NVJET = "nvjet_sm90_tst_128x192_64x5_4x1_v_bz_coopB_NTN"
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
       "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
COPY = "".join([
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::",
    "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, ",
    "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, ",
    "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, ",
    "at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::",
    "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, ",
    "std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, ",
    "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)",
])


def test_hopper_xmma_gemm_is_on_tensor_cores_with_its_types_layout_and_tile():
    expl = explain_kernel(XMMA_SM90)
    assert (expl.rule, expl.family, expl.tensor_cores) == ("xmma-gemm-hopper", "gemm", True)
    parts = dict(expl.parts)
    assert "wgmma" in parts["2x1x1"] and "warpgroup" in parts["2x1x1"]
    assert parts["bf16bf16_bf16f32_f32"].endswith(
        "inputs bfloat16, output bfloat16, accumulated in float32, alpha/beta in float32")
    assert parts["tn"].startswith("operand layouts tn") and parts["n"] == "output layout n"
    assert parts["128x256x64"] == "tile 128x256x64" and "cluster 1x2x1" in parts["1x2x1"]
    assert "Hopper" in parts["sm90"]


def test_nvjet_types_tile_stages_and_cluster():
    parts = _parts(NVJET)
    assert parts["tst"] == "types tst: inputs bfloat16, accumulated in float32, output bfloat16"
    assert parts["128x192"].startswith("output tile 128x192") and parts["64"] == "K step 64 per pipeline stage"
    assert parts["5"].startswith("5 pipeline stages") and parts["4x1"] == "thread-block cluster 4x1"
    assert "not decoded" in parts["bz"] and "not decoded" in parts["coopB"]  # never a guess
    assert parts["NTN"].startswith("layouts NTN")
    assert _parts("nvjet_sm90_qqs_128x128_64x4_1x1_h_bz_NNT")["qqs"] == "types qqs: not decoded"


def test_cutlass3x_names_decode_every_field():
    expl = explain_kernel(CUTLASS3X)
    assert (expl.rule, expl.family, expl.tensor_cores) == ("cutlass3x", "gemm", True)
    assert expl.short_name.startswith("cutlass3x_sm90_tensorop_")
    parts = dict(expl.parts)
    assert parts["bf16_bf16_f32_bf16_bf16"].endswith("A bfloat16, B bfloat16, accumulator float32, C bfloat16, "
                                                      "D bfloat16")
    assert parts["128x128x64"].startswith("tile 128x128x64") and parts["1x2x1"] == "thread-block cluster 1x2x1"
    assert parts["tnn"].startswith("layouts tnn") and parts["8"] == "operands aligned to 8 elements"
    assert parts["warpspecialized_cooperative"] == "kernel schedule: warpspecialized cooperative"
    assert "float32" in parts["s"] and "TMA" in parts["tma"]
    blackwell = explain_kernel("cutlass3x_sm100_tensorop_gemm_f16_f16_f32_void_f16_256x128x64_2x1x1_0_ntn_align8_1sm")
    assert blackwell.tensor_cores is True and "Blackwell" in dict(blackwell.parts)["sm100"]
    assert "C none" in dict(blackwell.parts)["f16_f16_f32_void_f16"]


def test_aten_elementwise_template_arguments_are_explained():
    parts = _parts(ADD)
    assert parts["4"] == "template argument 4: elements per vectorized load and store"
    assert parts["CUDAFunctor_add"] == "the op: CUDAFunctor_add" and parts["float"] == "computed in float"
    assert parts["3"] == "3 tensors (outputs and inputs)"
    loop = _parts(MASKED_FILL)
    assert "threads per block" in loop["128"] and "elements per thread" in loop["4"]
    assert "no casts" in loop["gpu_kernel_impl_nocast"] and loop["masked_fill_kernel"] == "the op: masked_fill_kernel"
    copy = _parts(COPY)
    assert copy["direct_copy_kernel_cuda"] == "the op: direct_copy_kernel_cuda" and "(float)" in copy["float"]
    assert "elements per thread" in copy["4"] and "contiguous" in copy["TrivialOffsetCalculator"]
    assert explain_kernel(COPY).family == "elementwise" and explain_kernel(COPY).tensor_cores is False


def test_the_gemms_and_elementwise_kernels_of_the_h200_traces_say_whether_they_use_tensor_cores():
    """Every GEMM of the real traces says yes or no for tensor cores (nvjet: yes), and every ATen elementwise
    kernel is elementwise, without tensor cores."""
    import gzip
    import json
    from pathlib import Path

    names = set()
    for path in (Path(__file__).parent / "data" / "h200").rglob("*.json.gz"):
        with gzip.open(path, "rt") as fh:
            names |= {e["name"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"}
    decoded = [explain_kernel(n) for n in sorted(names)]
    assert len(decoded) > 100
    gemms = [e for e in decoded if e.family == "gemm"]
    assert all(e.tensor_cores is not None for e in gemms)
    assert all(e.tensor_cores for e in decoded if e.name.startswith("nvjet_"))
    assert all(e.family == "elementwise" and e.tensor_cores is False for e in decoded
               if "elementwise_kernel" in e.name and "elementwise_kernel_with_index" not in e.name)


@pytest.mark.parametrize("name", ["some_random_kernel_xyz", "void my_ns::my_kernel<int>(int)", "", "gemm"])
def test_unknown_is_never_a_guess(name):
    expl = explain_kernel(name)
    assert expl.family == "unknown" and expl.tensor_cores is None and expl.library is None and expl.parts == []


@pytest.mark.parametrize("name,short", [
    (FLASH, "flash_fwd_kernel"),
    (EFFICIENT, "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"),
    (SOFTMAX, "softmax_warp_forward"),
    (MASKED_FILL, "elementwise_kernel<masked_fill_kernel>"),
    (WHERE, "elementwise_kernel<where_kernel_impl>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
     "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int)",
     "vectorized_elementwise_kernel<MulFunctor>"),
    (TRIU, "triu_tril_kernel"),
    (FA3, "FlashAttnFwdSm90"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
     "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"),
    ("void my_kernel<(anonymous namespace)::X>(int)", "my_kernel"),
    ("void cutlass::device_kernel<ns::inner_kernel<int> >(int)", "inner_kernel"),
    # a return type before the name (cuBLAS' gemv): the function's name, never a type or punctuation
    ("std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, "
     "true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, float> >("
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, float>)", "gemvx::kernel"),
    ("std::enable_if<std::is_same<T, float>::value, void>::type at::native::foo_kernel<float>(float*)", "foo_kernel"),
    ("std::enable_if<(sizeof(T) > 2), void>::type (anonymous namespace)::softmax_warp_forward<float>(float*)",
     "softmax_warp_forward"),
    ("void ns::kern<(N>0)>(int)", "kern"),
])
def test_short_names(name, short):
    assert short_kernel_name(name) == short


def test_rule_file_loads_and_every_group_exists():
    loaded = rules()
    assert len(loaded) > 20
    assert len({r.id for r in loaded}) == len(loaded)
    for rule in loaded:
        assert rule.tensor_cores in (True, False, None)
        for part in rule.parts:
            assert part.literal or part.group in rule.regex.groupindex


def test_rules_are_extensible_and_ordered():
    text = """
rules:
  - id: mine
    pattern: '^my_attn_(?P<tile>\\d+x\\d+)'
    family: fused-attention
    library: in-house
    meaning: our attention kernel
    tensor_cores: true
    parts:
      - {group: tile, meaning: "tile {value}"}
  - id: catch-all
    pattern: 'my_'
    family: other
    tensor_cores: null
"""
    custom = _load_rules(text)
    expl = _explain_with("my_attn_64x64", custom)
    assert (expl.rule, expl.family, expl.tensor_cores, expl.parts) == ("mine", "fused-attention", True,
                                                                       [("64x64", "tile 64x64")])
    assert _explain_with("my_other", custom).rule == "catch-all"


def test_bad_rules_are_rejected():
    with pytest.raises(ValueError, match="bad pattern"):
        _load_rules("rules:\n  - {id: x, pattern: '(', family: f}\n")
    with pytest.raises(ValueError, match="names group"):
        _load_rules("rules:\n  - {id: x, pattern: 'a', family: f, parts: [{group: nope, meaning: m}]}\n")
