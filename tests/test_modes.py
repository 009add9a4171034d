"""Training modes on CPU: bwd and fwd+bwd cells, their JSON fields, gradient checks, 'no backward',
the config's `modes` and `--mode`, and the step callables."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attnprof.config import Config, MeasureOptions, Schedule, parse_config
from attnprof.errors import ConfigError
from attnprof.pipeline import plan_cells, run_cell, run_cells
from attnprof.pipeline.engine import Job, run_job
from attnprof.pipeline.rows import cell_row
from attnprof.plugins import load_variants
from attnprof.registry import RunSpec

torch = pytest.importorskip("torch")

SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
FAST = MeasureOptions(min_time_s=0.02)


def ceiling():
    from attnprof.profiling.ceiling import Ceiling, RunCeiling

    return RunCeiling("cpu", "fp32", Ceiling(tflops=1.0, bandwidth_gbps=10.0, source="cached"))


def spec(mode: str, **kw) -> RunSpec:
    return RunSpec("cpu", kw.pop("dtype", "fp32"), **{**SHAPE, **kw}, mode=mode)


def builtin(name: str):
    return load_variants(no_plugins=True).registry.get(name)


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(device="cpu", dtype="fp32", shapes=[SHAPE], variants=["naive", "sdpa-math"], baseline="sdpa-math",
                  schedule=Schedule(wait=0, warmup=1, active=2), output_dir=tmp_path)


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
@pytest.mark.parametrize("name", ["naive", "sdpa-math", "sdpa"])
def test_backward_cells_run_and_their_gradients_pass(config, mode, name) -> None:
    result = run_cell(builtin(name), spec(mode), config, FAST, ceiling())
    assert result.ok, result.reason
    entry = cell_row(result)
    assert entry.mode == mode and entry.status == "ok" and entry.passed is True
    assert set(entry.grad_rel_error) == {"dq", "dk", "dv"}
    assert all(0 <= err < 2e-5 for err in entry.grad_rel_error.values())
    assert entry.grad_rel_error_dq == entry.grad_rel_error["dq"]
    assert entry.grad_rel_error_threshold == 2e-5
    assert entry.correctness_scope == "output: full; gradients: full"
    factor = "2.5" if mode == "bwd" else "3.5"
    assert entry.flops_convention.startswith(f"{mode} = {factor} × fwd; fwd = 4·B·H·D × the ")
    assert "pairs causal keeps" in entry.flops_convention
    assert entry.forwards == 2 and entry.latency_us > 0
    forward_flops = 4 * 1 * 2 * (32 * 33 // 2) * 16  # the causal pairs, exactly
    assert entry.tflops == pytest.approx(float(factor) * forward_flops / (entry.latency_us * 1e-6) / 1e12)
    assert f"_causal_{mode}_cpu" in entry.trace


def test_the_default_mode_keeps_todays_row_and_adds_mode_and_convention(config) -> None:
    entry = cell_row(run_cell(builtin("naive"), spec("fwd"), config, FAST, ceiling()))
    assert entry.mode == "fwd" and entry.grad_rel_error is None
    assert entry.grad_rel_error_dq is None and entry.grad_rel_error_threshold is None
    assert entry.correctness_scope == "full" and entry.passed is True
    assert entry.flops_convention.startswith("fwd = 4·B·H·D × the ")
    assert entry.flops_convention.endswith("(query, key) pairs causal keeps (exact pairs; backward factor of "
                                              "tritonbench / flash-attention)")
    assert entry.trace.endswith("_causal_cpu.json.gz")
    without = cell_row(run_cell(builtin("naive"), spec("fwd"), config, FAST))
    assert without.tflops is None and without.flops_convention is None  # no FLOP figure, no convention


def test_bwd_times_only_the_backward(config) -> None:
    calls = []
    naive = builtin("naive")

    def counting(q, k, v, causal, state):
        calls.append(torch.is_grad_enabled())
        return naive.forward(q, k, v, causal, state)

    result = run_cell(replace(naive, forward=counting), spec("bwd"), config, FAST.model_copy(update={'timing': False}))
    assert result.ok, result.reason
    # one forward made the graph the backward reuses; memory is off without timing; none ran in the loop
    assert calls == [True]
    assert result.analysis.forwards == 2


def test_a_backward_that_cannot_repeat_gets_a_fresh_untimed_forward_each_time(config) -> None:
    """`repeatable_backward=False` (the `compiled` variant): every timed or profiled backward runs on
    the graph of its own forward, made outside the timing and outside the region, and freed after."""
    calls = []
    naive = builtin("naive")

    def once_only(q, k, v, causal, state):
        out = naive.forward(q, k, v, causal, state)
        calls.append(out)
        return out

    variant = replace(naive, forward=once_only, repeatable_backward=False)
    result = run_cell(variant, spec("bwd"), config, FAST)
    assert result.ok and result.passed, result.reason
    assert result.timing.method.startswith("time.perf_counter per call, each after an untimed forward")
    n_timed = result.timing.reps + result.timing.warmup_reps + 1  # + the cold call
    # build_step's forward, one per timed call, one per profiled step (wait+warmup+active = 3), and
    # the memory probe's whole step
    assert len(calls) >= n_timed + 3 + 1
    assert result.analysis.forwards == 2


def test_build_step_prepare_runs_the_forward_and_call_frees_it() -> None:
    from attnprof.profiling.steps import build_step

    counts = {"fwd": 0}

    def forward(q, k, v):
        counts["fwd"] += 1
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    step = build_step(spec("bwd"), forward, (q, k, v), seed=0, repeatable_backward=False)
    assert step.prepare is not None and counts["fwd"] == 1
    first = step.call()
    assert counts["fwd"] == 1  # the graph build_step made
    step.prepare()
    second = step.call()
    assert counts["fwd"] == 2
    for a, b in zip(first.grads, second.grads, strict=True):
        assert torch.equal(a, b)
    step.call()  # without prepare it still runs a true backward (on a forward of its own)
    assert counts["fwd"] == 3
    repeatable = build_step(spec("bwd"), forward, (q, k, v), seed=0)
    assert repeatable.prepare is None


def test_a_variant_without_backward_is_skipped(config) -> None:
    naive = replace(builtin("naive"), has_backward=False)
    for mode in ("bwd", "fwd+bwd"):
        result = run_cell(naive, spec(mode), config, FAST)
        assert (result.status, result.reason) == ("skipped", "no backward")
        assert cell_row(result).status == "skipped: no backward"
    assert run_cell(naive, spec("fwd"), config, FAST).ok


def test_a_forward_that_tracks_no_gradient_is_skipped_not_failed(config) -> None:
    naive = builtin("naive")

    def detached(q, k, v, causal, state):
        return naive.forward(q, k, v, causal, state).detach()

    result = run_cell(replace(naive, forward=detached), spec("fwd+bwd"), config, FAST)
    assert result.status == "skipped"
    assert result.reason == "no backward (the output does not track gradients)"


def test_a_wrong_gradient_fails_with_the_tensor_named(config) -> None:
    naive = builtin("naive")

    class HalveDv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            return v.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * 0.5

    def wrong(q, k, v, causal, state):
        return naive.forward(q, k, HalveDv.apply(v), causal, state)

    result = run_cell(replace(naive, forward=wrong), spec("bwd"), config, FAST)
    assert result.status == "failed"
    assert result.reason.startswith("gradient relative error dv 5.0e-01 > 2e-05 (fp32 limit)")
    assert result.grad_check.rel_errors["dq"] < 2e-5 and not cell_row(result).passed


def test_plan_crosses_shapes_modes_and_variants_and_speedups_stay_within_a_mode(config) -> None:
    config = config.model_copy(update={"modes": ["fwd", "fwd+bwd"]})
    variants = [builtin("naive"), builtin("sdpa-math")]
    cells = plan_cells(config, variants, "cpu")
    assert [(v.name, s.mode) for v, s in cells] == [("naive", "fwd"), ("sdpa-math", "fwd"),
                                                    ("naive", "fwd+bwd"), ("sdpa-math", "fwd+bwd")]
    results, _ = run_cells(cells, config, FAST)
    assert [r.speedup_vs_baseline for r in results[1::2]] == [pytest.approx(1.0)] * 2
    assert results[2].speedup_vs_baseline == pytest.approx(results[3].latency_us / results[2].latency_us)
    outcome, _ = run_job(Job("compare", config, "cpu", FAST, cells))
    assert outcome is not None
    assert [r.speedup_vs_baseline for r in outcome.document.results[1::2]] == [pytest.approx(1.0)] * 2
    document = json.loads(outcome.files[0].read_text())
    assert [r["mode"] for r in document["results"]] == ["fwd", "fwd", "fwd+bwd", "fwd+bwd"]
    assert document["config"]["modes"] == ["fwd", "fwd+bwd"]
    header = outcome.files[1].read_text().splitlines()[0].split(",")
    assert {"mode", "flops_convention", "grad_rel_error_dq", "grad_rel_error_dk", "grad_rel_error_dv"} <= set(header)


def test_config_modes_are_validated() -> None:
    base = {"shapes": [SHAPE]}
    assert parse_config(base).modes == ["fwd"]
    assert parse_config({**base, "modes": ["bwd", "fwd+bwd"]}).modes == ["bwd", "fwd+bwd"]
    with pytest.raises(ConfigError, match=r"modes.0: Input should be 'fwd', 'bwd' or 'fwd\+bwd'"):
        parse_config({**base, "modes": ["backward"]})
    with pytest.raises(ConfigError, match="modes: bwd given more than once"):
        parse_config({**base, "modes": ["bwd", "bwd"]})
    with pytest.raises(ConfigError, match="modes: List should have at least 1 item"):
        parse_config({**base, "modes": []})
    with pytest.raises(ValueError, match="mode must be one of fwd, bwd, fwd\\+bwd"):
        RunSpec("cpu", "fp32", 1, 1, 8, 8, mode="back")


def test_mode_option_overrides_the_config(cli, write_config) -> None:
    path = write_config(variants=["naive"], baseline=None, modes=["fwd"])
    result = cli("compare", str(path), "--mode", "fwd+bwd,bwd", "--min-time", "0.02", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [r["mode"] for r in document["results"]] == ["fwd+bwd", "bwd"]
    assert all(r["grad_rel_error"] is not None for r in document["results"])


def test_a_bad_mode_is_one_line_and_no_traceback(cli, write_config) -> None:
    result = cli("run", str(write_config()), "-v", "naive", "--mode", "backward")
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.stderr == "error: --mode must be 'fwd', 'bwd' or 'fwd+bwd' (got 'backward')\n"  # as typed


def test_tables_title_the_mode(cli, write_config) -> None:
    path = write_config(variants=["naive"], baseline=None)
    result = cli("compare", str(path), "--mode", "fwd+bwd", "--min-time", "0.02", "--wide")
    assert result.exit_code == 0, result.output
    assert "== 1x2x32x16 fp32 causal fwd+bwd on cpu" in result.stdout
    assert "1x2x32x16 fwd+bwd" in result.stdout  # the at-a-glance shape says the mode too


def test_run_refuses_a_variant_without_backward_in_one_line(cli, write_config, monkeypatch) -> None:
    from attnprof import plugins
    from attnprof.variant_registry import Registry

    real = plugins.load_variants

    def without_backward(*args, **kwargs):
        loaded = real(*args, **kwargs)
        registry = Registry()  # a fresh one: the cached registry stays as it is
        for variant in loaded.registry.all():
            registry.register(replace(variant, has_backward=False) if variant.name == "naive" else variant)
        return replace(loaded, registry=registry)

    monkeypatch.setattr(plugins, "load_variants", without_backward)
    result = cli("run", str(write_config()), "-v", "naive", "--mode", "bwd")
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert "naive cannot run on cpu with fp32 at 1x2x32x16 in bwd: no backward" in result.output


def test_rows_carry_the_phases_and_tables_say_per_step(config) -> None:
    """run/compare rows hold the forward and backward phase facts of the real H200 trace they were
    measured with; in a backward mode the tables' per-forward columns read per step."""
    from pathlib import Path

    from attnprof.analysis import analyze_trace
    from attnprof.report.run_tables import run_summary_table
    from attnprof.report.tables import compare_report
    from attnprof.results.files import csv_values

    data = Path(__file__).parent / "data" / "h200" / "training"
    result = run_cell(builtin("naive"), spec("fwd+bwd"), config, FAST, ceiling())
    step = replace(result, analysis=analyze_trace(data / "fwd+bwd/8x16x1024x64/sdpa-flash.json.gz"))
    entry = cell_row(step)
    assert (entry.forward_kernels, entry.backward_kernels) == (1, 5)
    assert (entry.backward_memcpy, entry.backward_memset, entry.backward_outside_region) == (0, 0, False)
    assert entry.backward_kernel_time_us > entry.forward_kernel_time_us > 0
    assert entry.phases.backward.kernels == 5 and entry.kernels_per_forward == 6
    assert {"forward_kernels", "backward_kernels", "backward_kernel_time_us"} <= set(csv_values(cell_row(step)))
    summary = run_summary_table(entry, "table")
    assert "kernels per step: forward + backward" in summary and "1 + 5 (" in summary
    after = replace(result, analysis=analyze_trace(data / "fwd-then-backward/8x16x1024x64/sdpa-flash.json.gz"))
    assert "(backward after the region)" in run_summary_table(cell_row(after), "table")
    report = compare_report([entry], "table", None, width=200)
    assert "kernels/step" in report and "kernels/fwd" not in report
    forward_only = cell_row(run_cell(builtin("naive"), spec("fwd"), config, FAST))
    assert forward_only.forward_kernels is None and forward_only.phases is None  # CPU: no device work
    assert "kernels/fwd" in compare_report([forward_only], "table", None, width=200)
