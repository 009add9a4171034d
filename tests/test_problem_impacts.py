"""Every `problem` finding carries an impact or says why it cannot (`no_impact_reason`): every registered
rule, walked over every checked-in trace (with and without a measured matmul ceiling) and the checked-in
Nsight Compute pages; and `fp32-cuda-cores` gives the FP32 GEMMs' time, `info` when it is a small cost by
design outside the attention calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.analysis import analyze_trace
from attnprof.analysis.counters import counters_for_cell, load_counters
from attnprof.analysis.findings import FINDINGS, Counted, Finding
from attnprof.analysis.findings.forward import BY_DESIGN_SHARE
from attnprof.analysis.findings.registry import NO_IMPACT_REASONS, FindingRegistry, NoImpact, Rule
from attnprof.errors import TraceError
from attnprof.peaks import measured_peaks
from attnprof.registry import RunSpec
from attnprof.results.records import finding_of, finding_record

DATA = Path(__file__).parent / "data"
TRACES = sorted(DATA.rglob("*.json.gz"))
#: The ceiling `run` measures for bf16 on the H200, about (the branch of the impacts that reads one).
H200_CEILING_TFLOPS = 800.0


def _problems_lack_nothing(found: list[Finding]) -> list[str]:
    """The problem findings with neither an impact nor a known reason."""
    return [
        f"{f.id}: {f.no_impact_reason!r}"
        for f in found
        if f.severity == "problem" and f.impact_us is None and f.no_impact_reason not in NO_IMPACT_REASONS
    ]


def test_every_problem_rule_has_an_impact_function() -> None:
    problems = [rule.id for rule in FINDINGS if rule.severity == "problem"]
    assert problems and all(FINDINGS.get(i).impact is not None for i in problems)


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(DATA)))
@pytest.mark.parametrize("ceiling", [None, H200_CEILING_TFLOPS], ids=["analyze", "measured-ceiling"])
def test_every_problem_finding_on_the_checked_in_traces_has_an_impact_or_a_reason(
    trace: Path, ceiling: float | None
) -> None:
    try:
        analysis = analyze_trace(trace, ceiling_tflops=ceiling)
    except TraceError:
        pytest.skip("a trace the analysis refuses (its golden file says why)")
    assert _problems_lack_nothing(analysis.findings) == []
    for finding in analysis.findings:  # the reason survives a row's record
        assert finding_of(finding_record(finding)).no_impact_reason == finding.no_impact_reason


@pytest.mark.parametrize("page", sorted((DATA / "h200" / "ncu").glob("*-fwd.raw.csv")), ids=lambda p: p.name)
def test_every_counter_problem_has_an_impact_or_a_reason(page: Path) -> None:
    spec = RunSpec("cuda", "bf16", 1, 64, 16384, 128, 8, causal=True)
    counters = counters_for_cell(load_counters(page), spec, measured_peaks(None), seconds=1.0, report_path=str(page))
    assert _problems_lack_nothing(list(Counted.of(counters, []).findings)) == []


def test_a_problem_that_cannot_be_measured_says_why() -> None:
    registry = FindingRegistry(
        [Rule("unmeasured", "problem", "A rule.", "Its paragraph.", lambda ctx: "found", _no_shapes)]
    )
    (finding,) = registry.build(_context())
    assert (finding.severity, finding.impact_us, finding.no_impact_reason) == ("problem", None, "needs-record-shapes")
    assert json.loads(json.dumps(finding_record(finding).no_impact_reason)) == "needs-record-shapes"


def _no_shapes(ctx: object) -> NoImpact:
    """Nothing: the shapes are missing."""
    return NoImpact("needs-record-shapes")


def _context():
    from attnprof.analysis.findings import FindingContext

    return FindingContext([], [], None, None, 100.0, None)


# --------------------------------------------------------------------------- fp32-cuda-cores


MODELS = ["llama2l-sdpa", "llama2l-eager", "llama2l-flex_attention", "llama2l-sdpa-record_shapes"]


@pytest.mark.parametrize("name", MODELS)
def test_the_rotary_embedding_s_fp32_gemm_is_info_by_design_with_its_time(name: str) -> None:
    """HF's rotary embedding computes in FP32 on every implementation: a few µs of a multi-ms forward, outside
    the attention calls, is `info`, with the GEMM's time in its evidence."""
    analysis = analyze_trace(DATA / "h200" / "model" / f"{name}.json.gz", dtype="bf16")
    finding = analysis.finding("fp32-cuda-cores")
    assert finding is not None and finding.severity == "info" and finding.impact_us is None
    gemm = next(k for k in analysis.kernels if k.family == "gemm" and k.tensor_cores is False)
    assert finding.evidence["fp32_gemm_us"] == pytest.approx(gemm.time_us, abs=1e-3)
    share = 100.0 * gemm.time_us / max(analysis.cpu_time_us, analysis.gpu_time_us or 0.0)
    assert finding.evidence["share_pct"] == pytest.approx(share, abs=1e-3) and share < 100 * BY_DESIGN_SHARE
    assert "by design" in finding.message and "outside the attention calls" in finding.message


def test_fp32_gemms_inside_the_attention_calls_stay_a_problem_timed_by_their_kernels() -> None:
    """SDPA's math backend upcasts to FP32: its GEMMs run inside the calls, a problem whatever their share,
    with their device time as the impact when no matmul ceiling was measured."""
    trace = DATA / "h200" / "masks" / "sdpa-math-bf16.json.gz"  # record_shapes: the GEMMs' FLOPs are known
    analysis = analyze_trace(trace)
    finding = analysis.finding("fp32-cuda-cores")
    assert finding is not None and finding.severity == "problem"
    gemms = [k for k in analysis.kernels if k.kind == "kernel" and k.family == "gemm" and k.tensor_cores is False]
    assert finding.impact_us == pytest.approx(sum(k.time_us for k in gemms), abs=1e-6)
    excess = analyze_trace(trace, ceiling_tflops=H200_CEILING_TFLOPS).finding("fp32-cuda-cores")
    at_ceiling = sum(k.flops_per_forward or 0.0 for k in gemms) / (H200_CEILING_TFLOPS * 1e6)  # µs
    assert excess is not None and excess.impact_us == pytest.approx(finding.impact_us - at_ceiling, abs=1e-3)


def test_backend_fallback_is_weighed_against_the_ledger_s_peaks_without_a_measured_ceiling() -> None:
    analysis = analyze_trace(DATA / "h200" / "masks" / "sdpa-math-bf16.json.gz")
    finding = analysis.finding("backend-fallback")
    assert finding is not None and finding.impact_us is not None and finding.impact_us > 0
    math = [c for c in analysis.attention.calls if c.backend == "math" and c.phase == "forward"]  # type: ignore[union-attr]
    assert finding.impact_us < sum(c.time_us for c in math)  # the time above the bound, not all of it


def test_backend_fallback_without_the_calls_shapes_says_it_needs_them() -> None:
    finding = analyze_trace(DATA / "h200" / "8x16x1024x64" / "sdpa-math.json.gz").finding("backend-fallback")
    assert finding is not None and finding.impact_us is None and finding.no_impact_reason == "needs-record-shapes"
