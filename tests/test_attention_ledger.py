"""The attention ledger on synthetic traces (tests/tracegen.py): which calls are attention, their
backend, kernels and time, the overhead around them, and the host-sync, gpu-idle and
attention-overhead findings."""

from __future__ import annotations

import pytest
from analysis_json import analysis_json, ledger_json
from tracegen import (
    BF16,
    COPY,
    FLASH,
    GEMM_BF16,
    MUL,
    SOFTMAX,
    TraceBuilder,
    build,
    fused_forward,
    math_forward,
    naive_forward,
)

from attnprof.analysis import analyze_trace
from attnprof.analysis.findings.ledger import GPU_IDLE_SHARE, OVERHEAD_SHARE

MAIN, AUTOGRAD = 4242, 5151
FLEX = "triton_tem_fused_flex_attention_0"
FLEX_BWD = "triton_tem_fused_flex_attention_backward_1"
MASK_KERNELS = ("triton_red_fused_add_arange_le_sum_view_0", "triton_poi_fused_new_zeros_1")
BF16_COPY = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int)"
)
DIRECT_COPY = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
    "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::"
    "operator()() const::{lambda(c10::BFloat16)#1}> >(int)"
)
LINEAR_GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"


def ledger(trace, **kwargs):
    return ledger_json(analyze_trace(trace, **kwargs).attention)


def linear(b: TraceBuilder, us: float = 10.0) -> None:
    with b.op("aten::linear", [BF16, BF16]), b.op("aten::matmul"), b.op("aten::mm"):
        b.kernel(LINEAR_GEMM, gpu_us=us)


def copy_op(b: TraceBuilder, name: str, kernel: str = DIRECT_COPY, us: float = 10.0) -> None:
    with b.op(name), b.op("aten::clone"), b.op("aten::copy_"):
        b.kernel(kernel, gpu_us=us)


def repeat_kv(b: TraceBuilder, us: float = 10.0) -> None:
    """transformers' repeat_kv: unsqueeze, expand (views), then a reshape that copies."""
    b.leaf("aten::unsqueeze")
    b.leaf("aten::expand")
    copy_op(b, "aten::reshape", us=us)


def sdpa_layer(b: TraceBuilder, gqa: bool = False, cast: bool = False) -> None:
    """Projections, (K/V repeat), SDPA on the flash backend, an output cast, contiguous and o_proj."""
    for _ in range(3):
        linear(b)
    if gqa:
        repeat_kv(b)
        repeat_kv(b)
    fused_forward(b, "flash")
    if cast:
        with b.op("aten::to"), b.op("aten::_to_copy"), b.op("aten::copy_"):
            b.kernel(BF16_COPY, gpu_us=4.0)
    b.leaf("aten::transpose")
    copy_op(b, "aten::contiguous", us=8.0)
    linear(b)


def eager_layer(b: TraceBuilder) -> None:
    """transformers' eager attention: matmul (bmm), scale, mask add, softmax with its fp32 casts, matmul."""
    for _ in range(3):
        linear(b)
    repeat_kv(b)
    repeat_kv(b)
    with b.op("aten::matmul"), b.op("aten::bmm"):
        b.kernel(GEMM_BF16, gpu_us=80.0)
    with b.op("aten::mul"):
        b.kernel(MUL, gpu_us=120.0)
    with b.op("aten::add"):
        b.kernel(MUL, gpu_us=300.0)
    with b.op("aten::softmax"):
        with b.op("aten::to"), b.op("aten::_to_copy"), b.op("aten::copy_"):
            b.kernel(COPY, gpu_us=390.0)
        with b.op("aten::_softmax"):
            b.kernel(SOFTMAX, gpu_us=340.0)
    with b.op("aten::to"), b.op("aten::_to_copy"), b.op("aten::copy_"):
        b.kernel(BF16_COPY, gpu_us=180.0)
    b.leaf("aten::dropout")
    with b.op("aten::matmul"), b.op("aten::bmm"):
        b.kernel(GEMM_BF16, gpu_us=80.0)
    b.leaf("aten::transpose")
    copy_op(b, "aten::contiguous", us=12.0)
    linear(b)


