"""Ctrl-C at any moment: exit 130 at once, no failed row, no traceback, only finished cells written.

torch's profiler swallows a KeyboardInterrupt that lands while it starts and then fails with
"Profiler must be initialized before starting trace"; these tests swallow one the same way in
process, and send SIGINT to a real `attnprof compare` at several moments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.interrupts import interrupt_requested, recording_interrupts
from attnprof.pipeline import plan_cells, run_cells
from attnprof.pipeline.stages import guard
from attnprof.plugins import load_variants

SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
FAST = MeasureOptions(min_time_s=0.02)
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(device="cpu", dtype="fp32", shapes=[SHAPE], variants=["naive", "inplace", "sdpa-math"],
                  baseline="sdpa-math", schedule=Schedule(wait=0, warmup=1, active=2), output_dir=tmp_path)


def three_cells(config: Config, second_forward):
    registry = load_variants(no_plugins=True).registry
    cells = plan_cells(config, [registry.get(n) for n in ("naive", "inplace", "sdpa-math")], "cpu")
    cells[1] = (replace(cells[1][0], forward=second_forward), cells[1][1])
    return cells


def swallow_sigint() -> None:
    """What torch's profiler start does with Ctrl-C: the KeyboardInterrupt is caught and dropped."""
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pass


def test_a_swallowed_ctrl_c_that_ends_in_another_exception_stops_the_run(config) -> None:
    def forward(q, k, v, causal, state):
        swallow_sigint()
        raise AssertionError("Profiler must be initialized before starting trace")

    results, interrupted = run_cells(three_cells(config, forward), config, FAST)
    assert interrupted
    assert [(r.variant, r.status) for r in results] == [("naive", "ok")]  # no failed row, no third cell


def test_a_swallowed_ctrl_c_that_ends_in_nothing_still_stops_the_run(config) -> None:
    def forward(q, k, v, causal, state):
        swallow_sigint()
        return q

    results, interrupted = run_cells(three_cells(config, forward), config, FAST)
    assert interrupted and [r.variant for r in results] == ["naive"]  # the cell it landed in is dropped


def test_the_old_sigint_handler_comes_back(config) -> None:
    before = signal.getsignal(signal.SIGINT)
    with recording_interrupts():
        assert signal.getsignal(signal.SIGINT) is not before
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert interrupt_requested()
    assert signal.getsignal(signal.SIGINT) is before and not interrupt_requested()


def test_guard_turns_an_exception_raised_while_handling_ctrl_c_into_ctrl_c() -> None:
    naive = load_variants(no_plugins=True).registry.get("naive")
    with pytest.raises(KeyboardInterrupt), guard("forward", naive):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            # as torch.profiler does: a new error, its context the Ctrl-C
            raise AssertionError("Profiler must be initialized before stopping trace")  # noqa: B904


def test_a_ctrl_c_swallowed_before_the_cells_ends_the_command_with_130(cli, write_config, monkeypatch,
                                                                      tmp_path: Path) -> None:
    """CPython drops a KeyboardInterrupt that lands in an import-lock callback while torch is imported."""
    from attnprof.cli import common

    real = common.load_variants_for_cli

    def loading_with_a_swallowed_interrupt():
        swallow_sigint()
        return real()

    monkeypatch.setattr(common, "load_variants_for_cli", loading_with_a_swallowed_interrupt)
    result = cli("compare", str(write_config()), "--no-timing")
    assert result.exit_code == 130, result.output
    assert result.stderr.strip() == "error: interrupted before any cell finished: nothing written"
    assert list((tmp_path / "out").iterdir()) == []  # no 0-row results file, no empty run folder
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_ctrl_c_while_the_ceiling_is_measured_leaves_no_run_folder(cli, write_config, monkeypatch, tmp_path,
                                                                   command) -> None:
    """The first stage of a dtype, before any cell: nothing finished, so nothing is kept (a sweep's stream,
    opened with its header before the ceiling, goes with the folder)."""
    from attnprof.profiling import ceiling

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ceiling.RunCeiling, "start", interrupted)
    sweep = {"shapes": [{"batch": 1, "heads": 2, "head_dim": 16}], "sweep": {"seq": [32, 64]}}
    config = write_config(**sweep) if command == "sweep" else write_config()
    result = cli(command, str(config), "--min-time", "0.02")
    assert result.exit_code == 130, result.output
    assert "error: interrupted before any cell finished: nothing written" in result.stderr
    assert "Traceback" not in result.output and list((tmp_path / "out").iterdir()) == []


