"""Where the outputs go and what reaches the terminal: one folder per invocation, files that are created
whole and never overwritten, the paths on stderr and in the JSON, and a stderr free of the profiler's
native lines and of Python warnings (kept on the result, shown with --debug)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.errors import OutputError
from attnprof.files import create_new, unique_dir
from attnprof.pipeline import open_run_folder, run_cell
from attnprof.plugins import load_variants
from attnprof.profiling.profiler import NativeStderr, profile_forward
from attnprof.registry import RunSpec

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
SPEC = RunSpec("cpu", "fp32", **SHAPE)


def builtin(name: str):
    return load_variants(no_plugins=True).registry.get(name)


def attnprof(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, so that file descriptor 2 is real."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "attnprof", "--no-plugins", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300, check=False)


# --- files that never overwrite each other ----------------------------------------------------

def test_create_new_never_overwrites_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "results.json"
    assert create_new(target, lambda p: p.write_text("first")) == target
    with pytest.raises(OutputError, match="already exists"):
        create_new(target, lambda p: p.write_text("second"))
    assert target.read_text() == "first"
    trace = tmp_path / "naive_cpu.json.gz"
    made = [create_new(trace, lambda p: p.write_text(p.name), numbered=True) for _ in range(3)]
    assert [p.name for p in made] == ["naive_cpu.json.gz", "naive_cpu-2.json.gz", "naive_cpu-3.json.gz"]
    assert made[1].read_text().endswith(".partial.json.gz")  # the writer saw the same extension
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["results.json", *(p.name for p in made)])


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def boom(path: Path) -> None:
        path.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="No space left on device"):
        create_new(tmp_path / "results.csv", boom)
    assert list(tmp_path.iterdir()) == []


def test_parallel_invocations_in_one_second_get_folders_of_their_own(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:  # the exclusive mkdir races in the kernel, threads or processes alike
        made = list(pool.map(lambda _: unique_dir(tmp_path, "20260101-000000-run"), range(8)))
    assert len(set(made)) == 8
    assert sorted(Path(p).name for p in made)[:2] == ["20260101-000000-run", "20260101-000000-run-2"]


def test_open_run_folder_names_time_and_command(tmp_path: Path, monkeypatch) -> None:
    from attnprof.pipeline import run

    monkeypatch.setattr(run.time, "strftime", lambda fmt: "20260101-120000")
    first, second = open_run_folder(tmp_path, "compare"), open_run_folder(tmp_path, "compare")
    assert first.dir.name == "20260101-120000-compare" and second.dir.name == "20260101-120000-compare-2"
    assert first.traces.is_dir() and first.results_json == first.dir / "results.json"


def test_the_engine_names_its_folder_and_never_overwrites_a_results_file(tmp_path: Path) -> None:
    from attnprof.pipeline.engine import Job, run_job
    from attnprof.results.files import write_json

    config = Config(device="cpu", dtype="fp32", shapes=[SHAPE], output_dir=tmp_path)
    outcome, code = run_job(Job("run", config, "cpu", MeasureOptions(timing=False), []))
    assert outcome is not None and code == 0
    folder = outcome.folder
    assert outcome.document.files == folder.to_dict()
    assert json.loads(folder.results_json.read_text())["files"]["traces"] == str(folder.traces)
    with pytest.raises(OutputError, match="already exists"):
        write_json(folder.results_json, outcome.document)


# --- the paths: on stderr in every format, and in the JSON ----------------------------------

def test_json_names_the_files_and_stderr_says_where_they_are(cli, write_config, tmp_path: Path) -> None:
    result = cli("compare", str(write_config()), "--format", "json", "--no-timing")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    files = document["files"]
    folder = Path(files["dir"])
    assert folder.parent == tmp_path / "out" and folder.name.endswith("-compare")
    assert files == {"dir": str(folder), "results_json": str(folder / "results.json"),
                     "results_csv": str(folder / "results.csv"), "traces": str(folder / "traces")}
    assert json.loads(Path(files["results_json"]).read_text())["results"] == document["results"]
    assert Path(files["results_csv"]).read_text().startswith("variant,")
    assert {r["trace"] for r in document["results"]} == {str(p) for p in Path(files["traces"]).iterdir()}
    assert f"results: {files['results_json']} and results.csv" in result.stderr
    assert f"traces: 3 files in {files['traces']}{os.sep} (open in Perfetto, https://ui.perfetto.dev, " \
           "or in chrome://tracing)" in result.stderr
    assert result.stderr.count("ui.perfetto.dev") == 1


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_every_format_says_where_the_results_went(cli, write_config, fmt: str) -> None:
    result = cli("run", "--variant", "naive", "--config", str(write_config()), "--format", fmt, "--no-timing")
    assert result.exit_code == 0, result.output
    assert "results: " in result.stderr and "-run" + os.sep + "results.json and results.csv" in result.stderr
    assert "results:" not in result.stdout


# --- stderr: no native profiler lines, no warnings; --debug shows them ------------------------

def test_native_stderr_is_captured_at_the_descriptor_and_restored(capfd) -> None:
    native = NativeStderr()
    for line in (b"USDT: profiler_start\n", b"\n", b"USDT: profiler_stop\n"):
        with native.capture():
            os.write(2, line)
    os.write(2, b"after\n")
    assert native.lines() == ["USDT: profiler_start", "USDT: profiler_stop"]
    assert capfd.readouterr().err == "after\n"


def test_profile_forward_keeps_the_profilers_lines_off_the_terminal(capfd, tmp_path: Path) -> None:
    import torch

    q = torch.randn(1, 2, 8, 4)
    run = profile_forward(lambda: q @ q.transpose(-1, -2), SPEC, Schedule(wait=1, warmup=1, active=2), "r",
                          tmp_path / "t.json.gz")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "USDT" not in err, err
    assert run.trace_path == tmp_path / "t.json.gz" and run.trace_path.stat().st_size > 0
    assert all("profiler_st" in line for line in run.native_stderr if "USDT" in line)


def test_numpy_is_declared() -> None:
    """Without numpy, importing torch warns "Failed to initialize NumPy" on every run."""
    text = (ROOT / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL).group(1)
    assert re.search(r'^\s*"numpy[><=~ ]', dependencies, re.MULTILINE), dependencies


@pytest.mark.slow
def test_a_default_compare_leaves_stderr_clean(write_config, tmp_path: Path) -> None:
    plain = attnprof("compare", str(write_config(variants=["naive", "sdpa-math"])), "--no-timing", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    for noise in ("USDT", "profiler_start", "Failed to initialize NumPy", "Warning:", "Traceback"):
        assert noise not in plain.stderr, plain.stderr
    assert "results: " in plain.stderr


def test_debug_shows_the_profilers_captured_lines(cli, write_config) -> None:
    import torch
    from torch.profiler import profile

    probe = NativeStderr()
    with probe.capture(), profile():
        torch.ones(1)
    result = cli("--debug", "compare", str(write_config(variants=["naive"])), "--no-timing")
    assert result.exit_code == 0, result.output
    captured = [line for line in result.stderr.splitlines() if ": profiler stderr: " in line]
    if probe.lines():  # this torch prints on stderr when its profiler starts: --debug shows those lines
        assert captured and all(line.startswith("  naive @ 1x2x32x16: profiler stderr: ") for line in captured)
    else:
        assert not captured


# --- Python warnings: kept on the result; a pinned backend's refusal is the skip reason ---------

def test_a_refusing_sdpa_backend_is_skipped_with_the_warnings_reasons(tmp_path: Path) -> None:
    import torch

    flash = builtin("sdpa-flash")

    def wider_values(q, k, v, causal, state):  # flash needs q, k and v of one head_dim
        return flash.forward(q, k, torch.cat([v, v], dim=-1), causal, state)

    config = Config(device="cpu", dtype="fp32", shapes=[SHAPE], output_dir=tmp_path)
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        result = run_cell(replace(flash, forward=wider_values), SPEC, config, MeasureOptions(min_time_s=0.02))
    assert result.status == "skipped"
    assert result.reason.startswith("Flash attention kernel not used because: Flash attention requires q,k,v "
                                    "to have the same last dimension"), result.reason
    assert "\n" not in result.reason and "Triggered internally" not in result.reason
    assert any("Flash attention kernel not used because" in w for w in result.warnings)
    assert not outside  # nothing reached the warnings machinery outside the cell


def test_a_variants_warnings_are_kept_on_its_result(tmp_path: Path) -> None:
    def chatty(q, k, v, causal, state):
        warnings.warn("this kernel is experimental", UserWarning, stacklevel=1)
        return builtin("naive").forward(q, k, v, causal, state)

    config = Config(device="cpu", dtype="fp32", shapes=[SHAPE], schedule=Schedule(wait=0, warmup=1, active=2),
                    output_dir=tmp_path)
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        result = run_cell(replace(builtin("naive"), forward=chatty), SPEC, config, MeasureOptions(timing=False))
    assert result.ok, result.reason
    [line] = [w for w in result.warnings if "experimental" in w]
    assert line.startswith("UserWarning: this kernel is experimental (test_outputs.py:")
    assert not outside


def test_debug_shows_captured_lines(cli, write_config, monkeypatch) -> None:
    def chatty(q, k, v, causal, state):
        warnings.warn("this kernel is experimental", UserWarning, stacklevel=1)
        return q

    monkeypatch.setattr(load_variants(no_plugins=False).registry.get("sdpa-math"), "forward", chatty)
    config = str(write_config(variants=["sdpa-math"]))
    quiet = cli("compare", config, "--no-timing")
    assert "experimental" not in quiet.output
    loud = cli("--debug", "compare", config, "--no-timing")
    assert "  sdpa-math @ 1x2x32x16: warning: UserWarning: this kernel is experimental (test_outputs.py:" in loud.stderr
