"""The bytes of each attention call and its share of the read bandwidth, on the real H200 decode traces
(tests/data/h200/masks, see its README) and synthetic ones; the datasheet table; the memory-bound and
bandwidth-bound findings; no percentage above 100."""

from __future__ import annotations

import copy
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from analysis_json import analysis_json, ledger_json
from tracegen import FLASH, TraceBuilder, build

from attnprof.analysis import analyze_trace
from attnprof.analysis.hardware import datasheet
from attnprof.analysis.instance.bandwidth import IS_CAUSAL_INPUT, Traffic, call_traffic, causal_pairs
from attnprof.analysis.roofline import attention_flops
from attnprof.analysis.trace.decoding import CONCRETE_INPUT_OPS
from attnprof.analysis.trace.load import load_trace
from attnprof.registry import RunSpec

DATA = Path(__file__).parent / "data" / "h200"
MASKS = DATA / "masks"
DECODE = ("decode-flash", "decode-cudnn", "decode-math", "decode-flex", "decode-efficient-repeat-kv")
#: 16 sequences x 8 KV heads x 8,192 keys x 128 x 2 bytes, for K and for V; Q and O 16 x 32 x 1 x 128 x 2 each.
NO_SHAPES = (
    "attention bytes and GB/s need the calls' shapes: profile with record_shapes=True "
    "(a call replayed from a CUDA graph has no op, so no shapes)"
)
KV_BYTES = 2 * 16 * 8 * 8192 * 128 * 2
QO_BYTES = 2 * 16 * 32 * 1 * 128 * 2


@cache
def raw(name: str) -> dict[str, Any]:
    with gzip.open(MASKS / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)


@cache
def analysed(name: str) -> dict[str, Any]:
    return analysis_json(analyze_trace(MASKS / f"{name}.json.gz"))


def on_gpu(name: str, gpu: str) -> dict[str, Any]:
    """The analysis of trace `name` with its deviceProperties naming another GPU."""
    trace = copy.deepcopy(raw(name))
    for props in trace["deviceProperties"]:
        props["name"] = gpu
    return analysis_json(analyze_trace(trace))


