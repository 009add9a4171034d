"""Findings ranked by what they cost: each finding's severity and impact (the time per forward or step
at stake, and its share of the instance's time), cpu-bound without the waits in host syncs, host-sync
priced by the bubble it leaves, the info findings left to --wide, "What to look at", and the words
that follow the mode. On the real H200 traces in tests/data/h200 and on synthetic ones."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from analysis_json import analysis_json
from tracegen import BF16, FLASH, TraceBuilder
from typed_rows import analysed_row

from attnprof.analysis import analyze_trace
from attnprof.analysis.findings import FINDINGS
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.registry import RunSpec
from attnprof.report.analysis_tables import analyze_report, render_analysis
from attnprof.report.impact import impact_text, ranked, what_to_look_at
from attnprof.report.model_tables import model_report
from attnprof.report.tables import compare_report
from attnprof.results.parts import FindingRecord
from attnprof.results.records import finding_record
from attnprof.stats import median

H200 = Path(__file__).parent / "data" / "h200"
CEILING = 700.0  # a bf16 matmul ceiling in TFLOP/s, of the order an H200 measures
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel"


def findings_of(path: Path, **kwargs) -> dict[str, dict]:
    region = "model_forward" if path.parent.name == "model" and "train_step" not in path.name else None
    return {f["id"]: f for f in analysis_json(analyze_trace(path, region=region, **kwargs))["findings"]}


# ---------------------------------------------------------------- severity and impact on the H200 traces


@pytest.mark.parametrize("path", sorted(H200.glob("*/*.json.gz")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_finding_carries_its_rules_severity_and_info_ones_no_impact(path: Path) -> None:
    for finding in findings_of(path, ceiling_tflops=CEILING).values():
        rule = FINDINGS.get(finding["id"])  # a problem its settle judged a small cost by design is info
        assert finding["severity"] == rule.severity or (rule.settle is not None and finding["severity"] == "info")
        if finding["severity"] == "info":
            assert finding["impact_us"] is None and finding["impact_pct"] is None
        elif finding["impact_us"] is not None:
            assert finding["impact_us"] >= 0 and 0 <= finding["impact_pct"] <= 100


def test_a_hidden_memcpy_costs_the_copies_device_time() -> None:
    path = H200 / "4x16x8192x128" / "naive.json.gz"
    analysis = analyze_trace(path)
    copies = sum(k.time_us for k in analysis.kernels if k.is_dtod_memcpy)
    finding = analysis.finding("hidden-memcpy")
    assert copies > 3_000 and finding.impact_us == pytest.approx(copies)
    assert finding.impact_pct == pytest.approx(100 * copies / analysis.gpu_time_us)  # GPU-bound: the GPU's time
    assert msgspec.to_builtins(finding_record(finding)) == {
        "id": "hidden-memcpy", "message": finding.message, "severity": "problem", "impact_us": round(copies, 3),
        "impact_pct": round(finding.impact_pct, 2), "evidence": finding.evidence, "no_impact_reason": None,
    }


def test_fp32_gemms_cost_their_time_beyond_their_flops_at_the_measured_ceiling() -> None:
    """sdpa-math-bf16 (2x32x1024x128) recorded its shapes: two FP32 GEMMs of B·H·S·S·D multiply-adds each."""
    path = H200 / "masks" / "sdpa-math-bf16.json.gz"
    analysis = analyze_trace(path, ceiling_tflops=CEILING)
    gemms = [k for k in analysis.kernels if k.family == "gemm" and k.tensor_cores is False]
    assert len(gemms) == 2 and all(k.flops_per_forward == 2 * 2 * 32 * 1024 * 1024 * 128 for k in gemms)
    assert all(k.flops_per_forward is None for k in analysis.kernels if k not in gemms)
    at_ceiling = sum(k.flops_per_forward for k in gemms) / (CEILING * 1e12) * 1e6
    expected = sum(k.time_us for k in gemms) - at_ceiling
    assert analysis.finding("fp32-cuda-cores").impact_us == pytest.approx(expected)
    assert 700 < expected < 800  # 811 µs of FP32 GEMMs where tensor cores take 49 µs
    # without a measured ceiling (analyze, model) or without shapes, the cost is the GEMMs' whole device time
    assert analyze_trace(path).finding("fp32-cuda-cores").impact_us == pytest.approx(sum(k.time_us for k in gemms))
    shapeless = analyze_trace(H200 / "8x16x1024x64" / "sdpa-math.json.gz", ceiling_tflops=CEILING)
    unshaped = [k for k in shapeless.kernels if k.kind == "kernel" and k.family == "gemm" and k.tensor_cores is False]
    assert shapeless.finding("fp32-cuda-cores").impact_us == pytest.approx(sum(k.time_us for k in unshaped))


def test_backend_fallback_costs_the_math_calls_time_over_their_roofline_bound() -> None:
    analysis = analyze_trace(H200 / "masks" / "sdpa-math-bf16.json.gz", ceiling_tflops=CEILING)
    ledger = analysis.attention
    call = ledger.calls[0]
    bound = max(call.traffic.flops / (CEILING * 1e6), call.traffic.bytes / (ledger.read_bandwidth_gbps * 1e3))
    assert analysis.finding("backend-fallback").impact_us == pytest.approx(call.time_us - bound)
    # without a measured ceiling, against the 16-bit tensor peak the ledger compares with (the datasheet's here)
    datasheet = analyze_trace(H200 / "masks" / "sdpa-math-bf16.json.gz")
    peak = datasheet.attention.peaks.tensor_tflops
    read = datasheet.attention.read_bandwidth_gbps
    bound = max(call.traffic.flops / (peak * 1e6), call.traffic.bytes / (read * 1e3))
    found = datasheet.finding("backend-fallback")
    assert found.impact_us == pytest.approx(datasheet.attention.calls[0].time_us - bound)


def test_the_rebuilt_mask_costs_its_device_time_when_the_gpu_bounds_the_forward() -> None:
    analysis = analyze_trace(H200 / "8x16x1024x64" / "sdpa-math.json.gz")
    device = median([m.mask_device_us for m in analysis.per_forward])
    host = median([m.mask_host_us for m in analysis.per_forward])
    assert host > 5 * device  # the ops' CPU time is hidden under the GPU's work
    assert analysis.finding("mask-rebuilt").impact_us == pytest.approx(device)
    assert "cpu-bound" not in analysis.finding_ids


def test_a_blockmask_built_every_forward_costs_its_host_time_when_the_cpu_bounds_it() -> None:
    analysis = analyze_trace(H200 / "masks" / "flex-mask-rebuilt.json.gz")
    host = median([sum(b.host_us for b in m.attention.masks) for m in analysis.per_forward])
    assert "cpu-bound" in analysis.finding_ids
    assert analysis.finding("mask-build").impact_us == pytest.approx(host) and host > 10_000


def test_safe_softmax_costs_the_kernels_beyond_the_softmax() -> None:
    analysis = analyze_trace(H200 / "8x16x1024x64" / "sdpa-math.json.gz")
    softmax = next(k for k in analysis.kernels if k.short_name == "softmax_warp_forward")
    extra = analysis.finding("safe-softmax").impact_us
    assert extra == pytest.approx(median([m.safe_softmax_extra_us for m in analysis.per_forward]))
    assert 0 < extra and softmax.time_us > 0  # isneginf, and, fill and where over the scores: not the softmax


def test_a_dense_mask_costs_its_conversion_kernels() -> None:
    analysis = analyze_trace(H200 / "masks" / "dense-mask.json.gz")
    prep = median([sum(c.prep_time_us for c in m.attention.calls) for m in analysis.per_forward])
    assert prep > 0 and analysis.finding("dense-mask").impact_us == pytest.approx(prep)


def test_a_slow_memory_bound_call_costs_its_time_over_its_bytes_at_the_read_bandwidth() -> None:
    analysis = analyze_trace(H200 / "masks" / "decode-flex-split.json.gz")
    ledger = analysis.attention
    lost = sum(c.time_us - c.traffic.bytes / ledger.read_bandwidth_gbps / 1e3 for c in ledger.forward_calls)
    assert analysis.finding("memory-bound").impact_us == pytest.approx(lost)


def test_grad_accumulation_costs_its_kernels_per_step() -> None:
    analysis = analyze_trace(H200 / "training" / "fwd-then-backward" / "8x16x1024x64" / "sdpa-efficient.json.gz")
    time = median([sum(w.time_us for w in m.backward_roles["grad-accumulation"]) for m in analysis.per_forward])
    assert analysis.finding("grad-accumulation").impact_us == pytest.approx(time) and time > 50


# ---------------------------------------------------------------- cpu-bound leaves the sync waits out


def sync_forward(b: TraceBuilder, python_us: float = 300.0) -> None:
    """The shape of the H200 model forward at seq 8192: kernels queued far ahead of the GPU, a host sync
    that waits for them, Python before the next launches, and a sync at the end that waits again."""
    for _ in range(8):
        with b.op("aten::mm", [BF16, BF16]):
            b.kernel(GEMM, gpu_us=2_000.0)
    with b.op("aten::item"), b.op("aten::_local_scalar_dense"):
        b.memcpy("DtoH", gpu_us=1.0, nbytes=4)
        b.synchronize()
    b.advance(python_us)  # the CPU catches up: the GPU has nothing queued
    for _ in range(16):
        with b.op("aten::mm", [BF16, BF16]):
            b.kernel(GEMM, gpu_us=2_000.0)
    with b.op("aten::to"), b.op("aten::_to_copy"), b.op("aten::copy_"):
        b.memcpy("DtoH", gpu_us=1.0, nbytes=4)
        b.synchronize()


def sync_trace(python_us: float = 300.0) -> dict:
    b = TraceBuilder()
    for _ in range(3):
        with b.step(), b.region():
            sync_forward(b, python_us)
        b.advance(50.0)
    return b.to_dict()


def test_a_forward_whose_cpu_time_is_mostly_sync_waits_is_not_cpu_bound() -> None:
    """The H200 case: CPU time above the GPU's, almost all of it waiting for the GPU in syncs."""
    analysis = analyze_trace(sync_trace())
    stalls = [m.stalls for m in analysis.per_forward]
    assert analysis.cpu_time_us > analysis.gpu_time_us  # the old test: CPU time exceeds GPU time
    assert all(s.sync_wait_us > 0.9 * analysis.cpu_time_us for s in stalls)
    assert all(s.busy_us > 0.9 * s.span_us for s in stalls)  # 48 ms of kernels in its span
    assert "cpu-bound" not in analysis.finding_ids and "host-sync" in analysis.finding_ids


