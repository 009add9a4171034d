"""triton-flash's attention sinks and packed seq_lens on a CUDA GPU, bf16 (their CPU check runs under the Triton
interpreter in test_triton_plugin.py): forward and gradients (dsinks with sinks) against float64, every autotune
configuration, one kernel per forward, CUDA-graph replay, and whole cells through the pipeline and `attnprof run`.
Run on the device with `python -m pytest -m gpu plugins/attnprof-triton/tests/test_triton_sinks_varlen_gpu.py`."""

from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path

import attnprof_triton
import pytest
import torch

from attnprof import RunSpec
from attnprof.profiling.correctness import check_variant_output
from attnprof.profiling.gradcheck import check_grads
from attnprof.profiling.inputs import make_inputs, make_sinks
from attnprof.profiling.steps import cell_step
from attnprof.varlen import cu_seqlens_tensor, packed_pairs, padded_pairs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("triton") is not None),
                       reason="needs a CUDA GPU and triton"),
]

# (batch, heads, kv_heads, q_len or None, kv_len, head_dim, mask): gpt-oss-20b's heads (64/kv8, head_dim 64) causal and
# in its 128-key window, no mask, chunked prefill and decode (q_len < kv_len), head_dim 256, lengths no tile divides.
SINK_CASES = [
    (1, 64, 8, None, 2048, 64, "causal"),
    (1, 64, 8, None, 2048, 64, "sliding_window:128"),
    (2, 8, 2, None, 1000, 128, "none"),
    (2, 8, 2, 300, 1000, 64, "causal"),
    (4, 8, 2, 1, 4100, 128, "causal"),
    (1, 4, None, None, 777, 256, "causal"),
]
# Packed lengths: ragged, one token, none a multiple of a tile but one; lognormal requests around 256.
PACKED_LENGTHS = {
    "ragged": (1000, 17, 4096, 300, 2048, 1),
    "requests": (300, 211, 64, 1, 513, 250, 129, 380),
}


def _no_stage(name: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _sink_spec(case, mode="fwd", device="cuda") -> RunSpec:
    batch, heads, kv_heads, q_len, kv_len, head_dim, mask = case
    return RunSpec(device=device, dtype="bf16", batch=batch, heads=heads, seq=kv_len, q_len=q_len, head_dim=head_dim,
                   kv_heads=kv_heads, mask=mask, causal=mask == "causal", mode=mode, score_mod="sinks")


def _packed_spec(lengths, causal, mode="fwd", heads=8, kv_heads=2, head_dim=128, device="cuda") -> RunSpec:
    return RunSpec(device=device, dtype="bf16", batch=1, heads=heads, seq=sum(lengths), head_dim=head_dim,
                   kv_heads=kv_heads, causal=causal, mode=mode, seq_lens=lengths)


def _checked_step(spec: RunSpec):
    """The cell's step, built as a cell builds it (inputs, sinks, setup, `bound_forward`), run once, and its
    checks against float64: (forward Check, GradCheck or None)."""
    variant = attnprof_triton.make_variant()
    assert variant.unavailable_reason(spec) is None
    with cell_step(variant, spec, 0, _no_stage) as step:
        output = step.call()
        out = output.out if spec.backward else output
        q, k, v = step.inputs
        check = check_variant_output(out, q, k, v, causal=spec.causal, dtype=spec.dtype, mask=spec.mask,
                                     score_mod=spec.score_mod, sinks=step.sinks, seq_lens=spec.seq_lens)
        if not spec.backward:
            return check, None
        grads = check_grads(output.grads, q, k, v, step.grad_out, causal=spec.causal, dtype=spec.dtype,
                            mask=spec.mask, score_mod=spec.score_mod, sinks=step.sinks, sink_grad=output.sink_grad,
                            seq_lens=spec.seq_lens)
        return check, grads


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("case", SINK_CASES, ids=lambda c: "x".join(str(x) for x in c if x is not None))
def test_gpu_sinks_match_float64(monkeypatch, case, mode):
    """The output, and dq, dk, dv and dsinks, against float64 (the default tiles: every configuration below)."""
    from attnprof_triton import _kernel

    monkeypatch.setenv(_kernel.AUTOTUNE_ENV, "0")
    check, grads = _checked_step(_sink_spec(case, mode))
    assert check.passed, check.reason
    if grads is not None:
        assert grads.passed, (grads.reason, grads.rel_errors)
        assert grads.rel_errors["dsinks"] is not None


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "none"])
@pytest.mark.parametrize("name", list(PACKED_LENGTHS))
def test_gpu_packed_batches_match_float64_per_sequence(monkeypatch, name, causal, mode):
    from attnprof_triton import _kernel

    monkeypatch.setenv(_kernel.AUTOTUNE_ENV, "0")
    head_dim = 64 if name == "requests" else 128
    check, grads = _checked_step(_packed_spec(PACKED_LENGTHS[name], causal, mode, head_dim=head_dim))
    assert check.passed, check.reason
    if grads is not None:
        assert grads.passed, (grads.reason, grads.rel_errors)


