"""Gradient checks against float64 autograd, and the step callables of each mode."""

from __future__ import annotations

import pytest

from attnprof.errors import VariantUnavailableError
from attnprof.profiling.gradcheck import GRAD_THRESHOLDS, check_grads, grad_subset, grad_threshold_for
from attnprof.profiling.steps import StepOutput, build_step, graph_retention
from attnprof.registry import RunSpec

torch = pytest.importorskip("torch")


def inputs(batch=2, heads=4, kv_heads=2, seq=16, dim=8, dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    q = torch.randn(batch, heads, seq, dim, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, seq, dim, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, seq, dim, generator=g).to(dtype)
    return q, k, v


def sdpa(q, k, v, causal=True):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def grads_of(fn, q, k, v, grad_out, causal=True):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    return torch.autograd.grad(fn(*leaves, causal), leaves, grad_out)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_sdpa_gradients_pass_within_the_dtype_limit(causal, dtype, name) -> None:
    q, k, v = inputs(dtype=dtype)
    grad_out = torch.randn_like(q)
    check = check_grads(grads_of(sdpa, q, k, v, grad_out, causal), q, k, v, grad_out, causal=causal, dtype=name)
    assert check.passed, check.reason
    assert set(check.rel_errors) == {"dq", "dk", "dv"} and check.scope == "full"
    assert check.threshold == GRAD_THRESHOLDS[name]


def test_a_wrong_mask_fails_every_gradient() -> None:
    q, k, v = inputs()
    grad_out = torch.randn_like(q)
    check = check_grads(grads_of(sdpa, q, k, v, grad_out, causal=False), q, k, v, grad_out, causal=True, dtype="fp32")
    assert not check.passed and check.reason.startswith("gradient relative error dq ")
    assert all(err > 0.05 for err in check.rel_errors.values())


def test_nan_and_shape_are_caught_per_tensor() -> None:
    q, k, v = inputs()
    grad_out = torch.randn_like(q)
    dq, dk, dv = grads_of(sdpa, q, k, v, grad_out)
    dk[0, 0, 0, 0] = float("nan")
    assert check_grads((dq, dk, dv), q, k, v, grad_out, causal=True, dtype="fp32").reason == "NaN in dk"
    check = check_grads((dq, dk[:, :1], dv), q, k, v, grad_out, causal=True, dtype="fp32")
    assert check.reason == "dk shape (2, 1, 16, 8) != expected (2, 2, 16, 8) (bhsd)" and check.rel_errors == {}


def test_bshd_gradients_are_checked_in_their_layout() -> None:
    q, k, v = inputs()
    grad_out = torch.randn_like(q)
    grads = grads_of(sdpa, q, k, v, grad_out)
    as_bshd = [t.transpose(1, 2).contiguous() for t in (*grads, q, k, v, grad_out)]
    check = check_grads(tuple(as_bshd[:3]), *as_bshd[3:], causal=True, dtype="fp32", layout="bshd")
    assert check.passed, check.reason


def test_big_shapes_check_an_exact_slice_of_batches_and_kv_heads() -> None:
    assert grad_subset(2, 4, 2, 16) is None
    assert grad_subset(8, 16, 4, 1024, limit=1 << 24) == {"batches": [0, 7], "kv_heads": [0, 3]}
    assert grad_subset(8, 16, 4, 1024, limit=1 << 22) == {"batches": [0], "kv_heads": [0]}
    assert grad_subset(8, 16, 16, 8192, limit=1 << 24) == {"batches": [0], "kv_heads": [0]}
    q, k, v = inputs(batch=3, heads=4, kv_heads=2, seq=16)
    grad_out = torch.randn_like(q)
    grads = grads_of(sdpa, q, k, v, grad_out)
    check = check_grads(grads, q, k, v, grad_out, causal=True, dtype="fp32", limit=2 * 16 * 16 * 2)
    assert check.passed, check.reason
    assert check.scope == "slice: batches [0, 2], 1 of 2 kv heads (2 of 4 query heads), all rows"
    # a wrong gradient inside the slice is still caught
    bad = (grads[0], grads[1] * 2, grads[2])
    assert not check_grads(bad, q, k, v, grad_out, causal=True, dtype="fp32", limit=2 * 16 * 16 * 2).passed


def test_unknown_dtype_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        grad_threshold_for("int8")


def spec(mode):
    return RunSpec("cpu", "fp32", 2, 4, 16, 8, kv_heads=2, mode=mode)


def test_fwd_step_is_the_forward_and_leaves_inputs_alone() -> None:
    q, k, v = inputs()
    step = build_step(spec("fwd"), lambda q, k, v: sdpa(q, k, v), (q, k, v), seed=0)
    assert step.grad_out is None and not q.requires_grad
    assert torch.equal(step.call(), sdpa(q, k, v))


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_backward_steps_return_output_and_gradients_without_accumulating(mode) -> None:
    q, k, v = inputs()
    step = build_step(spec(mode), lambda q, k, v: sdpa(q, k, v), (q, k, v), seed=0)
    assert all(t.requires_grad for t in (q, k, v)) and step.grad_out.shape == q.shape
    first, second = step.call(), step.call()
    assert isinstance(first, StepOutput)
    assert all(torch.equal(a, b) for a, b in zip(first.grads, second.grads, strict=True))
    assert all(t.grad is None for t in (q, k, v))  # autograd.grad, never .backward()
    assert not first.out.requires_grad
    expected = grads_of(sdpa, q, k, v, step.grad_out)
    assert all(torch.allclose(a, b) for a, b in zip(first.grads, expected, strict=True))


def test_bwd_runs_the_forward_once_outside_the_step() -> None:
    calls = []

    def forward(q, k, v):
        calls.append(1)
        return sdpa(q, k, v)

    step = build_step(spec("bwd"), forward, inputs(), seed=0)
    assert len(calls) == 1
    step.call(), step.call()
    assert len(calls) == 1
    step.whole()
    assert len(calls) == 2  # the whole step (peak memory) runs its own forward


def test_grad_out_is_seeded() -> None:
    a = build_step(spec("fwd+bwd"), lambda q, k, v: sdpa(q, k, v), inputs(), seed=3).grad_out
    b = build_step(spec("fwd+bwd"), lambda q, k, v: sdpa(q, k, v), inputs(), seed=3).grad_out
    assert torch.equal(a, b)


def test_an_unimplemented_derivative_is_no_backward() -> None:
    class ForwardOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return sdpa(q, k, v)

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("backward is not implemented for this kernel")

    step = build_step(spec("fwd+bwd"), ForwardOnly.apply, inputs(), seed=0)
    with pytest.raises(VariantUnavailableError, match=r"^no backward \(backward is not implemented"):
        step.call()


def test_graph_retention_turns_donated_buffers_off_in_bwd_only() -> None:
    import torch._functorch.config as functorch_config

    before = functorch_config.donated_buffer
    for mode in ("fwd", "fwd+bwd"):
        with graph_retention(mode):
            assert functorch_config.donated_buffer == before
    with graph_retention("bwd"):
        assert functorch_config.donated_buffer is False
    assert functorch_config.donated_buffer == before


@pytest.mark.slow
def test_compiled_variant_in_bwd_retains_its_graph(tmp_path) -> None:
    """torch.compile (inductor, a C++ compiler on CPU): the backward runs again and again on one graph."""
    from attnprof.config import Config, MeasureOptions, Schedule
    from attnprof.pipeline import run_cell
    from attnprof.plugins import load_variants

    shape = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
    config = Config(device="cpu", dtype="fp32", shapes=[shape], schedule=Schedule(wait=0, warmup=1, active=2),
                    output_dir=tmp_path)
    variant = load_variants(no_plugins=True).registry.get("compiled")
    result = run_cell(variant, RunSpec("cpu", "fp32", **shape, mode="bwd"), config, MeasureOptions(min_time_s=0.02))
    assert result.ok, result.reason
    assert result.grad_check.passed and result.timing.reps >= 10


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads, kv_heads, limit", [(8, 2, 1), (8, 2, 2 * 24 * 24 * 3), (4, 4, 24 * 24), (6, 1, 1)])
def test_chunked_reference_grads_equal_the_whole(causal, heads, kv_heads, limit) -> None:
    """The reference run a few query heads at a time (what keeps one GQA group at S=32k in memory)
    gives the gradients of the whole, dk and dv summed over each group's chunks."""
    from attnprof.profiling.gradcheck import reference_grads

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, heads, 24, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, 24, 8, generator=g) for _ in range(2))
    grad_out = torch.randn(2, heads, 24, 8, generator=g)
    whole = reference_grads(q, k, v, grad_out, causal)
    chunked = reference_grads(q, k, v, grad_out, causal, limit=limit)
    for a, b in zip(whole, chunked, strict=True):
        assert a.dtype == b.dtype == torch.float64 and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
