"""The pipeline on CPU: one cell top to bottom, failures as rows, Ctrl-C, clocks and the written outputs."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from attnprof import devices
from attnprof.config import Config, MeasureOptions, Schedule, load_config
from attnprof.errors import UnknownVariantError, VariantFailure
from attnprof.pipeline import (
    cell_specs,
    config_exclusions,
    plan_cells,
    resolve_config,
    run_cell,
    run_cells,
    select_variants,
    without_collective,
    without_unrunnable_wildcards,
)
from attnprof.pipeline.cell import exceeds, throughput
from attnprof.pipeline.engine import Job, run_job
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.pipeline.stages import guard, phase
from attnprof.plugins import load_variants
from attnprof.profiling.ceiling import Ceiling, RunCeiling
from attnprof.registry import RunSpec

SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
SPEC = RunSpec("cpu", "fp32", **SHAPE)
FAST = MeasureOptions(min_time_s=0.02)


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(
        device="cpu",
        dtype="fp32",
        shapes=[SHAPE],
        variants=["naive", "sdpa-math"],
        baseline="sdpa-math",
        schedule=Schedule(wait=0, warmup=1, active=2),
        output_dir=tmp_path,
    )


def builtin(name: str):
    return load_variants(no_plugins=True).registry.get(name)


def test_one_cell_fills_every_part(config) -> None:
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert result.ok, result.reason
    assert result.timing is not None and result.timing.reps >= 10 and result.latency_us > 0
    assert result.check is not None and result.check.passed and result.check.threshold == 1e-5
    assert result.analysis is not None and result.analysis.forwards == 2 and result.analysis.region == "attnprof"
    assert result.trace_path.exists() and result.trace_path.parent == config.output_dir
    assert result.memory_mib is None  # no honest per-call peak on CPU
    assert result.throughput is None  # no ceiling given
    assert set(result.phases_s) >= {"setup", "timing", "profile", "trace_export", "correctness", "analysis"}


def test_without_timing_there_is_no_latency_but_a_trace(config) -> None:
    result = run_cell(builtin("sdpa-math"), SPEC, config, MeasureOptions(timing=False))
    assert result.ok and result.timing is None and result.latency_us is None
    assert result.analysis.forwards == 2 and "warmup" in result.phases_s


def fixed_ceiling(
    tflops: float | None, dtype: str = "fp32", calls: list | None = None, fresh_tflops: float | None = None
) -> RunCeiling:
    """A run ceiling of `tflops` whose measurement again (counted in `calls`) gives `fresh_tflops`."""

    def probe(device: str, dtype: str) -> Ceiling:
        if calls is not None:
            calls.append(dtype)
        return Ceiling(fresh_tflops, 10.0, "measured", method="fake", read_gbps=20.0, read_method="fake read")

    return RunCeiling("cpu", dtype, Ceiling(tflops, 10.0, "cached", method="fake", read_gbps=20.0), probe=probe)


def test_a_ceiling_gives_throughput(config) -> None:
    result = run_cell(builtin("sdpa-math"), SPEC, config, FAST, fixed_ceiling(1.0))
    assert result.throughput is not None and result.throughput.peak_tflops == 1.0
    assert result.throughput.tflops > 0 and result.throughput.bound in {"compute", "memory"}
    assert 0 < result.throughput.pct_of_peak < 100 and result.throughput.pct_of_peak_note is None
    assert result.throughput.peak_read_gbps == 20.0 and 0 < result.throughput.pct_of_read_bandwidth < 100
    row = cell_row(result)
    assert row.pct_of_read_bandwidth == pytest.approx(result.throughput.pct_of_read_bandwidth)
    assert row.peak_read_gbps == row.read_reference_gbps == 20.0 and row.read_bandwidth_note is None


def test_an_exceeded_ceiling_is_measured_again_once_then_the_achieved_figure_is_the_reference(config) -> None:
    calls: list = []
    ceiling = fixed_ceiling(1e-9, calls=calls, fresh_tflops=2e-9)  # any attention beats these
    first = run_cell(builtin("sdpa-math"), SPEC, config, FAST, ceiling)
    assert calls == ["fp32"] and ceiling.replaced.tflops == 1e-9 and ceiling.current.tflops == 2e-9
    assert ceiling.current.reason.startswith("sdpa-math at 1x2x32x16 reached ")
    tp = first.throughput
    assert tp.pct_of_peak == 100.0 and tp.peak_tflops == 2e-9 and tp.tflops > 2e-9 and tp.pct_of_peak_note is None
    second = run_cell(builtin("naive"), SPEC, config, FAST, ceiling)
    assert calls == ["fp32"] and second.throughput.peak_tflops == 2e-9  # once per run
    row = cell_row(first)
    assert row.pct_of_peak == 100.0 and row.pct_of_peak_note is None and row.bound is not None
    assert row.peak_tflops == 2e-9 and row.peak_reference_tflops == tp.tflops
    assert row.peak_reference_note == (
        f"% of peak is of {tp.tflops:.3g} TFLOP/s (sdpa-math at 1x2x32x16 fp32 causal fwd, by latency), "
        "above the fp32 matmul measured on cpu (2e-09 TFLOP/s)"
    )


def test_a_fresh_ceiling_that_holds_gives_a_percentage(config) -> None:
    calls: list = []
    result = run_cell(builtin("sdpa-math"), SPEC, config, FAST, fixed_ceiling(1e-9, calls=calls, fresh_tflops=1e3))
    assert calls == ["fp32"] and result.throughput.peak_tflops == 1e3
    assert 0 < result.throughput.pct_of_peak < 100 and result.throughput.pct_of_peak_note is None


def test_no_ceiling_gives_na_with_its_reason_and_measures_nothing(config) -> None:
    spec = replace(SPEC, dtype="bf16")
    ceiling = RunCeiling.start("cpu", "bf16")
    result = run_cell(builtin("sdpa-math"), spec, config, FAST, ceiling)
    tp = result.throughput
    assert tp.tflops > 0 and tp.achieved_gbps > 0 and ceiling.replaced is None
    assert (tp.pct_of_peak, tp.peak_tflops, tp.bound) == (None, None, None)
    assert tp.pct_of_peak_note == "no meaningful bf16 matmul ceiling on CPU (attention there computes in fp32)"


def test_throughput_is_pure_arithmetic() -> None:
    from attnprof.analysis.roofline import attention_flops

    latency_us = attention_flops(SPEC) / 0.5e12 * 1e6  # 0.5 TFLOP/s
    half = throughput(SPEC, latency_us, Ceiling(1.0, 10.0, "cached"))
    assert half.pct_of_peak == pytest.approx(50.0) and half.pct_of_peak_note is None and not exceeds(half)
    over = throughput(SPEC, latency_us, Ceiling(0.25, 10.0, "cached"))
    assert exceeds(over) and over.pct_of_peak == 100.0 and over.pct_of_peak_note is None  # its own figure


def test_a_measurement_again_puts_every_cell_of_the_run_on_the_fresh_ceiling(config) -> None:
    calls: list = []
    ceiling = fixed_ceiling(1e9, calls=calls, fresh_tflops=1e3)  # the first cell is far below it

    def sink_the_ceiling(result: CellResult) -> None:  # as if the second cell met a stale, absurdly low figure
        if result.variant == "naive":
            ceiling.current = Ceiling(1e-9, 10.0, "cached", method="fake")

    cells = [(builtin("naive"), SPEC), (builtin("sdpa-math"), SPEC)]
    results, _ = run_cells(cells, config, FAST, ceiling, on_done=sink_the_ceiling)
    assert calls == ["fp32"] and ceiling.current.reason.startswith("sdpa-math at ")  # the second cell exceeded it
    assert [r.throughput.peak_tflops for r in results] == [1e3, 1e3]  # the first one was computed against 1e9
    assert all(0 < r.throughput.pct_of_peak < 100 for r in results)


def test_a_variant_that_cannot_run_is_skipped_and_a_broken_plugin_failed(config) -> None:
    naive = builtin("naive")
    skipped = run_cell(replace(naive, devices=("cuda",)), SPEC, config, FAST)
    assert (skipped.status, skipped.reason) == ("skipped", "needs CUDA")
    broken = run_cell(replace(naive, load_error="plugin failed to import: boom"), SPEC, config, FAST)
    assert (broken.status, broken.reason) == ("failed", "plugin failed to import: boom")


def test_a_raising_forward_is_a_failed_row_naming_the_stage(config) -> None:
    def explode(q, k, v, causal, state):
        raise ValueError("bad shape\nsecond line")

    result = run_cell(replace(builtin("naive"), forward=explode, source="attnprof-x 1.0"), SPEC, config, FAST)
    assert result.status == "failed"
    assert result.reason == "forward raised ValueError (plugin attnprof-x 1.0): bad shape"


def test_a_wrong_output_fails_after_the_trace_is_analysed(config) -> None:
    import torch

    result = run_cell(replace(builtin("naive"), forward=lambda q, k, v, c, s: torch.zeros_like(q)), SPEC, config, FAST)
    assert result.status == "failed" and result.reason.startswith("relative error 1.0e+00 > 1e-05")
    assert result.analysis is not None and result.check is not None and not result.check.passed


def test_guard_and_phase() -> None:
    result = CellResult("v", "built-in", SPEC)
    variant = builtin("naive")
    with (
        pytest.raises(VariantFailure, match="setup raised KeyError: 'x'"),
        phase(result, "setup"),
        guard("setup", variant),
    ):
        raise KeyError("x")
    with pytest.raises(KeyboardInterrupt), guard("forward", variant):
        raise KeyboardInterrupt
    with phase(result, "setup"):
        pass
    assert result.phases_s["setup"] >= 0.0 and list(result.phases_s) == ["setup"]


def test_run_cells_keeps_finished_cells_on_ctrl_c_and_sets_speedups(config) -> None:
    def interrupt(*args):
        raise KeyboardInterrupt

    cells = plan_cells(config, select_variants(config, load_variants(no_plugins=True).registry, "cpu"), "cpu")
    assert [(v.name, s) for v, s in cells] == [("naive", SPEC), ("sdpa-math", SPEC)]
    results, interrupted = run_cells(cells, config, FAST)
    assert not interrupted and all(r.ok for r in results)
    assert results[1].speedup_vs_baseline == pytest.approx(1.0) and results[0].speedup_vs_baseline > 0
    cells[1] = (replace(cells[1][0], forward=interrupt), SPEC)
    results, interrupted = run_cells(cells, config, FAST)
    assert interrupted and [r.variant for r in results] == ["naive"]


def test_the_engine_writes_json_and_csv(config) -> None:
    outcome, code = run_job(Job("compare", config, "cpu", FAST, plan_cells(config, [builtin("naive")], "cpu")))
    assert outcome is not None and code == 0
    json_path, csv_path = outcome.files
    document = json.loads(json_path.read_text())
    assert document["command"] == "compare" and document["interrupted"] is False
    assert document["results"][0]["variant"] == "naive" and document["results"][0]["timing_reps"] >= 10
    [row] = list(csv.DictReader(csv_path.open()))
    assert row["variant"] == "naive" and row["status"] == "ok"
    assert outcome.exit_code == 0


@pytest.mark.parametrize(("capability", "expected"), [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16")])
def test_auto_dtype_is_resolved_once_for_the_device(monkeypatch, capability, expected) -> None:
    """The built-in default's `dtype: auto` is a GPU user's dtype on a GPU, fp32 on CPU; cell specs see
    only the concrete dtype, and a dtype the config names stays."""
    monkeypatch.setattr(devices, "compute_capability", lambda device: capability)
    default = load_config(None)
    assert default.dtype == "auto"
    on_gpu = resolve_config(default, "cuda:0")
    assert on_gpu.dtype == expected and cell_specs(on_gpu, "cuda:0")[0].dtype == expected
    assert resolve_config(default, "cpu").dtype == "fp32"
    pinned = default.model_copy(update={"dtype": "fp32"})
    assert resolve_config(pinned, "cuda:0") is pinned


def test_default_exclusions_hold_on_cpu_only() -> None:
    """flex and compiled are left out of the default compare on CPU, with the config's reason, and kept on a GPU."""
    registry = load_variants(no_plugins=True).registry
    default = load_config(None)
    def chosen(device: str) -> list[str]:
        found = without_collective(default, select_variants(default, registry, device), False)
        return [v.name for v in without_unrunnable_wildcards(default, found)]

    on_cpu, on_gpu = chosen("cpu"), chosen("cuda:0")
    assert "flex" not in on_cpu and "compiled" not in on_cpu
    assert on_gpu[-2:] == ["flex", "compiled"] and set(on_gpu) - set(on_cpu) == {"flex", "compiled"}
    [(names, reason)] = config_exclusions(default, registry, "cpu")
    assert names == ["flex", "compiled"] and reason.startswith("torch.compile takes tens of seconds on a small CPU")
    assert config_exclusions(default, registry, "cuda:0") == []


