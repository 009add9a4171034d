"""The dense-mask finding names its alternative in run and compare: a cell of the same run (is_causal at the
causal shape, flex's BlockMask at the same shape), or one measured for comparison, or why it cannot run.

On CPU no trace shows `dense-mask` (it needs the attention ledger, which needs device events), so the
end-to-end tests give the sdpa cells the finding as the H200 trace of a dense causal mask shows it
(tests/data/h200/masks/dense-mask.json.gz); the rest of each cell is measured for real.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

import attnprof.analysis
from attnprof.analysis import analyze_trace
from attnprof.config import Config, MeasureOptions
from attnprof.masks import Mask
from attnprof.pipeline.mask_alternatives import (
    BLOCK_MASK,
    IS_CAUSAL,
    MEASURED,
    THIS_RUN,
    Alternatives,
    attach_row_alternatives,
    wanted,
)
from attnprof.pipeline.measured import CellResult
from attnprof.plugins import load_variants
from attnprof.profiling.timing import Timing
from attnprof.registry import RunSpec
from attnprof.results.files import to_json
from attnprof.results.schema import Row

DATA = Path(__file__).parent / "data" / "h200" / "masks"
FAST = MeasureOptions(min_time_s=0.02)
CONFIG = Config(shapes=[{"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}], device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def dense_analysis():
    """The analysis of a real trace whose SDPA call got a dense bool causal mask (dense-mask fires)."""
    analysis = analyze_trace(DATA / "dense-mask.json.gz")
    assert analysis.finding("dense-mask") is not None
    return analysis


@pytest.mark.parametrize(
    ("mask", "kv_len", "same"),
    [
        (Mask("causal"), 64, True),
        (Mask("prefix", 1), 64, True),
        (Mask("prefix", 2), 64, False),
        (Mask("sliding_window", 64), 64, True),
        (Mask("sliding_window", 63), 64, False),
        (Mask("documents", 1), 64, True),
        (Mask("documents", 2), 64, False),
        (Mask("none"), 64, False),
    ],
)
def test_which_masks_keep_exactly_the_causal_pairs(mask: Mask, kv_len: int, same: bool) -> None:
    assert mask.same_as_causal(kv_len) is same
    if same:  # the closed-form pair counts agree
        assert mask.pairs(kv_len, kv_len) == Mask("causal").pairs(kv_len, kv_len)


def _key(mask: str, causal: bool = False) -> tuple:
    return RunSpec("cpu", "fp32", 1, 4, 64, 16, causal=causal, mask=mask).cell_key


def test_wanted_alternatives_per_mask() -> None:
    window = wanted("sdpa", "sliding_window:16", 64, _key("sliding_window:16"))
    assert [(w.kind, w.variants, w.measure) for w in window] == [(BLOCK_MASK, ("flex",), True)]
    assert window[0].key == _key("sliding_window:16")
    causal = wanted("sdpa-efficient", "prefix:1", 64, _key("prefix:1"))
    assert [(w.kind, w.measure) for w in causal] == [(IS_CAUSAL, True), (BLOCK_MASK, False)]
    assert causal[0].variants[:2] == ("sdpa-efficient", "sdpa")  # the same backend first, then the dispatcher
    assert causal[0].key == _key("causal", causal=True)
    assert wanted("naive", "prefix:1", 64, _key("prefix:1"))[0].variants[0] == "sdpa"
    assert [w.kind for w in wanted("sdpa-cudnn", "causal", 64, _key("causal", True))] == [BLOCK_MASK]
    assert wanted("sdpa", "none", 64, _key("none")) == []


def _row(variant: str, mask: str, latency: float | None, findings: tuple[str, ...] = (), **extra) -> Row:
    spec = RunSpec("cuda", "bf16", 4, 16, 8192, 64, mask=mask)
    row = {
        "variant": variant,
        "shape": spec.shape_label,
        "batch": 4,
        "heads": 16,
        "kv_heads": 16,
        "seq": 8192,
        "head_dim": 64,
        "dtype": "bf16",
        "device": "cuda:0",
        "causal": spec.causal,
        "mode": "fwd",
        "mask": spec.mask.text,
        "score_mod": None,
        "q_len": 8192,
        "kv_len": 8192,
        "status": "ok" if latency else "skipped: needs CUDA",
        "reason": None if latency else "needs CUDA",
        "latency_us": latency,
        "findings": [{"id": f, "message": f"{f} says so."} for f in findings],
        "mask_alternatives": [],
        **extra,
    }
    return msgspec.convert(row, Row)


def test_a_compare_names_the_cells_of_its_alternatives() -> None:
    dense = _row("sdpa", "prefix:1", 900.0, ("dense-mask",))
    rows = [
        _row("sdpa", "causal", 300.0),
        _row("flex", "causal", 500.0),
        dense,
        _row("flex", "prefix:1", 450.0),
        _row("sdpa", "sliding_window:1024", 400.0, ("dense-mask",)),
        _row("flex", "sliding_window:1024", 0.0),  # skipped
    ]
    attach_row_alternatives(rows)
    message = dense.findings[0].message
    assert message.startswith("dense-mask says so. ")
    assert (
        "SDPA with is_causal=True (sdpa at 4x16x8192x64) takes 300.0 us (a cell of this run) against this "
        "cell's 900.0 us: 3.00x faster." in message
    )
    assert "FlexAttention with a BlockMask (flex at 4x16x8192x64 prefix1) takes 450.0 us" in message
    assert [(a.kind, a.variant, a.source, a.speedup) for a in dense.mask_alternatives] == [
        (IS_CAUSAL, "sdpa", THIS_RUN, 3.0),
        (BLOCK_MASK, "flex", THIS_RUN, 2.0),
    ]
    window = rows[4]
    assert window.mask_alternatives[0].latency_us is None
    assert window.findings[0].message.endswith(
        "FlexAttention with a BlockMask (flex at 4x16x8192x64 sw1024) did not run in this run: needs CUDA."
    )
    # the impact is what the fastest alternative saves: 900 - 300 us, 66.67% of the cell's latency
    assert (dense.findings[0].impact_us, dense.findings[0].impact_pct) == (600.0, 66.67)
    assert window.findings[0].impact_us is None  # its alternative did not run: the trace's impact stays
    # the evidence names the alternative the impact comes from
    evidence = dense.findings[0].evidence
    assert (evidence["alternative_kind"], evidence["alternative_variant"], evidence["saved_us"]) == (
        IS_CAUSAL,
        "sdpa",
        600.0,
    )
    again = to_json(rows)
    attach_row_alternatives(rows)  # a resumed run's rows were joined already
    assert to_json(rows) == again
    assert rows[0].mask_alternatives == []  # no dense-mask finding, nothing joined


def test_only_a_faster_alternative_gives_an_impact() -> None:
    from attnprof.analysis.findings.judge import saved_by
    from attnprof.pipeline.measured import MaskAlternative

    slower = MaskAlternative(BLOCK_MASK, "flex", "c", THIS_RUN, 250.0, 0.4)
    faster = MaskAlternative(IS_CAUSAL, "sdpa", "c", THIS_RUN, 80.0, 1.25)
    missing = MaskAlternative(IS_CAUSAL, "sdpa", "c", THIS_RUN, reason="needs CUDA")
    assert saved_by([slower, missing], 100.0) is None and saved_by([], 100.0) is None
    assert saved_by([slower, faster], 100.0) == (20.0, 20.0)


def test_a_slower_alternative_says_so() -> None:
    rows = [_row("sdpa", "sliding_window:8192", 100.0, ("dense-mask",)), _row("flex", "sliding_window:8192", 250.0)]
    rows.append(_row("sdpa-cudnn", "causal", 80.0))  # the window covers every key: is_causal is the alternative
    attach_row_alternatives(rows)
    message = rows[0].findings[0].message
    assert (
        "(sdpa-cudnn at 4x16x8192x64) takes 80.0 us (a cell of this run) against this cell's 100.0 us: 1.25x faster"
        in message
    )
    assert (
        "flex at 4x16x8192x64 sw8192) takes 250.0 us (a cell of this run) against this cell's 100.0 us: 2.50x slower"
        in message
    )


def _dense_cell(variant: str, spec: RunSpec, analysis, latency: float = 500.0) -> CellResult:
    timing = Timing(latency, 1.0, latency, latency, latency, 10, 3, 1.0, False, "perf_counter")
    return CellResult(
        variant, "built-in", spec, timing=timing, analysis=replace(analysis, findings=list(analysis.findings))
    )


def _dense_finding(result: CellResult):
    return next(f for f in result.findings if f.id == "dense-mask")


def test_missing_alternative_is_measured_for_comparison(dense_analysis) -> None:
    spec = RunSpec("cpu", "fp32", 1, 2, 64, 16, mask="prefix:1")
    sdpa = load_variants(no_plugins=True).registry.get("sdpa-math")
    result = _dense_cell("sdpa-math", spec, dense_analysis)
    Alternatives([(sdpa, spec)]).measure(result, CONFIG, FAST)
    (alt,) = result.mask_alternatives  # flex's block mask is named only when the run has it
    assert (alt.kind, alt.variant, alt.cell, alt.source) == (IS_CAUSAL, "sdpa-math", "1x2x64x16", MEASURED)
    assert alt.latency_us is not None and alt.latency_us > 0 and alt.speedup == pytest.approx(500.0 / alt.latency_us)
    finding = _dense_finding(result)  # the judge weighs the cell's dense-mask finding with what was measured
    message = finding.message
    assert "SDPA with is_causal=True (sdpa-math at 1x2x64x16) takes " in message
    assert "(measured for comparison, outside the profiled region) against this cell's 500.0 us" in message
    if alt.latency_us < 500.0:  # the measured alternative is the time at stake
        assert finding.impact_us == pytest.approx(500.0 - alt.latency_us)
        assert finding.impact_pct == pytest.approx(100 * (500.0 - alt.latency_us) / 500.0)
    assert result.phases_s["mask_alternative"] > 0


def test_an_alternative_that_cannot_run_here_says_why(dense_analysis) -> None:
    spec = RunSpec("cpu", "fp32", 1, 2, 64, 48, mask="sliding_window:16")  # flex needs a power-of-two head_dim
    result = _dense_cell("sdpa", spec, dense_analysis)
    Alternatives([]).measure(result, CONFIG, FAST)
    (alt,) = result.mask_alternatives
    assert (alt.kind, alt.variant, alt.latency_us) == (BLOCK_MASK, "flex", None)
    assert alt.reason == "flex: flex attention needs a power-of-two head_dim >= 16 (got 48)"
    assert _dense_finding(result).message.endswith(
        "FlexAttention with a BlockMask (flex at 1x2x64x48 sw16) could not be measured for comparison here: "
        "flex: flex attention needs a power-of-two head_dim >= 16 (got 48)."
    )


def test_nothing_is_measured_when_the_plan_has_it_or_there_is_no_finding(dense_analysis) -> None:
    registry = load_variants(no_plugins=True).registry
    spec = RunSpec("cpu", "fp32", 1, 2, 64, 16, mask="sliding_window:16")
    plan = Alternatives([(registry.get("sdpa"), spec), (registry.get("flex"), spec)])
    assert plan.missing(_dense_cell("sdpa", spec, dense_analysis)) == []
    assert Alternatives([]).missing(_dense_cell("sdpa", spec, replace(dense_analysis, findings=[]))) == []
    untimed = _dense_cell("sdpa", spec, dense_analysis)
    untimed.timing = None  # --no-timing: no latency to compare with
    assert Alternatives([]).missing(untimed) == []
    assert [w.kind for w in Alternatives([]).missing(_dense_cell("sdpa", spec, dense_analysis))] == [BLOCK_MASK]


def _shapes(*masks: str) -> list[dict]:
    return [{"batch": 1, "heads": 2, "seq": 64, "head_dim": 16, "mask": m} for m in masks]


def test_compare_joins_its_own_cells(cli, write_config, tmp_path, monkeypatch, dense_analysis) -> None:
    real = attnprof.analysis.analyze_trace
    finding = dense_analysis.finding("dense-mask")

    def analyze(path, **kwargs):
        analysis = real(path, **kwargs)
        if "prefix1" in Path(path).name:
            analysis.findings = [*analysis.findings, finding]
        return analysis

    monkeypatch.setattr(attnprof.analysis, "analyze_trace", analyze)
    config = write_config(shapes=_shapes("causal", {"prefix": 1}), variants=["sdpa", "sdpa-math"], baseline="sdpa")
    result = cli("compare", str(config), "--min-time", "0.02", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {(r["variant"], r["shape"]): r for r in json.loads(result.stdout)["results"]}
    dense = rows[("sdpa-math", "1x2x64x16 prefix1")]
    (alt,) = dense["mask_alternatives"]
    causal = rows[("sdpa-math", "1x2x64x16")]
    assert (alt["kind"], alt["variant"], alt["source"], alt["latency_us"]) == (
        IS_CAUSAL,
        "sdpa-math",
        THIS_RUN,
        causal["latency_us"],
    )
    message = next(f["message"] for f in dense["findings"] if f["id"] == "dense-mask")
    assert f"(sdpa-math at 1x2x64x16) takes {causal['latency_us']:,.1f} us (a cell of this run)" in message
    assert "measured for comparison" not in message


def test_run_measures_what_it_lacks(cli, write_config, tmp_path, monkeypatch, dense_analysis) -> None:
    real = attnprof.analysis.analyze_trace
    finding = dense_analysis.finding("dense-mask")

    def analyze(path, **kwargs):
        analysis = real(path, **kwargs)
        analysis.findings = [*analysis.findings, finding]
        return analysis

    monkeypatch.setattr(attnprof.analysis, "analyze_trace", analyze)
    config = write_config(shapes=_shapes({"prefix": 1}))
    result = cli("run", str(config), "--variant", "sdpa", "--min-time", "0.02", "--wide")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "[dense-mask]" in text
    assert "SDPA with is_causal=True (sdpa at 1x2x64x16) takes " in text
    assert "(measured for comparison, outside the profiled region) against this cell's" in text
    folder = Path(str(tmp_path / "out"))
    (document,) = [json.loads(p.read_text()) for p in folder.glob("*/results.json")]
    (alt,) = document["results"][0]["mask_alternatives"]
    assert alt["source"] == MEASURED and alt["latency_us"] > 0
