"""`fp8-not-faster`: an fp8 row against the fastest bf16 row of its shape and mode in the same run, through the
judge after the run (`pipeline.fp8_compare`)."""

from __future__ import annotations

import pytest

from attnprof.analysis.findings import FINDING_IDS, FINDINGS, judge_fp8
from attnprof.analysis.findings.registry import Fp8AgainstBf16
from attnprof.pipeline.fp8_compare import attach_fp8_comparisons
from attnprof.results.schema import Row

SHAPE = {"subject": "cell", "device": "cuda:0", "batch": 1, "heads": 64, "kv_heads": 8, "seq": 32768,
         "head_dim": 128, "causal": True, "mask": "causal"}


def row(variant: str, dtype: str, latency_us: float, mode: str = "bwd", **fields) -> Row:
    return Row(variant=variant, dtype=dtype, latency_us=latency_us, mode=mode, **(SHAPE | {"status": "ok"} | fields))


def finding(r: Row):
    return next((f for f in r.findings if f.id == "fp8-not-faster"), None)


def test_the_rule_is_registered_as_a_problem_with_its_paragraph() -> None:
    assert "fp8-not-faster" in FINDING_IDS
    rule = FINDINGS.get("fp8-not-faster")
    assert rule.severity == "problem" and "bf16" in rule.summary


def test_an_fp8_backward_slower_than_the_fastest_bf16_gets_the_finding_with_the_time_as_impact() -> None:
    # cudnn-frontend's H200 figures at 1x64x32k x128/kv8 causal: fp8 backward 370 TFLOP/s, bf16 581
    rows = [
        row("cudnn-fe", "bf16", 6000.0),
        row("sdpa-cudnn", "bf16", 6500.0),
        row("cudnn-fe-fp8", "fp8", 6000.0 * 581 / 370),
    ]
    attach_fp8_comparisons(rows)
    fp8 = finding(rows[2])
    assert fp8 is not None and fp8.severity == "problem"
    assert fp8.impact_us == pytest.approx(6000.0 * 581 / 370 - 6000.0, abs=1e-3)
    assert fp8.impact_pct == pytest.approx(100.0 * (1 - 370 / 581), abs=0.01)
    assert fp8.evidence["bf16_variant"] == "cudnn-fe" and fp8.evidence["bf16_latency_us"] == 6000.0
    assert "fp8 took 9,421.6 µs, 1.57x the 6,000.0 µs of cudnn-fe in bf16" in fp8.message
    assert finding(rows[0]) is None and finding(rows[1]) is None  # bf16 rows are not judged


def test_a_faster_fp8_row_or_one_within_the_noise_margin_has_none() -> None:
    rows = [row("cudnn-fe", "bf16", 1000.0), row("a", "fp8", 600.0), row("b", "fp8_e5m2", 1015.0)]
    attach_fp8_comparisons(rows)
    assert finding(rows[1]) is None and finding(rows[2]) is None


def test_only_the_same_shape_and_mode_in_the_run_counts() -> None:
    rows = [
        row("cudnn-fe", "bf16", 1000.0, mode="fwd"),
        row("cudnn-fe-fp8", "fp8", 2000.0, mode="bwd"),  # no bf16 bwd row
        row("cudnn-fe-fp8", "fp8", 2000.0, mode="fwd", seq=8192),  # another shape
        row("cudnn-fe", "bf16", 500.0, mode="fwd", status="failed", reason="x"),  # not timed
    ]
    attach_fp8_comparisons(rows)
    assert all(finding(r) is None for r in rows)


def test_judged_again_the_row_holds_one_fp8_not_faster_and_keeps_its_other_findings() -> None:
    rows = [row("cudnn-fe", "bf16", 1000.0), row("cudnn-fe-fp8", "fp8", 1500.0)]
    attach_fp8_comparisons(rows)
    first = list(rows[1].findings)
    attach_fp8_comparisons(rows)  # a resumed run judges its rows again
    assert [f.id for f in rows[1].findings] == [f.id for f in first] == ["fp8-not-faster"]


def test_the_judge_keeps_other_findings_and_drops_a_stale_fp8_not_faster() -> None:
    slow = Fp8AgainstBf16("fp8", 1500.0, "cudnn-fe", 1000.0)
    judged = judge_fp8([], slow, "step")
    assert [f.id for f in judged] == ["fp8-not-faster"]
    fast = Fp8AgainstBf16("fp8", 800.0, "cudnn-fe", 1000.0)
    assert judge_fp8(judged, fast, "step") == []


def test_an_fp8_row_is_sped_up_against_the_baselines_bf16_row_when_the_baseline_runs_no_fp8() -> None:
    from attnprof.pipeline.resume import attach_row_speedups
    from attnprof.report.columns import speedup_text
    from attnprof.results.schema import Row

    def row(variant: str, dtype: str, latency: float | None, status: str = "ok") -> Row:
        return Row(variant=variant, dtype=dtype, device="cuda:0", batch=1, heads=64, kv_heads=8, seq=8192,
                   head_dim=128, causal=True, mode="fwd", mask="causal", shape="1x64x8192x128/kv8",
                   status=status, latency_us=latency)

    rows = [
        row("sdpa-cudnn", "bf16", 2000.0),
        row("cudnn-fe", "bf16", 1980.0),
        row("sdpa-cudnn", "fp8", None, "skipped: needs dtype bf16/fp16/fp32 (got fp8)"),
        row("cudnn-fe-fp8", "fp8", 1250.0),
        row("cudnn-fe-fp8", "bf16", None, "skipped: needs dtype fp8 (got bf16)"),
    ]
    attach_row_speedups(rows, "sdpa-cudnn")
    base, bf16, _, fp8, _ = rows
    assert (base.speedup_vs_baseline, base.speedup_vs_dtype) == (1.0, None)
    assert bf16.speedup_vs_baseline == pytest.approx(2000 / 1980) and bf16.speedup_vs_dtype is None
    assert fp8.speedup_vs_baseline == pytest.approx(1.6) and fp8.speedup_vs_dtype == "bf16"
    assert speedup_text(fp8) == "1.60x vs bf16" and speedup_text(bf16) == "1.01x"
    rows[2] = row("sdpa-cudnn", "fp8", 1000.0)  # a baseline that runs fp8 is the fp8 row's own
    attach_row_speedups(rows, "sdpa-cudnn")
    assert rows[3].speedup_vs_baseline == pytest.approx(0.8) and rows[3].speedup_vs_dtype is None
