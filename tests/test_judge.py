"""The judge (`analysis.findings.judge`): a row's final findings from the trace's and what else the row
measured. Each judge rule fires and stays quiet; the registry rules that name their numbers carry them as
evidence; and no module outside analysis/findings/ makes, drops or rewrites a finding."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import msgspec
import pytest

from attnprof.analysis import analyze_trace
from attnprof.analysis.findings import Counted, Finding, Verdict, judge, judge_alternatives
from attnprof.analysis.findings.attainable import judge_attainable
from attnprof.analysis.findings.judge import (
    BLOCK_MASK,
    IS_CAUSAL,
    JUDGE_RULES,
    THIS_RUN,
    apply_timed_fixes,
    drop_by_design,
    flag_contention,
    join_counters,
    join_gpu_health,
    net_of_recording,
    saved_by,
    settle_cpu_bound,
    settle_gpu_idle,
    weigh_dense_mask,
)
from attnprof.analysis.findings.registry import HostDevice
from attnprof.model_spec import ModelSpec
from attnprof.pipeline.measured import CellResult
from attnprof.registry import RunSpec
from attnprof.results.files import to_json
from attnprof.results.parts import FindingRecord, MaskAlternative
from attnprof.results.records import finding_of, finding_record

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "tests" / "data" / "h200"
SPEC = RunSpec("cuda", "bf16", 1, 32, 1, 128, kv_len=16384)

CPU_BOUND = Finding("cpu-bound", "CPU time per forward (154.7 us) exceeds GPU time.", "problem", 27.8, 18.0)
OTHER = Finding("bandwidth-bound", "reads at 89%.", "info")
DENSE = Finding("dense-mask", "dense-mask says so.", "problem", 12.0, 1.3)


def test_the_rules_run_in_a_fixed_order() -> None:
    assert JUDGE_RULES == (
        flag_contention,
        settle_cpu_bound,
        settle_gpu_idle,
        net_of_recording,
        weigh_dense_mask,
        apply_timed_fixes,
        join_counters,
        judge_attainable,
        join_gpu_health,
        drop_by_design,
    )


def test_without_anything_beyond_the_trace_the_judge_keeps_the_trace_findings() -> None:
    assert judge(Verdict([CPU_BOUND, OTHER, DENSE])) == [CPU_BOUND, OTHER, DENSE]
    assert judge(Verdict()) == []


# ---------------------------------------------------------------- cpu-bound against the unprofiled latency


class _Analysis:
    """What a row's verdict reads of a TraceAnalysis."""

    def __init__(self, findings, gpu_time_us):
        self.findings, self.gpu_time_us, self.kernels, self.per_forward = findings, gpu_time_us, [], []
        self.device, self.attention, self.input_dtype = None, None, None  # a model row's attainable reference


@pytest.mark.parametrize("row", ["cell", "model"])
@pytest.mark.parametrize(("latency", "settled"), [(130.0, True), (160.0, False)])
def test_cpu_bound_is_settled_by_the_unprofiled_latency(latency, settled, row) -> None:
    """Decode at 16k keys on the H200: 155 us of CPU under the profiler against 127 us on the GPU, yet 130 us
    timed without it: the GPU sets the pace, and cpu-bound becomes info. At 160 us the host does show. A model
    row (timed without the profiler too) is settled alike; in a training step the words say step."""
    if row == "cell":
        result = CellResult("sdpa", "built-in", SPEC)
        unit = "forward"
    else:
        result = CellResult("sdpa", "built-in", ModelSpec("llama", "sdpa", 1, 128, "fwd+bwd", "bf16", "cuda"))
        unit = "step"
    result.analysis = _Analysis([CPU_BOUND, OTHER], 126.9)  # type: ignore[assignment]
    with patch.object(type(result), "latency_us", property(lambda self: latency)):
        findings = result.findings
    found = next(f for f in findings if f.id == "cpu-bound")
    assert findings[1] is OTHER
    if settled:
        assert (found.severity, found.impact_us, found.impact_pct) == ("info", None, None)
        assert found.message.endswith(
            f"a {unit} takes 130.0 us, within 10% of its 126.9 us on the GPU: the host time above includes the "
            "profiler's own recording, and the GPU sets the pace."
        )
        assert found.evidence == {"latency_us": 130.0, "gpu_time_us": 126.9, "margin": 1.1, "settled": True}
    else:
        assert found is CPU_BOUND


