"""The typed cell result and the one serializer: nothing measured is dropped, nothing missing reads 0."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from tracegen import build, fused_forward

from attnprof.analysis import analyze_trace
from attnprof.config import Config
from attnprof.pipeline.measured import CellResult, Throughput, attach_speedups, speed_basis
from attnprof.pipeline.rows import cell_row, results_document
from attnprof.profiling.clocks import ClockWindow
from attnprof.profiling.correctness import Check
from attnprof.profiling.timing import summarize
from attnprof.registry import RunSpec
from attnprof.report.tables import compare_report
from attnprof.results.files import load_results, to_builtins, to_json, write_csv, write_json
from attnprof.results.records import attention_record
from attnprof.results.schema import CELL_COLUMNS

SPEC = RunSpec("cuda:0", "bf16", 8, 16, 1024, 64)
OTHER = RunSpec("cuda:0", "bf16", 4, 16, 8192, 128)


def timed(us: float, spec: RunSpec = SPEC, variant: str = "v", **kwargs) -> CellResult:
    timing = summarize([us * 1e-6, us * 1.1e-6, us * 0.9e-6, us * 1e-6], reps=4, warmup_reps=3, cold_s=0.5,
                       method="cuda events")
    return CellResult(variant, "built-in", spec, timing=timing, **kwargs)


def full_result() -> CellResult:
    result = timed(100.0)
    result.check = Check(rel_error=1e-3, passed=True, threshold=1.5e-2, scope="subset: batches [0]")
    result.clock = ClockWindow(sm_mhz=1845, min_sm_mhz=1650, max_sm_mhz=1980, limits=("sw_power_cap",), samples=9)
    result.throughput = Throughput(tflops=500.0, pct_of_peak=65.0, peak_tflops=770.0, achieved_gbps=300.0,
                                   bound="compute")
    result.memory_mib = 12.5
    result.analysis = analyze_trace(build(fused_forward, backend="cudnn"))
    result.backend = "cudnn"
    result.phases_s = {"timing": 0.3}
    return result


def test_every_part_reaches_the_row() -> None:
    row = cell_row(full_result())
    assert row.latency_us == pytest.approx(100.0)
    assert row.latency_p25_us < row.latency_us < row.latency_p75_us
    assert row.latency_min_us == pytest.approx(90.0)
    assert (row.timing_reps, row.warmup_reps, row.forwards_per_sample) == (4, 3, 1)
    assert row.cold_ms == pytest.approx(500.0)
    assert (row.rel_error, row.passed, row.rel_error_threshold) == (1e-3, True, 1.5e-2)
    assert row.correctness_scope == "subset: batches [0]"
    assert (row.sm_clock_mhz, row.sm_clock_min_mhz, row.clock_limits) == (1845, 1650, "sw_power_cap")
    assert (row.tflops, row.pct_of_peak, row.bound) == (500.0, pytest.approx(100 * 500 / 770), "compute")
    assert row.peak_memory_mib == 12.5 and row.backend == "cudnn"
    assert row.kernels_per_forward == 1 and row.finding_ids[0]
    # the attention ledger: one cuDNN call (186.3 us kernel + 0.8 us memset) per forward, no overhead
    assert (row.attention_calls_per_forward, row.attention_backends) == (1, "cudnn:1")
    assert row.attention_time_us == pytest.approx(187.1) and row.attention_overhead_us == 0.0
    assert 90.0 < row.attention_gpu_pct <= 100.0


def test_a_skipped_cell_has_no_numbers_and_says_why() -> None:
    row = cell_row(CellResult("v", "built-in", SPEC, status="skipped", reason="needs CUDA"))
    assert row.status == "skipped: needs CUDA" and row.reason == "needs CUDA"
    measured = [k for k in CELL_COLUMNS if k not in {"variant", "source", "shape", "batch", "heads", "kv_heads", "seq",
                                                   "head_dim", "dtype", "device", "causal", "mode", "status", "reason",
                                                   "findings", "mask", "score_mod", "q_len", "kv_len",
                                                   "causal_alignment", "fully_masked_rows"}]
    assert all(getattr(row, k) is None for k in measured), {k: getattr(row, k) for k in measured if getattr(row, k)}
    assert row.findings == []


def test_the_row_holds_the_nested_parts_and_reads_back_the_same(tmp_path) -> None:
    result = full_result()
    row = cell_row(result)
    assert row.finding_ids == [f.id for f in result.findings]
    assert row.kernels and row.launch_apis and row.trace_device.name == "NVIDIA H200"
    assert row.phases_s == {"timing": 0.3}
    assert row.attention == attention_record(result.analysis.attention) and row.attention.backends == {"cudnn": 1}
    config = Config(shapes=[{"batch": 1, "heads": 1, "seq": 16, "head_dim": 16}])
    path = write_json(tmp_path / "results.json", results_document("compare", config, {}, None, [row], False))
    [read] = load_results(path).rows
    assert read == row and json.loads(to_json(read)) == to_builtins(row)


def test_csv_flattens_the_same_row(tmp_path) -> None:
    path = write_csv(tmp_path / "r.csv", [cell_row(full_result())])
    [line] = list(csv.DictReader(path.open()))
    assert list(line) == list(CELL_COLUMNS)
    assert float(line["latency_p75_us"]) == pytest.approx(cell_row(full_result()).latency_p75_us)


def test_speed_basis_prefers_the_latency() -> None:
    assert speed_basis(timed(50.0)) == ("latency_us", pytest.approx(50.0))
    untimed = CellResult("v", "built-in", SPEC, analysis=analyze_trace(build(fused_forward, backend="flash")))
    key, value = speed_basis(untimed)
    assert key == "gpu_time_us" and value == pytest.approx(untimed.analysis.gpu_time_us)
    assert speed_basis(CellResult("v", "built-in", SPEC)) is None


def test_speedups_are_per_spec_and_only_for_ok_cells() -> None:
    base, fast, failed = timed(100.0, variant="base"), timed(25.0, variant="fast"), timed(10.0, variant="bad")
    failed.status = "failed"
    elsewhere_base, elsewhere = timed(400.0, OTHER, "base"), timed(100.0, OTHER, "fast")
    results = [base, fast, failed, elsewhere_base, elsewhere]
    attach_speedups(results, "base")
    assert base.speedup_vs_baseline == pytest.approx(1.0)
    assert fast.speedup_vs_baseline == pytest.approx(4.0)
    assert failed.speedup_vs_baseline is None
    assert elsewhere.speedup_vs_baseline == pytest.approx(4.0)


def test_no_speedups_without_a_usable_baseline() -> None:
    base, fast = timed(100.0, variant="base"), timed(25.0, variant="fast")
    base.status = "failed"
    attach_speedups([base, fast], "base")
    assert fast.speedup_vs_baseline is None
    attach_speedups([fast], None)
    assert fast.speedup_vs_baseline is None


def shaky(us: float, variant: str) -> CellResult:
    """A result whose timing is unstable (IQR 50 % of the median)."""
    timing = summarize([us * 0.5e-6, us * 1e-6, us * 1e-6, us * 1.5e-6], reps=4, warmup_reps=3, cold_s=0.5,
                       method="cuda events")
    assert timing.unstable
    return CellResult(variant, "built-in", SPEC, timing=timing)


def test_a_speedup_from_an_unstable_timing_is_unreliable() -> None:
    base, steady, wobbly = timed(100.0, variant="base"), timed(25.0, variant="steady"), shaky(25.0, "wobbly")
    attach_speedups([base, steady, wobbly], "base")
    assert (base.speedup_reliable, steady.speedup_reliable, wobbly.speedup_reliable) == (True, True, False)
    base, steady = shaky(100.0, "base"), timed(25.0, variant="steady")
    attach_speedups([base, steady], "base")
    assert steady.speedup_vs_baseline == pytest.approx(4.0) and steady.speedup_reliable is False
    assert base.speedup_reliable is True  # its own 1.00x is exact


def test_profiler_time_speedups_are_not_marked_and_missing_ones_have_no_verdict() -> None:
    base = CellResult("base", "built-in", SPEC, analysis=analyze_trace(build(fused_forward, backend="flash")))
    other = CellResult("other", "built-in", SPEC, analysis=base.analysis)
    lone = timed(10.0, OTHER, "lone")
    attach_speedups([base, other, lone], "base")
    assert other.speedup_vs_baseline == pytest.approx(1.0) and other.speedup_reliable is True
    assert lone.speedup_vs_baseline is None and lone.speedup_reliable is None


def test_retimed_and_speedup_reliable_reach_json_and_csv(tmp_path) -> None:
    result = full_result()
    result.retimed, result.speedup_vs_baseline, result.speedup_reliable = 1, 4.1, False
    row, entry = cell_row(result), cell_row(result)
    assert (row.retimed, row.speedup_vs_baseline, row.speedup_reliable) == (1, 4.1, False)
    assert (entry.retimed, entry.speedup_reliable) == (1, False)
    path = write_csv(tmp_path / "r.csv", [row])
    [line] = list(csv.DictReader(path.open()))
    assert (line["retimed"], line["speedup_reliable"]) == ("1", "False")
    assert cell_row(CellResult("v", "built-in", SPEC)).retimed is None  # not timed: no count, not 0


DECODE = Path(__file__).parent / "data" / "h200" / "results" / "decode-kernel-gbps.json"


def test_a_decode_row_and_its_bandwidth_finding_say_the_same_thing() -> None:
    """On the H200, decode at batch 1 is host-bound: the row's bytes over its latency (`achieved_gbps`) are far
    below the kernel's rate, which `kernel_gbps` gives and the bandwidth finding judges (its evidence)."""
    results = load_results(DECODE)
    assert results.header.schema_version == 2 and [r.subject for r in results.rows] == ["cell"] * 3
    for row in results.rows:
        finding = row.finding("bandwidth-bound") or row.finding("memory-bound")
        assert finding is not None and row.kernel_gbps is not None and row.achieved_gbps is not None
        assert row.kernel_gbps == pytest.approx(finding.evidence["achieved_gbps"], abs=1e-3)
        assert row.kernel_gbps > 1.5 * row.achieved_gbps  # the host's share of the latency
    cudnn = results.rows[0]
    assert cudnn.variant == "sdpa-cudnn" and cudnn.kernel_gbps == pytest.approx(3622.5, abs=0.1)
    assert "kernel GB/s" in compare_report(results.rows, "table", "sdpa-cudnn", None)
