"""Training steps on a real H200 (tests/data/h200/training, see its README): forward and backward phases.

PHASES pins, per region instance, what each trace holds; `raw_phase_counts` counts it again from the
raw JSON without attnprof, by another rule (the autograd thread's calls from the region's start to
the next region's start, correlated to device events), and must agree with the pins.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from analysis_json import analysis_json

from attnprof.analysis import analyze_trace

DATA = Path(__file__).parent / "data" / "h200" / "training"
KIND = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}

# trace: ((kernels, memcpy, memset) forward, (kernels, memcpy, memset) backward), the same in every instance
PHASES = {
    "bwd/8x16x1024x64/inplace": ((0, 0, 0), (8, 1, 1)),
    "bwd/8x16x1024x64/naive": ((0, 0, 0), (8, 1, 1)),
    "bwd/8x16x1024x64/sdpa-cudnn": ((0, 0, 0), (3, 0, 1)),
    "bwd/8x16x1024x64/sdpa-efficient": ((0, 0, 0), (3, 0, 0)),
    "bwd/8x16x1024x64/sdpa-flash": ((0, 0, 0), (5, 0, 0)),
    "bwd/8x16x1024x64/sdpa-math": ((0, 0, 0), (12, 0, 0)),
    "bwd/8x16x1024x64/sdpa": ((0, 0, 0), (3, 0, 1)),
    "fwd+bwd/4x16x8192x128/compiled": ((3, 0, 2), (5, 0, 4)),
    "fwd+bwd/4x16x8192x128/flex": ((1, 0, 0), (2, 0, 0)),
    "fwd+bwd/4x16x8192x128/inplace": ((11, 0, 2), (17, 1, 4)),
    "fwd+bwd/4x16x8192x128/naive": ((11, 1, 2), (17, 1, 4)),
    "fwd+bwd/4x16x8192x128/sdpa-cudnn": ((1, 0, 1), (3, 0, 1)),
    "fwd+bwd/4x16x8192x128/sdpa-efficient": ((1, 0, 0), (3, 0, 0)),
    "fwd+bwd/4x16x8192x128/sdpa-flash": ((1, 0, 0), (5, 0, 0)),
    "fwd+bwd/4x16x8192x128/sdpa-math": ((51, 0, 0), (19, 0, 0)),
    "fwd+bwd/4x16x8192x128/sdpa": ((1, 0, 1), (3, 0, 1)),
    "fwd+bwd/8x16x1024x64/compiled": ((3, 0, 1), (5, 0, 1)),
    "fwd+bwd/8x16x1024x64/flex": ((1, 0, 0), (2, 0, 0)),
    "fwd+bwd/8x16x1024x64/inplace": ((5, 0, 1), (8, 1, 1)),
    "fwd+bwd/8x16x1024x64/naive": ((5, 1, 1), (8, 1, 1)),
    "fwd+bwd/8x16x1024x64/sdpa-cudnn": ((1, 0, 1), (3, 0, 1)),
    "fwd+bwd/8x16x1024x64/sdpa-efficient": ((1, 0, 0), (3, 0, 0)),
    "fwd+bwd/8x16x1024x64/sdpa-flash": ((1, 0, 0), (5, 0, 0)),
    "fwd+bwd/8x16x1024x64/sdpa-math": ((20, 0, 0), (12, 0, 0)),
    "fwd+bwd/8x16x1024x64/sdpa": ((1, 0, 1), (3, 0, 1)),
    "fwd-then-backward/8x16x1024x64/compiled": ((3, 0, 1), (8, 0, 1)),
    "fwd-then-backward/8x16x1024x64/flex": ((1, 0, 0), (5, 0, 0)),
    "fwd-then-backward/8x16x1024x64/inplace": ((5, 0, 1), (11, 1, 1)),
    "fwd-then-backward/8x16x1024x64/naive": ((5, 1, 1), (11, 1, 1)),
    "fwd-then-backward/8x16x1024x64/sdpa-cudnn": ((1, 0, 1), (6, 0, 1)),
    "fwd-then-backward/8x16x1024x64/sdpa-efficient": ((1, 0, 0), (6, 0, 0)),
    "fwd-then-backward/8x16x1024x64/sdpa-flash": ((1, 0, 0), (8, 0, 0)),
    "fwd-then-backward/8x16x1024x64/sdpa-math": ((20, 0, 0), (15, 0, 0)),
    "fwd-then-backward/8x16x1024x64/sdpa": ((1, 0, 1), (6, 0, 1)),
    "train_step/8x16x1024x64/sdpa-flash": ((5, 0, 1), (12, 1, 0)),
}

_COMMON = {"low-occupancy-by-design", "occupancy-unreported"}
_FUSED_BWD = {"bwd-dot-do-o", "bwd-dq-convert"}
_CUDNN_BWD = _FUSED_BWD | {"bwd-memsets"}
# fp32-cuda-cores: without record_shapes the bf16 inputs are known from the kernels' names (c10::BFloat16)
_MATH = {"mask-rebuilt", "safe-softmax", "low-occupancy-by-design", "metadata-transposes", "fp32-cuda-cores",
         "backend-fallback"}
_UNFUSED = {"hidden-memcpy", *_COMMON, "metadata-transposes", "bwd-memsets", "unfused-attention"}
FINDINGS = {
    "bwd/8x16x1024x64/inplace": {"hidden-memcpy", *_COMMON, "bwd-memsets"},
    "bwd/8x16x1024x64/naive": {"hidden-memcpy", *_COMMON, "bwd-memsets"},
    "bwd/8x16x1024x64/sdpa-cudnn": {*_COMMON, "cpu-bound", *_CUDNN_BWD},
    "bwd/8x16x1024x64/sdpa-efficient": {"low-occupancy-by-design"},
    "bwd/8x16x1024x64/sdpa-flash": {*_COMMON, "cpu-bound", *_FUSED_BWD},
    "bwd/8x16x1024x64/sdpa-math": {"low-occupancy-by-design", "fp32-cuda-cores"},
    "bwd/8x16x1024x64/sdpa": {*_COMMON, "cpu-bound", *_CUDNN_BWD},
    "fwd+bwd/4x16x8192x128/compiled": {*_COMMON, "bwd-memsets", "unfused-attention"},
    "fwd+bwd/4x16x8192x128/flex": {*_COMMON, "bwd-dot-do-o"},
    "fwd+bwd/4x16x8192x128/inplace": _UNFUSED,
    "fwd+bwd/4x16x8192x128/naive": _UNFUSED,
    "fwd+bwd/4x16x8192x128/sdpa-cudnn": {*_COMMON, *_CUDNN_BWD},
    "fwd+bwd/4x16x8192x128/sdpa-efficient": {*_COMMON, "metadata-transposes"},
    "fwd+bwd/4x16x8192x128/sdpa-flash": {*_COMMON, "metadata-transposes", *_FUSED_BWD},
    "fwd+bwd/4x16x8192x128/sdpa-math": _MATH,
    "fwd+bwd/4x16x8192x128/sdpa": {*_COMMON, *_CUDNN_BWD},
    "fwd+bwd/8x16x1024x64/compiled": {*_COMMON, "cpu-bound", "bwd-memsets", "unfused-attention"},
    "fwd+bwd/8x16x1024x64/flex": {*_COMMON, "cpu-bound", "bwd-dot-do-o"},
    "fwd+bwd/8x16x1024x64/inplace": _UNFUSED,
    "fwd+bwd/8x16x1024x64/naive": _UNFUSED,
    "fwd+bwd/8x16x1024x64/sdpa-cudnn": {*_COMMON, "cpu-bound", *_CUDNN_BWD},
    "fwd+bwd/8x16x1024x64/sdpa-efficient": {"low-occupancy-by-design", "metadata-transposes"},
    "fwd+bwd/8x16x1024x64/sdpa-flash": {*_COMMON, "cpu-bound", "metadata-transposes", *_FUSED_BWD},
    "fwd+bwd/8x16x1024x64/sdpa-math": _MATH,
    "fwd+bwd/8x16x1024x64/sdpa": {*_COMMON, *_CUDNN_BWD, "cpu-bound"},
    "fwd-then-backward/8x16x1024x64/compiled": {
        *_COMMON,
        "bwd-memsets",
        "grad-accumulation",
        "cpu-bound",
        "unfused-attention",
    },
    "fwd-then-backward/8x16x1024x64/flex": {*_COMMON, "cpu-bound", "grad-accumulation", "bwd-dot-do-o"},
    "fwd-then-backward/8x16x1024x64/inplace": {*_UNFUSED, "grad-accumulation"},
    "fwd-then-backward/8x16x1024x64/naive": {*_UNFUSED, "grad-accumulation"},
    "fwd-then-backward/8x16x1024x64/sdpa-cudnn": {*_COMMON, "cpu-bound", *_CUDNN_BWD, "grad-accumulation"},
    "fwd-then-backward/8x16x1024x64/sdpa-efficient": {"low-occupancy-by-design", "metadata-transposes",
                                                      "grad-accumulation"},
    "fwd-then-backward/8x16x1024x64/sdpa-flash": {*_COMMON, "metadata-transposes", *_FUSED_BWD, "grad-accumulation",
                                                  "cpu-bound"},
    "fwd-then-backward/8x16x1024x64/sdpa-math": {*_MATH, "grad-accumulation"},
    "fwd-then-backward/8x16x1024x64/sdpa": {*_COMMON, *_CUDNN_BWD, "grad-accumulation", "cpu-bound"},
    "train_step/8x16x1024x64/sdpa-flash": {"hidden-memcpy", *_COMMON, "cpu-bound", "metadata-transposes",
                                           *_FUSED_BWD, "grad-accumulation"},
}


def _region(name: str) -> str:
    return "train_step" if name.startswith("train_step/") else "attnprof"


def _events(name: str) -> list[dict]:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def raw_phase_counts(name: str) -> list[tuple[tuple[int, ...], ...]]:
    """Per region instance, from the raw JSON: the device work of the region thread's calls inside
    the region, and of other threads' calls from the region's start to the next region's start."""
    events = _events(name)
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    regions = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"] == _region(name)
                      and any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in steps)),
                     key=lambda e: e["ts"])
    main = regions[0]["tid"]
    by_corr: dict[int, list[dict]] = {}
    for e in events:
        if e.get("cat") in KIND:
            by_corr.setdefault(e["args"]["correlation"], []).append(e)
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    result = []
    for k, r in enumerate(regions):
        start, end = r["ts"], r["ts"] + r["dur"]
        following = regions[k + 1]["ts"] if k + 1 < len(regions) else float("inf")
        forward = [c for c in calls if c["tid"] == main and start <= c["ts"] and c["ts"] + c["dur"] <= end]
        backward = [c for c in calls if c["tid"] != main and start <= c["ts"] < following]
        counts = []
        for group in (forward, backward):
            kinds = Counter(KIND[d["cat"]] for c in group for d in by_corr.get(c["args"].get("correlation"), []))
            counts.append((kinds[0], kinds[1], kinds[2]))
        result.append(tuple(counts))
    return result


