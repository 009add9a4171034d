"""CPU checks of benchmarks/fidelity.py's bookkeeping (the timings themselves need the GPU)."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("fidelity", Path(__file__).parents[1] / "benchmarks" / "fidelity.py")
fidelity = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fidelity)


def test_clock_column_marks_windows_held_down_but_not_idle_ones():
    held = {"sm_mhz": 1845, "min_sm_mhz": 1845, "max_sm_mhz": 1980, "limits": ("sw_power_cap",), "samples": 3}
    free = {"sm_mhz": 1980, "min_sm_mhz": 1980, "max_sm_mhz": 1980, "limits": (), "samples": 3}
    assert fidelity.clocks({"sm_clock": {"attnprof_graph": held, "graph": free}}) == "1845* / 1980 / n/a / n/a"


def test_diff_pct():
    assert fidelity.diff_pct(105.0, 100.0) == pytest.approx(5.0)
    assert fidelity.diff_pct(None, 100.0) is None and fidelity.diff_pct(1.0, None) is None


def test_rounds_interleave_and_flip_each_pair(monkeypatch):
    from attnprof.profiling import timing

    calls = []
    fake_time = iter(range(10_000))
    monkeypatch.setattr(fidelity.time, "time", lambda: float(next(fake_time)))

    class T:
        def __init__(self, us, graph=False):
            self.median_us, self.cuda_graph, self.method = us, graph, "m"

    def fake_time_forward(fn, device, options=None):
        cuda_graph, flush_l2 = (options.cuda_graph, options.flush_l2) if options else (False, False)
        key = "attnprof_graph" if cuda_graph else "attnprof_flush" if flush_l2 else "attnprof"
        calls.append(key)
        return T({"attnprof": 10.0, "attnprof_graph": 5.0, "attnprof_flush": 7.0}[key] + len(calls), graph=cuda_graph)

    monkeypatch.setattr(timing, "time_forward", fake_time_forward)
    monkeypatch.setattr(fidelity, "graph_time_us", lambda fn: calls.append("graph") or 4.0)
    monkeypatch.setattr(fidelity, "do_bench_us", lambda fn: calls.append("do_bench") or None)
    out = fidelity.timed_rounds(lambda: None, "cuda:0", 2)
    assert calls == ["attnprof", "graph", "attnprof_graph", "attnprof_flush", "do_bench",
                     "attnprof", "attnprof_graph", "graph", "do_bench", "attnprof_flush"]
    assert out["rounds"]["attnprof_graph"] == [8.0, 12.0] and out["attnprof_graph_us"] == 10.0
    assert out["graph_us"] == 4.0 and out["do_bench_us"] is None
    assert len(out["windows"]["graph"]) == 2 and all(a < b for a, b in out["windows"]["graph"])


def test_median_or_none():
    assert fidelity.median_or_none([3.0, None, 1.0, 2.0]) == 2.0
    assert fidelity.median_or_none([4.0, 1.0]) == 2.5
    assert fidelity.median_or_none([None]) is None


def test_backward_rounds_leave_the_graph_timings_out(monkeypatch):
    """In bwd/fwd+bwd the CUDA-graph timers cannot capture autograd's backward: they are not run."""
    from attnprof.profiling import timing

    calls = []

    class T:
        median_us, cuda_graph, method = 10.0, False, "m"

    monkeypatch.setattr(timing, "time_forward", lambda fn, device, options=None: calls.append(
        "attnprof" if options is None else "flush" if options.flush_l2 else "graph?") or T())
    monkeypatch.setattr(fidelity, "graph_time_us", lambda fn: calls.append("graph") or 4.0)
    monkeypatch.setattr(fidelity, "do_bench_us", lambda fn: calls.append("do_bench") or 10.2)
    out = fidelity.timed_rounds(lambda: None, "cuda:0", 2, graphs=False)
    assert calls == ["attnprof", "flush", "do_bench", "attnprof", "do_bench", "flush"]
    assert out["graph_us"] is None and out["attnprof_graph_us"] is None and out["do_bench_us"] == 10.2