def model(b: TraceBuilder, layer=sdpa_layer, layers: int = 2, **kwargs) -> None:
    linear(b)
    for _ in range(layers):
        layer(b, **kwargs)


def test_eager_attention_is_one_call_covering_matmuls_scale_mask_softmax_and_casts():
    d = ledger(build(model, layer=eager_layer))
    assert d["calls_per_forward"] == 2 and d["backends"] == {"eager": 2}
    call = d["calls"][0]
    assert call["op"] == "aten::matmul → aten::softmax → aten::matmul" and call["phase"] == "forward"
    assert len(call["kernels"]) == 7  # 2 GEMMs, mul, add, the fp32 cast, softmax, the cast back
    assert call["time_us"] == pytest.approx(80 + 120 + 300 + 390 + 340 + 180 + 80)
    assert d["kernel_time_us"] == pytest.approx(2 * call["time_us"])
    kinds = {o["kind"]: o for o in d["overhead"]}
    assert set(kinds) == {"kv-repeat", "layout-copy"}
    assert kinds["kv-repeat"]["count_per_forward"] == 4 and kinds["kv-repeat"]["time_us"] == pytest.approx(40.0)
    assert kinds["kv-repeat"]["ops"] == ["aten::reshape → aten::clone → aten::copy_"]
    assert kinds["layout-copy"]["count_per_forward"] == 2
    assert kinds["layout-copy"]["ops"] == ["aten::contiguous → aten::clone → aten::copy_"]


def test_the_naive_variant_is_one_eager_call_with_its_memcpy():
    d = ledger(build(naive_forward))
    assert d["calls_per_forward"] == 1 and d["backends"] == {"eager": 1}
    assert d["calls"][0]["kernels"].count("Memcpy DtoD") == 1 and len(d["calls"][0]["kernels"]) == 6
    assert d["overhead"] == [] and d["overhead_us"] == 0.0
    assert 90.0 < d["gpu_time_pct"] <= 100.0


def test_projections_and_a_router_softmax_are_not_attention():
    """mm (not batched) → softmax → mm, as in an MoE router or a classifier head."""

    def forward(b):
        linear(b)
        with b.op("aten::softmax"), b.op("aten::_softmax"):
            b.kernel(SOFTMAX, gpu_us=5.0)
        linear(b)

    d = ledger(build(forward))
    assert d["calls_per_forward"] == 0 and d["calls"] == [] and d["backends"] == {}
    assert d["kernel_time_us"] == 0.0 and d["overhead"] == []


@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn"])
def test_sdpa_calls_name_the_backend_they_dispatched_to(backend):
    d = ledger(build(model, layer=lambda b: fused_forward(b, backend)))
    assert d["calls_per_forward"] == 2 and d["backends"] == {backend: 2}
    assert d["calls"][0]["op"] == "aten::scaled_dot_product_attention"
    assert d["calls"][0]["kernels"][-1] != "Memset"


def test_the_math_backend_is_one_call_with_all_its_kernels():
    d = ledger(build(math_forward, input_types=False))
    assert d["calls_per_forward"] == 1 and d["backends"] == {"math": 1}
    assert len(d["calls"][0]["kernels"]) == 13  # casts, mask, GEMMs, safe softmax: everything inside SDPA
    assert d["overhead"] == []  # its mask and casts are inside the call, not overhead


def test_gqa_repeat_casts_and_copies_around_sdpa_are_the_overhead():
    d = ledger(build(model, gqa=True, cast=True))
    kinds = {o["kind"]: o for o in d["overhead"]}
    assert [o["kind"] for o in d["overhead"]] == ["kv-repeat", "dtype-cast", "layout-copy"]
    assert (kinds["kv-repeat"]["count_per_forward"], kinds["kv-repeat"]["time_us"]) == (4, pytest.approx(40.0))
    assert (kinds["dtype-cast"]["count_per_forward"], kinds["dtype-cast"]["time_us"]) == (2, pytest.approx(8.0))
    assert (kinds["layout-copy"]["count_per_forward"], kinds["layout-copy"]["time_us"]) == (2, pytest.approx(16.0))
    assert d["overhead_us"] == pytest.approx(64.0)
    # the projections before and o_proj after are not overhead: the walk stops at them
    assert all("aten::linear" not in chain for o in d["overhead"] for chain in o["ops"])


