"""Tests of the attnprof-cudnn-frontend plugin.

CPU: registration, the reasons without `cudnn`, the checks, and the graph-building calls and the data flow of
both variants' forward and backward through a stand-in `cudnn` module (`fake_cudnn`: the graph API's calls,
recorded, with `execute` computing SDPA in float64). GPU (`-m gpu`): the real library on the H200.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

import attnprof_cudnn_frontend as fe
import fake_cudnn
import pytest
import torch

from attnprof import RunSpec
from attnprof.plugins import PLUGINS_ENV, load_variants
from attnprof.profiling import fp8
from attnprof.profiling.correctness import check_fp8_output, reference_attention
from attnprof.profiling.steps import cell_step
from attnprof.registry import FP8_NEEDS_CUDA

SHAPE = dict(batch=1, heads=4, kv_heads=2, seq=32, head_dim=16)


def spec(**overrides) -> RunSpec:
    return RunSpec(**({"device": "cpu", "dtype": "bf16"} | SHAPE | overrides))


class _Hide:
    """A meta-path finder that makes `cudnn` fail to import, as where nvidia-cudnn-frontend is absent."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "cudnn":
            raise ModuleNotFoundError("No module named 'cudnn'", name="cudnn")
        return None


@pytest.fixture(autouse=True)
def fresh_lookup(monkeypatch):
    monkeypatch.setattr(fe, "_cudnn", None)


@pytest.fixture
def no_cudnn(monkeypatch):
    monkeypatch.delitem(sys.modules, "cudnn", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Hide(), *sys.meta_path])


@pytest.fixture
def fake(monkeypatch):
    for record in (fake_cudnn.handles, fake_cudnn.streams, fake_cudnn.graphs):
        record.clear()
    monkeypatch.setitem(sys.modules, "cudnn", fake_cudnn)
    return fake_cudnn


def variants():
    return {v.name: v for v in fe.make_variants()}


# --- registration and the reasons without cudnn -----------------------------------------


def test_entry_point_registers_both_variants(monkeypatch):
    try:
        version = metadata.version("attnprof-cudnn-frontend")
    except metadata.PackageNotFoundError:
        pytest.skip("attnprof-cudnn-frontend is not installed: pip install -e plugins/attnprof-cudnn-frontend")
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    loaded = load_variants(refresh=True)
    status = next(p for p in loaded.plugins if p.entry_point == "cudnn-frontend")
    assert status.ok, status.error
    bf16, fp8_variant = loaded.registry.get("cudnn-fe"), loaded.registry.get("cudnn-fe-fp8")
    assert bf16.source == fp8_variant.source == f"attnprof-cudnn-frontend {version}"
    assert bf16.dtypes == ("bf16", "fp16") and fp8_variant.dtypes == ("fp8",)
    assert fp8_variant.fp8_scaling == "per-tensor" and fp8_variant.fp8_output == "fp8"


def test_import_looks_nothing_up(no_cudnn, monkeypatch):
    monkeypatch.delitem(sys.modules, "attnprof_cudnn_frontend")
    module = importlib.import_module("attnprof_cudnn_frontend")
    assert module._cudnn is None and "cudnn" not in sys.modules


def test_without_cudnn_every_cell_is_skipped_with_the_install_line(no_cudnn):
    reason = "needs cudnn (pip install nvidia-cudnn-frontend --no-deps)"
    for variant in variants().values():
        dtype = variant.dtypes[0]
        assert variant.unavailable_reason(spec(device="cuda", dtype=dtype)) == reason


def test_a_broken_cudnn_says_it_is_installed_but_failed(monkeypatch):
    broken = type(sys)("cudnn")  # imports, but is not nvidia-cudnn-frontend
    monkeypatch.setitem(sys.modules, "cudnn", broken)
    reason = fe.find_cudnn()
    assert reason == "the installed cudnn module lacks pygraph, data_type, heur_mode, create_handle " \
        "(not nvidia-cudnn-frontend?)"


