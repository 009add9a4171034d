"""`attnprof check`: the expectations schema, each rule, configs/expect-blog.yaml against a real H200
compare (tests/data/h200/results/compare.json), and a compare run on CPU then checked."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import yaml

from attnprof.errors import ExpectationsError
from attnprof.report.expectations import check_rows, counts, load_expectations, parse_expectations
from attnprof.results.files import load_results
from attnprof.results.schema import Row

REPO = Path(__file__).resolve().parents[1]
BLOG_EXPECTATIONS = REPO / "configs" / "expect-blog.yaml"
H200 = Path(__file__).parent / "data" / "h200" / "results" / "compare.json"


def h200_rows(shape: str | None = "8x16x1024x64") -> list[Row]:
    return [r for r in load_results(H200).rows if shape is None or r.shape == shape]


def h200_entries(shape: str) -> list[dict]:
    """The rows of one shape as the file holds them (JSON), to write a results file of them."""
    return [r for r in json.loads(H200.read_text())["results"] if r["shape"] == shape]


def expect(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "expect.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def verdicts(data: dict, rows: list[Row], tmp_path: Path) -> list[tuple[str, str, str, str]]:
    outcomes = check_rows(parse_expectations(data, tmp_path / "e.yaml"), rows)
    return [(o.verdict, o.expectation.pattern, o.expectation.expected_text, o.measured) for o in outcomes]


def test_expect_blog_is_valid_and_names_the_blog_config() -> None:
    declared = load_expectations(BLOG_EXPECTATIONS)
    assert declared.configs == (REPO / "configs" / "a100.yaml",) and declared.configs[0].exists()
    patterns = {e.pattern for e in declared.items}
    assert patterns == {"*", "naive", "inplace", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn"}
    assert ("naive", "has", "hidden-memcpy") in {(e.pattern, e.kind, e.value) for e in declared.items}


def test_expect_blog_holds_on_the_real_h200_compare(cli, tmp_path) -> None:
    results = tmp_path / "blog.json"
    document = json.loads(H200.read_text())
    results.write_text(json.dumps(document | {"results": h200_entries("8x16x1024x64")}))
    result = cli("check", str(BLOG_EXPECTATIONS), str(results), "--wide")
    assert result.exit_code == 0, result.output
    assert "checked at 8x16x1024x64 bf16 causal fwd" in result.output
    assert any(line.split()[:3] == ["✓", "sdpa-math", "kernels_per_forward"] for line in result.output.splitlines())
    assert "51 held, 0 missed, 1 not run" in result.output  # flash-attn was not installed there


def test_at_other_shapes_the_blog_counts_miss(cli) -> None:
    result = cli("check", str(BLOG_EXPECTATIONS), str(H200), "--format", "json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    missed = {
        (c["variant"], c["cell"], c["field"], c["measured"]) for c in document["checks"] if c["verdict"] == "missed"
    }
    # the [4, 16, 8192, 8192] scores exceed 2**31 elements: ATen splits each elementwise op in two
    assert ("naive", "4x16x8192x128 bf16 causal fwd", "kernels_per_forward", "11") in missed
    assert ("sdpa-math", "4x16x8192x128 bf16 causal fwd", "kernels_per_forward", "51") in missed
    assert document["missed"] == len(missed) and document["held"] > 100


def test_each_rule(tmp_path) -> None:
    rows = h200_rows()
    data = {
        "sdpa-flash": {"kernels_per_forward": 1, "pct_of_peak": {"min": 30}, "backend": "flash", "passed": True},
        "sdpa-*": {"memcpy_per_forward": {"max": 0}},
        "sdpa-math": {
            "pct_of_peak": {"min": 0.5, "max": 1},
            "findings": {"has": ["mask-rebuilt"], "lacks": ["cpu-bound"]},
        },
        "naive": {"findings": {"has": ["single-fused-kernel"]}, "unstable": 1},
        "flash-attn": {"kernels_per_forward": 1},
        "sdpa-nothing": {"kernels_per_forward": 1},
    }
    found = verdicts(data, rows, tmp_path)
    assert found[:4] == [
        ("held", "sdpa-flash", "= 1", "1"),
        ("missed", "sdpa-flash", ">= 30", "24.2"),  # the measured value next to the expected one
        ("held", "sdpa-flash", "= flash", "flash"),
        ("held", "sdpa-flash", "= True", "yes"),
    ]
    assert [v for v, pattern, *_ in found if pattern == "sdpa-*"] == ["held"] * 4  # each sdpa-* row (not sdpa)
    assert ("held", "sdpa-math", "0.5 to 1", "0.887") in found
    assert ("held", "sdpa-math", "has mask-rebuilt", "present") in found
    assert ("held", "sdpa-math", "lacks cpu-bound", "absent") in found
    assert ("missed", "naive", "has single-fused-kernel", "absent") in found
    assert ("missed", "naive", "= 1", "no") in found  # a bool is not the number 1
    assert found[-2][0] == "not run" and found[-2][3].startswith("skipped: needs flash_attn")
    assert found[-1] == ("missed", "sdpa-nothing", "= 1", "no row of this variant in the results")


def test_a_failed_row_is_a_miss() -> None:
    declared = parse_expectations({"*": {"kernels_per_forward": 1}}, Path("e.yaml"))
    failed = Row(variant="x", status="failed: out of memory: 8 GiB", kernels_per_forward=None)
    [outcome] = check_rows(declared, [failed])
    assert outcome.verdict == "missed" and outcome.measured == "failed: out of memory: 8 GiB"
    assert counts([outcome]) == {"held": 0, "missed": 1, "not run": 0, "not judged": 0}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"naive": {"kernels": 5}}, "naive.kernels: unknown field; did you mean "),
        ({"naive": {"latency": 5}}, "naive.latency: unknown field; did you mean latency_us"),
        (
            {"naive": {"findings": {"has": ["hidden-memcopy"]}}},
            "unknown finding hidden-memcopy; did you mean hidden-memcpy?",
        ),
        ({"naive": {"findings": {"maybe": ["cpu-bound"]}}}, "naive.findings.maybe: unknown key"),
        ({"naive": {"pct_of_peak": {"min": 5, "max": 1}}}, "naive.pct_of_peak: min 5 is above max 1"),
        ({"naive": {"pct_of_peak": {}}}, "give min, max or both"),
        ({"naive": {"pct_of_peak": {"least": 1}}}, "naive.pct_of_peak.least: unknown key"),
        ({"naive": {"kernels_per_forward": [1, 2]}}, "expected a number, a string, true/false or {min, max}"),
        ({"naive": 5}, "naive: expected a mapping of fields"),
        ([1, 2], "expected a mapping of variant patterns"),
    ],
)
def test_schema_errors_are_one_line_and_exit_2(cli, tmp_path, data, message) -> None:
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(data, tmp_path / "e.yaml")
    assert message in info.value.message and "\n" not in info.value.message
    result = cli("check", str(expect(tmp_path, data)), str(H200))
    assert result.exit_code == 2 and "error: " in result.output and "Traceback" not in result.output


def test_missing_files_exit_2(cli, tmp_path) -> None:
    assert cli("check", str(tmp_path / "none.yaml"), str(H200)).exit_code == 2
    good = expect(tmp_path, {"naive": {"kernels_per_forward": 5}})
    assert cli("check", str(good), str(tmp_path / "none.json")).exit_code == 2
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("naive: {kernels: [")
    assert cli("check", str(bad_yaml), str(H200)).exit_code == 2


def test_results_and_compare_options_exclude_each_other(cli, tmp_path) -> None:
    good = expect(tmp_path, {"naive": {"kernels_per_forward": 5}})
    result = cli("check", str(good), str(H200), "--seq", "64")
    assert result.exit_code == 2 and "--seq would run a compare" in result.output


def test_without_results_check_runs_a_compare(cli, write_config, tmp_path) -> None:
    expectations = expect(
        tmp_path,
        {
            "*": {"status": "ok", "device": "cpu", "forwards": 2},
            "sdpa-math": {"findings": {"has": ["mask-rebuilt", "safe-softmax"], "lacks": ["hidden-memcpy"]}},
            "naive": {"gpu_time_us": {"min": 1}},  # no device time on a CPU: n/a, a miss
        },
    )
    result = cli("check", str(expectations), "-c", str(write_config()), "--no-timing", "--format", "json")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["missed"] == 1 and document["held"] == 3 * 3 + 3
    [miss] = [c for c in document["checks"] if c["verdict"] == "missed"]
    assert (miss["variant"], miss["field"], miss["measured"]) == ("naive", "gpu_time_us", "n/a")
    [folder] = (tmp_path / "out").glob("*-check")
    assert document["results"] == str(folder / "results.json")


def test_where_lists_findings_any_and_faster_than(tmp_path) -> None:
    rows = h200_rows(None)
    data = {
        "sdpa-flash": [
            {"where": {"shape": "8x16x1024x64"}, "faster_than": "sdpa-math"},
            {"where": {"seq": [8192, 16384]}, "faster_than": {"variant": "sdpa-math", "by": 33}},
        ],
        "naive": {
            "where": {"shape": "8x16x1024x64"},
            "faster_than": "inplace",
            "findings": {"any": ["hidden-memcpy", "cpu-bound"]},
        },
        "sdpa-math": {"where": {"shape": "8x16x1024x64"}, "findings": {"any": ["cpu-bound", "gpu-idle"]}},
        "flex": {"where": {"shape": "8x16x1024x64"}, "faster_than": "flash-attn"},
        "sdpa": {"where": {"seq": 3}, "status": "ok"},
        "sdpa-cudnn": {"where": {"shape": "8x16x1024x64"}, "faster_than": {"variant": "sdpa-flash", "seq": 123}},
        "triton-flash": {"where": {"shape": "4x16x8192x128"}, "faster_than": {"variant": "flex", "head_dim": 128}},
    }
    found = verdicts(data, rows, tmp_path)
    assert found == [
        ("held", "sdpa-flash", "faster than sdpa-math", "27.31x: 95.5 us against 2,609 us"),
        ("missed", "sdpa-flash", "faster than sdpa-math by 33x", "32.71x: 3,346 us against 109,444 us"),
        ("held", "sdpa-flash", "faster than sdpa-math by 33x", "33.25x: 6,569 us against 218,411 us"),
        ("missed", "naive", "faster than inplace", "0.88x: 1,062 us against 934.5 us"),
        ("held", "naive", "any of hidden-memcpy, cpu-bound", "hidden-memcpy"),
        ("missed", "sdpa-math", "any of cpu-bound, gpu-idle", "none present"),
        (
            "not run",
            "flex",
            "faster than flash-attn",
            "flash-attn: skipped: needs flash_attn (FA2/FA3/FA4): No module named 'flash_attn'",
        ),
        ("missed", "sdpa", "= ok", "no row of this variant where seq = 3 in the results"),
        ("missed", "sdpa-cudnn", "faster than sdpa-flash at seq=123", "no sdpa-flash row at this cell, seq=123"),
        ("held", "triton-flash", "faster than flex at head_dim=128", "1.06x: 2,597 us against 2,765 us"),
    ]


def test_faster_than_changes_the_mask_of_the_cell(tmp_path) -> None:
    def row(variant: str, mask: str, latency: float, q_len: int = 64) -> Row:
        causal = mask == "causal"
        return msgspec.convert(
            {"variant": variant, "status": "ok", "latency_us": latency, "device": "cuda:0", "dtype": "bf16",
             "batch": 1, "heads": 2, "kv_heads": 2, "seq": 64, "head_dim": 16, "mode": "fwd", "causal": causal,
             "mask": mask, "score_mod": None, "q_len": q_len, "kv_len": 64},
            Row,
        )  # fmt: skip

    rows = [row("sdpa", "causal", 10.0), row("sdpa", "prefix:1", 30.0), row("sdpa", "causal", 5.0, q_len=1)]
    data = {"sdpa": {"where": {"mask": "causal", "q_len": 64}, "faster_than": {"variant": "sdpa", "mask": "prefix:1"}}}
    assert verdicts(data, rows, tmp_path) == [
        ("held", "sdpa", "faster than sdpa at mask=prefix:1", "3.00x: 10 us against 30 us")
    ]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"naive": {"where": {"kernels": 1}, "status": "ok"}}, "naive.where.kernels: unknown field"),
        (
            {"naive": {"where": {"latncy_us": 1}, "status": "ok"}},
            "naive.where.latncy_us: unknown field; did you mean latency_us",
        ),
        ({"naive": {"where": {"seq": [[1]]}, "status": "ok"}}, "naive.where.seq: expected a value or a list"),
        ({"naive": {"where": {"seq": 1}}}, "naive: expected a mapping of fields to expected values"),
        ({"naive": [{"status": "ok"}, 5]}, "naive[1]: expected a mapping of fields"),
        ({"naive": {"faster_than": {"by": 2}}}, "naive.faster_than: expected a variant name or {variant"),
        ({"naive": {"faster_than": {"variant": "x", "by": -1}}}, "naive.faster_than.by: expected a positive number"),
        (
            {"naive": {"faster_than": {"variant": "x", "kernels": 1}}},
            "naive.faster_than.kernels: not a field of the cell",
        ),
        ({"naive": {"findings": {"any": ["cpu-bund"]}}}, "unknown finding cpu-bund"),
    ],
)
def test_where_and_faster_than_errors_are_one_line(tmp_path, data, message) -> None:
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(data, tmp_path / "e.yaml")
    assert message in info.value.message and "\n" not in info.value.message


def test_without_results_check_runs_a_compare_per_config(cli, write_config, tmp_path) -> None:
    first = write_config()
    second = tmp_path / "second.yaml"
    second.write_text(first.read_text().replace("seq: 32", "seq: 16"))
    expectations = expect(tmp_path, {"config": [first.name, second.name], "*": {"status": "ok", "forwards": 2}})
    result = cli("check", str(expectations), "--no-timing", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["results"]) == 2 and document["held"] == 2 * 2 * 3
    assert {c["cell"].split()[0] for c in document["checks"]} == {"1x2x32x16", "1x2x16x16"}


def test_fields_are_resolved_against_the_row_schema_when_loaded(tmp_path) -> None:
    """An expectation names a scalar field of `Row` (a cell's or a model row's column), checked by attribute."""
    declared = parse_expectations(
        {"sdpa-flash": {"where": {"mask": None}, "kernel_gbps": {"min": 0}, "logits_max_abs_diff": {"max": 1}}},
        tmp_path / "e.yaml",
    )
    assert [(e.field, e.where) for e in declared.items] == [
        ("kernel_gbps", (("mask", (None,)),)),
        ("logits_max_abs_diff", (("mask", (None,)),)),
    ]
    assert all(e.field in Row.__struct_fields__ for e in declared.items)
    for nested in ("attention", "spread", "counters"):
        with pytest.raises(ExpectationsError, match=f"naive.{nested}: unknown field"):
            parse_expectations({"naive": {nested: 1}}, tmp_path / "e.yaml")