def test_a_wildcard_leaves_out_variants_of_none_of_the_configs_dtypes(config) -> None:
    """sdpa-fp8 (fp8 only) is left out of `sdpa-*` in a bf16 config, kept in an fp8 sweep and when named."""
    registry = load_variants(no_plugins=True).registry

    def chosen(**update) -> list[str]:
        cfg = Config.model_validate(config.model_dump() | update)
        return [v.name for v in without_unrunnable_wildcards(cfg, select_variants(cfg, registry, "cuda:0"))]

    assert "sdpa-fp8" not in chosen(variants=["sdpa-*"], dtype="bf16")
    assert "sdpa-fp8" in chosen(variants=["sdpa-*"], dtype="bf16", sweep={"dtype": ["bf16", "fp8"]})
    assert "sdpa-fp8" in chosen(variants=["sdpa-flash", "sdpa-fp8"], dtype="bf16")
    assert "sdpa-fp8" in chosen(variants=["sdpa-*"], dtype="auto")


def test_exclusions_name_each_variant_once_under_its_first_entry(config) -> None:
    registry = load_variants(no_plugins=True).registry
    config = config.model_copy(update={"variants": ["naive", "sdpa*"]})
    config = Config.model_validate(
        config.model_dump()
        | {
            "exclude": [
                {"variants": ["sdpa-cudnn", "sdpa-flash"], "device": "cuda", "reason": "r1"},
                "sdpa-*",
                "compiled",
            ]
        }
    )
    assert config_exclusions(config, registry, "cuda:1") == [
        (["sdpa-flash", "sdpa-cudnn"], "r1"),
        (["sdpa-math", "sdpa-efficient", "sdpa-fp8"], None),
    ]
    assert config_exclusions(config, registry, "cpu") == [
        (["sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "sdpa-fp8"], None)
    ]


def test_names_are_checked_for_every_device(config) -> None:
    """A typo in an exclusion that applies only on CUDA fails on CPU too; so does a typo'd baseline."""
    registry = load_variants(no_plugins=True).registry
    scoped = Config.model_validate(config.model_dump() | {"exclude": [{"variants": ["flx"], "device": "cuda"}]})
    with pytest.raises(UnknownVariantError, match="unknown variant 'flx'; did you mean flex"):
        select_variants(scoped, registry, "cpu")
    typo = config.model_copy(update={"baseline": "sdpa-mth"})
    with pytest.raises(UnknownVariantError, match="unknown baseline 'sdpa-mth'; did you mean sdpa-math"):
        select_variants(typo, registry, "cpu")


def fake_timings(monkeypatch, *spreads: float) -> list[dict]:
    """Replace time_forward by one returning a Timing per spread in turn (unstable above 10 %);
    returns the calls it received."""
    from attnprof.profiling import timing

    calls: list[dict] = []
    samples = iter(spreads)

    def time_forward(fn, device, options, **kwargs):
        calls.append({"options": options, **kwargs})
        spread = next(samples)
        return timing.summarize(
            [1e-4 * (1 - spread), 1e-4, 1e-4, 1e-4 * (1 + spread)],
            reps=4,
            warmup_reps=3,
            cold_s=0.5 / len(calls),
            method=f"fake {len(calls)}",
        )

    monkeypatch.setattr(timing, "time_forward", time_forward)
    return calls


def test_an_unstable_timing_is_retimed_once_and_the_second_kept(config, monkeypatch) -> None:
    calls = fake_timings(monkeypatch, 0.5, 0.01)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert result.ok and len(calls) == 2 and calls[1]["options"].min_time_s == FAST.min_time_s
    assert result.retimed == 1 and result.timing.method.startswith("fake 2;") and not result.timing.unstable
    assert result.timing.cold_ms == pytest.approx(500.0)  # the first sample's cold call: only it was cold
    assert result.timing_window[0] <= result.timing_window[1]


def test_a_stable_timing_is_not_retimed_and_a_still_unstable_one_stays_marked(config, monkeypatch) -> None:
    calls = fake_timings(monkeypatch, 0.01)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert len(calls) == 1 and result.retimed == 0
    calls = fake_timings(monkeypatch, 0.5, 0.6, 0.01)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert len(calls) == 2 and result.retimed == 1 and result.timing.unstable
    assert result.timing.method.startswith("fake 2; timed again") and result.timing.method.endswith("still unstable")


def test_an_unstable_sample_that_did_not_drift_is_kept_and_says_why(config, monkeypatch) -> None:
    """Spread through the whole sample (a host-bound launch loop) is the forward's own: a second sample would
    give the same median, so none is taken; the row stays unstable and its method says so."""
    from attnprof.profiling import timing

    calls: list[int] = []

    def time_forward(fn, device, options, **kwargs):
        calls.append(1)
        return timing.summarize([1e-4, 1.3e-4] * 20, reps=40, warmup_reps=3, cold_s=0.5, method="fake")

    monkeypatch.setattr(timing, "time_forward", time_forward)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert result.ok and len(calls) == 1 and result.retimed == 0 and result.timing.unstable
    assert result.timing.method.startswith("fake; unstable (IQR 26% of the median) but not timed again")
    assert "retiming" not in result.phases_s


def test_a_retimed_sample_says_why_and_times_apart(config, monkeypatch) -> None:
    fake_timings(monkeypatch, 0.5, 0.01)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert result.retimed == 1 and result.timing.method.startswith("fake 2; timed again: the first sample was")
    assert "differed by 50.0%" in result.timing.method and result.phases_s["retiming"] >= 0.0


def test_a_single_process_leaves_out_collective_variants_a_wildcard_chose(config) -> None:
    """cp-ring and cp-torch need a torchrun group: `*` leaves them out of one process (the run stays as it
    was), a name given in full keeps them (skipped, with the reason), and a group keeps them all."""
    registry = load_variants(no_plugins=True).registry
    everything = select_variants(config.model_copy(update={"variants": ["*"]}), registry, "cpu")
    assert {"cp-ring", "cp-torch"} <= {v.name for v in everything}
    alone = without_collective(config.model_copy(update={"variants": ["*"]}), everything, grouped=False)
    assert not any(v.collective for v in alone) and len(alone) == len(everything) - 2
    assert without_collective(config.model_copy(update={"variants": ["*"]}), everything, grouped=True) == everything
    named = config.model_copy(update={"variants": ["naive", "cp-ring"]})
    assert [v.name for v in without_collective(named, select_variants(named, registry, "cpu"), False)] == [
        "naive",
        "cp-ring",
    ]
    only = config.model_copy(update={"variants": ["cp-*"]})
    assert [v.name for v in without_collective(only, select_variants(only, registry, "cpu"), False)] == [
        "cp-ring",
        "cp-torch",
    ]


def test_the_profilers_own_table_is_built_only_when_asked(tmp_path):
    """key_averages costs tens of ms per cell on a GPU and only `run` prints it: other commands skip it."""
    config = Config(shapes=[SHAPE], schedule=Schedule(wait=0, warmup=1, active=1), output_dir=tmp_path)
    plain = run_cell(builtin("sdpa-math"), SPEC, config, MeasureOptions(timing=False))
    asked = run_cell(builtin("sdpa-math"), SPEC, config, MeasureOptions(timing=False, key_averages_table=True))
    assert plain.status == asked.status == "ok"
    assert plain.key_averages_table is None and "Self CPU" in (asked.key_averages_table or "")
