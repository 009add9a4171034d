"""Every built-in variant that runs on CPU agrees with a float64 reference on small shapes."""

from __future__ import annotations

import math

import pytest
import torch

from attnprof.plugins import load_variants
from attnprof.profiling.inputs import make_inputs, to_bhsd
from attnprof.registry import RunSpec
from attnprof.variants import compiled

BUILTINS = load_variants(no_plugins=True).registry
CPU_FP32 = RunSpec(device="cpu", dtype="fp32", batch=1, heads=2, seq=16, head_dim=16)
COMPILED = [v.name for v in compiled.variants()]  # torch.compile'd: slow on a small CPU
EAGER = [v.name for v in BUILTINS.all() if v.name not in COMPILED and v.unavailable_reason(CPU_FP32) is None]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Attention in float64, written independently of the variants."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[-2]
        hidden = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, -1) @ v


def run_variant(name: str, spec: RunSpec) -> tuple[torch.Tensor, torch.Tensor]:
    variant = load_variants(no_plugins=True).registry.get(name)
    q, k, v = make_inputs(spec, seed=3, layout=variant.layout)
    state = variant.setup(spec) if variant.setup else None
    with torch.no_grad():
        out = variant.forward(q, k, v, spec.causal, state)
    return to_bhsd(out, variant.layout), reference(q, k, v, spec.causal)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_fp32_matches_reference(name: str, causal: bool, kv_heads: int | None) -> None:
    spec = RunSpec(device="cpu", dtype="fp32", batch=2, heads=4, kv_heads=kv_heads, seq=48, head_dim=32, causal=causal)
    out, ref = run_variant(name, spec)
    assert out.shape == ref.shape == (2, 4, 48, 32)
    assert rel_error(out, ref) < 1e-5


@pytest.mark.parametrize("name", EAGER)
def test_bf16_matches_reference(name: str) -> None:
    spec = RunSpec(device="cpu", dtype="bf16", batch=1, heads=2, seq=64, head_dim=32)
    out, ref = run_variant(name, spec)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, ref) < 1.5e-2


def test_naive_builds_its_mask_once_in_setup() -> None:
    variant = load_variants(no_plugins=True).registry.get("naive")
    spec = RunSpec(device="cpu", dtype="fp32", batch=1, heads=1, seq=8, head_dim=8)
    mask = variant.setup(spec)
    assert mask.dtype == torch.bool and mask.shape == (8, 8)
    assert bool(mask[0, 1]) and not bool(mask[1, 0])
    assert variant.setup(RunSpec(device="cpu", dtype="fp32", batch=1, heads=1, seq=8, head_dim=8, causal=False)) is None


def test_inputs_are_seeded_and_layout_independent() -> None:
    spec = RunSpec(device="cpu", dtype="fp32", batch=1, heads=2, seq=4, head_dim=8)
    a = make_inputs(spec, 7, "bhsd")
    b = make_inputs(spec, 7, "bshd")
    c = make_inputs(spec, 8, "bhsd")
    assert torch.equal(a[0], to_bhsd(b[0], "bshd"))
    assert not torch.equal(a[0], c[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED)
def test_compiled_variants_match_reference(name: str) -> None:
    spec = RunSpec(device="cpu", dtype="fp32", batch=1, heads=2, seq=128, head_dim=16)
    variant = load_variants(no_plugins=True).registry.get(name)
    if variant.unavailable_reason(spec):
        pytest.skip(variant.unavailable_reason(spec))
    out, ref = run_variant(name, spec)
    assert rel_error(out, ref) < 1e-5


def test_compiled_variants_start_each_cell_with_a_fresh_compile(monkeypatch) -> None:
    """Past Dynamo's recompile limit (8 shapes) a compiled function silently runs uncompiled: in an H200
    sweep `flex` fell back to eager at the 9th shape. Each cell's setup resets Dynamo, so none inherits
    the compile cache of the cells before it."""
    torch = pytest.importorskip("torch")
    from attnprof.plugins import load_variants
    from attnprof.registry import RunSpec

    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    registry = load_variants(no_plugins=True).registry
    spec = RunSpec("cpu", "fp32", batch=1, heads=2, seq=32, head_dim=16)
    for name in ("flex", "compiled"):
        state = registry.get(name).setup(spec)
        assert state["fn"] is not None
    assert len(resets) == 2