def test_the_model_trace_with_a_sync_is_judged_without_the_wait() -> None:
    """llama2l-eager waits 1.2 ms per forward in a cudaStreamSynchronize; counted as CPU work, the CPU's
    time would exceed the 4.5 ms the GPU is busy, without it it does not."""
    analysis = analyze_trace(H200 / "model" / "llama2l-eager.json.gz", region="model_forward")
    assert all(1_000 < m.stalls.sync_wait_us < 1_500 for m in analysis.per_forward)
    work = median([m.cpu_work_us for m in analysis.per_forward])
    waits = median([m.cpu_work_us - m.stalls.sync_wait_us for m in analysis.per_forward])
    busy = median([m.stalls.busy_us for m in analysis.per_forward])
    assert work > busy > waits
    assert "cpu-bound" not in analysis.finding_ids


def test_a_forward_that_launches_faster_than_it_computes_is_cpu_bound_by_its_launch_wait() -> None:
    b = TraceBuilder()
    for _ in range(3):
        with b.step(), b.region():
            for _ in range(20):
                with b.op("aten::add", pad=5.0):
                    b.kernel(FLASH, gpu_us=1.0)
    analysis = analyze_trace(b.to_dict())
    finding = analysis.finding("cpu-bound")
    m = analysis.per_forward[0]
    assert m.stalls.busy_us == pytest.approx(20.0)
    assert finding.impact_us == pytest.approx(median([x.cpu_work_us - x.stalls.busy_us for x in analysis.per_forward]))
    assert f"exceeds the GPU's busy time per forward ({20.0:,.1f} us of the" in finding.message
    assert finding.impact_pct == pytest.approx(100 * finding.impact_us / analysis.cpu_time_us)


