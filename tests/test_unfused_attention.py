"""unfused-attention: eager matmul → softmax → matmul attention, its time and the estimated saving from
fusing, on the checked-in H200 Llama eager trace and on CPU traces captured here with torch.profiler."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

import pytest
from profiled import capture_cpu, inside, raw_events, regions

from attnprof.analysis import analyze_trace
from attnprof.analysis.findings import FINDINGS, Finding, TimedFix, Verdict, judge

LLAMA_EAGER = Path(__file__).parent / "data" / "h200" / "model" / "llama2l-eager.json.gz"
UNFUSED = "unfused-attention"


def finding(analysis: Any, finding_id: str = UNFUSED) -> Finding:
    found = analysis.finding(finding_id)
    assert found is not None, f"{finding_id} missing; found {analysis.finding_ids}"
    assert "\n" not in found.message and found.message.endswith(".")
    return found


def _eager_matmuls(ops: list[dict[str, Any]], region: dict[str, Any], matmul: str) -> list[dict[str, Any]]:
    """The matmul ops just before and just after each softmax of one region instance (read from the raw
    trace, apart from attnprof's recogniser)."""
    within = sorted((e for e in ops if inside(region, e)), key=lambda e: e["ts"])
    found = []
    for softmax in (e for e in within if e["name"] == "aten::softmax"):
        before = [e for e in within if e["name"] == matmul and e["ts"] + e["dur"] <= softmax["ts"]]
        after = [e for e in within if e["name"] == matmul and e["ts"] >= softmax["ts"] + softmax["dur"]]
        found += [before[-1], after[0]]
    return found


def test_the_llama_eager_trace_runs_two_unfused_calls_and_fusing_them_is_estimated_from_their_gemms():
    analysis = analyze_trace(LLAMA_EAGER)
    f = finding(analysis)
    assert f.severity == "problem"
    ev = f.evidence
    assert ev["calls"] == 2 and ev["time_base"] == "device" and ev["impact_basis"] == "estimated"
    assert ev["time_us"] == pytest.approx(analysis.attention.kernel_time_us, abs=1e-3)  # the two calls' time
    # the GEMM kernels launched inside the matmuls around each softmax, from the raw trace
    events = raw_events(LLAMA_EAGER)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    per_forward, saved = [], []
    for region in regions(events, "model_forward"):
        matmuls = _eager_matmuls(ops, region, "aten::matmul")
        spans = [
            {"ts": a["ts"], "dur": b["ts"] + b["dur"] - a["ts"]}
            for a, b in zip(matmuls[::2], matmuls[1::2], strict=True)
        ]
        gemm = calls = 0.0
        for k in kernels:
            launch = launches.get(k["args"].get("correlation"))
            if launch is not None and "nvjet" in k["name"] and any(inside(m, launch) for m in matmuls):
                gemm += k["dur"]
            if launch is not None and any(inside(span, launch) for span in spans):
                calls += k["dur"]
        per_forward.append(gemm)
        saved.append(calls - gemm)
    assert len(per_forward) == 3
    assert ev["gemm_us"] == pytest.approx(median(per_forward), abs=1e-3)
    assert ev["saved_us"] == pytest.approx(median(saved), abs=2e-2)  # the median of each forward's saving
    assert f.impact_us == pytest.approx(ev["saved_us"], abs=2e-3)
    assert f.impact_pct == pytest.approx(100 * f.impact_us / max(analysis.cpu_time_us, analysis.gpu_time_us), rel=1e-3)
    # no recorded shapes: it says how to get them, and never calls the figure timed
    assert "estimated, not timed" in f.message and "record_shapes=True" in f.message
    assert "head_dim" not in ev


@pytest.fixture(scope="module")
def qkv():
    import torch

    torch.manual_seed(0)
    return [torch.randn(2, 4, 64, 16) for _ in range(3)]


def _eager(q, k, v):
    import torch

    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def test_a_cpu_eager_attention_captured_here_fires_with_its_shape_and_cpu_time(qkv, tmp_path):
    path = capture_cpu(lambda: _eager(*qkv), tmp_path / "eager.json")
    analysis = analyze_trace(path)
    f = finding(analysis)
    ev = f.evidence
    assert ev["time_base"] == "cpu" and ev["calls"] == 1
    assert (ev["batch"], ev["heads"], ev["queries"], ev["keys"], ev["head_dim"]) == (2, 4, 64, 64, 16)
    # its matrix products: the CPU time of the aten::bmm ops of each forward, from the raw trace
    events = raw_events(path)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    bmm = []
    for region in regions(events):
        bmm.append(sum(e["dur"] for e in ops if e["name"] == "aten::bmm" and inside(region, e)))
    assert ev["gemm_us"] == pytest.approx(median(bmm), abs=1e-3)
    assert 0 < ev["saved_us"] < ev["time_us"]
    assert "--device cpu --dtype fp32 --batch 2 --heads 4 --seq 64 --head-dim 16" in f.message


def test_fused_attention_on_the_cpu_is_not_unfused(qkv, tmp_path):
    import torch.nn.functional as F

    path = capture_cpu(lambda: F.scaled_dot_product_attention(*qkv), tmp_path / "sdpa.json")
    assert analyze_trace(path).finding(UNFUSED) is None


def test_a_timed_fix_replaces_the_estimate_through_the_judge():
    estimated = FINDINGS.get(UNFUSED)
    trace_finding = Finding(UNFUSED, "Unfused.", "problem", 900.0, 45.0, {"impact_basis": "estimated"})
    other = Finding("hidden-memcpy", "A copy.", "problem", 10.0, 0.5)
    fixes = [TimedFix(UNFUSED, "sdpa-efficient", 1000.0, 400.0), TimedFix(UNFUSED, "sdpa-flash", 1000.0, 250.0)]
    judged = judge(Verdict(findings=[trace_finding, other], timed_fixes=fixes, gpu_time_us=2000.0))
    timed = next(f for f in judged if f.id == UNFUSED)
    assert estimated.severity == timed.severity == "problem"
    assert timed.impact_us == 750.0  # the fastest fix's saving
    assert timed.impact_pct == pytest.approx(37.5)  # on the base the estimate had (900 us = 45%)
    assert timed.evidence["impact_basis"] == "timed" and timed.evidence["timed_alternative"] == "sdpa-flash"
    assert (
        "Timed at this shape (in place of the estimate of 900.0 us): sdpa-flash takes 250.0 us against 1,000.0 us "
        "for the work as traced (both re-created here), saving 750.0 us per forward (also: sdpa-efficient 400.0 us)."
        in timed.message
    )
    assert timed.evidence["timed_alternatives"] == "sdpa-flash 250.0 us; sdpa-efficient 400.0 us"
    assert next(f for f in judged if f.id == "hidden-memcpy") == other
    slower = judge(Verdict(findings=[trace_finding], timed_fixes=[TimedFix(UNFUSED, "sdpa-math", 1000.0, 1200.0)]))
    assert slower[0].impact_us == 0.0
    assert judge(Verdict(findings=[trace_finding])) == [trace_finding]
