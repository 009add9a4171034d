"""`attnprof diff`: matching, the threshold and spread rule, failures, findings, exit codes.

The CLI cases use tests/data/h200/results/compare.json (a real H200 compare) as BASE and a copy with
one thing changed as NEW.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import pytest

from attnprof.errors import UsageError
from attnprof.report.diff import compare_rows, diff_results, parse_threshold
from attnprof.results.schema import Row
from attnprof.results.upgrade import upgrade_row

H200 = Path(__file__).parent / "data" / "h200" / "results" / "compare.json"


def row(variant="sdpa-flash", latency=100.0, iqr=2.0, status="ok", findings="single-fused-kernel", **more) -> Row:
    """A typed cell row, read as the reader reads one: `findings` are ids (space-separated) or finding dicts,
    and a finding without a severity gets its rule's."""
    listed = findings.split() if isinstance(findings, str) else findings
    base = {
        "variant": variant,
        "shape": "8x16x1024x64",
        "dtype": "bf16",
        "device": "cuda:0",
        "causal": True,
        "mode": "fwd",
        "status": status,
        "reason": None if status == "ok" else status.partition(": ")[2],
        "latency_us": latency,
        "latency_iqr_us": iqr,
        "forwards": 3,
        "findings": [f if isinstance(f, dict) else {"id": f} for f in listed],
        "kernels_per_forward": 1,
        "peak_memory_mib": 16.0,
    }
    return msgspec.convert(upgrade_row(base | more, "cell"), Row)


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
        (110.0, 30.0, False, False),  # above the threshold but within both runs' IQRs (2 + 30 = 32 us)
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
    # an info finding is a fact, not a problem: shown, never gated on (its severity from the row, else the registry)
    facts = compare_rows(row(), row(findings="single-fused-kernel occupancy-unreported low-occupancy-by-design"), 0.05)
    assert facts.gained == [] and facts.gained_info == ["occupancy-unreported", "low-occupancy-by-design"]
    assert not facts.regressions
    said = row(
        findings=["single-fused-kernel", {"id": "cpu-bound", "message": "settled by the latency", "severity": "info"}]
    )
    assert not compare_rows(row(), said, 0.05).regressions
    lost = compare_rows(row(findings="single-fused-kernel cpu-bound"), row(), 0.05)
    assert lost.lost == ["cpu-bound"] and not lost.regressions
    skipped = compare_rows(row(), row(status="skipped: needs CUDA", latency=None, forwards=None), 0.05)
    assert not skipped.regressions and skipped.verdict == "now skipped"


def test_rows_match_by_variant_shape_dtype_causal_and_mode() -> None:
    base = [row(), row(variant="naive"), row(mode="bwd")]
    new = [row(latency=120.0), row(variant="naive", dtype="fp16"), row(mode="bwd"), row(variant="flex")]
    diff = diff_results(base, new, 0.05)
    assert [(p.new.variant, p.new.mode) for p in diff.rows] == [("sdpa-flash", "fwd"), ("sdpa-flash", "bwd")]
    assert [r.variant for r in diff.only_base] == ["naive"]
    assert [(r.variant, r.dtype) for r in diff.only_new] == [("naive", "fp16"), ("flex", "bf16")]
    assert [p.new.mode for p in diff.regressions] == ["fwd"]


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
            lambda rows: rows["inplace", "8x16x1024x64"]["findings"].append({"id": "hidden-memcpy"}),
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
    from attnprof.results.files import STREAM_FORMAT

    document = json.loads(H200.read_text())
    rows = copy.deepcopy(document["results"])
    header = {key: value for key, value in document.items() if key != "results"} | {"format": STREAM_FORMAT}
    stream = tmp_path / "results.jsonl"
    stream.write_text("\n".join([json.dumps(header)] + [json.dumps(r) for r in rows[:5]]))
    result = cli("diff", str(H200), str(stream))
    assert result.exit_code == 0 and "5 row(s) matched" in result.output


def cpu_row(latency=500.0, iqr=20.0, fastest=450.0, contention=0.05, **more):
    return row(latency=latency, iqr=iqr, device="cpu", latency_min_us=fastest, cpu_contention=contention, **more)


@pytest.mark.parametrize(
    "new, verdict, slower",
    [
        (cpu_row(700.0, fastest=640.0), "within noise: +40.0% is under the cpu noise floor of 50%", False),
        (cpu_row(1000.0, fastest=900.0), "slower by 100.0%", True),
        (
            cpu_row(1000.0, iqr=600.0, fastest=900.0),
            "within noise: +100.0% is within the runs' IQRs (620 µs together)",
            False,
        ),
        (
            cpu_row(1000.0, fastest=460.0),
            "within noise: +100.0%, but the fastest call is only +2.2% (slower calls, not all)",
            False,
        ),
        (
            cpu_row(1000.0, fastest=900.0, contention=0.77),
            "not judged: other processes took 77% of the CPU while NEW was timed",
            False,
        ),
        (cpu_row(250.0, fastest=225.0), "within noise: -50.0% is under the cpu noise floor of 50%", False),
    ],
)
def test_a_cpu_slowdown_must_beat_the_noise_between_runs(new, verdict, slower) -> None:
    pair = compare_rows(cpu_row(), new, 0.05)
    assert pair.verdict == verdict and pair.slower is slower and bool(pair.regressions) is slower