# ---------------------------------------------------------------- host-sync costs its bubble, not its wait


def test_host_sync_costs_the_gpu_idle_time_after_the_sync_not_the_cpu_wait() -> None:
    trace = sync_trace(python_us=300.0)
    analysis = analyze_trace(trace)
    events = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")),
                    key=lambda e: e["ts"])
    syncs = [e for e in trace["traceEvents"] if e.get("name") == "cudaDeviceSynchronize"]
    first = syncs[0]
    returned = first["ts"] + first["dur"]
    drained = max(e["ts"] + e["dur"] for e in events if e["ts"] + e["dur"] <= returned)
    resumed = min(e["ts"] for e in events if e["ts"] >= returned)
    assert resumed - drained > 300.0  # the Python between the sync and the next launch, and the launch
    instance = analysis.per_forward[0].stalls
    assert instance.syncs[0].bubble_us == pytest.approx(resumed - drained)
    assert instance.syncs[0].wait_us > 15_000  # the wait: the GPU was busy all along
    finding = analysis.finding("host-sync")
    assert finding.impact_us == pytest.approx(median([m.stalls.sync_bubble_us for m in analysis.per_forward]))
    assert finding.impact_us < 0.1 * median([m.stalls.sync_wait_us for m in analysis.per_forward])
    assert "the GPU then idle" in finding.message
    more = analyze_trace(sync_trace(python_us=1_300.0)).finding("host-sync")
    assert more.impact_us == pytest.approx(finding.impact_us + 1_000.0)  # the bubble follows the catching up


