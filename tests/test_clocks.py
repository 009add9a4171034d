"""SM clock sampling: parsing nvidia-smi's CSV, windows, reason bits, and the runner's use of it."""

import subprocess
import time
from datetime import datetime

import pytest

from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.profiling import clocks
from attnprof.profiling.clocks import ClockSample, ClockSampler, clock_window, parse_samples, reason_names
from attnprof.registry import RunSpec


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


T0 = 1_800_000_000.0
SAMPLES = [ClockSample(T0 + 0.00, 1980, 1980, 0x0), ClockSample(T0 + 0.02, 1845, 1980, 0x4),
           ClockSample(T0 + 0.04, 1845, 1980, 0x4), ClockSample(T0 + 0.06, 1965, 1980, 0x0),
           ClockSample(T0 + 1.00, 1980, 1980, 0x1)]


def test_parse_samples_reads_nvidia_smi_lines_and_skips_junk():
    text = "\n".join([
        f"{stamp(T0)}, 1980, 1980, 0x0000000000000000",
        f"{stamp(T0 + 0.02)}, 1845, 1980, 0x0000000000000004",
        "timestamp, clocks.current.sm [MHz], clocks.max.sm [MHz], clocks_event_reasons.active",
        f"{stamp(T0 + 0.04)}, [N/A], 1980, 0x0",
        f"{stamp(T0 + 0.06)}, 19",  # a line cut off when the sampler was stopped
    ])
    samples = parse_samples(text)
    assert [(s.sm_mhz, s.max_sm_mhz, s.reasons) for s in samples] == [(1980, 1980, 0), (1845, 1980, 4)]
    assert samples[1].when == pytest.approx(T0 + 0.02, abs=1e-3)


def test_window_median_min_max_and_reasons():
    w = clock_window(SAMPLES, [(T0 + 0.01, T0 + 0.07)])
    assert (w.sm_mhz, w.min_sm_mhz, w.max_sm_mhz, w.limits, w.samples) == (1845, 1845, 1980, ("sw_power_cap",), 3)
    row = cell_row(CellResult("a", "built-in", RunSpec("cuda:0", "bf16", 1, 1, 16, 16), clock=w))
    assert {k: getattr(row, k) for k in ("sm_clock_mhz", "sm_clock_min_mhz", "sm_clock_max_mhz", "clock_limits")} == {
        "sm_clock_mhz": 1845, "sm_clock_min_mhz": 1845, "sm_clock_max_mhz": 1980, "clock_limits": "sw_power_cap"}
    both = clock_window(SAMPLES, [(T0 - 0.01, T0 + 0.01), (T0 + 0.05, T0 + 0.07), (T0 + 0.9, T0 + 1.1)])
    assert (both.sm_mhz, both.min_sm_mhz, both.limits) == (1980, 1965, ())  # idle is not a limit
    assert both.limits_text is None
    assert clock_window(SAMPLES, [(T0 + 5, T0 + 6)]) is None


def test_reason_names():
    assert reason_names(0x1) == ()
    assert reason_names(0x4 | 0x40 | 0x1) == ("sw_power_cap", "hw_thermal_slowdown")


def test_sampler_without_nvidia_smi_gives_nothing_and_says_why(monkeypatch):
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    monkeypatch.setattr(clocks, "gpu_selector", lambda device: "GPU-x")
    sampler = ClockSampler("cuda:0").start()
    assert sampler.stop() == [] and sampler.unavailable == "no nvidia-smi"


def test_sampler_uses_the_reasons_field_the_driver_knows(monkeypatch, tmp_path):
    """A fake nvidia-smi that rejects the new field name and streams two samples."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"""#!/bin/sh
