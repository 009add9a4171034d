"""Tests of the attnprof-flash-attn plugin.

CPU: the unavailable path with the package hidden, which interface wins, and the bshd
layout handling through stand-in `flash_attn` modules that compute attention with torch
SDPA. GPU (`-m gpu`): the real library against a float64 reference, when installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types
from importlib import metadata

import attnprof_flash_attn as fa
import pytest
import torch
import torch.nn.functional as F

from attnprof import RunSpec
from attnprof.plugins import PLUGINS_ENV, load_variants
from attnprof.profiling.inputs import make_inputs, to_bhsd

FLASH_MODULES = ("flash_attn", "flash_attn_interface")


def spec(**overrides) -> RunSpec:
    fields = dict(device="cpu", dtype="bf16", batch=2, heads=4, seq=40, head_dim=32, kv_heads=None, causal=True)
    fields.update(overrides)
    return RunSpec(**fields)


def reference(q, k, v, causal: bool):
    """Attention in float64 on [B, H, S, D] tensors, key/value heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[2]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


class _Hide:
    """A meta-path finder that makes the FlashAttention modules fail to import."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FLASH_MODULES:
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}", name=name)
        return None


def _clear_flash_modules(monkeypatch):
    for name in [n for n in sys.modules if n.split(".")[0] in FLASH_MODULES]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture(autouse=True)
def fresh_lookup(monkeypatch):
    """Each test looks the interface up afresh, and leaves no cached result behind."""
    monkeypatch.setattr(fa, "_found", None)


@pytest.fixture
def no_flash_attn(monkeypatch):
    _clear_flash_modules(monkeypatch)
    monkeypatch.setattr(sys, "meta_path", [_Hide(), *sys.meta_path])


def _bshd_sdpa(calls: list, returns_lse: bool = False):
    """A stand-in flash_attn_func: [B, S, H, D] in and out, computed by torch SDPA."""

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, **_ignored):
        calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), causal=causal, scale=softmax_scale))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        group = qt.shape[1] // kt.shape[1]
        kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=softmax_scale)
        out = out.transpose(1, 2).contiguous()
        if returns_lse:
            return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])
        return out

    return flash_attn_func


@pytest.fixture
def fake_flash(monkeypatch, no_flash_attn):
    """Install stand-ins: fake_flash("fa2", "fa4") makes those interfaces importable.

    The hiding finder stays, so a real installed FlashAttention never answers instead.
    """
    calls: dict[str, list] = {"fa2": [], "fa3": [], "fa4": []}

    def install(*which: str) -> dict[str, list]:
        if "fa2" in which or "fa4" in which:
            pkg = types.ModuleType("flash_attn")
            pkg.__path__ = []  # a package, so `flash_attn.cute` is looked up in sys.modules
            if "fa2" in which:
                pkg.flash_attn_func = _bshd_sdpa(calls["fa2"])
            monkeypatch.setitem(sys.modules, "flash_attn", pkg)
            if "fa4" in which:
                cute = types.ModuleType("flash_attn.cute")
                cute.flash_attn_func = _bshd_sdpa(calls["fa4"], returns_lse=True)
                pkg.cute = cute
                monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
        if "fa3" in which:
            iface = types.ModuleType("flash_attn_interface")
            iface.flash_attn_func = _bshd_sdpa(calls["fa3"])
            monkeypatch.setitem(sys.modules, "flash_attn_interface", iface)
        return calls

    return install


# --- discovery and the unavailable path -----------------------------------------------


def test_entry_point_discovered(monkeypatch):
    try:
        version = metadata.version("attnprof-flash-attn")
    except metadata.PackageNotFoundError:
        pytest.skip("attnprof-flash-attn is not installed: pip install -e plugins/attnprof-flash-attn")
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    loaded = load_variants(refresh=True)
    status = next(p for p in loaded.plugins if p.entry_point == "flash-attn")
    assert status.ok, status.error
    variant = loaded.registry.get("flash-attn")
    assert variant.source == f"attnprof-flash-attn {version}"
    assert variant.layout == "bshd" and variant.devices == ("cuda",) and variant.dtypes == ("bf16", "fp16")


def test_import_looks_nothing_up(no_flash_attn, monkeypatch):
    monkeypatch.delitem(sys.modules, "attnprof_flash_attn")
    module = importlib.import_module("attnprof_flash_attn")
    assert module._found is None
    assert "FA4" in module.make_variant().description  # says what it will look for, not what it found


def test_unavailable_reason_when_missing(no_flash_attn):
    variant = fa.make_variant()
    expected = "needs flash_attn (FA2/FA3/FA4): No module named 'flash_attn'"
    assert fa.find_interface(refresh=True) == expected
    assert variant.unavailable_reason(spec(device="cuda")) == expected
    assert variant.description == fa.BASE_DESCRIPTION  # check is pure


def test_unavailable_on_cpu_device():
    assert fa.make_variant().unavailable_reason(spec(device="cpu")) == "needs CUDA"


def test_unavailable_for_fp32():
    assert fa.make_variant().unavailable_reason(spec(device="cuda", dtype="fp32")) == "needs dtype bf16/fp16 (got fp32)"


def test_only_a_namespace_package_counts_as_missing(monkeypatch, no_flash_attn):
    # FA4's wheel alone leaves `flash_attn` a namespace package without flash_attn_func.
    namespace = types.ModuleType("flash_attn")
    namespace.__path__ = []
    monkeypatch.setitem(sys.modules, "flash_attn", namespace)
    assert fa.find_interface(refresh=True) == (
        "needs flash_attn (FA2/FA3/FA4): module 'flash_attn' has no attribute 'flash_attn_func'")


def test_broken_install_reason(monkeypatch, no_flash_attn):
    # FA2 present but its compiled extension does not load: the reason says so, not "missing".
    broken = types.ModuleType("flash_attn")
    broken.__path__ = []
    broken.__file__ = "/site-packages/flash_attn/__init__.py"

    def failing_getattr(name):
        raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice")

    broken.__getattr__ = failing_getattr
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    assert fa.find_interface(refresh=True) == (
        "needs flash_attn (FA2/FA3/FA4): FA2 (flash_attn) is installed but failed: "
        "flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice")


def test_fa4_missing_a_dependency(monkeypatch, no_flash_attn):
    namespace = types.ModuleType("flash_attn")
    namespace.__path__ = []
    monkeypatch.setitem(sys.modules, "flash_attn", namespace)

    class CuteNeedsCutlass:
        def find_spec(self, name, path=None, target=None):
            if name == "flash_attn.cute":
                raise ModuleNotFoundError("No module named 'cutlass'", name="cutlass")
            return None

    monkeypatch.setattr(sys, "meta_path", [CuteNeedsCutlass(), *sys.meta_path])
    assert fa.find_interface(refresh=True) == (
        "needs flash_attn (FA2/FA3/FA4): FA4 (flash_attn.cute) is installed but failed: No module named 'cutlass'")


def test_setup_and_forward_raise_the_reason_when_missing(no_flash_attn):
    variant = fa.make_variant()
    with pytest.raises(RuntimeError, match="needs flash_attn"):
        variant.setup(spec())
    with pytest.raises(RuntimeError, match="needs flash_attn"):
        variant.forward(None, None, None, True, None)


@pytest.mark.parametrize(
    ("which", "label"),
    [
        (("fa2",), "FA2 (flash_attn)"),
        (("fa3",), "FA3 (flash_attn_interface)"),
        (("fa2", "fa3"), "FA3 (flash_attn_interface)"),
        (("fa2", "fa3", "fa4"), "FA4 (flash_attn.cute)"),
        (("fa4",), "FA4 (flash_attn.cute)"),
    ],
)
def test_newest_interface_wins(fake_flash, which, label):
    fake_flash(*which)
    found = fa.find_interface(refresh=True)
    assert not isinstance(found, str), found
    assert found.label == label
    variant = fa.make_variant()
    assert variant.check(spec()) is None  # a CPU spec: no GPU checks
    assert variant.description == fa.BASE_DESCRIPTION  # check is pure


def test_check_reasons(fake_flash):
    fake_flash("fa2")
    variant = fa.make_variant()
    assert variant.check(spec(head_dim=36)) == "head_dim must be a multiple of 8 up to 256 (got 36)"
    assert variant.check(spec(head_dim=512)) == "head_dim must be a multiple of 8 up to 256 (got 512)"
    assert variant.check(spec(heads=6, kv_heads=4)) == "heads (6) must be a multiple of kv_heads (4)"
    if not torch.cuda.is_available():
        assert variant.check(spec(device="cuda")) == "needs a CUDA GPU (torch sees none)"


# --- the bshd layout, through stand-in modules on the CPU -----------------------------


@pytest.mark.parametrize("which", ["fa2", "fa3", "fa4"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_bshd_output_matches_bhsd_reference(fake_flash, which, causal, kv_heads):
    calls = fake_flash(which)[which]
    variant = fa.make_variant()
    rs = spec(causal=causal, kv_heads=kv_heads)
    state = variant.setup(rs)  # one warm-up call, as on the GPU
    assert state.label.lower().startswith(which)
    q, k, v = make_inputs(rs, seed=7, layout=variant.layout)
    assert q.shape == (rs.batch, rs.seq, rs.heads, rs.head_dim)
    out = variant.forward(q, k, v, causal, state)
    assert out.shape == q.shape  # the library's layout, tuple unwrapped for FA4
    # what the runner does: back to [B, H, S, D], then like with like against the reference
    qr, kr, vr = make_inputs(rs, seed=7, layout="bhsd")
    assert torch.equal(to_bhsd(q, "bshd"), qr)
    torch.testing.assert_close(to_bhsd(out, variant.layout).double(), reference(qr, kr, vr, causal),
                               atol=2e-2, rtol=0)
    assert calls[-1] == dict(q=tuple(q.shape), k=tuple(k.shape), causal=causal, scale=rs.head_dim ** -0.5)
    assert len(calls) == 2  # setup's warm-up and the forward


# --- on the GPU -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(("heads", "kv_heads", "seq", "head_dim"), [(4, None, 1000, 64), (8, 2, 2048, 128)])
def test_gpu_matches_float64(causal, heads, kv_heads, seq, head_dim):
    found = fa.find_interface(refresh=True)
    if isinstance(found, str):
        pytest.skip(found)
    variant = fa.make_variant()
    rs = RunSpec(device="cuda", dtype="bf16", batch=2, heads=heads, seq=seq, head_dim=head_dim,
                 kv_heads=kv_heads, causal=causal)
    reason = variant.unavailable_reason(rs)
    if reason:
        pytest.skip(reason)
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=0, layout="bshd")
    out = to_bhsd(variant.forward(q, k, v, causal, state), "bshd")
    qr, kr, vr = make_inputs(rs, seed=0)
    torch.testing.assert_close(out.double(), reference(qr, kr, vr, causal), atol=2e-2, rtol=0)


def test_backward_support_follows_the_interface_and_the_gpu():
    fa4, fa3, fa2 = fa.INTERFACES
    assert fa.make_variant().has_backward is True
    assert fa.backward_missing(fa4, spec(mode="fwd"), (8, 0)) is None  # the forward needs no backward
    assert fa.backward_missing(fa4, spec(mode="bwd"), (9, 0)) is None
    assert fa.backward_missing(fa4, spec(mode="fwd+bwd"), (10, 0)) is None
    assert fa.backward_missing(fa4, spec(mode="bwd"), (8, 6)) == (
        "no backward: FA4 (flash_attn.cute) has a backward kernel for compute capability 9.x or 10.x only (got 8.6)")
    assert fa.backward_missing(fa2, spec(mode="bwd"), (8, 0)) is None
    assert fa.backward_missing(fa3, spec(mode="fwd+bwd"), (9, 0)) is None


def test_declares_plain_masks_only():
    """Causal and none, square: a sized mask, a score mod or decode is a skipped cell, never run unmasked."""
    variant = fa.make_variant()
    assert variant.masks == {"causal", "none"} and not variant.score_mods and not variant.unequal_lengths
    assert variant.masking_reason(spec(mask="sliding_window:4")).startswith("mask sliding_window not supported")
    assert "not supported" in variant.masking_reason(spec(q_len=1))
