"""`attnprof diff`: matching, the threshold and spread rule, failures, findings, exit codes.

The CLI cases use tests/data/h200/results/compare.json (a real H200 compare) as BASE and a copy with
one thing changed as NEW.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from attnprof.errors import UsageError
from attnprof.report.diff import compare_rows, diff_results, parse_threshold

H200 = Path(__file__).parent / "data" / "h200" / "results" / "compare.json"


def row(variant="sdpa-flash", latency=100.0, iqr=2.0, status="ok", findings="single-fused-kernel", **more):
    base = {
        "variant": variant,
        "shape": "8x16x1024x64",
        "dtype": "bf16",
        "causal": True,
        "mode": "fwd",
        "status": status,
        "reason": None if status == "ok" else status.partition(": ")[2],
        "latency_us": latency,
        "latency_iqr_us": iqr,
        "forwards": 3,
        "finding_ids": findings,
        "kernels_per_forward": 1,
        "peak_memory_mib": 16.0,
    }
    return base | more


@pytest.mark.parametrize("text, fraction", [("5%", 0.05), ("0.05", 0.05), ("12.5 %", 0.125), ("0", 0.0)])
def test_threshold_as_percent_or_fraction(text, fraction) -> None:
    assert parse_threshold(text) == pytest.approx(fraction)


@pytest.mark.parametrize("text", ["abc", "-5%", "5%%", ""])
def test_bad_threshold(text) -> None:
    with pytest.raises(UsageError, match="--threshold"):
        parse_threshold(text)


@pytest.mark.parametrize(
    "new_latency, new_iqr, slower, faster",
    [
        (110.0, 2.0, True, False),  # 10% > 5% and 10 us > the 2 us spread
        (104.0, 2.0, False, False),  # within the threshold
        (110.0, 30.0, False, False),  # above the threshold but within the spread ((2 + 30) / 2 = 16 us)
        (90.0, 2.0, False, True),
    ],
)
def test_slower_means_beyond_the_threshold_and_the_spread(new_latency, new_iqr, slower, faster) -> None:
    pair = compare_rows(row(), row(latency=new_latency, iqr=new_iqr), 0.05)
    assert (pair.slower, pair.faster) == (slower, faster)
    assert pair.change == pytest.approx(new_latency / 100 - 1)
    assert bool(pair.regressions) is slower


def test_failures_and_findings() -> None:
    failing = compare_rows(row(), row(status="failed: out of memory: 8 GiB", latency=None, forwards=None), 0.05)
    assert failing.started_failing and failing.regressions == ["started failing: out of memory: 8 GiB"]
    assert failing.gained == []  # a failed row was not analysed: no finding changes read from it
    fixed = compare_rows(row(status="failed: NaN in output"), row(), 0.05)
    assert fixed.fixed and not fixed.regressions and fixed.verdict == "fixed"
    still = compare_rows(row(status="failed: x"), row(status="failed: y"), 0.05)
    assert not still.regressions and still.verdict == "still failing"
    gained = compare_rows(row(), row(findings="single-fused-kernel hidden-memcpy"), 0.05)
    assert gained.regressions == ["gained hidden-memcpy"]
    lost = compare_rows(row(findings="single-fused-kernel cpu-bound"), row(), 0.05)
    assert lost.lost == ["cpu-bound"] and not lost.regressions
    skipped = compare_rows(row(), row(status="skipped: needs CUDA", latency=None, forwards=None), 0.05)
    assert not skipped.regressions and skipped.verdict == "now skipped"


def test_rows_match_by_variant_shape_dtype_causal_and_mode() -> None:
    base = [row(), row(variant="naive"), row(mode="bwd")]
    new = [row(latency=120.0), row(variant="naive", dtype="fp16"), row(mode="bwd"), row(variant="flex")]
    diff = diff_results(base, new, 0.05)
    assert [(p.new["variant"], p.new["mode"]) for p in diff.rows] == [("sdpa-flash", "fwd"), ("sdpa-flash", "bwd")]
    assert [r["variant"] for r in diff.only_base] == ["naive"]
    assert [(r["variant"], r["dtype"]) for r in diff.only_new] == [("naive", "fp16"), ("flex", "bf16")]
    assert [p.new["mode"] for p in diff.regressions] == ["fwd"]


def write(tmp_path: Path, name: str, change=None) -> Path:
    document = json.loads(H200.read_text())
    if change:
        change({(r["variant"], r["shape"]): r for r in document["results"]})
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_the_same_results_are_no_regression(cli) -> None:
    result = cli("diff", str(H200), str(H200))
    assert result.exit_code == 0, result.output
    assert "33 row(s) matched: no regression" in result.output
    assert "sdpa-cudnn" in result.output and "+0.0%" in result.output


@pytest.mark.parametrize(
    "change, verdict",
    [
        (lambda rows: rows["sdpa-flash", "8x16x1024x64"].update(latency_us=130.0), "slower by 36.1%"),
        (
            lambda rows: rows["naive", "4x16x8192x128"].update(
                status="failed: out of memory: x", reason="out of memory: x"
            ),
            "started failing: out of memory: x",
        ),
        (
            lambda rows: rows["inplace", "8x16x1024x64"].update(
                finding_ids=rows["inplace", "8x16x1024x64"]["finding_ids"] + " hidden-memcpy"
            ),
            "gained hidden-memcpy",
        ),
    ],
)
def test_a_regression_exits_1_and_is_named(cli, tmp_path, change, verdict) -> None:
    new = write(tmp_path, "new.json", change)
    result = cli("diff", str(H200), str(new), "--wide")
    assert result.exit_code == 1, result.output
    assert verdict in result.output and "1 regression(s)" in result.output


def test_threshold_decides(cli, tmp_path) -> None:
    new = write(tmp_path, "new.json", lambda rows: rows["sdpa-flash", "8x16x1024x64"].update(latency_us=110.0))
    assert cli("diff", str(H200), str(new)).exit_code == 1  # +15.2%
    assert cli("diff", str(H200), str(new), "--threshold", "20%").exit_code == 0
    assert cli("diff", str(H200), str(new), "--threshold", "0.2").exit_code == 0


def test_json_and_unmatched_rows(cli, tmp_path) -> None:
    def drop_and_change(rows):
        rows["sdpa-cudnn", "8x16x1024x64"].update(shape="8x16x2048x64", seq=2048)
        rows["sdpa-flash", "8x16x1024x64"].update(kernels_per_forward=2)

    new = write(tmp_path, "new.json", drop_and_change)
    result = cli("diff", str(H200), str(new), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["regressions"] == 0 and document["threshold"] == 0.05
    assert document["only_in_base"] == [
        {"variant": "sdpa-cudnn", "shape": "8x16x1024x64", "dtype": "bf16", "causal": True, "mode": "fwd"}
    ]
    assert [r["shape"] for r in document["only_in_new"]] == ["8x16x2048x64"]
    flash = next(r for r in document["rows"] if r["variant"] == "sdpa-flash" and r["shape"] == "8x16x1024x64")
    assert (flash["base_kernels_per_forward"], flash["new_kernels_per_forward"]) == (1, 2)
    table = cli("diff", str(H200), str(new), "--wide").output
    assert "only in BASE: sdpa-cudnn @ 8x16x1024x64 bf16 causal fwd" in table and "1 → 2" in table


def test_bad_input_exits_2(cli, tmp_path) -> None:
    assert cli("diff", str(H200), str(tmp_path / "missing.json")).exit_code == 2
    assert cli("diff", str(H200), str(H200), "--threshold", "five").exit_code == 2
    other = write(tmp_path, "other.json", lambda rows: [r.update(dtype="fp16") for r in rows.values()])
    result = cli("diff", str(H200), str(other))
    assert result.exit_code == 2 and "no row of" in result.output and "Traceback" not in result.output
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2]")
    assert cli("diff", str(broken), str(H200)).exit_code == 2


def test_diff_reads_a_sweep_stream(cli, tmp_path) -> None:
    from attnprof.report.results_file import stream_header

    document = json.loads(H200.read_text())
    rows = copy.deepcopy(document["results"])
    stream = tmp_path / "results.jsonl"
    stream.write_text("\n".join([json.dumps(stream_header(document))] + [json.dumps(r) for r in rows[:5]]))
    result = cli("diff", str(H200), str(stream))
    assert result.exit_code == 0 and "5 row(s) matched" in result.output