def flex_layer(b: TraceBuilder, mask: bool = False) -> None:
    """FlexAttention as transformers runs it: a compiled region (optionally building the BlockMask
    first, compiled), then the cast of its log-sum-exp."""
    if mask:
        with b.op("Torch-Compiled Region: 0/0"), b.op("## Call CompiledFxGraph abc ##"):
            for name in MASK_KERNELS:
                with b.op(name):
                    b.kernel(name, gpu_us=10.0, api="cuLaunchKernel")
    linear(b)
    b.leaf("TorchDynamo Cache Lookup")
    with b.op("Torch-Compiled Region: 1/0"), b.op("## Call CompiledFxGraph def ##"):
        with b.op(FLEX):
            b.kernel(FLEX, gpu_us=70.0, api="cuLaunchKernel")
        with b.op("triton_poi_fused_mul_1"):
            b.kernel("triton_poi_fused_mul_1", gpu_us=1.0, api="cuLaunchKernel")
    with b.op("aten::to"), b.op("aten::_to_copy"), b.op("aten::copy_"):
        b.kernel(BF16_COPY, gpu_us=1.0)
    linear(b)


def test_flex_calls_are_its_compiled_kernels_and_the_block_mask_is_overhead():
    def forward(b):
        flex_layer(b, mask=True)
        flex_layer(b)

    analysis = analyze_trace(build(forward))
    d = ledger_json(analysis.attention)
    assert d["calls_per_forward"] == 2 and d["backends"] == {"flex": 2}
    assert d["calls"][0] == {
        "op": FLEX,
        "backend": "flex",
        "attention_impl": "flex Triton",
        "phase": "forward",
        "kernels": [FLEX],
        "time_us": 70.0,
        "bytes": None,  # no shapes recorded
        "achieved_gbps": None,
        "pct_of_read_bandwidth": None,
        "forward_call": None,
        "varlen": None,
    }
    kinds = {o["kind"]: o for o in d["overhead"]}
    assert kinds["mask-build"]["count_per_forward"] == 1 and kinds["mask-build"]["time_us"] == pytest.approx(20.0)
    assert kinds["mask-build"]["ops"] == ["Torch-Compiled Region: 0/0"]  # a compiled graph, named as a whole
    assert kinds["dtype-cast"]["count_per_forward"] == 2
    # 22 us of overhead over 140 us of attention: more than OVERHEAD_SHARE
    assert d["overhead_us"] == pytest.approx(22.0) and 22.0 / 140.0 > OVERHEAD_SHARE
    message = analysis.finding("attention-overhead").message
    assert "mask-build x1 (20.0 us" in message and "16% of the calls' own 140.0 us" in message


def test_a_plugin_kernel_launched_under_no_op_is_a_call_of_its_own():
    def forward(b):
        linear(b)
        b.kernel("_attn_fwd", gpu_us=50.0, api="cuLaunchKernelEx")
        linear(b)

    d = ledger(build(forward))
    assert d["backends"] == {"triton": 1} and d["calls"][0]["op"] == "_attn_fwd"


def test_a_host_sync_names_its_op_chain_and_the_wait():
    def forward(b):
        linear(b, us=500.0)
        with b.op("aten::is_nonzero"), b.op("aten::item"), b.op("aten::_local_scalar_dense"):
            b.memcpy("DtoH", gpu_us=1.0, nbytes=1)
            b.call("cudaStreamSynchronize", dur=480.0)
        fused_forward(b, "flash")

    analysis = analyze_trace(build(forward))
    message = analysis.finding("host-sync").message
    assert "Every forward blocks the CPU" in message
    assert "cudaStreamSynchronize under aten::_local_scalar_dense ← aten::item ← aten::is_nonzero" in message
    assert "after a Memcpy DtoH" in message and "480.0 us per forward" in message
    assert analyze_trace(build(model)).finding("host-sync") is None