def percentages(value: Any, key: str = "") -> list[float]:
    """Every number under a key that says "pct" or "%", anywhere in a document."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in percentages(v, k)]
    if isinstance(value, list):
        return [p for v in value for p in percentages(v, key)]
    return [value] if isinstance(value, (int, float)) and ("pct" in key or "%" in key) else []


def test_the_decode_calls_move_q_k_v_and_o_once():
    assert KV_BYTES == 536_870_912 and KV_BYTES + QO_BYTES == 537_133_056
    for name in ("decode-flash", "decode-cudnn", "decode-math", "decode-flex"):
        ledger = analysed(name)["attention"]
        assert ledger["bytes_per_forward"] == 537_133_056, name
        assert [c["bytes"] for c in ledger["calls"]] == [537_133_056], name


def test_k_and_v_repeated_to_the_query_heads_are_read_at_their_repeated_size():
    ledger = analysed("decode-efficient-repeat-kv")["attention"]
    assert ledger["bytes_per_forward"] == 4 * KV_BYTES + QO_BYTES == 2_147_745_792


@pytest.mark.parametrize(
    ("name", "gbps", "pct"),
    [
        ("decode-flash", 4100, 85.4),  # splitkv + combine, 131.0 us
        ("decode-cudnn", 4359, 90.8),  # 123.2 us; the README's 128 us step is about 4.2 TB/s
        ("decode-math", 86.6, 1.8),
        ("decode-flex", 762, 15.9),
        ("decode-efficient-repeat-kv", 2645, 55.1),
    ],
)
def test_achieved_gbps_and_share_of_the_datasheet_bandwidth(name: str, gbps: float, pct: float):
    ledger = analysed(name)["attention"]
    assert ledger["achieved_gbps"] == pytest.approx(gbps, rel=0.002)
    assert ledger["pct_of_read_bandwidth"] == pytest.approx(pct, abs=0.06)
    assert ledger["read_bandwidth_source"] == "datasheet H200 4800 GB/s"
    (call,) = ledger["calls"]
    assert (call["achieved_gbps"], call["pct_of_read_bandwidth"]) == (
        ledger["achieved_gbps"],
        ledger["pct_of_read_bandwidth"],
    )
    assert ledger["achieved_gbps"] == pytest.approx(ledger["bytes_per_forward"] / ledger["kernel_time_us"] / 1e3)


def test_a_dense_mask_adds_its_bytes():
    dense, causal = analysed("dense-mask")["attention"], analysed("is-causal")["attention"]
    assert causal["bytes_per_forward"] == 4 * 2 * 32 * 2048 * 128 * 2  # Q, K, V, O at 2x32x2048x128 bf16
    assert dense["bytes_per_forward"] - causal["bytes_per_forward"] == 2048 * 2048  # the boolean mask


def test_without_record_shapes_bytes_are_null_and_a_note_says_why():
    d = analysis_json(analyze_trace(Path(__file__).parent / "data" / "h200" / "8x16x1024x64" / "sdpa-flash.json.gz"))
    ledger = d["attention"]
    assert ledger["bytes_per_forward"] is None and ledger["achieved_gbps"] is None
    assert ledger["pct_of_read_bandwidth"] is None and ledger["read_bandwidth_source"] is None
    assert all(c["bytes"] is None and c["pct_of_read_bandwidth"] is None for c in ledger["calls"])
    notes = [n for n in d["notes"] if "record_shapes=True" in n]
    assert notes == [NO_SHAPES]


@pytest.mark.parametrize(
    ("name", "gpu", "bandwidth", "tflops"),
    [
        ("NVIDIA H200", "H200", 4800, 989),
        ("NVIDIA H200 NVL", "H200 NVL", 4800, 835),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350, 989),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000, 756),
        ("NVIDIA H100 NVL", "H100 NVL", 3900, 835),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039, 312),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935, 312),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555, 312),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555, 312),
        ("NVIDIA L40S", "L40S", 864, 362),
        ("NVIDIA L40", "L40", 864, 181),
        ("NVIDIA L4", "L4", 300, 121),
        ("NVIDIA A10", "A10", 600, 125),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 1008, 165.2),
        ("NVIDIA B200", "B200", 8000, 2250),
    ],
)
def test_the_datasheet_of_a_gpu_by_its_device_properties_name(name: str, gpu: str, bandwidth: float, tflops: float):
    sheet = datasheet(name)
    assert sheet is not None and (sheet.gpu, sheet.bandwidth_gbps, sheet.tensor_tflops) == (gpu, bandwidth, tflops)
    assert sheet.bandwidth_source == f"datasheet {gpu} {bandwidth:g} GB/s"


def test_an_unknown_gpu_has_no_datasheet():
    assert datasheet("Tesla T4") is None and datasheet("") is None and datasheet(None) is None
    assert datasheet("NVIDIA A10G") is None  # not the A10's figures
    assert datasheet("NVIDIA H200").ridge == pytest.approx(989e3 / 4800)


def test_on_an_unknown_gpu_the_bytes_stay_and_the_percentages_are_null_with_a_note():
    d = on_gpu("decode-cudnn", "Some Future GPU")
    ledger = d["attention"]
    assert ledger["bytes_per_forward"] == 537_133_056 and ledger["achieved_gbps"] == pytest.approx(4358.7, abs=0.1)
    assert ledger["pct_of_read_bandwidth"] is None and ledger["read_bandwidth_source"] is None
    assert "no datasheet bandwidth for GPU 'Some Future GPU': attention's % of read bandwidth is null" in d["notes"]
    assert not {"memory-bound", "bandwidth-bound"} & {f["id"] for f in d["findings"]}


def test_an_achieved_figure_above_the_datasheet_becomes_the_reference_and_is_noted():
    d = on_gpu("decode-cudnn", "NVIDIA L4")  # 300 GB/s: the H200's 4,359 GB/s beats it
    ledger = d["attention"]
    assert ledger["pct_of_read_bandwidth"] == 100.0
    assert ledger["read_bandwidth_source"] == "achieved 4359 GB/s, above the datasheet L4 300 GB/s"
    assert any(n.startswith("attention achieved 4359 GB/s, above the datasheet L4 300 GB/s") for n in d["notes"])


@pytest.mark.parametrize("name", [*DECODE, "dense-mask", "is-causal", "flex-mask-once", "sdpa-math-bf16"])
def test_no_percentage_above_100(name: str):
    found = percentages(analysed(name))
    assert found and max(found) <= 100.0


def test_no_percentage_above_100_when_the_reference_is_beaten():
    assert max(percentages(on_gpu("decode-flash", "NVIDIA L4"))) <= 100.0


def test_overlapping_attention_kernels_count_once_in_the_share_of_gpu_time():
    """Two calls on two streams at once (as a CUDA graph's branches run): their kernel time adds up to
    nearly twice the GPU time, their share of it is the merged intervals' and at most 100%."""

    def forward(b: TraceBuilder):
        for stream in (7, 8):
            with b.op("aten::scaled_dot_product_attention"), b.op("aten::_scaled_dot_product_flash_attention"):
                b.kernel(FLASH, gpu_us=100.0, stream=stream)

    analysis = analyze_trace(build(forward))
    ledger = analysis.attention
    assert ledger.kernel_time_us == pytest.approx(200.0)
    assert ledger.kernel_time_us > analysis.gpu_time_us  # the plain sum would say about 190%
    assert ledger.gpu_time_pct == pytest.approx(100.0)  # the two kernels' union is the whole span
    assert ledger_json(ledger)["gpu_time_pct"] <= 100.0


def findings(name: str) -> dict[str, str]:
    return {f["id"]: f["message"] for f in analysed(name)["findings"]}


@pytest.mark.parametrize(
    ("name", "numbers", "cause"),
    [
        ("decode-math", "87 GB/s, 1.8% of the datasheet H200 4800 GB/s", "the math path materialises the 1x8192"),
        ("decode-flex", "762 GB/s, 16% of the datasheet H200 4800 GB/s", "the FlexAttention prefill template ran on 1"),
        ("decode-efficient-repeat-kv", "2,645 GB/s, 55% of the datasheet", "K/V come with as many heads as Q (32)"),
    ],
)
def test_memory_bound_names_the_slow_decode_call_and_its_likely_cause(name: str, numbers: str, cause: str):
    found = findings(name)
    assert "bandwidth-bound" not in found
    message = found["memory-bound"]
    assert numbers in message and f"Likely cause: {cause}" in message
    assert "arithmetic intensity" in message and "below the ridge point of 206" in message


def test_memory_bound_says_what_the_bytes_would_take_at_the_read_bandwidth():
    message = findings("decode-math")["memory-bound"]
    lost = 6199.883 - 537_133_056 / 4800 / 1e3  # the call's time less its bytes at 4,800 GB/s
    assert f"{lost:,.1f} us per forward over reading its bytes at 4,800 GB/s" in message


@pytest.mark.parametrize(("name", "pct"), [("decode-flash", "85%"), ("decode-cudnn", "91%")])
def test_a_decode_call_near_the_bandwidth_is_bandwidth_bound_info(name: str, pct: str):
    found = findings(name)
    assert "memory-bound" not in found
    assert f"{pct} of the datasheet H200 4800 GB/s" in found["bandwidth-bound"]


@pytest.mark.parametrize("name", ["dense-mask", "is-causal", "flex-mask-once", "sdpa-math-bf16"])
def test_prefill_is_above_the_ridge_point_and_neither_finding_fires(name: str):
    assert not {"memory-bound", "bandwidth-bound"} & set(findings(name))


def test_compiled_flex_decode_is_one_call_of_one_kernel_beside_the_default_block_mask():
    """decode-flex ran FlexAttention's template without a split over the keys (grid 1x16x32, one program
    per sequence and query head): the call is that one kernel; the step's other launches are the two
    0.7 us fills of the default BlockMask (ones, zeros), not part of the call."""
    d = analysed("decode-flex")
    (call,) = d["attention"]["calls"]
    assert call["backend"] == "flex" and len(call["kernels"]) == 1 and "flex_attention" in call["kernels"][0]
    others = {k["short_name"] for k in d["kernels"]} - set(call["kernels"])
    assert others == {"triton_poi_fused_ones_0", "triton_poi_fused_zeros_1"}


def test_a_cuda_graph_replay_of_split_kv_flash_is_one_call_without_bytes():
    """decode-flash-graph: the splitkv and combine kernels run under no op (cudaGraphLaunch); the combine
    finishes the splitkv's call. A replay records no shapes: bytes are null and the note says why."""
    d = analysed("decode-flash-graph")
    ledger = d["attention"]
    assert ledger["calls_per_forward"] == 1 and ledger["backends"] == {"flash": 1}
    (call,) = ledger["calls"]
    assert call["kernels"] == ["flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel"]
    assert call["time_us"] == pytest.approx(ledger["kernel_time_us"]) and call["bytes"] is None
    assert 99 < ledger["gpu_time_pct"] <= 100
    assert NO_SHAPES in d["notes"]


def test_a_compiled_flex_decode_split_over_the_keys_is_one_call_of_three_kernels():
    d = analysed("decode-flex-split")
    ledger = d["attention"]
    assert ledger["calls_per_forward"] == 1
    (call,) = ledger["calls"]
    assert [k[:18] for k in call["kernels"]] == ["triton_tem_fused__", "triton_per_fused__", "triton_per_fused__"]
    assert call["bytes"] == 2 * 1 * 8 * 65536 * 128 * 2 + 2 * 1 * 8 * 1 * 128 * 2 == 268_439_552
    message = findings("decode-flex-split")["memory-bound"]
    assert "Likely cause: the keys are split into chunks" in message and "1 x 8 = 8 (sequence, KV head)" in message


def test_graph_replayed_combine_kernels_finish_the_call_before_them():
    """Two attention layers replayed from one graph: each splitkv kernel starts a call, each combine
    kernel joins the call before it."""
    combine = "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>()"
    splitkv = "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>()"

    def forward(b: TraceBuilder):
        b.graph([splitkv, combine, "triton_poi_fused_add_0", splitkv, combine], gpu_us=10.0)

    ledger = ledger_json(analyze_trace(build(forward)).attention)
    assert ledger["calls_per_forward"] == 2
    pair = ["flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel"]
    assert [c["kernels"] for c in ledger["calls"]] == [pair, pair]


def first_op_traffic(path: Path, op_name: str = "aten::scaled_dot_product_attention") -> Traffic | None:
    """`call_traffic` of the first op named `op_name` in the trace at `path`."""
    trace = load_trace(path)
    op = next(i for i in range(len(trace.cpu_ops)) if trace.names[trace.cpu_ops.name[i]] == op_name)
    return call_traffic(trace, op)


def test_an_is_causal_call_counts_the_causal_pairs_only():
    # is-causal: SDPA at 2x32x2048x128, is_causal=True in its Concrete Inputs (real H200 trace)
    traffic = first_op_traffic(MASKS / "is-causal.json.gz")
    assert traffic is not None and traffic.causal is True
    assert traffic.flops == 4 * 128 * 2 * 32 * (2048 * 2049 // 2) == 68_753_031_168
    spec = RunSpec("cuda", "bf16", 2, 32, 2048, 128, causal=True)
    assert traffic.flops == attention_flops(spec)  # the convention run and compare use


def test_the_backend_op_reads_its_own_is_causal_position():
    # the cuDNN op takes is_causal 7th (index 6), the flash op 5th (index 4), math 6th (index 5)
    cudnn = first_op_traffic(MASKS / "is-causal.json.gz", "aten::_scaled_dot_product_cudnn_attention")
    flash = first_op_traffic(
        DATA / "training" / "train_step" / "8x16x1024x64" / "sdpa-flash.json.gz",
        "aten::_scaled_dot_product_flash_attention",
    )
    math = first_op_traffic(MASKS / "sdpa-math-bf16.json.gz", "aten::_scaled_dot_product_attention_math")
    assert cudnn is not None and (cudnn.causal, cudnn.flops) == (True, 68_753_031_168)
    assert flash is not None and (flash.causal, flash.flops) == (True, 4 * 64 * 8 * 16 * (1024 * 1025 // 2))
    assert math is not None and (math.causal, math.flops) == (True, 4 * 128 * 2 * 32 * (1024 * 1025 // 2))


def test_a_call_recorded_non_causal_counts_every_pair():
    dense = first_op_traffic(MASKS / "dense-mask.json.gz")  # a dense causal mask: every pair, as before
    decode = first_op_traffic(MASKS / "decode-flash.json.gz")
    assert dense is not None and (dense.causal, dense.flops) == (False, 4 * 128 * 2 * 32 * 2048 * 2048)
    assert decode is not None and (decode.causal, decode.flops) == (False, 4 * 128 * 16 * 32 * 1 * 8192)


def test_a_call_without_concrete_inputs_counts_every_pair_and_says_is_causal_is_unknown(tmp_path):
    trace = raw("is-causal")
    stripped = copy.deepcopy(trace)
    for event in stripped["traceEvents"]:
        event.get("args", {}).pop("Concrete Inputs", None)
    path = tmp_path / "no-concrete-inputs.json"
    path.write_text(json.dumps(stripped))
    traffic = first_op_traffic(path)
    assert traffic is not None and traffic.causal is None
    assert traffic.flops == 4 * 128 * 2 * 32 * 2048 * 2048


@pytest.mark.parametrize(
    ("queries", "keys", "bottom_right", "pairs"),
    [
        (4, 4, False, 10),
        (4, 4, True, 10),
        (2, 5, False, 1 + 2),  # SDPA's is_causal: query i keeps keys 0..i
        (2, 5, True, 4 + 5),  # flash's: query i sits at position i + 3
        (5, 2, False, 1 + 2 + 2 + 2 + 2),
        (5, 2, True, 1 + 2),  # the first 3 queries keep no key
    ],
)
def test_causal_pairs_by_alignment(queries: int, keys: int, bottom_right: bool, pairs: int):
    kept = sum(1 for i in range(queries) for j in range(keys) if j <= (i + keys - queries if bottom_right else i))
    assert causal_pairs(queries, keys, bottom_right) == kept == pairs


def test_the_reader_keeps_the_concrete_inputs_of_every_op_whose_is_causal_is_read():
    assert set(IS_CAUSAL_INPUT) == CONCRETE_INPUT_OPS
