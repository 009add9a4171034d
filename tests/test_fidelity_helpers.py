"""CPU checks of benchmarks/fidelity.py's bookkeeping (the timings themselves need the GPU)."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("fidelity", Path(__file__).parents[1] / "benchmarks" / "fidelity.py")
fidelity = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fidelity)

SAMPLES = [(1.00, 1980, 0x0), (1.02, 1845, 0x4), (1.04, 1845, 0x4), (1.06, 1965, 0x0), (2.00, 1980, 0x1)]


def test_window_clock_takes_median_min_and_throttle_bits_of_its_window():
    c = fidelity.window_clock(SAMPLES, 1.01, 1.07)
    assert c == {"sm_mhz": 1845, "min_sm_mhz": 1845, "throttle_bits": 0x4, "samples": 3}
    assert fidelity.window_clock(SAMPLES, 3.0, 4.0) is None


def test_clock_column_marks_throttled_windows_but_not_idle_ones():
    row = {"sm_clock": {"attnprof_graph": fidelity.window_clock(SAMPLES, 1.01, 1.07),
                        "graph": fidelity.window_clock(SAMPLES, 1.9, 2.1)}}
    assert fidelity.clocks(row) == "1845* / 1980 / n/a / n/a"


def test_diff_pct():
    assert fidelity.diff_pct(105.0, 100.0) == pytest.approx(5.0)
    assert fidelity.diff_pct(None, 100.0) is None and fidelity.diff_pct(1.0, None) is None
