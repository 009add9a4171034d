"""The small things that add up: a closed pipe ends quietly, errors name what the user typed, unknown keys
and fields get the nearest names, YAML errors say where, `--variants a,b` is two names, a run's tables
leave out the same columns, notes never land on the progress bar's line, and `run`/`compare` record
stacks on request and shapes unless told not to."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from analysis_json import analysis_json

from attnprof.cli.options import config_changes, split_patterns
from attnprof.config import did_you_mean

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
RESULTS = ROOT / "tests" / "data" / "results" / "cpu-seqs.json"


def one_line(result, code: int, expected: str) -> None:
    """Exit `code`, `error: <expected>` on stderr as the only line, no traceback."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.stderr.splitlines()[0] == f"error: {expected}", result.stderr


# ---------------------------------------------------------------- a closed pipe


@pytest.mark.parametrize("args", [["list"], ["findings"], ["--help"], ["explain", "--help"]])
def test_output_into_a_closed_pipe_ends_quietly_with_exit_0(args) -> None:
    # the reader is gone before the first write: every write fails, deterministically
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnprof", "--no-plugins", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(60) == 0, stderr
    assert stderr == ""


def test_list_piped_to_head_ends_quietly() -> None:
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m attnprof --no-plugins list | head -1"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("variants on ") and len(done.stdout.splitlines()) == 1
    assert "BrokenPipe" not in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- errors name what the user typed


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--seq", "0"], "--seq must be > 0 (got 0)"),
        (["--head-dim", "1024"], "--head-dim must be <= 512 (got 1024)"),
        (["--wait", "-1"], "--wait must be >= 0 (got -1)"),
        (["--mode", "fwdd"], "--mode must be 'fwd', 'bwd' or 'fwd+bwd' (got 'fwdd')"),
        (["--dtype", "bf17"], "--dtype must be 'auto', 'bf16', 'fp16', 'fp32', 'fp8' or 'fp8_e5m2' (got 'bf17')"),
        (["--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N (got 'gpu')"),
        (["--min-time", "0"], "--min-time must be > 0 (got 0)"),
        (["--heads", "4", "--kv-heads", "3"], "heads (4) must be a multiple of kv_heads (3)"),
    ],
)
def test_a_bad_option_is_named_as_typed(cli, write_config, args, expected) -> None:
    one_line(cli("compare", str(write_config()), *args), 2, expected)


def test_two_bad_options_are_one_line_each(cli, write_config) -> None:
    result = cli("compare", str(write_config()), "--batch", "0", "--seq", "-5")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[:2] == ["error: --batch must be > 0 (got 0)", "--seq must be > 0 (got -5)"]


def test_model_options_are_named_as_typed(cli, model_config) -> None:
    one_line(cli("model", str(model_config()), "--batch", "0"), 2, "--batch must be > 0 (got 0)")
    one_line(cli("model", str(model_config()), "--min-time", "0"), 2, "--min-time must be > 0 (got 0)")
    one_line(cli("model", str(model_config()), "--seq", "0"), 2, "--seq: every seq must be positive")


def test_a_bad_value_in_the_config_file_keeps_its_field_path(cli, write_config) -> None:
    result = cli("compare", str(write_config(shapes=[{"batch": 0, "heads": 2, "seq": 32, "head_dim": 16}])))
    assert result.exit_code == 2 and "shapes.0.batch: Input should be greater than 0" in result.stderr


# ---------------------------------------------------------------- the nearest names


def test_an_unknown_config_key_gets_did_you_mean(cli, write_config) -> None:
    config = write_config(casual=True, schedule={"wiat": 1}, shapes=[{"batch": 1, "hedas": 2, "seq": 32,
                                                                      "head_dim": 16}])
    result = cli("compare", str(config))
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line.strip() for line in result.stderr.splitlines()]
    assert "casual: unknown key; did you mean causal?" in lines
    assert "schedule.wiat: unknown key; did you mean wait?" in lines
    assert "shapes.0.hedas: unknown key; did you mean heads or kv_heads?" in lines
    assert "shapes.0.heads: Field required" in lines


def test_did_you_mean_offers_nothing_when_nothing_is_near() -> None:
    assert did_you_mean("colour", ["variants", "device", "reason"]) == ""
    assert did_you_mean("casual", ["causal", "device", "mask"]) == "; did you mean causal?"
    assert did_you_mean("sdpa-mth", ["sdpa-math", "sdpa-flash", "naive"]) == "; did you mean sdpa-math or sdpa-flash?"


def test_a_bad_check_field_gets_the_nearest_names_not_all_of_them(cli, tmp_path) -> None:
    expectations = tmp_path / "e.yaml"
    expectations.write_text(yaml.safe_dump({"naive": {"latency": 5}}))
    result = cli("check", str(expectations), str(RESULTS))
    assert result.exit_code == 2 and "Traceback" not in result.output
    first, hint = result.stderr.splitlines()
    assert first.startswith(f"error: {expectations}: naive.latency: unknown field; did you mean latency_us")
    assert first.count(",") <= 2  # at most three names, not the 90-odd columns
    assert hint.startswith("hint: a field is findings, faster_than, where or one of the ")
    assert "scalar fields of a results row (the columns of its CSV)" in hint  # names where the fields are listed