@pytest.mark.parametrize("what", ["sinks", "packed"])
def test_gpu_every_config_with_sinks_and_packed(what):
    """Each forward configuration the autotuner may pick, and each (dK/dV, dQ) pair of the backward's, launched as
    given, against float64."""
    from attnprof_triton import _backward, _kernel

    if what == "sinks":
        spec = _sink_spec((1, 8, 2, None, 1000, 128, "causal"), "fwd+bwd")
        extra, lengths = {}, None
    else:
        lengths = PACKED_LENGTHS["ragged"]
        spec = _packed_spec(lengths, True, "fwd+bwd")
        extra = {"cu_seqlens": cu_seqlens_tensor(lengths, "cuda"), "max_seqlen": max(lengths)}
    q, k, v = make_inputs(spec, seed=1)
    sinks = make_sinks(spec, 1)
    grad_out = torch.randn_like(q)
    for cfg in _kernel.autotune_space(max(lengths) if lengths else spec.n_queries, spec.head_dim):
        try:
            out, lse = _kernel.attention(q, k, v, config=cfg, mask=spec.mask.text, return_lse=True, sinks=sinks,
                                         **extra)
        except Exception as exc:  # out of shared memory on a smaller GPU: the autotuner skips these too
            if "OutOfResources" in type(exc).__name__ or "out of resource" in str(exc):
                continue
            raise
        check = check_variant_output(out, q, k, v, causal=True, dtype="bf16", score_mod=spec.score_mod, sinks=sinks,
                                     seq_lens=lengths)
        assert check.passed, (cfg, check.reason)
    dkdv, dq = _backward.backward_space(spec.head_dim, 2)
    for configs in zip(dkdv, dq + dq[: max(len(dkdv) - len(dq), 0)], strict=False):
        grads = _backward.attention_backward(grad_out, q, k, v, out, lse, spec.mask.text, configs=configs,
                                             sinks=sinks, **extra)
        check = check_grads(grads[:3], q, k, v, grad_out, causal=True, dtype="bf16", score_mod=spec.score_mod,
                            sinks=sinks, sink_grad=grads[3] if sinks is not None else None, seq_lens=lengths)
        assert check.passed, (configs, check.reason, check.rel_errors)