def test_host_sync_on_the_model_trace_costs_its_bubble() -> None:
    analysis = analyze_trace(H200 / "model" / "llama2l-eager.json.gz", region="model_forward")
    finding = analysis.finding("host-sync")
    waits = median([m.stalls.sync_wait_us for m in analysis.per_forward])
    assert 50 < finding.impact_us < 200 < 1_000 < waits  # the 1.2 ms wait costs a bubble of about 0.1 ms


# ---------------------------------------------------------------- tables: problems shown, info with --wide


def test_a_fitted_analysis_shows_the_problems_and_counts_the_info_findings() -> None:
    analysis = analyze_trace(H200 / "4x16x8192x128" / "naive.json.gz")
    assert {f.severity for f in analysis.findings} == {"problem", "info"}
    fitted = render_analysis(analysis, "table", 120)
    section = " ".join(fitted[fitted.index("Findings"):].split())
    assert "[hidden-memcpy]" in section and "Impact: 3,994 µs per forward (9.1% of the forward)" in section
    assert "[low-occupancy-by-design]" not in section
    assert "3 info finding(s) not shown (facts, nothing to fix): --wide, the JSON and the report have them." in section
    wide = render_analysis(analysis, "table", None)
    assert all(f"[{f.id}]" in wide for f in analysis.findings) and "not shown" not in wide


# ---------------------------------------------------------------- What to look at


def cells(*paths: str) -> list[CellResult]:
    results = []
    for path in paths:
        shape, variant = path.split("/")
        spec = RunSpec("cuda:0", "bf16", 4, 16, 8192, 128) if shape == "4x16x8192x128" else RunSpec(
            "cuda:0", "bf16", 8, 16, 1024, 64)
        results.append(CellResult(variant.split(".")[0], "built-in", spec,
                                  analysis=analyze_trace(H200 / path, dtype="bf16", ceiling_tflops=CEILING)))
    return results


def test_compare_ends_with_the_findings_that_cost_the_most() -> None:
    entries = [cell_row(r) for r in cells("4x16x8192x128/naive.json.gz", "4x16x8192x128/sdpa-math.json.gz",
                                            "8x16x1024x64/sdpa-cudnn.json.gz", "8x16x1024x64/sdpa.json.gz")]
    text = compare_report(entries, "table", None, 200)
    look = text[text.index("What to look at"):].splitlines()
    lines = [line[2:] for line in look if line.startswith("- ")]
    expected = sorted(
        ((e.variant, e.shape, f) for e in entries for f in e.findings if (f.impact_us or 0) > 0),
        key=lambda t: (t[2].impact_pct, t[2].impact_us), reverse=True,
    )[:5]
    assert len(lines) == 5
    for line, (variant, shape, finding) in zip(lines, expected, strict=True):
        assert line == f"{finding.id} on {variant}, {shape} bf16 causal fwd: {impact_text(finding, 'forward')}"
    assert {"4x16x8192x128", "8x16x1024x64"} <= {line.split(", ")[1].split()[0] for line in lines}
    assert all(FINDINGS.get(line.split()[0]).severity == "problem" for line in lines)


