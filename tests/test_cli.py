"""The CLI end to end on CPU: list, run, compare, analyze, explain, and every bad-input case."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAST = ("--min-time", "0.02")


def assert_one_line_error(result, code: int, *fragments: str) -> None:
    """A non-zero exit, an `error:` line, the expected words, and no traceback."""
    assert result.exit_code == code, result.output
    text = result.output
    assert "Traceback" not in text
    assert "error: " in text
    for fragment in fragments:
        assert fragment in text, text


def test_help_lists_the_commands(cli) -> None:
    result = cli("--help")
    assert result.exit_code == 0
    for command in ("list", "run", "compare", "analyze", "explain"):
        assert command in result.output


def test_help_does_not_import_torch() -> None:
    code = "import sys; from attnprof.cli.app import app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_list_no_plugins_does_not_import_torch() -> None:
    """`list` answers availability from attnprof.devices; the built-in checks do not import torch."""
    code = ("import sys; from attnprof.cli.app import app\n"
            "try:\n    app(['--no-plugins', 'list', '--format', 'json'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "False"
    assert {v["name"] for v in json.loads(out.stdout)["variants"]} >= {"naive", "sdpa-cudnn", "flex"}


def test_list_availability_matches_torch(cli) -> None:
    """The torch-free answers agree with torch's own on this machine."""
    import torch

    result = cli("--no-plugins", "list", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")


def test_list_cuda_on_a_cpu_machine(cli) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = cli("--no-plugins", "list", "--device", "cuda")
    assert_one_line_error(result, 3, "device 'cuda' requested")


def test_python_dash_m_works() -> None:
    out = subprocess.run([sys.executable, "-m", "attnprof", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("attnprof ")


def test_list_shows_availability_and_reasons(cli, write_config) -> None:
    result = cli("list", "--config", str(write_config()))
    assert result.exit_code == 0, result.output
    assert "sdpa-cudnn" in result.output and "needs CUDA" in result.output
    data = json.loads(cli("list", "--config", str(write_config()), "--format", "json").output)
    by_name = {v["name"]: v for v in data["variants"]}
    assert by_name["naive"]["available"] is True and by_name["naive"]["source"] == "built-in"
    assert by_name["sdpa-efficient"] == by_name["sdpa-efficient"] | {"available": False, "reason": "needs CUDA"}


def test_run_profiles_one_variant(cli, write_config, tmp_path: Path) -> None:
    result = cli("run", "--variant", "inplace", "--config", str(write_config()), *FAST)
    assert result.exit_code == 0, result.output
    assert "kernels / forward" in result.output and "latency (µs, median ± IQR)" in result.output
    assert "key_averages" in result.output and "attnprof" in result.output
    [trace] = (tmp_path / "out").glob("*-run/traces/inplace_1x2x32x16_fp32_causal_cpu.json.gz")
    assert f"traces: {trace} (open in Perfetto, https://ui.perfetto.dev, or in chrome://tracing)" in result.stderr
    again = cli("run", "--variant", "inplace", "--config", str(write_config()), *FAST)
    assert again.exit_code == 0
    assert len(list((tmp_path / "out").glob("*-run*/traces/inplace_*.json.gz"))) == 2  # each run has its folder


def test_run_json_stdout_is_only_json(cli, write_config) -> None:
    result = cli("run", "--variant", "naive", "--config", str(write_config()), "--format", "json", *FAST)
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    row = document["results"][0]
    assert row["variant"] == "naive" and row["status"] == "ok"
    assert row["forwards"] == 2  # the schedule's active steps
    assert row["cpu_time_us"] > 0
    assert row["gpu_time_us"] is None  # CPU run: no device time, never a fake zero
    assert row["passed"] is True and row["rel_error"] < 1e-5
    assert document["environment"]["torch"]
    assert document["config"]["shapes"][0]["seq"] == 32


def test_shape_options_override_the_config(cli, write_config) -> None:
    result = cli("run", "--variant", "sdpa-math", "--config", str(write_config()), "--seq", "24",
                 "--heads", "4", "--kv-heads", "2", "--format", "json", *FAST)
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["results"][0]
    assert (row["seq"], row["heads"], row["kv_heads"]) == (24, 4, 2)


def test_compare_writes_tables_json_and_csv(cli, write_config, tmp_path: Path) -> None:
    result = cli("compare", str(write_config()), *FAST)
    assert result.exit_code == 0, result.output
    assert "speed-up vs sdpa-math" in result.output
    assert "at a glance" in result.output
    [folder] = (tmp_path / "out").glob("*-compare")
    json_file, csv_file = folder / "results.json", folder / "results.csv"
    assert len(list((folder / "traces").glob("*.json.gz"))) == 3
    document = json.loads(json_file.read_text())
    assert [r["variant"] for r in document["results"]] == ["naive", "inplace", "sdpa-math"]
    baseline = next(r for r in document["results"] if r["variant"] == "sdpa-math")
    assert baseline["speedup_vs_baseline"] == pytest.approx(1.0)
    rows = list(csv.DictReader(csv_file.open()))
    assert {"latency_us", "speedup_vs_baseline", "kernels_per_forward", "rel_error"} <= set(rows[0])


def test_compare_skips_what_the_machine_cannot_run_with_exit_zero(cli, write_config) -> None:
    config = write_config(variants=["sdpa-math", "sdpa-cudnn"])
    result = cli("compare", str(config), "--format", "json", *FAST)
    assert result.exit_code == 0, result.output
    rows = {r["variant"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["sdpa-cudnn"]["status"] == "skipped: needs CUDA"
    assert rows["sdpa-math"]["status"] == "ok"


def test_compare_pattern_selection(cli, write_config) -> None:
    result = cli("compare", str(write_config()), "--variants", "sdpa-*", "--exclude", "sdpa-cudnn",
                 "--exclude", "sdpa-efficient", "--no-timing", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [r["variant"] for r in json.loads(result.stdout)["results"]] == ["sdpa-math", "sdpa-flash"]


def test_explicit_variants_replace_the_config_exclude(cli, write_config) -> None:
    config = write_config(variants=["*"], exclude=["sdpa*", "naive"])
    result = cli("compare", str(config), "--variants", "sdpa-math", "--no-timing", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [r["variant"] for r in json.loads(result.stdout)["results"]] == ["sdpa-math"]


def test_markdown_tables(cli, write_config) -> None:
    result = cli("compare", str(write_config(variants=["sdpa-math"])), "--format", "markdown", "--no-timing")
    assert result.exit_code == 0
    assert "| variant" in result.output and "|---" in result.output.replace(":", "-")


# --- bad input: one line, non-zero, no traceback ---------------------------------------------

def test_unknown_variant(cli, write_config) -> None:
    result = cli("run", "--variant", "sdpa-flsh", "--config", str(write_config()))
    assert_one_line_error(result, 2, "unknown variant 'sdpa-flsh'", "did you mean sdpa-flash")


def test_missing_config(cli, tmp_path: Path) -> None:
    assert_one_line_error(cli("compare", str(tmp_path / "missing.yaml")), 2, "config file not found")


def test_invalid_config_lists_field_paths(cli, write_config) -> None:
    result = cli("compare", str(write_config(dtype="int8", extra=1)))
    assert_one_line_error(result, 2, "dtype: Input should be", "extra: unknown key")


def test_variant_the_device_cannot_run(cli, write_config) -> None:
    result = cli("run", "--variant", "sdpa-cudnn", "--config", str(write_config()))
    assert_one_line_error(result, 3, "sdpa-cudnn cannot run on cpu", "needs CUDA", "variants that can run here: naive")


def test_cuda_requested_on_a_cpu_machine(cli, write_config) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = cli("run", "--variant", "naive", "--config", str(write_config()), "--device", "cuda")
    assert_one_line_error(result, 3, "device 'cuda' requested")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; the file case below covers it")
def test_unwritable_output_dir_permissions(cli, write_config, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = cli("run", "--variant", "naive", "--config", str(write_config()), "--output-dir", str(locked / "x"))
    assert_one_line_error(result, 5, "cannot write to output directory")


def test_unwritable_output_dir(cli, write_config, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = cli("run", "--variant", "naive", "--config", str(write_config()), "--output-dir", str(blocker / "sub"))
    assert_one_line_error(result, 5, "cannot write to output directory")


def test_json_errors_are_json(cli, write_config) -> None:
    result = cli("run", "--variant", "nope", "--config", str(write_config()), "--format", "json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"].startswith("unknown variant 'nope'")


def test_failed_variant_keeps_the_others(cli, write_config, monkeypatch) -> None:
    """A variant whose forward runs out of memory is a failed row; the others still run."""
    import torch

    from attnprof.plugins import load_variants

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")


    monkeypatch.setattr(load_variants(no_plugins=False).registry.get("naive"), "forward", out_of_memory)
    result = cli("compare", str(write_config()), "--format", "json", *FAST)
    assert result.exit_code == 1
    rows = {r["variant"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["naive"]["status"].startswith("failed: out of memory")
    assert rows["inplace"]["status"] == "ok" and rows["sdpa-math"]["status"] == "ok"


def test_nan_output_is_a_failed_row(cli, write_config, monkeypatch) -> None:
    import torch

    from attnprof.plugins import load_variants

    def nan_forward(q, k, v, causal, state):
        return torch.full_like(q, float("nan"))

    monkeypatch.setattr(load_variants(no_plugins=False).registry.get("inplace"), "forward", nan_forward)
    result = cli("compare", str(write_config()), "--format", "json", *FAST)
    assert result.exit_code == 1
    rows = {r["variant"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["inplace"]["status"].startswith("failed: ") and "NaN" in rows["inplace"]["status"]
    assert rows["naive"]["status"] == "ok"


def test_ctrl_c_keeps_finished_cells(cli, write_config, monkeypatch, tmp_path: Path) -> None:
    from attnprof.plugins import load_variants

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(load_variants(no_plugins=False).registry.get("inplace"), "forward", interrupt)
    result = cli("compare", str(write_config()), "--no-timing")
    assert result.exit_code == 130
    [json_file] = (tmp_path / "out").glob("*-compare/results.json")
    document = json.loads(json_file.read_text())
    assert document["interrupted"] is True
    assert [r["variant"] for r in document["results"]] == ["naive"]


def test_an_exceeded_cached_ceiling_is_measured_again_without_asking(cli, write_config, isolated_cache) -> None:
    from attnprof.profiling import ceiling

    config = str(write_config(variants=["sdpa-math"]))
    assert cli("compare", config, *FAST).exit_code == 0
    cache = isolated_cache / "ceilings.json"
    data = json.loads(cache.read_text())
    [entry] = data["entries"].values()
    entry["tflops"] = 1e-9  # measured while the machine was busy, say
    cache.write_text(json.dumps(data))
    ceiling.forget()
    result = cli("compare", config, "--format", "json", *FAST)
    document = json.loads(result.stdout)
    assert document["ceiling"]["tflops"] > 1e-6 and document["ceiling"]["source"] == "measured"
    assert "fp32 matmul ceiling on cpu: 1e-09 TFLOP/s exceeded (sdpa-math at 1x2x32x16 reached " in result.stderr
    [row] = document["results"]
    assert 0 < row["pct_of_peak"] < 100 and row["pct_of_peak_note"] is None
    assert json.loads(cache.read_text())["entries"].popitem()[1]["tflops"] > 1e-6  # the cache holds the fresh one
    fresh = cli("compare", config, "--format", "json", "--refresh-ceiling", *FAST)
    assert "measured now (a fresh measurement was asked for)" in fresh.stderr


def test_the_cached_note_is_printed_only_when_the_cached_figure_was_used(cli, write_config) -> None:
    import re

    from attnprof.profiling import ceiling

    args = ("run", "--variant", "sdpa-math", "--config", str(write_config()), *FAST)
    first = cli(*args)
    assert first.exit_code == 0, first.output
    assert re.search(r"^fp32 matmul ceiling on cpu: \S+ TFLOP/s, read bandwidth \S+ GB/s by torch.sum, "
                     r"measured now \(no cached figure\)$", first.stderr, re.MULTILINE), first.stderr
    assert "cached on" not in first.stderr and "--refresh-ceiling" not in first.stderr
    ceiling.forget()  # a new process
    second = cli(*args)
    assert re.search(r"^fp32 matmul ceiling on cpu: \S+ TFLOP/s, read bandwidth \S+ GB/s by torch.sum, cached "
                     r"on \d{4}-\d\d-\d\d \(--refresh-ceiling measures again\)$", second.stderr, re.MULTILINE), \
        second.stderr
    assert "measured now" not in second.stderr


def test_a_ceiling_still_exceeded_after_measuring_again_gives_way_to_the_achieved_figure(cli, write_config, tmp_path,
                                                                                         monkeypatch) -> None:
    from attnprof.profiling import ceiling

    calls = []

    def absurd(device: str, dtype: str) -> ceiling.Ceiling:
        calls.append(dtype)
        return ceiling.Ceiling(1e-9, 1.0, "measured", method="fake")

    monkeypatch.setattr(ceiling, "probe_ceiling", absurd)
    result = cli("run", "--variant", "sdpa-math", "--config", str(write_config()), "--wide", *FAST)
    assert result.exit_code == 0, result.output
    assert calls == ["fp32", "fp32"]  # at the start, and once more when the cell exceeded it
    assert ("1e-09 TFLOP/s exceeded (sdpa-math at 1x2x32x16 reached " in result.stderr
            and "measured again: 1e-09 TFLOP/s; still beaten by sdpa-math @ 1x2x32x16: % of peak is of the best "
                "achieved figure" in result.stderr), result.stderr
    [json_file] = (tmp_path / "out").glob("*-run/results.json")
    [row] = json.loads(json_file.read_text())["results"]
    assert row["pct_of_peak"] == 100.0 and row["tflops"] > 1e-9 and row["bound"] is None  # no read figure faked
    assert row["pct_of_peak_note"] is None and row["peak_reference_tflops"] == row["tflops"]
    assert row["peak_reference_note"].endswith("above the fp32 matmul measured on cpu (1e-09 TFLOP/s)")
    assert row["peak_reference_note"] in " ".join(result.stdout.split())  # beside the run summary's figure
    [line] = csv.DictReader(json_file.with_suffix(".csv").open())
    assert float(line["pct_of_peak"]) == 100.0 and line["peak_reference_note"] == row["peak_reference_note"]


def test_half_precision_on_cpu_has_no_ceiling(cli, write_config, tmp_path) -> None:
    result = cli("compare", str(write_config(dtype="bf16", variants=["sdpa-math"])), "--wide", *FAST)
    assert result.exit_code == 0, result.output
    reason = "no meaningful bf16 matmul ceiling on CPU (attention there computes in fp32)"
    assert f"% of peak is n/a: {reason}" in result.stderr and "cached on" not in result.stderr
    [json_file] = (tmp_path / "out").glob("*-compare/results.json")
    document = json.loads(json_file.read_text())
    assert document["ceiling"]["source"] == "none" and document["ceiling"]["tflops"] is None
    [row] = document["results"]
    assert row["tflops"] > 0 and row["pct_of_peak"] is None and row["pct_of_peak_note"] == reason
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "% peak" in line)  # the shape table
    column = lines[header].index("% peak")
    assert lines[header + 2].startswith("sdpa-math") and lines[header + 2][column:].split()[0] == "n/a"


def test_no_clocks_reaches_the_runner(cli, write_config, monkeypatch) -> None:
    from attnprof.pipeline import engine

    seen = []
    real = engine.run_cells

    def spy(cells, config, measure, *args, **kwargs):
        seen.append(measure.clocks)
        return real(cells, config, measure, *args, **kwargs)

    monkeypatch.setattr(engine, "run_cells", spy)
    config = str(write_config(variants=["inplace"]))
    assert cli("compare", config, *FAST).exit_code == 0
    assert cli("run", "--variant", "inplace", "--config", config, "--no-clocks", *FAST).exit_code == 0
    assert seen == [True, False]


@pytest.mark.parametrize("command", [(), ("list",), ("run",), ("compare",)])
def test_help_shows_flags_as_flags(cli, command) -> None:
    """Flags take no value, so the help shows no `<bool>` for them (typer's rich help did)."""
    result = cli(*command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output and "--help" in result.output
    if command in (("run",), ("compare",)):
        assert "--no-timing" in result.output and "--cuda-graph" in result.output
        assert "<int>" in result.output  # options that take a value still show its type


@pytest.mark.parametrize("command", [("run", "--variant", "naive"), ("compare",), ("list",)])
def test_config_as_argument_or_option(cli, write_config, command) -> None:
    """run, compare and list take the config as the argument or with -c/--config, not both."""
    config = str(write_config(variants=["naive"], baseline=None, seed=7))
    extra = ("--format", "json") if command[0] == "list" else ("--no-timing", "--format", "json")
    for given in ((config,), ("-c", config), ("--config", config)):
        result = cli(*command, *given, *extra)
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["shape"] == "1x2x32x16" if command[0] == "list" else document["config"]["seed"] == 7
    assert_one_line_error(cli(*command, config, "-c", config, *extra), 2, "two configs given",
                          "as the argument or with -c, not both")


# --- what a new user trips over -----------------------------------------------------------------

def test_auto_dtype_rows_carry_the_concrete_dtype(cli, write_config) -> None:
    """`dtype: auto` on CPU is fp32 in every row, in the document's config and in the table headings."""
    config = str(write_config(dtype="auto", variants=["sdpa-math"]))
    document = json.loads(cli("compare", config, "--no-timing", "--format", "json").stdout)
    assert [r["dtype"] for r in document["results"]] == ["fp32"] and document["config"]["dtype"] == "fp32"
    assert "1x2x32x16 fp32 causal fwd on cpu" in cli("compare", config, "--no-timing").stdout
    result = cli("run", "--variant", "naive", "--config", config, "--dtype", "auto", "--no-timing", "--format", "json")
    assert json.loads(result.stdout)["results"][0]["dtype"] == "fp32"


def test_baseline_typo_fails_like_a_variant_typo(cli, write_config) -> None:
    """A baseline no variant has is exit 2 with a suggestion, given with --baseline or in the config."""
    config = str(write_config())
    assert_one_line_error(cli("compare", config, "--baseline", "sdpa-mth", "--no-timing"), 2,
                          "unknown baseline 'sdpa-mth'", "did you mean sdpa-math")
    typo = str(write_config(baseline="sdpa-mth"))
    assert_one_line_error(cli("compare", typo, "--no-timing"), 2, "unknown baseline 'sdpa-mth'; did you mean sdpa-math")
    assert_one_line_error(cli("run", typo, "--variant", "naive", "--no-timing"), 2, "unknown baseline 'sdpa-mth'")


def test_a_real_baseline_left_out_is_a_note(cli, write_config) -> None:
    result = cli("compare", str(write_config()), "--variants", "naive", "--no-timing", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "baseline 'sdpa-math' is not among the selected variants: no speed-ups" in result.stderr
    assert json.loads(result.stdout)["results"][0]["speedup_vs_baseline"] is None
    table = cli("compare", str(write_config()), "--variants", "naive", "--no-timing")
    assert table.exit_code == 0 and "speed-up vs" not in table.stdout  # no title promises one


def test_default_compare_says_what_the_config_excluded(cli, tmp_path: Path) -> None:
    """The built-in default on CPU leaves out flex and compiled, and says so (with why) on stderr."""
    result = cli("compare", "--seq", "32", "--heads", "2", "--head-dim", "16", "--no-timing",
                 "-o", str(tmp_path / "out"), "--format", "json")
    assert result.exit_code == 0, result.output
    assert ("excluded by the config: flex, compiled (torch.compile takes tens of seconds on a small CPU; "
            "--variants flex includes them)") in result.stderr.splitlines()
    assert not {"flex", "compiled"} & {r["variant"] for r in json.loads(result.stdout)["results"]}


def test_plain_exclude_is_named_too_but_not_the_command_lines(cli, write_config) -> None:
    scoped = {"variants": ["inplace"], "device": "cpu", "reason": "not today"}
    config = str(write_config(exclude=[scoped, "naive"]))
    result = cli("compare", config, "--no-timing", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "excluded by the config: inplace (not today); naive" in result.stderr
    assert [r["variant"] for r in json.loads(result.stdout)["results"]] == ["sdpa-math"]
    for override in (("--exclude", "naive"), ("--variants", "naive")):
        result = cli("compare", config, *override, "--no-timing", "--format", "json")
        assert result.exit_code == 0, result.output
        assert "excluded by the config" not in result.stderr