@pytest.mark.parametrize("name", sorted(PHASES))
def test_raw_json_holds_the_pinned_counts(name):
    assert raw_phase_counts(name) == [PHASES[name]] * 3


@pytest.mark.parametrize("name", sorted(PHASES))
def test_phase_counts_and_findings(name):
    a = analyze_trace(DATA / f"{name}.json.gz", _region(name))
    (fk, fmc, fms), (bk, bmc, bms) = PHASES[name]
    assert a.forwards == 3
    for m in a.per_forward:  # every instance, not only the medians
        forward, backward = m.phases["forward"], m.phases["backward"]
        assert (forward.kernels, forward.memcpy, forward.memset) == (fk, fmc, fms)
        assert (backward.kernels, backward.memcpy, backward.memset) == (bk, bmc, bms)
    # the per-forward counts hold both phases
    assert (a.kernels_per_forward, a.memcpy_per_forward, a.memset_per_forward) == (fk + bk, fmc + bmc, fms + bms)
    phases = analysis_json(a)["phases"]
    assert (phases["forward"]["kernels"], phases["backward"]["kernels"]) == (fk, bk)
    assert phases["backward"]["outside_region"] is name.startswith("fwd-then-backward/")
    assert set(a.finding_ids) == FINDINGS[name]
    assert "single-fused-kernel" not in a.finding_ids  # a step with a backward is never one kernel
    assert a.annotation_mismatches in (None, 0)


