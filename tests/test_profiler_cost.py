"""The profiler's own recording cost: calibrated on this machine, cached, and what `analyze` judges net of it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from tracegen import MUL, TraceBuilder

from attnprof.analysis import analyze_trace
from attnprof.profiling import profiler_cost as pc

CALIBRATED_ON = "2026-12-01"


@dataclass(frozen=True)
class PerOp:
    """A cost per op given explicitly, as the cache would give it."""

    per_op_us: float
    cuda: bool = False
    measured_on: str = CALIBRATED_ON


def many_tiny_ops() -> dict:
    """3 forwards, each 10 launches of a 10 us kernel, 20 tiny 2 us ops before each: 210 ops, 462 us of CPU
    work against 100 us busy on the GPU (of a 424 us span)."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.region():
                for _ in range(10):
                    for _ in range(20):
                        b.leaf("aten::empty", dur=2.0)
                    with b.op("aten::mul"):
                        b.kernel(MUL, gpu_us=10.0)
    return b.to_dict()


def analysed(per_op_us: float | None, cuda: bool = False):
    asked: list[tuple[bool, bool]] = []

    def recording(record_shapes: bool, traced: bool) -> PerOp | None:
        asked.append((record_shapes, traced))
        return None if per_op_us is None else PerOp(per_op_us, cuda)

    analysis = analyze_trace(many_tiny_ops(), recording=recording)
    assert asked == [(False, True)]  # no Input Dims: record_shapes off; device work traced
    return analysis


def test_without_a_cost_cpu_bound_and_gpu_idle_fire_as_before():
    plain = analyze_trace(many_tiny_ops())
    for per_op in (None, 0.0):
        a = analysed(per_op)
        for finding_id in ("cpu-bound", "gpu-idle"):
            assert a.finding(finding_id) == plain.finding(finding_id)
            assert a.finding(finding_id).severity == "problem"
    assert plain.finding("cpu-bound").impact_us == pytest.approx(462.0 - 100.0)
    assert "recording_us" not in plain.finding("cpu-bound").evidence


def test_host_time_that_is_mostly_recording_is_judged_net():
    a = analysed(2.0)  # 210 ops x 2 us = 420 us of the 462 us: net 42 us, within the GPU's 100 us
    cpu = a.finding("cpu-bound")
    assert cpu.severity == "info" and cpu.impact_us is None and cpu.impact_pct is None
    assert "about 420.0 us is the profiler's own recording (210 ops x 2.00 us" in cpu.message
    assert f"on {CALIBRATED_ON}" in cpu.message and "a lower bound with CUDA activity" in cpu.message
    assert "net of it, 42.0 us is within the GPU's 100.0 us" in cpu.message
    ev = cpu.evidence
    assert (ev["recording_ops"], ev["recording_per_op_us"], ev["recording_us"], ev["net_cpu_us"]) == (
        210,
        2.0,
        420.0,
        42.0,
    )
    assert ev["recording_calibrated_on"] == CALIBRATED_ON and ev["recording_lower_bound"] is True
    idle = a.finding("gpu-idle")  # 324 us idle of a 424 us span: all of it within the recording's 420 us
    assert idle.severity == "info" and idle.impact_us is None
    assert idle.evidence["net_idle_us"] == 0.0 and idle.evidence["recording_us"] == 420.0


def test_a_small_recording_cost_lowers_the_impact_but_the_finding_stands():
    plain = analyze_trace(many_tiny_ops())
    a = analysed(0.2, cuda=True)  # 42 us of recording, calibrated with CUDA activity: not a lower bound
    cpu = a.finding("cpu-bound")
    assert cpu.severity == "problem" and cpu.impact_us == pytest.approx(462.0 - 42.0 - 100.0)
    assert cpu.impact_pct == pytest.approx(plain.finding("cpu-bound").impact_pct * 320.0 / 362.0)
    assert "still exceeds the GPU's busy time by 320.0 us" in cpu.message and "lower bound" not in cpu.message
    assert cpu.evidence["recording_lower_bound"] is False
    idle = a.finding("gpu-idle")
    assert idle.severity == "problem" and idle.impact_us == pytest.approx(324.0 - 42.0)
    assert idle.evidence["net_idle_share"] == pytest.approx(282.0 / 382.0, abs=1e-3)


def test_a_cpu_only_trace_is_not_judged_net():
    b = TraceBuilder(device_properties=[])
    for _ in range(2):
        with b.step():
            with b.region():
                for _ in range(50):
                    b.leaf("aten::empty")
    a = analyze_trace(b.to_dict(), recording=lambda rs, traced: PerOp(5.0))
    assert a.finding("cpu-bound") is None and a.finding("gpu-idle") is None


def test_calibration_runs_and_is_plausible(tmp_path):
    cost = pc.profiler_cost(record_shapes=True, path=tmp_path / "cost.json")
    assert 0.05 <= cost.per_op_us <= 50 and cost.ops >= pc.CALLS and cost.record_shapes and not cost.cuda
    assert pc.cached_cost(True, path=tmp_path / "cost.json") == cost
    assert pc.cached_cost(False, path=tmp_path / "cost.json") is None  # record_shapes is part of the key