def test_ctrl_c_after_the_folder_opened_and_before_the_cells_leaves_no_run_folder(cli, write_config, monkeypatch,
                                                                                  tmp_path) -> None:
    """An interrupt outside the cells' loop (here while the environment is collected) removes the folder too."""
    from attnprof.profiling import environment

    def interrupted(device):
        raise KeyboardInterrupt

    monkeypatch.setattr(environment, "collect_environment", interrupted)
    result = cli("compare", str(write_config()), "--no-timing")
    assert result.exit_code == 130 and "interrupted before any cell finished: nothing written" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_ctrl_c_before_the_first_model_row_leaves_no_run_folder(cli, model_config, monkeypatch, tmp_path) -> None:
    from attnprof.pipeline import model

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "run_model", interrupted)
    result = cli("model", str(model_config(output_dir=str(tmp_path / "model-out"))), "--no-timing")
    assert result.exit_code == 130, result.output
    assert "error: interrupted before any cell finished: nothing written" in result.stderr
    assert not (tmp_path / "model-out").exists() or list((tmp_path / "model-out").iterdir()) == []


def test_an_interrupted_compare_names_the_whole_command_that_goes_on(cli, write_config, monkeypatch,
                                                                    tmp_path) -> None:
    """Ctrl-C in the second cell: the first is kept, and the line printed is a command that resumes the run."""
    from attnprof.pipeline import run

    real, calls = run.run_cell, []

    def second_interrupted(*args, **kwargs):
        calls.append(args[0].name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "run_cell", second_interrupted)
    result = cli("compare", str(write_config()), "--no-timing")
    assert result.exit_code == 130, result.output
    [folder] = (tmp_path / "out").glob("*-compare")
    line = f"interrupted: keeping the 1 finished cell(s); to go on: attnprof compare --resume {folder}"
    assert line in result.stderr, result.stderr
    monkeypatch.setattr(run, "run_cell", real)
    command = line.split("to go on: attnprof ")[1].split()
    resumed = cli(*command, "--no-timing")
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming {folder / 'results.json'}: 1 finished cell(s) kept, 2 of 3 to run" in resumed.stderr


def test_a_ctrl_c_swallowed_by_a_command_that_then_succeeds_still_exits_130(cli, monkeypatch) -> None:
    from attnprof.cli import list_cmd

    real = list_cmd.load_variants_for_cli

    def loading_with_a_swallowed_interrupt():
        swallow_sigint()
        return real()

    monkeypatch.setattr(list_cmd, "load_variants_for_cli", loading_with_a_swallowed_interrupt)
    result = cli("--no-plugins", "list", "--format", "json")
    assert result.exit_code == 130 and "error: interrupted" in result.stderr


# --- a real process, a real SIGINT ------------------------------------------------------------

def interrupt_compare(config_path: Path, marker: str, delay_s: float) -> tuple[int, str, str]:
    """Start `attnprof compare`, send SIGINT `delay_s` after `marker` appears on its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "attnprof", "--no-plugins", "compare", str(config_path),
                             "--no-timing"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                found.set()
        found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert found.wait(120), "".join(seen)
    time.sleep(delay_s)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    stdout = proc.stdout.read()
    proc.wait(120)
    reader.join(10)
    return proc.returncode, stdout, "".join(seen)


# The moments: inside the first cell's profiler start (with `wait: 1` it starts in the first
# `step()` and imports for about a second: where torch swallowed Ctrl-C), and early in the second
# cell, with many more to go so that the run cannot have ended when the signal arrives (since the process
# warm-up took the profiler's first start out of the first cell, a cell of these takes tens of ms: twelve
# of them could end within the 0.9 s).
SHAPES = [{"batch": 1, "heads": 2, "seq": seq, "head_dim": 16} for seq in range(32, 160, 8)]
PLAN = [(variant, f"1x2x{s['seq']}x16") for s in SHAPES for variant in ("naive", "inplace", "sdpa-math")]
MOMENTS = [(f"[1/{len(PLAN)}]", 0.3), (f"[1/{len(PLAN)}]", 0.9), (f"[2/{len(PLAN)}]", 0.05)]


@pytest.mark.slow
def test_sigint_at_several_moments_exits_130_keeping_only_finished_cells(write_config, tmp_path: Path) -> None:
    for index, (marker, delay) in enumerate(MOMENTS):
        out = tmp_path / f"out{index}"
        config = write_config(output_dir=str(out), shapes=SHAPES, schedule={"wait": 1, "warmup": 1, "active": 2})
        code, stdout, stderr = interrupt_compare(config, marker, delay)
        assert code == 130, (marker, delay, stderr)
        assert "Traceback" not in stderr and "failed" not in stderr and "failed" not in stdout, stderr
        found = list(out.glob("*-compare/results.json"))
        if not found:  # SIGINT before the first cell finished: nothing written, no folder left
            assert "interrupted before any cell finished: nothing written" in stderr and not any(out.iterdir())
            continue
        [results] = found
        document = json.loads(results.read_text())
        assert document["interrupted"] is True
        cells = [(r["variant"], r["shape"]) for r in document["results"]]
        assert cells == PLAN[:len(cells)] and len(cells) < len(PLAN)
        assert all(r["status"] == "ok" for r in document["results"])
        goes_on = f"to go on: attnprof --no-plugins compare --resume {results.parent}"
        assert f"interrupted: keeping the {len(cells)} finished cell(s); {goes_on}" in stderr