def test_backward_after_the_region_is_reported_with_a_note():
    a = analyze_trace(DATA / "fwd-then-backward/8x16x1024x64/sdpa-flash.json.gz")
    assert analysis_json(a)["phases"]["backward"]["outside_region"] is True
    assert any("ran after the region ended" in n for n in a.notes)
    message = a.finding("grad-accumulation").message
    assert "3 kernel(s) per step, 37.8 us per step" in message and "CUDAFunctor_add" in message


def test_fused_backward_helpers_state_their_cost():
    a = analyze_trace(DATA / "fwd+bwd/8x16x1024x64/sdpa-flash.json.gz")
    assert "flash_bwd_dot_do_o_kernel" in a.finding("bwd-dot-do-o").message
    assert "1 kernel(s) per step, 16.6 us per step" in a.finding("bwd-dot-do-o").message
    assert "flash_bwd_convert_dq_kernel" in a.finding("bwd-dq-convert").message
    cudnn = analyze_trace(DATA / "fwd+bwd/8x16x1024x64/sdpa-cudnn.json.gz")
    assert "1 memset(s) per step, 0.8 us per step, 4 B each, launched under aten::_cudnn_attention_backward" in (
        cudnn.finding("bwd-memsets").message)
    assert "convert_dq_to_16bits" in cudnn.finding("bwd-dq-convert").message