def test_fp8_on_cpu_and_bf16_on_cpu_are_skipped_with_their_reasons(fake):
    bf16, fp8_variant = variants()["cudnn-fe"], variants()["cudnn-fe-fp8"]
    assert bf16.unavailable_reason(spec()) == "needs CUDA"
    assert fp8_variant.unavailable_reason(spec(dtype="fp8")) == FP8_NEEDS_CUDA
    assert fp8_variant.unavailable_reason(spec(device="cuda", dtype="fp8_e5m2")) == "needs dtype fp8 (got fp8_e5m2)"
    assert bf16.unavailable_reason(spec(device="cuda", mask="sliding_window:8")).startswith("mask sliding_window")


@pytest.mark.parametrize("name, head_dim, reason", [
    ("cudnn-fe", 12, "head_dim must be a multiple of 8 up to 256 (got 12)"),
    ("cudnn-fe-fp8", 24, "head_dim must be a multiple of 16 up to 128 (got 24)"),
    ("cudnn-fe-fp8", 256, "head_dim must be a multiple of 16 up to 128 (got 256)"),
])
def test_the_checks_name_the_head_dim_rule(fake, name, head_dim, reason):
    check = fe.check_bf16 if name == "cudnn-fe" else fe.check_fp8
    assert check(spec(head_dim=head_dim)) == reason
    assert check(spec(heads=3, kv_heads=2)) == "heads (3) must be a multiple of kv_heads (2)"
    assert check(spec()) is None