def test_a_contended_base_is_not_judged_either_and_the_summary_counts_it() -> None:
    from attnprof.report.diff import summary

    base = [cpu_row(contention=0.9), cpu_row(variant="naive")]
    new = [cpu_row(1000.0, fastest=900.0), cpu_row(600.0, variant="naive", fastest=460.0)]
    diff = diff_results(base, new, 0.05)
    assert diff.rows[0].verdict == "not judged: other processes took 90% of the CPU while BASE was timed"
    assert diff.rows[0].not_judged and not diff.regressions and diff.outcome == "not judged"
    assert summary(diff) == (
        "2 row(s) matched: no judged regression; 1 latency change(s) within noise, 1 not judged (timed while "
        "other processes held the CPU) (threshold 5.0%, noise floor cpu 50%, beyond both runs' IQRs and in the "
        "fastest call too)"
    )


def test_the_noise_floor_can_be_set_for_every_row(cli, tmp_path) -> None:
    pair = compare_rows(cpu_row(), cpu_row(700.0, fastest=640.0), 0.05, floor=0.1)
    assert pair.slower and pair.floor == 0.1
    on_gpu = compare_rows(row(), row(latency=120.0, latency_min_us=118.0), 0.05)
    assert on_gpu.floor == 0.0 and on_gpu.slower  # rows without a fastest call are judged without it
    assert cli("diff", str(H200), str(H200), "--noise-floor", "lots").exit_code == 2


CPU_PAIR = Path(__file__).parent / "data" / "results" / "cpu-back-to-back"


def test_two_real_back_to_back_cpu_compares_are_no_regression(cli) -> None:
    """Two identical default compares run one after the other on the shared 2-core CPU (issue 25: the old
    rule called one of them 49.9% slower)."""
    result = cli("diff", str(CPU_PAIR / "base.json"), str(CPU_PAIR / "new.json"), "--wide")
    assert result.exit_code == 0, result.output
    assert "no regression" in result.output


def test_a_2x_slowdown_of_a_real_cpu_compare_exits_1(cli, tmp_path) -> None:
    document = json.loads((CPU_PAIR / "new.json").read_text())
    timed = [r for r in document["results"] if r.get("latency_us")]
    for r in timed:
        for name in ("latency_us", "latency_iqr_us", "latency_p25_us", "latency_p75_us", "latency_min_us"):
            r[name] *= 2
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(document))
    result = cli("diff", str(CPU_PAIR / "base.json"), str(slow), "--format", "json")
    assert result.exit_code == 1, result.output
    verdicts = {r["variant"]: r["verdict"] for r in json.loads(result.stdout)["rows"] if r["new_latency_us"]}
    assert len(verdicts) == len(timed) >= 4
    assert all(v.startswith("slower by ") for v in verdicts.values()), verdicts


BUSY_PAIR = Path(__file__).parent / "data" / "results" / "cpu-busy-neighbour"


def test_compares_beside_a_busy_neighbour_are_not_judged_rather_than_called_slower(cli) -> None:
    """Two identical default compares run one after the other while another process kept one of the two cores
    busy: naive took 60 ms in the first and 0.43 ms in the second. Taking the second as BASE, the spread rule
    alone called the first a regression; not judged, it is no pass either: exit 3 (issue 32)."""
    base_path, new_path = BUSY_PAIR / "second.json", BUSY_PAIR / "first.json"
    rows = {
        side: {r["variant"]: r for r in json.loads(path.read_text())["results"] if r.get("latency_us")}
        for side, path in (("base", base_path), ("new", new_path))
    }
    old_rule = [
        name
        for name, b in rows["base"].items()
        if (delta := rows["new"][name]["latency_us"] - b["latency_us"]) > 0.05 * b["latency_us"]
        and delta > (b["latency_iqr_us"] + rows["new"][name]["latency_iqr_us"]) / 2
    ]
    assert old_rule, "the files no longer show what the issue saw"
    result = cli("diff", str(base_path), str(new_path), "--format", "json")
    assert result.exit_code == 3, result.output
    document = json.loads(result.stdout)
    verdicts = {r["variant"]: r["verdict"] for r in document["rows"]}
    assert all(verdicts[name].startswith("not judged: other processes took ") for name in old_rule), verdicts
    assert "not judged (timed while other processes held the CPU)" in document["summary"]
    assert document["outcome"] == "not judged" and document["not_judged"] == len(verdicts) - 2  # 2 skipped
    assert cli("diff", str(base_path), str(new_path), "--allow-unjudged").exit_code == 0