def test_cache_round_trip_by_setting(tmp_path):
    path = tmp_path / "cost.json"
    made = []

    def calibrator(record_shapes: bool, cuda: bool) -> pc.ProfilerCost:
        made.append((record_shapes, cuda))
        return pc.ProfilerCost(0.5 if record_shapes else 0.3, record_shapes, False, 2000, "2026-12-02T10:00:00+00:00")

    assert pc.cached_cost(False, path=path) is None
    off = pc.profiler_cost(False, calibrator=calibrator, path=path)
    on = pc.profiler_cost(True, cuda=True, calibrator=calibrator, path=path)  # CUDA asked for, not available
    assert made == [(False, False), (True, True)]
    assert pc.cached_cost(False, path=path) == off and off.measured_on == "2026-12-02"
    assert pc.cached_cost(True, cuda=True, path=path) == on  # the CPU-only figure stands in for CUDA
    entries = json.loads(path.read_text())["entries"]
    assert sorted(k.rsplit("|", 2)[1:] for k in entries) == [
        ["record_shapes=False", "cpu"],
        ["record_shapes=True", "cpu"],
    ]
    path.write_text("not json")
    assert pc.cached_cost(False, path=path) is None


def test_analyze_uses_the_cached_cost_and_says_how_to_get_one(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path))
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(many_tiny_ops()))
    first = cli("analyze", str(trace), "--format", "json")
    assert first.exit_code == 0, first.output
    assert "--calibrate-profiler measures its cost" in first.stderr
    cpu = next(f for f in json.loads(first.stdout)["findings"] if f["id"] == "cpu-bound")
    assert cpu["severity"] == "problem" and "recording_us" not in cpu["evidence"]
    pc.profiler_cost(
        False, calibrator=lambda rs, cuda: pc.ProfilerCost(2.0, rs, False, 2000, "2026-12-02T10:00:00+00:00")
    )
    second = cli("analyze", str(trace), "--format", "json")
    assert second.exit_code == 0 and "--calibrate-profiler" not in second.stderr
    cpu = next(f for f in json.loads(second.stdout)["findings"] if f["id"] == "cpu-bound")
    assert cpu["severity"] == "info" and cpu["evidence"]["recording_us"] == 420.0


def test_analyze_calibrate_profiler_measures_and_caches(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path))
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(many_tiny_ops()))
    result = cli("analyze", str(trace), "--format", "json", "--calibrate-profiler")
    assert result.exit_code == 0, result.output
    cached = pc.cached_cost(False, cuda=True)
    assert cached is not None and 0.05 <= cached.per_op_us <= 50
    cpu = next(f for f in json.loads(result.stdout)["findings"] if f["id"] == "cpu-bound")
    assert cpu["evidence"]["recording_per_op_us"] == pytest.approx(cached.per_op_us, abs=1e-3)


@pytest.mark.gpu
def test_calibration_with_cuda_activity(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cost = pc.profiler_cost(record_shapes=False, cuda=True, path=tmp_path / "cost.json")
    assert cost.cuda and 0.05 <= cost.per_op_us <= 50
    assert pc.cached_cost(False, cuda=True, path=tmp_path / "cost.json") == cost


def test_the_judge_nets_once_and_leaves_a_settled_finding():
    from attnprof.analysis.findings import Finding, RecordingCost, Verdict, judge

    evidence = {"cpu_us": 462.0, "gpu_us": 100.0, "ops": 210}
    found = Finding("cpu-bound", "CPU time exceeds GPU time.", "problem", 362.0, 78.0, evidence)
    recording = RecordingCost(210, 0.2, CALIBRATED_ON)
    once = judge(Verdict([found], recording=recording))
    assert once[0].impact_us == pytest.approx(320.0) and once[0].evidence["net_cpu_us"] == 420.0
    assert judge(Verdict(once, recording=recording)) == once  # attach_counters judges the findings again
    settled = Verdict([found], recording=recording, latency_us=101.0, gpu_time_us=100.0)
    assert "net_cpu_us" not in judge(settled)[0].evidence  # the unprofiled latency settled it first
    assert judge(Verdict([found])) == [found]


def test_a_calibration_under_contention_is_refused_and_not_cached(tmp_path, monkeypatch, cli):
    """Other processes held the CPU while it was calibrated: it measured them too, so analyze says so in one
    line, exits 3 and caches nothing."""

    class Busy:
        @classmethod
        def start(cls) -> Busy:
            return cls()

        def others(self) -> float:
            return 0.7

    monkeypatch.setattr(pc, "CpuShare", Busy)
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path))
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(many_tiny_ops()))
    result = cli("analyze", str(trace), "--calibrate-profiler")
    assert result.exit_code == 3, result.output
    assert "other processes took 70% of the CPU: not cached, not used" in result.stderr
    assert "Traceback" not in result.output
    assert pc.cached_cost(False) is None and pc.cached_cost(False, cuda=True) is None
