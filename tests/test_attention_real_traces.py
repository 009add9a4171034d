"""The attention ledger on real H200 traces: a 2-layer Llama-style model (tests/data/h200/model, see its
README) and the single-call traces of every variant (tests/data/h200/<shape>, .../training)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from analysis_json import ledger_json

from attnprof.analysis import analyze_trace

DATA = Path(__file__).parent / "data" / "h200"
MODEL = DATA / "model"
LEDGER_FINDINGS = {"host-sync", "gpu-idle", "attention-overhead"}


def llama(name: str):
    region = "train_step" if name.endswith("train_step") else "model_forward"
    return analyze_trace(MODEL / f"llama2l-{name}.json.gz", region=region)


def raw_counts(name: str, region: str = "model_forward") -> list[Counter]:
    """Per region instance, from the raw JSON without attnprof: the cpu ops on the region's thread
    inside it, and its device events by name (through the launches' correlation ids)."""
    with gzip.open(MODEL / f"llama2l-{name}.json.gz", "rt", encoding="utf-8") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    regions = [
        e
        for e in events
        if e.get("cat") == "user_annotation"
        and e["name"] == region
        and any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps)
    ]
    device = {}
    for e in events:
        if e.get("cat") == "kernel":
            device.setdefault(e["args"]["correlation"], []).append(e["name"])
    counts = []
    for r in sorted(regions, key=lambda e: e["ts"]):
        inside = [e for e in events if e["tid"] == r["tid"] and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]]
        found = Counter(e["name"] for e in inside if e.get("cat") == "cpu_op")
        for e in inside:
            if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
                found.update(device.get(e["args"].get("correlation"), []))
        counts.append(found)
    return counts


@pytest.mark.parametrize(
    "name, op, per_forward",
    [
        ("eager", "aten::softmax", 2),
        ("sdpa", "aten::scaled_dot_product_attention", 2),
        ("sdpa-record_shapes", "aten::_scaled_dot_product_cudnn_attention", 2),
        ("flex_attention", "triton_tem_fused_flex_attention_0", 4),  # its cpu op and its kernel, per layer
    ],
)
def test_the_raw_trace_holds_two_attention_calls_per_forward(name, op, per_forward):
    assert [c[op] for c in raw_counts(name)] == [per_forward] * 3


@pytest.mark.parametrize(
    "name, backend, pct",
    [
        ("eager", "eager", (50.0, 60.0)),
        ("sdpa", "cudnn", (1.0, 3.0)),
        ("sdpa-record_shapes", "cudnn", (1.0, 3.0)),
        ("flex_attention", "flex", (1.5, 3.0)),
        ("eager-train_step", "eager", (35.0, 45.0)),
    ],
)
def test_two_layers_are_two_calls_per_forward(name, backend, pct):
    a = llama(name)
    d = ledger_json(a.attention)
    assert d["calls_per_forward"] == 2 and d["backends"] == {backend: 2}
    assert pct[0] < d["gpu_time_pct"] < pct[1]
    assert 0 < d["kernel_time_us"] < a.gpu_time_us
    forward = [c for c in d["calls"] if c["phase"] == "forward"]
    assert len(forward) == 2 and all(c["backend"] == backend for c in forward)
    assert d["kernel_time_us"] == pytest.approx(sum(c["time_us"] for c in d["calls"]), rel=0.01)


def test_eager_calls_cover_matmuls_scale_mask_softmax_and_its_casts():
    d = ledger_json(llama("eager").attention)
    call = d["calls"][0]
    assert call["op"] == "aten::matmul → aten::softmax → aten::matmul"
    # the query's layout copy inside matmul, memset + GEMM, scale, mask add, fp32 cast, softmax, cast back, GEMM
    assert call["kernels"][1:] == [
        "Memset",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
        "vectorized_elementwise_kernel<MulFunctor>",
        "elementwise_kernel<CUDAFunctor_add>",
        "unrolled_elementwise_kernel<direct_copy_kernel_cuda>",
        "softmax_warp_forward",
        "vectorized_elementwise_kernel<bfloat16_copy_kernel_cuda>",
        "nvjet_sm90_tst_64x512_64x2_1x2_h_bz_coopB_NNT",
    ]
    assert 1_500 < call["time_us"] < 1_700