def test_the_gpu_capability_is_checked(fake, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert fe.check_bf16(spec(device="cuda")) is None
    assert fe.check_fp8(spec(device="cuda", dtype="fp8")) == "cudnn-fe-fp8 needs compute capability 9.0 or newer " \
        "(got 8.0)"


# --- the graphs and the data flow, through the stand-in ---------------------------------

BUILD = ["validate", "build_operation_graph", "create_execution_plans(A,FALLBACK)", "check_support", "build_plans"]


def test_cudnn_fe_forward_builds_one_graph_as_the_samples_do_and_matches_float64(fake):
    cell = spec(dtype="bf16")
    state = fe.setup_bf16(cell)
    assert state.backward is None and len(fake.graphs) == 1
    graph = fake.graphs[0]
    assert graph.calls == ["sdpa", *BUILD] and graph.handle is state.handle
    assert graph.io_data_type == "BFLOAT16" and graph.compute_data_type == "FLOAT"
    _, kwargs, _ = graph.node
    assert kwargs["generate_stats"] is False and kwargs["use_causal_mask"] is True
    assert kwargs["attn_scale"] == pytest.approx(16**-0.5)
    q, k, v = (torch.randn(1, h, 32, 16).bfloat16() for h in (4, 2, 2))
    out = fe.forward_bf16(q, k, v, True, state)
    assert out.dtype == torch.bfloat16 and graph.executions == 1
    ref = reference_attention(q, k, v, True)
    assert (out.double() - ref).norm() / ref.norm() < 1e-2


def test_cudnn_fe_backward_runs_both_graphs_through_autograd(fake):
    cell = spec(dtype="bf16", mode="fwd+bwd")
    with cell_step(variants()["cudnn-fe"], cell, 0, lambda what: _nothing()) as step:
        forward_graph, backward_graph = fake.graphs
        assert forward_graph.node[1]["generate_stats"] is True
        assert backward_graph.calls == ["sdpa_backward", *BUILD]
        output = step.call()
    q, k, v = (t.detach().double().requires_grad_(True) for t in step.inputs)
    with torch.enable_grad():
        ref = reference_attention(q, k, v, True, differentiable=True)
        expected = torch.autograd.grad(ref, (q, k, v), step.grad_out.double())
    for got, want in zip(output.grads, expected, strict=True):
        assert got.shape == want.shape and (got.double() - want).norm() / want.norm() < 2e-2
    assert backward_graph.executions == 1


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_cudnn_fe_fp8_forward_takes_the_quantized_inputs_descales_and_returns_an_fp8_o(fake):
    cell = spec(dtype="fp8")
    variant = variants()["cudnn-fe-fp8"]
    with cell_step(variant, cell, 0, lambda what: _nothing()) as step:
        (graph,) = fake.graphs
        assert graph.io_data_type == "FP8_E4M3" and graph.calls == ["sdpa_fp8", *BUILD]
        kind, kwargs, _ = graph.node
        assert set(fe.FP8_FORWARD_SCALARS) <= set(kwargs)
        scales = step.fp8.state.scales
        assert scales["scale_s"].item() == 448.0 and scales["descale_s"].item() == pytest.approx(1 / 448)
        assert scales["descale_q"].item() == pytest.approx(step.fp8.inputs.descale_q.item())
        assert scales["scale_o"].item() == pytest.approx(1 / step.fp8.inputs.descale_v.item())
        out = step.call()
    assert out.dtype == torch.float8_e4m3fn  # the O Hopper's fp8 SDPA writes
    check = check_fp8_output(fp8.output_values(out, step.fp8.descale_o), step.fp8.inputs, step.inputs, True)
    assert check.passed and check.fp8 is not None and check.fp8.sqnr_db > 20
    assert scales["amax_o"].item() > 0  # the amax output was written


def test_cudnn_fe_fp8_backward_uses_delayed_scales_and_quantizes_do_once(fake):
    cell = spec(dtype="fp8", mode="bwd")
    variant = variants()["cudnn-fe-fp8"]
    with cell_step(variant, cell, 0, lambda what: _nothing()) as step:
        forward_graph, backward_graph = fake.graphs
        assert backward_graph.calls == ["sdpa_fp8_backward", *BUILD]
        state = step.fp8.state
        first = step.call()  # scales of dQ, dK, dV start at 1
        quantized_do = state.quantized_do[2]
        second = step.call()  # ... then follow the amax of the call before
        assert state.quantized_do[2] is quantized_do  # the same grad_out: dO quantized once
        assert state.scales["scale_dq"].item() == pytest.approx(448.0 / state.scales["amax_dq"].item())
    assert backward_graph.executions == 2 and forward_graph.executions == 1
    q, k, v = (t.detach().double().requires_grad_(True) for t in step.fp8.inputs.dequantized())
    with torch.enable_grad():
        ref = reference_attention(q, k, v, True, differentiable=True)
        expected = torch.autograd.grad(ref, (q, k, v), step.grad_out.double())
    for got, want in zip(second.grads, expected, strict=True):
        assert got.dtype == torch.bfloat16 and (got.double() - want).norm() / want.norm() < 0.1
    assert all(g.dtype == torch.bfloat16 for g in first.grads)


@pytest.mark.parametrize("name, dtype", [("cudnn-fe", "bf16"), ("cudnn-fe-fp8", "fp8")])
@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_a_whole_cell_through_the_pipeline_with_the_stand_in(fake, name, dtype, mode, tmp_path, monkeypatch):
    """Each variant's cell end to end on CPU through attnprof's pipeline (its CUDA-only skip lifted): timing, the
    profiled loop, the output and gradient checks, an fp8 cell's quantize phase and row fields."""
    from attnprof import Variant
    from attnprof.config import MeasureOptions, parse_config
    from attnprof.pipeline.cell import run_cell
    from attnprof.pipeline.rows import cell_row

    monkeypatch.setattr(Variant, "unavailable_reason", lambda self, spec: None)
    config = parse_config({"device": "cpu", "dtype": dtype, "output_dir": str(tmp_path), "shapes": [SHAPE]})
    row = cell_row(run_cell(variants()[name], spec(dtype=dtype, mode=mode), config, MeasureOptions()))
    assert row.status == "ok", row.reason
    assert row.passed and row.latency_us
    if dtype == "fp8":
        assert (row.fp8_scaling, row.output_dtype) == ("per-tensor", "fp8") and row.quantize_ms
        assert row.sqnr_db is not None and row.sqnr_db > 20
    else:
        assert row.fp8_scaling is None and row.quantize_ms is None
