"""`analyze` on the CPU traces users have (tests/data/cpu, real torch.profiler traces, see capture.py there): a
trace without annotations as one window, the attention ledger timed on the CPU (SDPA's math and CPU-flash
backends, nn.MultiheadAttention's and nn.TransformerEncoderLayer's fast paths, eager attention, a CPU
backward), and the top ops by self CPU time. Every figure is checked against the trace's own events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from analysis_json import analysis_json

from attnprof.analysis import analyze_trace
from attnprof.analysis.attribution.regions import WHOLE_TRACE
from attnprof.report.analysis_tables import render_analysis

DATA = Path(__file__).parent / "data" / "cpu"
MHA = "aten::_native_multi_head_attention"
SDPA = "aten::scaled_dot_product_attention"
GPU_FINDINGS = {"host-sync", "gpu-idle", "attention-overhead", "cpu-bound", "low-occupancy-by-design"}


def events(name: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / f"{name}.json.gz", "rt") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def ops_inside(trace: list[dict[str, Any]], outer: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The cpu ops called `name` inside the range `outer`, by start."""
    end = outer["ts"] + outer["dur"]
    found = [e for e in trace if e.get("cat") == "cpu_op" and e["name"] == name and outer["ts"] <= e["ts"] <= end]
    return sorted(found, key=lambda e: e["ts"])