@pytest.mark.parametrize("command", ["compare", "check"])
def test_yaml_errors_give_the_line_and_column(cli, tmp_path, command) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("naive: {kernels_per_forward: 1\n" if command == "check" else "device: cpu\nshapes: [{batch: 1\n")
    args = [command, str(bad)] + ([str(RESULTS)] if command == "check" else [])
    result = cli(*args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.startswith(f"error: {bad}: not valid YAML (line "), result.stderr
    assert ", column " in result.stderr.splitlines()[0]


# ---------------------------------------------------------------- --variants a,b


def test_comma_separated_patterns_are_several_names() -> None:
    assert split_patterns(["naive,sdpa-math", "flex", " inplace , "]) == ["naive", "sdpa-math", "flex", "inplace"]
    changes = config_changes({"variants": ["naive,sdpa-math"], "exclude": None})
    assert changes["variants"] == ["naive", "sdpa-math"] and changes["exclude"] == []
    assert config_changes({"variants": None, "exclude": ["sdpa-*,flex"]})["exclude"] == ["sdpa-*", "flex"]


def test_compare_runs_both_of_a_comma_separated_pair(cli, write_config, tmp_path) -> None:
    result = cli("compare", str(write_config()), "--variants", "naive,sdpa-math", "--no-timing", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert [row["variant"] for row in rows] == ["naive", "sdpa-math"]
    # a CPU cell's ledger is timed on the CPU: its calls and time, but no GPU share, overhead or kernel TFLOP/s
    assert [row["attention_backends"] for row in rows] == ["eager:1", "math:1"]
    for row in rows:
        assert row["attention_time_us"] > 0 and row["attention_calls_per_forward"] == 1
        assert row["attention_gpu_pct"] is None and row["attention_overhead_us"] is None
        assert row["kernel_tflops"] is None


# ---------------------------------------------------------------- one run, one set of columns


@pytest.mark.parametrize("width", [80, 90, 100, 110, 120])
def test_every_shape_table_of_a_run_leaves_out_the_same_columns(width) -> None:
    from attnprof.report.tables import compare_report
    from attnprof.results.files import load_results

    entries = load_results(RESULTS).rows
    text = compare_report(entries, "table", "sdpa-math", width).split("== at a glance")[0]
    tables = text.split("\n== ")[1:]
    assert len(tables) == 8  # four sequence lengths, fwd and fwd+bwd
    left_out = set()
    for block in tables:
        lines = block.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("left out:"))
        note = " ".join(lines[start:]).split(" - ")[0]  # the wrapped note, before any reason bullets
        left_out.add(note.replace("/step", "/fwd").split("; --wide")[0])
        assert all(len(line) <= width for line in lines)
    assert len(left_out) == 1, left_out


# ---------------------------------------------------------------- the progress bar's line


def test_a_ceiling_said_while_the_bar_shows_gets_a_line_of_its_own(monkeypatch, capsys) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from attnprof.cli import execute

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    monkeypatch.setattr(execute, "ceiling_note", lambda ceiling, beaten=None: "fp32 matmul ceiling on cpu: 0.1 TFLOP/s")
    watcher = execute.StderrWatcher()
    with Progress(TextColumn("{task.description}"), BarColumn(), console=console) as bar:
        task = bar.add_task("naive @ 1x2x32x16", total=2)
        bar.refresh()
        watcher.shown = execute.CellProgress(bar, task, True, None)
        watcher.ceiling(None)  # type: ignore[arg-type]
    assert "ceiling" not in capsys.readouterr().err  # not written past the bar on stderr
    line = next(line for line in out.getvalue().split("\n") if "matmul ceiling" in line)
    assert line.split("\r")[-1].replace("\x1b[2K", "").startswith("fp32 matmul ceiling on cpu")


def test_without_a_bar_the_ceiling_is_a_plain_note(monkeypatch, capsys) -> None:
    from attnprof.cli import execute

    monkeypatch.setattr(execute, "ceiling_note", lambda ceiling, beaten=None: "fp32 matmul ceiling on cpu: 0.1 TFLOP/s")
    execute.StderrWatcher().ceiling(None)  # type: ignore[arg-type]
    assert capsys.readouterr().err == "fp32 matmul ceiling on cpu: 0.1 TFLOP/s\n"


# ---------------------------------------------------------------- --record-shapes and --with-stack


def test_run_records_stacks_on_request_and_shapes_by_default(cli, write_config, tmp_path) -> None:
    out = tmp_path / "out"
    result = cli("run", str(write_config()), "--variant", "sdpa-math", "--no-timing", "--with-stack", "-o", str(out))
    assert result.exit_code == 0, result.output
    [results] = out.glob("*-run/results.json")
    measure = json.loads(results.read_text())["measure"]
    assert measure["record_shapes"] is True and measure["with_stack"] is True
    [trace] = out.glob("*-run/traces/*.json.gz")
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    assert any("Input Dims" in e.get("args", {}) for e in events if e.get("cat") == "cpu_op")
    assert any(e.get("cat") == "python_function" for e in events)
    from attnprof.analysis import analyze_trace

    analysis = analyze_trace(trace)
    assert analysis.input_dtype == "fp32"  # from the recorded Input type
    ledger = analysis_json(analysis)["attention"]
    assert ledger["calls"][0]["bytes"] == 4 * 1 * 2 * 32 * 16 * 4  # q, k, v, o of 1x2x32x16 in fp32


def test_no_record_shapes_gives_a_trace_without_shapes_or_stacks(cli, write_config, tmp_path) -> None:
    out = tmp_path / "out"
    result = cli("run", str(write_config()), "--variant", "sdpa-math", "--no-timing", "--no-record-shapes",
                 "-o", str(out))
    assert result.exit_code == 0, result.output
    [results] = out.glob("*-run/results.json")
    measure = json.loads(results.read_text())["measure"]
    assert measure["record_shapes"] is False and measure["with_stack"] is False
    [trace] = out.glob("*-run/traces/*.json.gz")
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    assert not any("Input Dims" in e.get("args", {}) for e in events)
    assert not any(e.get("cat") == "python_function" for e in events)