#: gpu-idle on a 1.1B Llama at seq 2048 under the profiler (the H200, 2026-12-03): its work spanned 40,401.7 us
GPU_IDLE = Finding("gpu-idle", "The GPU sat idle 29,693.5 us of the 40,401.7 us it spanned.", "problem", 29693.5, 72.9)
LLAMA = HostDevice(cpu_work_us=39800.0, sync_wait_us=16.8, gpu_busy_us=10708.2, gpu_span_us=40401.7)


@pytest.mark.parametrize(
    ("latency", "severity", "impact"),
    [
        (26318.0, "problem", 15609.8),  # sdpa's latency: idle 59% of it, more than half
        (18615.0, "info", None),  # triton-flash's: idle 42%, not more than half
        (60000.0, "problem", 29693.5),  # slower than the profiled span: the trace's idle time stands
    ],
)
def test_gpu_idle_is_at_most_the_unprofiled_latency_less_the_gpu_s_busy_time(latency, severity, impact) -> None:
    (found,) = settle_gpu_idle([GPU_IDLE], Verdict(latency_us=latency, host_device=LLAMA))
    assert found.severity == severity and found.impact_us == pytest.approx(impact)
    if latency < GPU_IDLE.impact_us:
        assert found.evidence["unprofiled_idle_us"] == pytest.approx(latency - LLAMA.gpu_busy_us)
        assert f"a forward takes {latency:,.1f} us" in found.message
        assert (found.impact_pct is None) == (severity == "info")
        if found.impact_pct is not None:
            assert found.impact_pct == pytest.approx(100 * impact / latency)
    else:
        assert found == GPU_IDLE
    assert settle_gpu_idle([GPU_IDLE], Verdict(host_device=LLAMA)) == [GPU_IDLE]  # no latency: it stands
    assert settle_gpu_idle([GPU_IDLE], Verdict(latency_us=latency)) == [GPU_IDLE]  # no device work: it stands


@pytest.mark.parametrize(("latency", "severity"), [(2000.0, "info"), (5000.0, "problem")])
def test_a_model_row_s_gpu_idle_is_judged_against_its_latency(latency, severity) -> None:
    """A 2-layer Llama on the H200 (tests/data/h200/model): under the profiler the GPU sat idle 4,635 us of each
    forward; the row's latency bounds that by the GPU's busy time from the same trace."""
    trace = H200 / "model" / "llama2l-sdpa.json.gz"
    result = CellResult("sdpa", "built-in", ModelSpec("llama", "sdpa", 1, 128, "fwd", "bf16", "cuda"))
    result.analysis = analyze_trace(trace)
    traced = next(f for f in result.analysis.findings if f.id == "gpu-idle")
    with patch.object(type(result), "latency_us", property(lambda self: latency)):
        found = next(f for f in result.findings if f.id == "gpu-idle")
    busy = found.evidence["gpu_busy_us"]
    assert 1000 < busy < 2000 and traced.impact_us > latency - busy
    assert found.severity == severity and found.evidence["unprofiled_idle_us"] == pytest.approx(latency - busy)
    assert found.impact_us == (pytest.approx(latency - busy) if severity == "problem" else None)


def test_cpu_bound_stands_without_a_latency_or_a_device_time() -> None:
    for verdict in (Verdict([CPU_BOUND], gpu_time_us=126.9), Verdict([CPU_BOUND], latency_us=130.0)):
        assert judge(verdict) == [CPU_BOUND]
    assert judge(Verdict([OTHER], latency_us=130.0, gpu_time_us=126.9)) == [OTHER]  # nothing to settle


# ---------------------------------------------------------------- dense-mask against its alternatives


def _alt(kind: str, latency: float | None, source: str = THIS_RUN, reason: str | None = None) -> MaskAlternative:
    variant = "sdpa" if kind == IS_CAUSAL else "flex"
    speedup = None if latency is None else 100.0 / latency
    return MaskAlternative(kind, variant, "4x16x8192x64", source, latency, speedup, reason)