@pytest.mark.parametrize("what", ["sinks", "packed"])
def test_gpu_one_kernel_per_forward_and_graph_replay(what):
    """Sinks and a packed batch keep the forward one `_attn_fwd` launch, which a CUDA graph can capture."""
    from torch.profiler import ProfilerActivity, profile

    spec = _sink_spec((2, 8, 2, None, 1024, 128, "causal")) if what == "sinks" else _packed_spec(
        PACKED_LENGTHS["ragged"], True)
    variant = attnprof_triton.make_variant()
    state = variant.setup(spec)
    q, k, v = make_inputs(spec, seed=0)
    extra = {"sinks": make_sinks(spec, 0)} if what == "sinks" else {}
    expected = variant.forward(q, k, v, True, state, **extra)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        variant.forward(q, k, v, True, state, **extra)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    assert kernels == [kernels[0]] and "_attn_fwd" in kernels[0], kernels
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        variant.forward(q, k, v, True, state, **extra)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = variant.forward(q, k, v, True, state, **extra)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("what", ["sinks", "packed"])
def test_gpu_cell_through_the_pipeline(tmp_path, what):
    """A whole fwd+bwd cell (autotuned in setup, timed, profiled, checked): ok, dsinks checked with sinks, and the
    executed FLOPs of a packed batch its sequences' own tiles, far below the padded batch's."""
    from attnprof.config import Config, MeasureOptions, Schedule
    from attnprof.pipeline import run_cell
    from attnprof.pipeline.rows import cell_row

    if what == "sinks":
        shape = dict(batch=1, heads=64, kv_heads=8, seq=4096, head_dim=64, score_mod={"sinks": True})
        rs = _sink_spec((1, 64, 8, None, 4096, 64, "causal"), "fwd+bwd", device="cuda:0")
    else:
        lengths = PACKED_LENGTHS["ragged"]
        shape = dict(heads=8, kv_heads=2, head_dim=128, seq_lens=list(lengths))
        rs = _packed_spec(lengths, True, "fwd+bwd", device="cuda:0")
    config = Config(shapes=[shape], schedule=Schedule(wait=1, warmup=1, active=3), output_dir=tmp_path)
    result = run_cell(attnprof_triton.make_variant(), rs, config, MeasureOptions(min_time_s=0.05))
    assert result.status == "ok", result.reason
    assert result.check.passed and result.grad_check.passed and result.latency_us > 0
    row = cell_row(result)
    if what == "sinks":
        assert row.grad_rel_error_dsinks is not None
    else:
        useful_pairs, padded = packed_pairs(lengths, True), padded_pairs(lengths, True)
        assert row.flops <= row.executed_flops < row.flops / useful_pairs * padded, (row.flops, row.executed_flops)


def test_gpu_attnprof_run_with_sinks_and_a_packed_batch(tmp_path):
    """`attnprof run --variant triton-flash` through the CLI: a sinks shape and a packed one, fwd and fwd+bwd."""
    import yaml
    from typer.testing import CliRunner

    from attnprof.cli.app import app

    config = tmp_path / "triton-sinks-packed.yaml"
    config.write_text(yaml.safe_dump({
        "device": "cuda",
        "dtype": "bf16",
        "shapes": [
            {"batch": 1, "heads": 64, "kv_heads": 8, "seq": 2048, "head_dim": 64, "score_mod": {"sinks": True}},
            {"heads": 8, "kv_heads": 2, "head_dim": 128, "seq_lens": list(PACKED_LENGTHS["requests"])},
        ],
        "causal": True,
        "modes": ["fwd", "fwd+bwd"],
        "schedule": {"wait": 1, "warmup": 1, "active": 3},
    }))
    result = CliRunner().invoke(app, ["run", str(config), "--variant", "triton-flash", "-o", str(tmp_path / "out"),
                                      "--min-time", "0.05", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert len(rows) == 4
    for row in rows:
        assert row["status"] == "ok" and row["passed"] is True, (row["shape"], row["mode"], row["status"])
        if row["mode"] == "fwd+bwd":
            assert row["grad_rel_error_dq"] is not None
            assert (row["grad_rel_error_dsinks"] is not None) == ("sinks" in row["shape"])
        if row["seq_lens"]:
            assert row["executed_flops"] >= row["flops"] > 0
    assert Path(json.loads(result.stdout)["files"]["results_json"]).exists()