case "$*" in *clocks_event_reasons*) echo 'Field "clocks_event_reasons.active" is not a valid field'; exit 2;; esac
case "$*" in *-lms*) echo "{stamp(T0)}, 1980, 1980, 0x0"; echo "{stamp(T0 + 0.02)}, 1755, 1980, 0x4"; exec sleep 30;;
*) echo "{stamp(T0)}, 1980, 1980, 0x0";; esac
""")
    fake.chmod(0o755)
    monkeypatch.setattr(clocks.shutil, "which", lambda name: str(fake))
    monkeypatch.setattr(clocks, "gpu_selector", lambda device: "GPU-x")
    calls = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(clocks.subprocess, "Popen", lambda cmd, **kw: calls.append(cmd) or real_popen(cmd, **kw))
    sampler = ClockSampler("cuda:0").start()
    streaming = [cmd for cmd in calls if "-lms" in cmd]
    assert len(streaming) == 1 and any("clocks_throttle_reasons.active" in part for part in streaming[0])
    deadline = time.time() + 5
    while time.time() < deadline:
        time.sleep(0.1)
        sampler._file.flush()
        sampler._file.seek(0)
        if len(parse_samples(sampler._file.read())) >= 2:
            break
    samples = sampler.stop()
    assert [s.sm_mhz for s in samples] == [1980, 1755] and sampler.unavailable is None


def test_runner_attaches_the_clock_of_each_timing_window():
    from attnprof.pipeline import attach_clocks
    from attnprof.pipeline.measured import CellResult
    from attnprof.pipeline.rows import cell_row
    from attnprof.registry import RunSpec

    spec = RunSpec("cuda:0", "bf16", 1, 1, 16, 16)
    timed = CellResult("a", "built-in", spec, timing_window=(T0 + 0.01, T0 + 0.07))
    untimed = CellResult("b", "built-in", spec)
    other = CellResult("c", "built-in", RunSpec("cuda:1", "bf16", 1, 1, 16, 16), timing_window=(T0, T0 + 1))
    attach_clocks([timed, untimed, other], "cuda:0", SAMPLES)
    assert cell_row(timed).sm_clock_mhz == 1845 and cell_row(timed).clock_limits == "sw_power_cap"
    assert untimed.clock is None and other.clock is None


def test_cpu_runs_start_no_sampler():
    from attnprof.config import MeasureOptions
    from attnprof.pipeline.run import _clock_sampler
    from attnprof.registry import RunSpec

    assert _clock_sampler([(None, RunSpec("cpu", "fp32", 1, 1, 16, 16))], MeasureOptions()) is None


def _row(**extra):
    from attnprof.results.schema import Row

    row = {"variant": "v", "source": "built-in", "shape": "1x1x16x16", "dtype": "bf16", "causal": True,
           "device": "cuda:0", "status": "ok", "latency_us": 2036.0, "latency_iqr_us": 27.0}
    row.update(extra)
    return Row(**row)


def test_tables_show_a_held_down_clock_and_leave_a_free_one_alone():
    from attnprof.report.columns import latency_text
    from attnprof.report.run_tables import run_summary_table

    held = _row(sm_clock_mhz=1650, sm_clock_min_mhz=1560, sm_clock_max_mhz=1980, clock_limits="sw_power_cap")
    assert latency_text(held) == "2,036 ± 27 @ 1,650 MHz"
    assert latency_text(_row(sm_clock_mhz=1980, sm_clock_max_mhz=1980)) == "2,036 ± 27"
    table = run_summary_table(held, "markdown")
    assert "1,650 MHz median, 1,560 lowest, 1,980 max; held down by sw_power_cap" in table
    assert "n/a (not sampled" in run_summary_table(_row(), "markdown")


def test_result_rows_carry_the_clock_fields():
    from attnprof.pipeline.measured import CellResult
    from attnprof.pipeline.rows import cell_row
    from attnprof.profiling.clocks import ClockWindow
    from attnprof.registry import RunSpec

    result = CellResult("a", "built-in", RunSpec("cuda:0", "bf16", 1, 1, 16, 16),
                        clock=ClockWindow(sm_mhz=1845, min_sm_mhz=1650, max_sm_mhz=1980, limits=("sw_power_cap",),
                                          samples=4))
    row = cell_row(result)
    assert (row.sm_clock_mhz, row.sm_clock_max_mhz, row.clock_limits) == (1845, 1980, "sw_power_cap")
    assert row.sm_clock_min_mhz == 1650
    assert cell_row(CellResult("b", "built-in", result.spec)).sm_clock_mhz is None