def test_a_faster_alternative_is_the_dense_masks_impact() -> None:
    alternatives = [_alt(IS_CAUSAL, 80.0), _alt(BLOCK_MASK, 250.0)]
    (found, other) = judge(Verdict([DENSE, OTHER], latency_us=100.0, alternatives=alternatives))
    assert other is OTHER
    assert found.message == (
        "dense-mask says so. SDPA with is_causal=True (sdpa at 4x16x8192x64) takes 80.0 us (a cell of this run) "
        "against this cell's 100.0 us: 1.25x faster. FlexAttention with a BlockMask (flex at 4x16x8192x64) takes "
        "250.0 us (a cell of this run) against this cell's 100.0 us: 2.50x slower."
    )
    assert (found.impact_us, found.impact_pct) == (20.0, 20.0)
    assert found.evidence == {
        "dense_latency_us": 100.0,
        "alternative_kind": IS_CAUSAL,
        "alternative_variant": "sdpa",
        "alternative_cell": "4x16x8192x64",
        "alternative_source": THIS_RUN,
        "alternative_latency_us": 80.0,
        "saved_us": 20.0,
    }


def test_a_slower_or_missing_alternative_keeps_the_trace_impact() -> None:
    alternatives = [_alt(BLOCK_MASK, 250.0), _alt(IS_CAUSAL, None, reason="needs CUDA")]
    (found,) = judge(Verdict([DENSE], latency_us=100.0, alternatives=alternatives))
    assert (found.impact_us, found.impact_pct) == (DENSE.impact_us, DENSE.impact_pct)
    assert found.message.endswith(
        "SDPA with is_causal=True (sdpa at 4x16x8192x64) did not run in this run: needs CUDA."
    )
    assert found.evidence == {"dense_latency_us": 100.0}
    assert saved_by(alternatives, 100.0) is None


def test_dense_mask_stands_without_alternatives_or_a_latency() -> None:
    assert judge(Verdict([DENSE], latency_us=100.0)) == [DENSE]
    assert judge(Verdict([DENSE], alternatives=[_alt(IS_CAUSAL, 80.0)])) == [DENSE]
    assert judge(Verdict([OTHER], latency_us=100.0, alternatives=[_alt(IS_CAUSAL, 80.0)])) == [OTHER]


def test_alternatives_found_after_the_run_weigh_only_the_dense_mask() -> None:
    """A row's findings judged before: cpu-bound is not settled a second time, dense-mask takes the new sentences."""
    measured = judge(Verdict([DENSE], latency_us=100.0, alternatives=[_alt(IS_CAUSAL, 90.0, "measured")]))
    (again,) = judge_alternatives(measured, [_alt(BLOCK_MASK, 70.0)], 100.0)
    assert again.message.startswith(measured[0].message + " FlexAttention with a BlockMask (flex at ")
    assert (again.impact_us, again.impact_pct) == (30.0, 30.0)
    assert judge_alternatives([CPU_BOUND], [_alt(BLOCK_MASK, 70.0)], 100.0) == [CPU_BOUND]


# ---------------------------------------------------------------- counters


def test_counters_resolve_occupancy_unreported_and_add_their_findings() -> None:
    analysis = analyze_trace(H200 / "4x32x8192x128-kv8" / "sdpa-cudnn.json.gz")
    assert "occupancy-unreported" in analysis.finding_ids
    stall = Finding("stall-dominated", "wait.", "info")
    measured = Counted((stall,), frozenset(k.name for k in analysis.kernels))
    found = judge(Verdict(analysis.findings, analysis.kernels, counters=measured))
    assert [f.id for f in found] == [i for i in analysis.finding_ids if i != "occupancy-unreported"] + [stall.id]
    nothing_measured = Counted((stall,))  # the report measured none of the trace's kernels: the finding stays
    assert [f.id for f in judge(Verdict(analysis.findings, analysis.kernels, counters=nothing_measured))] == [
        *analysis.finding_ids,
        stall.id,
    ]
    twice = Counted((replace(OTHER, message="again"),))  # a counter finding already among them is not repeated
    assert judge(Verdict([OTHER], counters=twice)) == [OTHER]
    assert judge(Verdict(analysis.findings, analysis.kernels)) == analysis.findings  # without counters


# ---------------------------------------------------------------- by design


def test_a_variants_by_design_findings_are_left_out() -> None:
    assert judge(Verdict([CPU_BOUND, OTHER], by_design=frozenset({"bandwidth-bound"}))) == [CPU_BOUND]
    assert judge(Verdict([CPU_BOUND, OTHER], by_design=frozenset({"backend-fallback"}))) == [CPU_BOUND, OTHER]
    counted = Counted((Finding("stall-dominated", "wait.", "info"),))
    assert judge(Verdict([OTHER], by_design=frozenset({"stall-dominated"}), counters=counted)) == [OTHER]


# ---------------------------------------------------------------- the registry's evidence