def test_eager_overhead_is_the_mask_the_kv_repeat_and_the_output_copy():
    d = ledger_json(llama("eager").attention)
    items = {o["kind"]: o for o in d["overhead"]}
    assert list(items) == ["mask-build", "kv-repeat", "layout-copy"]
    assert items["mask-build"]["count_per_forward"] == 2 and items["mask-build"]["ops"][0] == "aten::le"
    assert items["kv-repeat"]["count_per_forward"] == 4  # repeat_kv for K and V, in each of 2 layers
    assert items["kv-repeat"]["ops"] == ["aten::reshape → aten::clone → aten::copy_"]
    assert items["layout-copy"]["count_per_forward"] == 2  # attn_output.transpose(1, 2).contiguous()
    assert 90 < d["overhead_us"] < 110
    assert sum(o["time_us"] for o in d["overhead"]) == pytest.approx(d["overhead_us"], rel=0.01)  # medians


def test_sdpa_with_gqa_has_no_overhead_and_flex_builds_its_block_mask():
    assert ledger_json(llama("sdpa").attention)["overhead"] == []
    d = ledger_json(llama("flex_attention").attention)
    items = {o["kind"]: o for o in d["overhead"]}
    assert list(items) == ["mask-build", "dtype-cast"]
    assert items["mask-build"]["count_per_forward"] == 1 and 15 < items["mask-build"]["time_us"] < 25
    assert items["mask-build"]["ops"] == ["Torch-Compiled Region: 0/0"]  # create_block_mask, compiled
    assert items["dtype-cast"]["count_per_forward"] == 2  # the log-sum-exp cast after each call


def test_the_training_step_links_each_backward_to_its_forward_call():
    d = ledger_json(llama("eager-train_step").attention)
    backward = [c for c in d["calls"] if c["phase"] == "backward"]
    assert [c["forward_call"] for c in backward] == [0, 1]
    assert all("SoftmaxBackward0" in c["op"] and "BmmBackward0" in c["op"] for c in backward)
    assert d["backward_kernel_time_us"] == pytest.approx(sum(c["time_us"] for c in backward), rel=0.01)
    assert 3_000 < d["backward_kernel_time_us"] < 4_000
    kv = next(o for o in d["overhead"] if o["kind"] == "kv-repeat")
    forward_only = next(o for o in ledger_json(llama("eager").attention)["overhead"] if o["kind"] == "kv-repeat")
    assert kv["count_per_forward"] == 4 and kv["time_us"] > forward_only["time_us"] + 40  # ExpandBackward0 sums


@pytest.mark.parametrize("name, wait", [("eager", (1_000, 1_500)), ("eager-train_step", (5, 20))])
def test_the_mask_copy_from_pageable_memory_is_a_host_sync(name, wait):
    a = llama(name)
    syncs = [s for m in a.per_forward for s in m.stalls.syncs]
    assert len(syncs) == 3 and {s.api for s in syncs} == {"cudaStreamSynchronize"}
    assert all(s.chain == ("aten::copy_", "aten::_to_copy", "aten::to") and s.memcpy == "Memcpy HtoD" for s in syncs)
    assert all(wait[0] < s.wait_us < wait[1] for s in syncs)
    message = a.finding("host-sync").message
    assert "cudaStreamSynchronize under aten::copy_ ← aten::_to_copy ← aten::to, after a Memcpy HtoD" in message


@pytest.mark.parametrize(
    "name, findings",
    [
        ("eager", {"host-sync"}),  # 22% idle, overhead 3% of attention
        ("sdpa", {"gpu-idle"}),
        ("sdpa-record_shapes", {"gpu-idle"}),
        ("flex_attention", {"gpu-idle", "attention-overhead"}),
        ("eager-train_step", {"host-sync"}),
    ],
)
def test_ledger_findings_on_the_model(name, findings):
    assert LEDGER_FINDINGS & set(llama(name).finding_ids) == findings


def test_gpu_idle_names_the_compiled_regions_flex_waits_on():
    message = llama("flex_attention").finding("gpu-idle").message
    assert "Torch-Compiled Region: 0/0" in message and "TorchDynamo Cache Lookup" in message



def raw_enclosing_ops(name: str, kernel_part: str) -> list[set[str]]:
    """For each device event whose name holds `kernel_part`, from the raw JSON without
    attnprof: the names of the cpu ops on its launch's thread whose range holds the launch."""
    with gzip.open(MODEL / f"llama2l-{name}.json.gz", "rt", encoding="utf-8") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    found = []
    for kernel in (e for e in events if e.get("cat") == "kernel" and kernel_part in e["name"]):
        call = launches[kernel["args"]["correlation"]]
        found.append(
            {o["name"] for o in ops if o["tid"] == call["tid"] and o["ts"] <= call["ts"] <= o["ts"] + o["dur"]}
        )
    return found