def test_what_to_look_at_ranks_by_share_and_leaves_out_what_is_not_measured() -> None:
    def finding(fid: str, us: float | None, pct: float | None, severity: str = "problem") -> FindingRecord:
        return FindingRecord(id=fid, message="", severity=severity, impact_us=us, impact_pct=pct)

    found = ranked([
        ("a, 8x16x1024x64 bf16 causal fwd", "forward", [finding("cpu-bound", 50.0, 40.0),
                                                      finding("fp32-cuda-cores", None, None),
                                                      finding("hidden-memcpy", 0.0, 0.0)]),
        ("b, 4x16x8192x128 bf16 causal fwd+bwd", "step", [finding("hidden-memcpy", 4_000.0, 9.0)]),
    ])
    assert [(r.cell[0], r.finding.id) for r in found] == [("a", "cpu-bound"), ("b", "hidden-memcpy")]
    text = what_to_look_at([("b, x fwd+bwd", "step", [finding("hidden-memcpy", 4_000.0, 9.0)])], "markdown", None)
    assert text.splitlines()[0] == "### What to look at"
    assert "1. hidden-memcpy on b, x fwd+bwd: 4,000 µs per step (9% of the step)" in text
    assert what_to_look_at([("c", "forward", [finding("fp32-cuda-cores", None, None)])], "table", 80) == ""


def test_analyze_ends_with_what_to_look_at() -> None:
    analysis = analyze_trace(H200 / "model" / "llama2l-eager-train_step.json.gz")
    text = analyze_report(analysis, "table", 120)
    look = text[text.index("What to look at"):]
    assert "- cpu-bound: " in look and "µs per step" in look and "per forward" not in look
    assert analyze_report(analyze_trace(H200 / "4x16x8192x128" / "sdpa-cudnn.json.gz"), "table", 120).count(
        "What to look at") == 0  # nothing with a cost: no list


def test_the_analyze_command_prints_the_list_and_the_json_keeps_every_finding(cli) -> None:
    path = H200 / "4x16x8192x128" / "naive.json.gz"
    table = cli("analyze", str(path), env={"COLUMNS": "120"})
    assert table.exit_code == 0 and "What to look at" in table.stdout
    assert "- hidden-memcpy: 3,994 µs per forward (9.1% of the forward)" in table.stdout
    document = json.loads(cli("analyze", str(path), "--format", "json").stdout)
    assert {f["severity"] for f in document["findings"]} == {"problem", "info"}
    assert all({"impact_us", "impact_pct"} <= set(f) for f in document["findings"])


# ---------------------------------------------------------------- words follow the mode


def test_analyze_on_a_training_trace_counts_per_step() -> None:
    text = render_analysis(analyze_trace(H200 / "model" / "llama2l-eager-train_step.json.gz"), "table", None)
    assert "3 step(s)" in text and "CPU time / step" in text
    assert "µs / step" in text and "count / step" in text and "/ fwd" not in text
    assert " per forward" not in text


def test_model_rows_with_a_backward_count_per_step() -> None:
    model = {"subject": "model", "model": "llama", "batch": 2, "seq": 2048, "dtype": "bf16", "device": "cuda:0"}
    fwd = analysed_row(analyze_trace(H200 / "model" / "llama2l-sdpa.json.gz", region="model_forward"),
                       variant="sdpa", mode="fwd", **model)
    step = analysed_row(analyze_trace(H200 / "model" / "llama2l-eager-train_step.json.gz"),
                        variant="eager", mode="fwd+bwd", **model)
    rows = [fwd, step]
    text = model_report(rows, "table", "sdpa", 240)  # wide enough that no header wraps
    assert "kernels/step" in text and "kernels/fwd" not in text
    look = text[text.index("What to look at"):]
    assert "cpu-bound on eager @ 2048 fwd+bwd: " in look and "µs per step" in look
    assert "cpu-bound on sdpa @ 2048 fwd: " in look and "µs per forward" in look
    body = text[: text.index("What to look at")]
    assert "eager @ 2048 fwd+bwd [cpu-bound]: CPU time per step" in " ".join(body.split())
    assert "[low-occupancy-by-design]" not in body and "info finding(s) not shown" in " ".join(body.split())
