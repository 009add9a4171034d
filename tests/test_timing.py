from dataclasses import asdict

import pytest
import torch

from attnprof.errors import VariantFailure
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.profiling import retime, timing
from attnprof.profiling.timing import (
    TimingOptions,
    choose_reps,
    has_settled,
    is_unstable,
    summarize,
    time_forward,
)
from attnprof.registry import RunSpec


class FakeClock:
    """A clock that only moves when the timed function says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_summary_quantiles_match_torch_linear():
    samples_s = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    t = summarize(samples_s, reps=6, warmup_reps=0, cold_s=0.0, method="m")
    us = torch.tensor(samples_s, dtype=torch.float64) * 1e6
    assert t.p25_us == pytest.approx(torch.quantile(us, 0.25).item())
    assert t.median_us == pytest.approx(torch.quantile(us, 0.5).item())
    assert t.p75_us == pytest.approx(torch.quantile(us, 0.75).item())
    assert t.iqr_us == pytest.approx(t.p75_us - t.p25_us) and t.min_us == pytest.approx(1e6)


def test_unstable_rule_is_iqr_over_median_above_ten_percent():
    assert not is_unstable(100.0, 10.0)
    assert is_unstable(100.0, 10.1)
    assert is_unstable(100.0, 5.0, threshold=0.04)
    assert is_unstable(0.0, 0.0)


def test_choose_reps_fills_time_and_clamps():
    assert choose_reps(0.001, 0.25, 10, 1000) == 250
    assert choose_reps(1e-6, 0.25, 10, 1000) == 1000  # tiny call: capped
    assert choose_reps(2.0, 0.25, 10, 1000) == 10  # huge call: floor
    assert choose_reps(0.0, 0.25, 10, 1000) == 1000
    with pytest.raises(ValueError):
        choose_reps(0.001, 0.25, 10, 5)


def test_has_settled():
    assert has_settled([5.0, 1.0, 1.02, 1.05], window=3)
    assert not has_settled([1.0, 2.0, 1.0], window=3)
    assert not has_settled([1.0, 1.0], window=3)


def test_time_based_reps_with_fake_clock():
    clock = FakeClock()
    durations = iter([0.100] + [0.001] * 10_000)  # first call "compiles" for 100 ms

    def fn():
        clock.now += next(durations)

    options = TimingOptions(min_time_s=0.05, min_reps=5, max_reps=1000, warmup_min_s=0.0)
    t = time_forward(fn, "cpu", options, clock=clock)
    assert t.reps == 50  # 0.05 s / 1 ms
    assert t.cold_ms == pytest.approx(100.0)
    assert t.median_us == pytest.approx(1000.0)
    assert t.iqr_us == pytest.approx(0.0)
    assert t.p25_us == pytest.approx(1000.0) and t.p75_us == pytest.approx(1000.0)
    assert t.warmup_reps == 3  # settled after the window of 3 equal calls
    assert not t.unstable
    assert "perf_counter" in t.method and "settled" in t.method


def test_warmup_runs_until_times_settle():
    clock = FakeClock()
    # cold call, then a slow-down that decays (autotuning, caches), then steady 1 ms
    durations = iter([0.5, 0.05, 0.02, 0.01, 0.005] + [0.001] * 10_000)

    def fn():
        clock.now += next(durations)

    t = time_forward(fn, "cpu", TimingOptions(min_time_s=0.01, min_reps=3, warmup_min_s=0.0), clock=clock)
    assert t.warmup_reps == 4 + 3  # the four decaying calls plus a settled window of three
    assert t.median_us == pytest.approx(1000.0)


def test_warmup_stops_at_its_time_budget():
    clock = FakeClock()
    state = {"i": 0}

    def fn():  # never settles: alternates 1 ms and 3 ms
        state["i"] += 1
        clock.now += 0.001 if state["i"] % 2 else 0.003

    t = time_forward(fn, "cpu", TimingOptions(min_time_s=0.02, min_reps=4, warmup_s=0.1), clock=clock)
    assert "time budget" in t.method
    assert 40 <= t.warmup_reps <= 60  # ~0.1 s of 2 ms-average calls
    assert t.unstable  # IQR/median is about 1 here


def test_huge_calls_get_min_reps():
    clock = FakeClock()

    def fn():
        clock.now += 1.0

    t = time_forward(fn, "cpu", TimingOptions(min_time_s=0.25, min_reps=3, max_reps=100, warmup_s=0.5), clock=clock)
    assert t.reps == 3
    assert t.median_us == pytest.approx(1e6)


def test_real_cheap_function_is_capped_by_max_reps():
    x = torch.ones(8)
    t = time_forward(lambda: x + 1, "cpu", TimingOptions(min_time_s=0.05, max_reps=200, min_reps=5, warmup_s=0.05))
    assert 5 <= t.reps <= 200
    assert 0 < t.p25_us <= t.median_us <= t.p75_us
    assert t.iqr_us == pytest.approx(t.p75_us - t.p25_us)


def test_cpu_notes_graph_and_flush_as_not_applicable():
    x = torch.ones(4)
    options = TimingOptions(min_time_s=0.005, min_reps=2, warmup_s=0.01, cuda_graph=True, flush_l2=True)
    t = time_forward(lambda: x * 2, "cpu", options)
    assert "cuda-graph n/a on CPU" in t.method and "flush-l2 n/a on CPU" in t.method
    assert t.cuda_graph is False and t.flush_l2 is False
    assert set(asdict(t)) >= {"median_us", "iqr_us", "p25_us", "p75_us", "reps", "cold_ms", "unstable", "method"}


def test_oom_becomes_one_line_variant_failure():
    def fn():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB.\nGPU 0 has 80 GiB total")

    with pytest.raises(VariantFailure) as info:
        time_forward(fn, "cpu")
    assert info.value.message.startswith("out of memory: ")
    assert "64.00 GiB" in info.value.message
    assert "\n" not in info.value.message


def test_oom_after_warmup_is_caught_too():
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return None

    with pytest.raises(VariantFailure, match="^out of memory"):
        time_forward(fn, "cpu", TimingOptions(min_time_s=0.01, warmup_s=0.01))


def test_other_errors_propagate():
    def fn():
        raise ValueError("bad shape")

    with pytest.raises(ValueError):
        time_forward(fn, "cpu")


def test_summarize_flags_unstable():
    t = timing.summarize([1e-3, 1e-3, 2e-3, 2e-3], reps=4, warmup_reps=0, cold_s=0.0, method="x")
    assert t.unstable and t.median_us == pytest.approx(1500.0)


def test_the_row_carries_the_timing_under_its_names():
    t = timing.summarize([1e-3, 2e-3, 3e-3], reps=3, warmup_reps=1, cold_s=0.5, method="m")
    row = cell_row(CellResult("v", "built-in", RunSpec("cpu", "fp32", 1, 1, 16, 16), timing=t))
    assert row.latency_us == t.median_us == pytest.approx(2000.0)
    assert row.latency_iqr_us == t.iqr_us and row.timing_method == "m"
    assert row.cold_ms == pytest.approx(500.0) and (row.timing_reps, row.warmup_reps) == (3, 1)


def test_forwards_per_graph_fills_the_target_and_is_clamped():
    from attnprof.profiling.cuda_graphs import GRAPH_MAX_FORWARDS, forwards_per_graph

    assert forwards_per_graph(54.0, target_us=1000.0) == 19  # a small kernel: launch spread over 19
    assert forwards_per_graph(2600.0, target_us=1000.0) == 1  # a big one already fills a replay
    assert forwards_per_graph(700.0, target_us=1000.0) == 1
    assert forwards_per_graph(3.0, target_us=1000.0) == GRAPH_MAX_FORWARDS
    assert forwards_per_graph(0.0) == GRAPH_MAX_FORWARDS
    assert forwards_per_graph(10.0, target_us=1000.0, max_forwards=8) == 8
    with pytest.raises(ValueError):
        forwards_per_graph(10.0, max_forwards=0)


def test_summarize_records_forwards_per_sample():
    t = summarize([1e-5] * 4, reps=4, warmup_reps=3, cold_s=0.0, method="m", cuda_graph=True,
                  forwards_per_sample=19)
    assert t.forwards_per_sample == 19 and asdict(t)["forwards_per_sample"] == 19
    assert t.median_us == pytest.approx(10.0)


def test_drift_is_the_halves_medians_apart_over_the_median():
    assert timing.halves_drift([1.0, 1.2, 0.8, 1.0, 1.2, 0.8]) == pytest.approx(0.0)
    assert timing.halves_drift([1.0, 1.0, 9.0, 2.0, 2.0]) == pytest.approx(1.0 / 2.0)  # middle call left out
    assert timing.halves_drift([5.0]) == 0.0 and timing.halves_drift([]) == 0.0


def test_only_an_unstable_sample_that_drifted_is_worth_retiming():
    jitter = summarize([1e-3, 1.3e-3] * 50, reps=100, warmup_reps=0, cold_s=0.0, method="m")  # host-bound jitter
    assert jitter.unstable and jitter.drift == pytest.approx(0.0) and not retime.worth_retiming(jitter)
    loaded = summarize([1e-3] * 50 + [1.5e-3] * 50, reps=100, warmup_reps=0, cold_s=0.0, method="m")  # load came
    assert loaded.unstable and loaded.drift == pytest.approx(0.4) and retime.worth_retiming(loaded)
    steady = summarize([1e-3] * 50 + [1.04e-3] * 50, reps=100, warmup_reps=0, cold_s=0.0, method="m")
    assert not steady.unstable and not retime.worth_retiming(steady)


def test_retime_note_says_what_became_of_an_unstable_sample():
    jitter = summarize([1e-3, 1.3e-3] * 50, reps=100, warmup_reps=0, cold_s=0.0, method="m")
    loaded = summarize([1e-3] * 50 + [1.5e-3] * 50, reps=100, warmup_reps=0, cold_s=0.0, method="m")
    calm = summarize([1e-3] * 100, reps=100, warmup_reps=0, cold_s=0.0, method="m")
    assert retime.retime_note(calm, calm, retimed=False) == ""
    assert retime.retime_note(jitter, jitter, retimed=False) == (
        "unstable (IQR 26% of the median) but not timed again: its halves' medians agree within 0.0%, "
        "so a second sample would give the same median"
    )
    assert retime.retime_note(loaded, calm, retimed=True) == (
        "timed again: the first sample was unstable (IQR 40% of the median) and its halves' medians differed by "
        "40.0%"
    )
    assert retime.retime_note(loaded, loaded, retimed=True).endswith("; still unstable")