def test_gpu_idle_names_the_largest_gaps_and_the_cpu_ops_meanwhile():
    def forward(b):
        linear(b, us=20.0)
        with b.op("aten::nonzero"):
            b.advance(400.0)  # CPU work that launches nothing: the device waits
        fused_forward(b, "flash")
        b.advance(150.0)  # no op at all
        linear(b, us=20.0)

    analysis = analyze_trace(build(forward))
    stalls = analysis.per_forward[0].stalls
    assert stalls.idle_share > GPU_IDLE_SHARE
    message = analysis.finding("gpu-idle").message
    assert "397.0 us after nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT (at +20 us)" in message
    assert "while the CPU ran aten::nonzero (383.0 us)" in message
    assert message.count(" after ") == 2 and "more than 50%" in message
    assert analyze_trace(build(model, layers=2)).finding("gpu-idle") is None


def test_backward_kernels_belong_to_the_call_of_their_sequence_number():
    def forward(b):
        with b.op("aten::scaled_dot_product_attention", [BF16, BF16, BF16], seq=7):
            with b.op("aten::_scaled_dot_product_flash_attention", seq=7):
                b.kernel(FLASH, gpu_us=100.0)
        with b.thread(AUTOGRAD):
            name = "ScaledDotProductFlashAttentionBackward0"
            with b.op(f"autograd::engine::evaluate_function: {name}", seq=7, fwd_tid=1):
                with b.op(name, seq=7, fwd_tid=1), b.op("aten::_scaled_dot_product_flash_attention_backward"):
                    b.kernel(FLASH.replace("flash_fwd_kernel", "flash_bwd_dq_dk_dv_loop_kernel"), gpu_us=200.0)

    d = ledger(build(forward))
    assert d["calls_per_forward"] == 1 and d["backends"] == {"flash": 1}
    forward_call, backward_call = d["calls"]
    assert backward_call["phase"] == "backward" and backward_call["forward_call"] == 0
    assert backward_call["op"] == "ScaledDotProductFlashAttentionBackward0" and backward_call["backend"] == "flash"
    assert d["kernel_time_us"] == pytest.approx(300.0) and d["backward_kernel_time_us"] == pytest.approx(200.0)


def test_an_unlinked_backward_kernel_is_a_backward_call_of_its_own():
    """A region around the backward only (the forward ran before it): the fused backward still counts."""

    def forward(b):
        with (
            b.thread(AUTOGRAD),
            b.op("autograd::engine::evaluate_function: CompiledFunctionBackward", seq=3, fwd_tid=1),
        ):
            b.kernel(FLEX_BWD, gpu_us=200.0, api="cuLaunchKernel")

    d = ledger(build(forward))
    assert d["calls_per_forward"] == 0 and d["backends"] == {}
    [call] = d["calls"]
    assert (call["phase"], call["backend"], call["forward_call"]) == ("backward", "flex", None)


def test_bf16_is_read_from_kernel_names_without_record_shapes():
    analysis = analyze_trace(build(math_forward, input_types=False))
    assert analysis.input_dtype is None  # float kernels only: no 16-bit type in any name
    analysis = analyze_trace(build(model, layer=eager_layer))
    assert analysis.input_dtype == "bf16"  # bfloat16_copy_kernel_cuda and c10::BFloat16 in the names


def test_a_cpu_only_trace_has_a_ledger_timed_on_the_cpu_that_the_findings_skip():
    b = TraceBuilder()
    for _ in range(3):
        with b.step(), b.region(), b.op("aten::scaled_dot_product_attention"):
            b.advance(10.0)
    analysis = analyze_trace(b.to_dict())
    ledger = analysis_json(analysis)["attention"]
    assert ledger["time_base"] == "cpu" and ledger["calls_per_forward"] == 1
    op_us = ledger["calls"][0]["time_us"]  # the SDPA op's own duration on the CPU
    assert op_us >= 10.0 and ledger["kernel_time_us"] == op_us and ledger["calls"][0]["kernels"] == []
    assert ledger["gpu_time_pct"] is None and ledger["overhead_us"] is None
    assert ledger["cpu_time_pct"] == round(100 * op_us / analysis.cpu_time_us, 2)
    assert ledger["pct_of_read_bandwidth"] is None and not analysis.notes[1:]  # no bandwidth note on a CPU
    assert not {"host-sync", "gpu-idle", "attention-overhead"} & set(analysis.finding_ids)