def test_cpu_bound_names_its_cpu_and_gpu_times() -> None:
    finding = analyze_trace(H200 / "8x16x1024x64" / "flex.json.gz").finding("cpu-bound")
    assert finding is not None
    evidence = finding.evidence
    assert {"cpu_us", "gpu_us", "gpu_span_us", "sync_wait_us", "ops", "launches"} <= set(evidence)
    assert f"{evidence['cpu_us']:,.1f} us" in finding.message and f"({evidence['gpu_us']:,.1f} us of" in finding.message


@pytest.mark.parametrize(
    ("trace", "finding_id"), [("decode-flex", "memory-bound"), ("decode-flash", "bandwidth-bound")]
)
def test_memory_findings_name_the_achieved_bandwidth(trace: str, finding_id: str) -> None:
    finding = analyze_trace(H200 / "masks" / f"{trace}.json.gz").finding(finding_id)
    assert finding is not None
    evidence = finding.evidence
    assert evidence["calls"] and evidence["read_bandwidth_gbps"]
    assert f"{evidence['achieved_gbps']:,.0f} GB/s" in finding.message
    pct = evidence["pct_of_read_bandwidth"]
    assert isinstance(pct, float) and (pct < 60 if finding_id == "memory-bound" else pct >= 60)


def test_a_finding_keeps_its_evidence_through_a_row_and_back() -> None:
    finding = judge(Verdict([CPU_BOUND], latency_us=130.0, gpu_time_us=126.9))[0]
    record = finding_record(finding)
    assert record.evidence == finding.evidence and finding_of(record) == finding
    written = msgspec.convert(json.loads(to_json(record)), FindingRecord)
    assert finding_of(written) == finding
    old = msgspec.convert({"id": "x", "message": "m"}, FindingRecord)  # written before findings had evidence
    assert finding_of(old).evidence == {}


# ---------------------------------------------------------------- only findings/ makes a finding

SRC = ROOT / "src" / "attnprof"
FINDINGS_DIR = SRC / "analysis" / "findings"
#: Where a row's findings are set from the judge's output: the row is made once (rows.py), records convert.
ROW_MAKERS = {SRC / "pipeline" / "rows.py", SRC / "results" / "records.py"}
#: The findings package's functions a `.findings =` may take its list from (the registry's build, the judge).
FINDINGS_API = {"build_findings", "counter_findings", "judge", "judge_alternatives"}
FINDING_FIELDS = {"message", "severity", "impact_us", "impact_pct", "evidence"}


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return None


def _offences(source: str, name: str, row_maker: bool = False) -> list[str]:
    """What the module `name` (its text `source`) does to findings that only findings/ may do."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, name)):
        line = getattr(node, "lineno", 0)
        where = f"{name}:{line}"
        name = _called(node)
        if name == "Finding":
            found.append((line, f"{where}: constructs a Finding"))
        if name == "replace" and isinstance(node, ast.Call) and FINDING_FIELDS & {k.arg for k in node.keywords}:
            found.append((line, f"{where}: rewrites a finding"))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and not row_maker:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            sets_findings = any(isinstance(t, ast.Attribute) and t.attr == "findings" for t in targets)
            if sets_findings and (isinstance(node, ast.AugAssign) or _called(node.value) not in FINDINGS_API):
                found.append((line, f"{where}: sets findings other than from the registry or the judge"))
    return [text for _, text in sorted(found)]


def test_no_module_outside_findings_makes_drops_or_rewrites_a_finding() -> None:
    paths = [p for p in SRC.rglob("*.py") if FINDINGS_DIR not in p.parents]
    found = [o for p in paths for o in _offences(p.read_text(), str(p.relative_to(ROOT)), p in ROW_MAKERS)]
    assert found == []


def test_the_scan_catches_what_it_forbids() -> None:
    text = (
        "a.findings = [f for f in a.findings if f.id != 'x']\n"
        "b = Finding('x', 'y')\n"
        "c = replace(f, message='z')\n"
        "a.findings = judge(v)\n"
        "a.findings += other\n"
    )
    found = _offences(text, "probe.py")
    assert [line.split(": ", 1)[1] for line in found] == [
        "sets findings other than from the registry or the judge",
        "constructs a Finding",
        "rewrites a finding",
        "sets findings other than from the registry or the judge",
    ]
    assert _offences("row.findings = [finding_record(f) for f in found]\n", "rows.py", row_maker=True) == []
