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
    result = cli("compare", str(write_config(dtype="fp8", extra=1)))
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


def test_refresh_ceiling_replaces_the_cached_figure(cli, write_config, isolated_cache) -> None:
    import json as _json

    from attnprof.profiling import ceiling

    config = str(write_config(variants=["sdpa-math"]))
    assert cli("compare", config, *FAST).exit_code == 0
    cache = isolated_cache / "ceilings.json"
    entries = _json.loads(cache.read_text())["entries"]
    [key] = entries
    entries[key]["tflops"] = 1e-9  # a stale, absurd figure
    cache.write_text(_json.dumps({"version": 1, "entries": entries}))
    ceiling.forget()
    stale = _json.loads(cli("compare", config, "--format", "json", *FAST).stdout)
    assert stale["ceiling"]["tflops"] == 1e-9
    fresh = _json.loads(cli("compare", config, "--format", "json", "--refresh-ceiling", *FAST).stdout)
    assert fresh["ceiling"]["tflops"] > 1e-6


def test_no_clocks_reaches_the_runner(cli, write_config, monkeypatch) -> None:
    from attnprof import pipeline

    seen = []
    real = pipeline.run_cells

    def spy(cells, config, measure, *args, **kwargs):
        seen.append(measure.clocks)
        return real(cells, config, measure, *args, **kwargs)

    monkeypatch.setattr(pipeline, "run_cells", spy)
    config = str(write_config(variants=["inplace"]))
    assert cli("compare", config, *FAST).exit_code == 0
    assert cli("run", "--variant", "inplace", "--config", config, "--no-clocks", *FAST).exit_code == 0
    assert seen == [True, False]