def test_cpu_work_leaves_out_the_wait_inside_the_engine():
    """Step by step from the raw JSON: the region's wall time, less the span from the first to the
    last backward op on the autograd thread, plus those ops' own durations (they do not overlap)."""
    name = "fwd+bwd/8x16x1024x64/sdpa-flash"
    events = _events(name)
    regions = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"] == "attnprof"),
                     key=lambda e: e["ts"])
    main = regions[0]["tid"]
    tops = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] != main
            and e["name"].startswith("autograd::engine::evaluate_function:")]
    expected = []
    for r in regions:
        mine = [e for e in tops if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]]
        span = max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)
        expected.append(r["dur"] - span + sum(e["dur"] for e in mine))
    a = analyze_trace(DATA / f"{name}.json.gz")
    assert [m.cpu_work_us for m in a.per_forward] == pytest.approx(expected, abs=1e-3)
    assert all(m.cpu_work_us < m.cpu_time_us for m in a.per_forward)
    assert "without its wait inside the autograd engine" in a.finding("cpu-bound").message


@pytest.mark.parametrize("shape", ["8x16x1024x64", "4x16x8192x128"])
def test_forward_only_traces_have_no_backward(shape):
    for path in sorted((DATA.parent / shape).glob("*.json.gz")):
        d = analysis_json(analyze_trace(path))
        assert d["phases"]["backward"] == {"kernels": 0, "memcpy": 0, "memset": 0, "kernel_time_us": 0.0,
                                           "gpu_time_us": 0.0, "outside_region": False}, path.name
        forward = d["phases"]["forward"]
        assert (forward["kernels"], forward["memcpy"], forward["memset"]) == (
            d["kernels_per_forward"], d["memcpy_per_forward"], d["memset_per_forward"]), path.name
        assert not any("backward" in n for n in d["notes"]), path.name


def test_flex_backward_names_its_inductor_delta_reduction_as_the_dot_do_o_kernel() -> None:
    a = analyze_trace(DATA / "fwd+bwd/8x16x1024x64/flex.json.gz")
    message = a.finding("bwd-dot-do-o").message
    assert "triton_per_fused_flex_attention_backward_0" in message and "1 kernel(s) per step" in message
    assert "triton_tem_fused_flex_attention_backward_1" not in message  # the template kernel is the backward itself


@pytest.mark.parametrize(
    "path, unit",
    [
        ("fwd+bwd/8x16x1024x64/sdpa-math.json.gz", "step"),
        ("fwd-then-backward/8x16x1024x64/sdpa-flash.json.gz", "step"),
        ("bwd/8x16x1024x64/sdpa-cudnn.json.gz", "step"),
        ("../8x16x1024x64/sdpa-math.json.gz", "forward"),
        ("../model/llama2l-eager-train_step.json.gz", "step"),
    ],
)
def test_findings_count_per_step_when_the_instances_run_a_backward(path, unit):
    """An instance with backward work is a training step: the findings count per step, never per forward."""
    region = "train_step" if "train_step" in path else None
    analysis = analyze_trace(DATA / path, region=region)
    text = " ".join(f.message for f in analysis.findings)
    other = "forward" if unit == "step" else "step"
    assert f"per {unit}" in text, text
    assert f"per {other}" not in text and f"every {other}" not in text.lower(), text


def test_cpu_bound_on_a_backward_only_step_says_where_its_ops_ran():
    message = analyze_trace(DATA / "bwd/8x16x1024x64/sdpa-cudnn.json.gz").finding("cpu-bound").message
    assert "CPU time per step" in message and "CPU runs 0 ops" not in message
    assert message.endswith("launch calls (its ops ran on other threads).")