def regions(trace: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The instances of a record_function region that lie in a profiler step (all of them without steps)."""
    steps = [e for e in trace if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    found = [e for e in trace if e.get("cat") == "user_annotation" and e["name"] == name]
    if steps:
        spans = [(s["ts"], s["ts"] + s["dur"]) for s in steps]
        found = [r for r in found if any(lo <= r["ts"] and r["ts"] + r["dur"] <= hi for lo, hi in spans)]
    return sorted(found, key=lambda e: e["ts"])


def test_a_trace_without_annotations_is_one_window_with_its_attention(cli):
    result = cli("analyze", str(DATA / "unannotated.json.gz"))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "analysed as one window" in result.stderr
    assert f"region {WHOLE_TRACE!r}, 1 forward(s)" in result.stdout
    analysis = analyze_trace(DATA / "unannotated.json.gz")
    assert analysis.region == WHOLE_TRACE and analysis.forwards == 1
    trace = events("unannotated")
    mha = sorted((e for e in trace if e.get("cat") == "cpu_op" and e["name"] == MHA), key=lambda e: e["ts"])
    ledger = analysis_json(analysis)["attention"]
    assert len(mha) == 6  # three forwards of two layers, all in the one window
    assert ledger["calls_per_forward"] == 6 and ledger["backends"] == {"native-mha": 6}
    assert [c["time_us"] for c in ledger["calls"]] == [round(e["dur"], 3) for e in mha]
    ops = [e for e in trace if e.get("cat") == "cpu_op"]
    window = max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)
    assert analysis.cpu_time_us == pytest.approx(window)
    assert analysis.cpu_ops_per_forward == len(ops)


def test_a_transformer_encoder_fast_path_is_two_native_mha_calls_per_forward():
    analysis = analyze_trace(DATA / "encoder.json.gz")
    data = analysis_json(analysis)
    assert analysis.region == "encoder" and analysis.forwards == 3 and analysis.input_dtype == "fp32"
    trace = events("encoder")
    instances = regions(trace, "encoder")
    assert len(instances) == 3
    per_call = [[e["dur"] for e in ops_inside(trace, r, MHA)] for r in instances]
    assert all(len(calls) == 2 for calls in per_call)
    ledger = data["attention"]
    assert ledger["time_base"] == "cpu" and ledger["backends"] == {"native-mha": 2}
    assert [c["op"] for c in ledger["calls"]] == [MHA, MHA] and all(c["kernels"] == [] for c in ledger["calls"])
    assert [c["time_us"] for c in ledger["calls"]] == [round(median(c[k] for c in per_call), 3) for k in range(2)]
    assert ledger["kernel_time_us"] == pytest.approx(median(sum(c) for c in per_call), abs=1e-3)
    pct = median(100 * sum(c) / r["dur"] for c, r in zip(per_call, instances, strict=True))
    assert ledger["cpu_time_pct"] == pytest.approx(pct, abs=0.01)
    assert ledger["gpu_time_pct"] is None and ledger["overhead_us"] is None
    assert ledger["bytes_per_forward"] is None  # a module's inputs are hidden states, not Q, K and V
    assert not GPU_FINDINGS & set(analysis.finding_ids)


def test_the_top_ops_by_self_cpu_time_are_the_traces_own():
    data = analysis_json(analyze_trace(DATA / "encoder.json.gz"))
    top = data["top_cpu_ops"]
    assert 0 < len(top) <= 20
    assert [op["self_cpu_us"] for op in top] == sorted((op["self_cpu_us"] for op in top), reverse=True)
    assert all(op["self_cpu_us"] <= op["cpu_total_us"] + 1e-6 for op in top)
    trace = events("encoder")
    instances = regions(trace, "encoder")
    softmax = next(op for op in top if op["name"] == "aten::_softmax")  # a leaf: self time is its duration
    durations = [sum(e["dur"] for e in ops_inside(trace, r, "aten::_softmax")) for r in instances]
    assert softmax["calls_per_forward"] == 2
    assert softmax["self_cpu_us"] == softmax["cpu_total_us"] == pytest.approx(median(durations), abs=1e-3)
    assert softmax["self_cpu_pct"] == pytest.approx(100 * median(durations) / data["cpu_time_us"], abs=0.01)
    assert softmax["input_shapes"] == "2x4x32x32, 2x4x32x32"  # record_shapes: its Input Dims
    layer = next(op for op in top if op["name"] == "aten::_transformer_encoder_layer_fwd")
    assert layer["cpu_total_us"] > layer["self_cpu_us"]  # its children are not its own time


def test_the_tables_show_the_cpu_ledger_and_the_top_ops():
    text = render_analysis(analyze_trace(DATA / "encoder.json.gz"), "table", 120)
    assert "2 attention call(s) per forward (native-mha:2); their CPU time" in text
    assert "Top 20 ops by self CPU time per forward" in text
    row = next(line for line in text.splitlines() if line.startswith("aten::_softmax "))
    assert row.split()[1] == "2" and "2x4x32x32" in row
    assert all(len(line) <= 120 for line in text.splitlines())


def test_sdpa_on_the_cpu_flash_backend_and_its_backward():
    analysis = analyze_trace(DATA / "encoder-train.json.gz")
    ledger = analysis_json(analysis)["attention"]
    assert analysis.region == "train_step" and analysis.forwards == 3
    assert ledger["backends"] == {"flash": 2} and ledger["calls_per_forward"] == 2
    forward = [c for c in ledger["calls"] if c["phase"] == "forward"]
    backward = [c for c in ledger["calls"] if c["phase"] == "backward"]
    assert [c["op"] for c in forward] == [SDPA, SDPA]
    assert [c["forward_call"] for c in backward] == [0, 1]
    assert all(c["op"] == "ScaledDotProductFlashAttentionForCpuBackward0" for c in backward)
    trace = events("encoder-train")
    engine = "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0"
    per_instance = [sum(e["dur"] for e in ops_inside(trace, r, engine)) for r in regions(trace, "train_step")]
    assert ledger["backward_kernel_time_us"] == pytest.approx(median(per_instance), abs=1e-3)


def test_sdpa_math_and_eager_attention_with_their_bytes_from_the_recorded_shapes():
    analysis = analyze_trace(DATA / "sdpa-math.json.gz")
    ledger = analysis_json(analysis)["attention"]
    assert [(c["op"], c["backend"]) for c in ledger["calls"]] == [
        (SDPA, "math"),
        ("aten::matmul → aten::softmax → aten::matmul", "eager"),
    ]
    qkvo = 4 * 1 * 4 * 64 * 32 * 4  # q, k, v and the output: 1x4x64x32 in fp32
    assert [c["bytes"] for c in ledger["calls"]] == [qkvo + 64 * 64, qkvo]  # SDPA also reads the bool mask
    for call in ledger["calls"]:
        assert call["achieved_gbps"] == pytest.approx(call["bytes"] / call["time_us"] / 1e3, abs=1e-3)  # CPU time
        assert call["pct_of_read_bandwidth"] is None  # a CPU has no datasheet bandwidth here
    trace = events("sdpa-math")
    sdpa = [ops_inside(trace, r, SDPA)[0]["dur"] for r in regions(trace, "attention")]
    assert ledger["calls"][0]["time_us"] == round(median(sdpa), 3)
    assert not any("bandwidth" in note for note in analysis.notes)