def test_a_cpu_only_trace_without_attention_has_no_ledger():
    b = TraceBuilder()
    for _ in range(3):
        with b.step(), b.region(), b.op("aten::mul"):
            b.advance(10.0)
    assert analysis_json(analyze_trace(b.to_dict()))["attention"] is None


def test_instances_of_one_shape_each_get_their_own_calls_and_times():
    """The recognisers run once per instance shape; every instance's calls are its own events, ops and
    times (here the flex kernel runs 100, 200 and 300 us in the three steps)."""
    durations = iter([100.0, 200.0, 300.0])

    def forward(b):
        linear(b)
        with b.op("FlexAttention"):
            b.kernel(FLEX, gpu_us=next(durations))
        linear(b)

    analysis = analyze_trace(build(forward))
    calls = [m.attention.calls for m in analysis.per_forward]
    assert [[c.time_us for c in found] for found in calls] == [[100.0], [200.0], [300.0]]
    assert all(found[0].op == "FlexAttention" and found[0].backend == "flex" for found in calls)
    assert ledger_json(analysis.attention)["kernel_time_us"] == 200.0


def test_instances_that_differ_in_a_kernel_are_different_shapes():
    """The same ops, but the second step's kernel is not attention: one call, then none."""
    kernels = iter([FLEX, MUL])

    def forward(b):
        with b.op("FlexAttention"):
            b.kernel(next(kernels), gpu_us=50.0)

    analysis = analyze_trace(build(forward, steps=2))
    assert [len(m.attention.calls) for m in analysis.per_forward] == [1, 0]


def test_instances_of_one_shape_each_get_their_own_overhead_times():
    """The overhead is found once per shape and call order; every instance adds up its own times."""
    durations = iter([10.0, 20.0, 30.0])

    def forward(b):
        linear(b)
        repeat_kv(b, us=next(durations))
        fused_forward(b, "flash")
        linear(b)

    analysis = analyze_trace(build(forward))
    times = [m.attention.overhead["kv-repeat"].time_us for m in analysis.per_forward]
    assert times == [10.0, 20.0, 30.0]
    assert ledger_json(analysis.attention)["overhead"][0]["time_us"] == 20.0


FLEX_DECODE = "triton_tem_fused__to_copy_flex_attention_ones_slice_sort_sum_transpose_zeros_2"  # as in
FLEX_REDUCE = "triton_per_fused__to_copy_flex_attention_ones_slice_sort_sum_transpose_zeros_3"  # decode-flex-split


def test_a_split_kv_flex_decode_is_one_call_of_its_template_and_its_reduction():
    """Compiled flex decoding splits the keys: a template kernel writes partial outputs and a reduction
    kernel of the same graph merges them; both are the one attention call (each kernel has its own op)."""

    def forward(b):
        b.leaf("TorchDynamo Cache Lookup")
        with b.op("Torch-Compiled Region: 0/0"), b.op("## Call CompiledFxGraph dec ##"):
            with b.op("triton_poi_fused_ones_0"):
                b.kernel("triton_poi_fused_ones_0", gpu_us=0.7, api="cuLaunchKernel")
            with b.op(FLEX_DECODE):
                b.kernel(FLEX_DECODE, gpu_us=100.0, api="cuLaunchKernel")
            with b.op(FLEX_REDUCE):
                b.kernel(FLEX_REDUCE, gpu_us=5.0, api="cuLaunchKernel")

    d = ledger_json(analyze_trace(build(forward)).attention)
    assert d["calls_per_forward"] == 1 and d["backends"] == {"flex": 1}
    (call,) = d["calls"]
    assert call["kernels"] == [FLEX_DECODE, FLEX_REDUCE] and call["time_us"] == pytest.approx(105.0)
    assert call["op"] == FLEX_DECODE
