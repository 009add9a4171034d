"""`diff` and `check` exit 3 when they could not judge (issue 32): a latency timed while other processes held
the CPU, or two unstable timings whose comparison lies within their spread, with the reason said; a judged
regression or miss still exits 1 (1 > 3 > 0); `--allow-unjudged` makes 3 a 0.

The results files are written from typed rows (`results.schema.Row` in a `Document`), as attnprof writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnprof.report.diff import compare_rows
from attnprof.results.files import write_json
from attnprof.results.schema import Document, Row

CELL = "1x4x256x64 fp32 causal fwd"


def cell(variant: str = "sdpa", latency: float | None = 100.0, iqr: float = 2.0, **more) -> Row:
    """An ok CPU row at one cell, timed on a quiet machine unless `cpu_contention` says otherwise; its fastest
    call 5% under its median."""
    fields = {
        "variant": variant,
        "shape": "1x4x256x64",
        "batch": 1,
        "heads": 4,
        "kv_heads": 4,
        "seq": 256,
        "head_dim": 64,
        "dtype": "fp32",
        "device": "cpu",
        "causal": True,
        "mode": "fwd",
        "status": "ok",
        "latency_us": latency,
        "latency_iqr_us": iqr,
        "latency_min_us": None if latency is None else latency * 0.95,
        "unstable": False,
        "cpu_contention": 0.02,
        "kernels_per_forward": 3,
    }
    return Row(**(fields | more))


def results(tmp_path: Path, name: str, *rows: Row) -> str:
    """A results file of `rows` (written again when it exists)."""
    (tmp_path / name).unlink(missing_ok=True)
    return str(write_json(tmp_path / name, Document(command="compare", results=list(rows))))


# --------------------------------------------------------------------------- diff


@pytest.fixture
def diff(cli, tmp_path):
    """`attnprof diff BASE NEW [options]` on two files of the given rows."""

    def run(base: list[Row], new: list[Row], *options: str):
        return cli("diff", results(tmp_path, "base.json", *base), results(tmp_path, "new.json", *new), *options)

    return run


def test_a_judged_regression_exits_1(diff) -> None:
    result = diff([cell()], [cell(latency=400.0)], "--wide")
    assert result.exit_code == 1, result.output
    assert "slower by 300.0%" in result.stdout and "1 regression(s): 1 slower" in result.stdout


def test_judged_without_a_regression_exits_0(diff) -> None:
    result = diff([cell(), cell("naive")], [cell(latency=101.0), cell("naive", latency=60.0)], "--wide")
    assert result.exit_code == 0, result.output
    assert "2 row(s) matched: no regression" in result.stdout and "not judged" not in result.output


def test_a_contended_row_exits_3_with_the_reason(diff) -> None:
    """A 4x slowdown timed while other processes took half the CPU: not called a regression, nor passed."""
    result = diff([cell()], [cell(latency=400.0, cpu_contention=0.49)])
    assert result.exit_code == 3, result.output
    reason = "other processes took 49% of the CPU while NEW was timed"
    assert f"- not judged: sdpa @ {CELL}: {reason}" in result.stdout
    assert "no judged regression; 1 not judged (timed while other processes held the CPU)" in result.stdout
    assert "not judged: 1 row(s) could not be judged, nothing judged failed; exit 3" in result.stderr
    document = json.loads(diff([cell()], [cell(latency=400.0, cpu_contention=0.49)], "--format", "json").stdout)
    assert document["outcome"] == "not judged" and document["regressions"] == 0 and document["not_judged"] == 1
    [row] = document["not_judged_rows"]
    assert (row["variant"], row["reason"], row["kind"]) == ("sdpa", reason, "timed while other processes held the CPU")
    assert document["rows"][0]["judged"] is False


def test_a_contended_base_is_not_judged_whatever_the_change(diff) -> None:
    """A contended BASE measured the other work too: a NEW as slow as it hides a real slowdown."""
    result = diff([cell(latency=400.0, cpu_contention=0.6)], [cell(latency=401.0)])
    assert result.exit_code == 3, result.output
    assert f"not judged: sdpa @ {CELL}: other processes took 60% of the CPU while BASE was timed" in result.stdout


def test_both_timings_unstable_exits_3(diff) -> None:
    """+50% beyond the threshold, within the two IQRs (30 + 30 µs): two unstable timings cannot tell."""
    base = cell(iqr=30.0, unstable=True)
    result = diff([base], [cell(latency=150.0, iqr=30.0, unstable=True)], "--noise-floor", "0", "--wide")
    assert result.exit_code == 3, result.output
    assert (
        f"not judged: sdpa @ {CELL}: both timings are unstable (IQR over 10% of the median): +50.0% is within "
        "the runs' IQRs (60 µs together)"
    ) in result.stdout
    assert "1 not judged (both timings unstable)" in result.stdout


def test_one_unstable_timing_or_a_clear_outcome_is_judged() -> None:
    one = compare_rows(cell(iqr=30.0), cell(latency=150.0, iqr=30.0, unstable=True), 0.05, floor=0.0)
    assert one.verdict.startswith("within noise: +50.0% is within the runs' IQRs") and not one.not_judged
    same = compare_rows(cell(iqr=30.0, unstable=True), cell(latency=102.0, iqr=30.0, unstable=True), 0.05)
    assert same.verdict == "ok" and not same.not_judged  # two medians within the threshold
    clear = compare_rows(cell(iqr=30.0, unstable=True), cell(latency=400.0, iqr=30.0, unstable=True), 0.05)
    assert clear.regressions == ["slower by 300.0%"] and not clear.not_judged  # beyond every noise


def test_allow_unjudged_exits_0_and_still_says_why(diff) -> None:
    result = diff([cell()], [cell(latency=400.0, cpu_contention=0.49)], "--allow-unjudged")
    assert result.exit_code == 0, result.output
    assert f"not judged: sdpa @ {CELL}: other processes took 49% of the CPU" in result.stdout
    assert "exit 0 (--allow-unjudged)" in result.stderr


def test_a_regression_outweighs_a_row_not_judged(diff) -> None:
    base = [cell(), cell("naive")]
    new = [cell(latency=400.0), cell("naive", latency=400.0, cpu_contention=0.9)]
    for options in ((), ("--allow-unjudged",)):
        result = diff(base, new, "--wide", *options)
        assert result.exit_code == 1, result.output
        assert "1 regression(s): 1 slower; 1 not judged" in result.stdout
        assert f"not judged: naive @ {CELL}: other processes took 90% of the CPU" in result.stdout


def test_a_contended_row_that_started_failing_is_a_regression(diff) -> None:
    """Only the latency goes unjudged: a row that started failing regressed, contended or not."""
    failed = cell(status="failed: NaN in output", reason="NaN in output", latency=None, cpu_contention=0.9)
    assert diff([cell()], [failed]).exit_code == 1


# --------------------------------------------------------------------------- check


@pytest.fixture
def check(cli, tmp_path):
    """`attnprof check EXPECTATIONS RESULTS [options]` on an expectations mapping and the given rows."""

    def run(expected: dict, rows: list[Row], *options: str):
        expectations = tmp_path / "expect.yaml"
        expectations.write_text(yaml.safe_dump(expected))
        return cli("check", str(expectations), results(tmp_path, "results.json", *rows), *options)

    return run


def test_check_a_judged_miss_exits_1_and_held_exits_0(check) -> None:
    expected = {"sdpa": {"latency_us": {"max": 200}}}
    assert check(expected, [cell(latency=400.0)]).exit_code == 1
    held = check(expected, [cell(latency=150.0)])
    assert held.exit_code == 0 and "1 held, 0 missed, 0 not run" in held.stdout and "judged" not in held.output


def test_check_a_contended_latency_exits_3_with_the_reason(check) -> None:
    expected = {"sdpa": {"latency_us": {"max": 200}, "kernels_per_forward": 3}}
    rows = [cell(latency=400.0, cpu_contention=0.49)]
    result = check(expected, rows, "--wide")
    assert result.exit_code == 3, result.output
    assert f"- not judged: sdpa @ {CELL}: other processes took 49% of the CPU while sdpa was timed" in result.stdout
    assert "1 held, 0 missed, 0 not run, 1 not judged" in result.stdout  # kernels_per_forward is no timing
    assert "not judged: 1 expectation(s) could not be judged, nothing judged failed; exit 3" in result.stderr
    document = json.loads(check(expected, rows, "--format", "json").stdout)
    assert document["outcome"] == "not judged" and document["not judged"] == 1 and document["held"] == 1
    latency = next(c for c in document["checks"] if c["field"] == "latency_us")
    assert latency["verdict"] == "not judged" and latency["measured"] == "400"
    assert latency["reason"] == "other processes took 49% of the CPU while sdpa was timed"
    assert document["not_judged_reasons"] == [f"not judged: sdpa @ {CELL}: {latency['reason']}"]


def test_check_faster_than_between_two_unstable_timings_exits_3(check) -> None:
    expected = {"sdpa": {"faster_than": "naive"}}
    close = [cell(iqr=30.0, unstable=True), cell("naive", latency=110.0, iqr=30.0, unstable=True)]
    result = check(expected, close, "--wide")
    assert result.exit_code == 3, result.output
    assert "both timings are unstable (IQR over 10% of the median), and 1.10x is within their IQRs" in result.stdout
    clear = [cell(iqr=30.0, unstable=True), cell("naive", latency=1000.0, iqr=300.0, unstable=True)]
    assert check(expected, clear).exit_code == 0  # 10x: a clear outcome is judged
    contended = [cell(), cell("naive", latency=1000.0, cpu_contention=0.3)]
    result = check(expected, contended, "--wide")
    assert result.exit_code == 3 and "other processes took 30% of the CPU while naive was timed" in result.stdout


def test_check_allow_unjudged_exits_0_and_still_says_why(check) -> None:
    result = check(
        {"sdpa": {"pct_of_peak": {"min": 1}}}, [cell(pct_of_peak=5.0, cpu_contention=0.8)], "--allow-unjudged"
    )
    assert result.exit_code == 0, result.output
    assert "other processes took 80% of the CPU while sdpa was timed" in result.stdout
    assert "exit 0 (--allow-unjudged)" in result.stderr


def test_check_a_miss_outweighs_an_expectation_not_judged(check) -> None:
    expected = {"*": {"latency_us": {"max": 200}}}
    rows = [cell(latency=400.0), cell("naive", latency=150.0, cpu_contention=0.9)]
    for options in ((), ("--allow-unjudged",)):
        result = check(expected, rows, *options)
        assert result.exit_code == 1, result.output
        assert "0 held, 1 missed, 0 not run, 1 not judged" in result.stdout
        assert f"not judged: naive @ {CELL}: other processes took 90% of the CPU" in result.stdout