@pytest.mark.parametrize("name", ["sdpa", "eager", "eager-train_step", "flex_attention"])
def test_fp32_cuda_cores_places_the_rotary_gemm_outside_the_attention_calls(name):
    """The model's one FP32 GEMM is the rotary embedding's (fp32 by design): the finding says it ran
    outside the attention calls and names its ops, as the raw trace shows them."""
    [enclosing] = {frozenset(ops) for ops in raw_enclosing_ops(name, "cutlass_80_simt_sgemm")}
    assert {"aten::matmul", "aten::bmm"} <= enclosing
    assert not enclosing & {"aten::scaled_dot_product_attention", "aten::softmax", "aten::_softmax"}
    message = llama(name).finding("fp32-cuda-cores").message
    assert "cutlass_80_simt_sgemm_128x32_8x5_nn_align1 x1 outside the attention calls" in message
    assert "launched by aten::matmul → aten::bmm" in message
    assert "inside" not in message


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_fp32_cuda_cores_places_the_math_backends_gemms_inside_its_calls(mode):
    path = DATA / ("8x16x1024x64" if mode == "fwd" else "training/fwd+bwd/8x16x1024x64") / "sdpa-math.json.gz"
    analysis = analyze_trace(path)
    message = analysis.finding("fp32-cuda-cores").message
    assert "all inside the attention calls (math)" in message
    assert "outside" not in message and "launched by" not in message
    gemms = [k for k in analysis.kernels if k.family == "gemm" and k.tensor_cores is False]
    assert gemms and all(k.launch_ops for k in gemms)  # recorded, though the message has no need of them
    for k in gemms:  # the math backend's forward, or autograd's backward of its bmm
        assert "aten::_scaled_dot_product_attention_math" in k.launch_ops[0] or "BmmBackward0" in k.launch_ops[0]


# ------------------------------------------------------------------ single-call traces of the variants

BACKENDS = {
    "naive": "eager",
    "inplace": "eager",
    "compiled": "eager",
    "sdpa-math": "math",
    "sdpa-flash": "flash",
    "sdpa-efficient": "efficient",
    "sdpa-cudnn": "cudnn",
    "sdpa": "cudnn",
    "flex": "flex",
    "triton-flash": "triton",
    "flash-attn": "flash-attn",
}
SINGLE = sorted(p for p in DATA.glob("[0-9]*x*/*.json.gz"))  # the shape folders


@pytest.mark.parametrize("path", SINGLE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_variant_is_one_call_with_its_backend(path):
    a = analyze_trace(path, dtype="bf16")
    d = ledger_json(a.attention)
    backend = BACKENDS[path.name.removesuffix(".json.gz")]
    assert d["calls_per_forward"] == 1 and d["backends"] == {backend: 1}
    [call] = d["calls"]
    if backend == "math":  # every kernel of the forward is the math backend's
        assert len(call["kernels"]) == a.kernels_per_forward
    assert d["gpu_time_pct"] > 75.0
    assert not {"gpu-idle", "attention-overhead", "host-sync"} & set(a.finding_ids)


def test_the_math_backend_holds_its_twenty_kernels():
    d = ledger_json(analyze_trace(DATA / "8x16x1024x64" / "sdpa-math.json.gz").attention)
    assert len(d["calls"][0]["kernels"]) == 20 and d["overhead"] == []


@pytest.mark.parametrize("variant", ["naive", "inplace"])
def test_gqa_repeat_interleave_is_kv_repeat(variant):
    d = ledger_json(analyze_trace(DATA / "4x32x8192x128-kv8" / f"{variant}.json.gz").attention)
    [item] = d["overhead"]
    assert item["kind"] == "kv-repeat" and item["count_per_forward"] == 2
    assert item["ops"][0].startswith("aten::repeat_interleave")


TRAINING = sorted((DATA / "training").glob("*/*/*.json.gz"))


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_training_steps_link_the_backward_to_the_forward_call(path):
    region = "train_step" if path.parent.parent.name == "train_step" else "attnprof"
    a = analyze_trace(path, region=region)
    d = ledger_json(a.attention)
    variant = path.name.removesuffix(".json.gz")
    backward = [c for c in d["calls"] if c["phase"] == "backward"]
    if path.parent.parent.name == "bwd":  # the forward ran before the region: only a fused backward is known
        assert d["calls_per_forward"] == 0
        fused = variant not in ("naive", "inplace", "sdpa-math")
        assert [(c["backend"], c["forward_call"]) for c in backward] == ([(BACKENDS[variant], None)] if fused else [])
    else:
        assert d["calls_per_forward"] == 1 and d["backends"] == {BACKENDS[variant]: 1}
        assert [c["forward_call"] for c in backward] == [0]
        assert d["backward_kernel_time_us"] > 0
    assert not {"gpu-idle", "attention-overhead", "host-sync"} & set(a.finding_ids)
