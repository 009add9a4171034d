"""Tests of the attnprof-flash-attn plugin.

CPU: the unavailable path with the package hidden, which interface wins, and the bshd
layout handling through stand-in `flash_attn` modules that compute attention with torch
SDPA. GPU (`-m gpu`): the real library against a float64 reference, when installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
import types
from dataclasses import replace
from importlib import metadata

import attnprof_flash_attn as fa
import pytest
import torch
import torch.nn.functional as F

from attnprof import RunSpec
from attnprof.plugins import PLUGINS_ENV, load_variants
from attnprof.profiling.correctness import reference_attention
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


# --- masks: window_size, softcap, documents through flash_attn_varlen_func ------------


def flash_math(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
    """FlashAttention's documented semantics on bshd tensors, in float64: query i (at position
    p = i + seqlen_k - seqlen_q) attends keys in [p - window_size[0], p + window_size[1]] (-1 or None:
    unbounded; causal sets the right side to 0), scores soft-capped as softcap·tanh(s / softcap)."""
    qt, kt, vt = (t.transpose(1, 2).double() for t in (q, k, v))
    group = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    sq, sk = qt.shape[2], kt.shape[2]
    p = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    left, right = (-1 if w is None else w for w in window_size)
    right = 0 if causal else right
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= p - left
    if right >= 0:
        keep &= j <= p + right
    scores = qt @ kt.transpose(-1, -2) * softmax_scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    out = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vt
    return out.transpose(1, 2).to(q.dtype).contiguous()


def _parameters(*names):
    """A signature of q, k, v and the named keyword parameters, as the real functions declare them."""
    kinds = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("q", "k", "v")]
    return inspect.Signature(kinds + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
                                      for n in names])


# The keyword parameters of flash_attn_func by release (FA4's has the same names, defaults aside).
FA2_2_2 = ("dropout_p", "softmax_scale", "causal", "return_attn_probs")
FA2_2_3 = ("dropout_p", "softmax_scale", "causal", "window_size", "alibi_slopes", "deterministic", "return_attn_probs")
FA2_2_6 = ("dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
           "return_attn_probs")
VARLEN = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


@pytest.fixture
def fake_release(monkeypatch, no_flash_attn):
    """fake_release(params, varlen_params or None, fa4=False): a stand-in FlashAttention whose functions have
    those keyword parameters and compute `flash_math`; returns the list of calls (name, kwargs, q shape)."""
    calls: list = []

    def install(params, varlen_params=None, fa4=False):
        def flash_attn_func(q, k, v, **kwargs):
            calls.append(("flash_attn_func", kwargs, tuple(q.shape)))
            out = flash_math(q, k, v, **{n: kwargs[n] for n in ("softmax_scale", "causal", "window_size", "softcap")
                                         if n in kwargs})
            return (out, None) if fa4 else out

        def flash_attn_varlen_func(q, k, v, **kwargs):
            calls.append(("flash_attn_varlen_func", kwargs, tuple(q.shape)))
            bounds = kwargs["cu_seqlens_q"].tolist()
            assert bounds == kwargs["cu_seqlens_k"].tolist()
            scale, causal, cap = kwargs["softmax_scale"], kwargs["causal"], kwargs.get("softcap", 0.0)
            pieces = [flash_math(q[None, a:b], k[None, a:b], v[None, a:b], scale, causal, softcap=cap)[0]
                      for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            out = torch.cat(pieces)
            return (out, None) if fa4 else out

        flash_attn_func.__signature__ = _parameters(*params)
        pkg = types.ModuleType("flash_attn")
        pkg.__path__ = []
        module = pkg
        if fa4:
            module = types.ModuleType("flash_attn.cute")
            pkg.cute = module
            monkeypatch.setitem(sys.modules, "flash_attn.cute", module)
        module.flash_attn_func = flash_attn_func
        if varlen_params is not None:
            flash_attn_varlen_func.__signature__ = _parameters(*VARLEN, *varlen_params)
            module.flash_attn_varlen_func = flash_attn_varlen_func
        monkeypatch.setitem(sys.modules, "flash_attn", pkg)
        return calls

    return install


def _run(rs, fake_calls):
    """setup and one forward as a cell runs them; the output in bhsd and the forward's call."""
    variant = fa.make_variant()
    assert variant.unavailable_reason(replace(rs, device="cuda")) in (None, "needs a CUDA GPU (torch sees none)",
                                                                       "needs CUDA")
    assert variant.check(rs) is None
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=5, layout="bshd")
    out = variant.forward(q, k, v, rs.causal, state)
    assert out.shape == q.shape
    return to_bhsd(out, "bshd"), fake_calls[-1]


def _expected(rs):
    q, k, v = make_inputs(rs, seed=5)
    return reference_attention(q, k, v, rs.causal, mask=rs.mask, score_mod=rs.score_mod)


def test_declares_windows_documents_and_softcap():
    variant = fa.make_variant()
    assert variant.masks == {"causal", "none", "sliding_window", "documents"}
    # q_len < kv_len passes the declaration: `check` allows it over a paged cache only
    assert variant.score_mods == {"softcap", "sinks"} and variant.unequal_lengths and variant.paged_kv
    assert variant.masking_reason(spec(mask="prefix:4")).startswith("mask prefix not supported by flash-attn")
    assert variant.masking_reason(spec(score_mod="alibi")).startswith("score_mod alibi not supported by flash-attn")


@pytest.mark.parametrize("window", [1, 7, 40])
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_a_sliding_window_is_window_size_w_minus_1_and_causal(fake_release, window, kv_heads):
    """window_size=(W - 1, 0) with causal=True keeps exactly attnprof's W keys up to each query's own position."""
    calls = fake_release(FA2_2_6, FA2_2_6)
    rs = spec(mask=f"sliding_window:{window}", causal=False, kv_heads=kv_heads, dtype="fp16")
    out, (name, kwargs, _shape) = _run(rs, calls)
    assert name == "flash_attn_func"
    assert kwargs == {"softmax_scale": rs.head_dim ** -0.5, "causal": True, "window_size": (window - 1, 0)}
    torch.testing.assert_close(out.double(), _expected(rs), atol=2e-3, rtol=0)
    assert len(calls) == 2  # setup's warm-up and the forward, alike


@pytest.mark.parametrize("mask", ["causal", "none", "sliding_window:9"])
def test_softcap_is_passed_as_softcap(fake_release, mask):
    calls = fake_release(FA2_2_6, FA2_2_6)
    rs = spec(mask=mask, causal=mask == "causal", score_mod="softcap:5", dtype="fp16")
    out, (name, kwargs, _shape) = _run(rs, calls)
    window = {"window_size": (8, 0)} if mask.startswith("sliding") else {}
    assert kwargs == {"softmax_scale": rs.head_dim ** -0.5, "causal": mask != "none", "softcap": 5.0, **window}
    torch.testing.assert_close(out.double(), _expected(rs), atol=2e-3, rtol=0)


@pytest.mark.parametrize("softcap", [None, "softcap:5"])
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_documents_go_through_varlen_with_each_documents_start(fake_release, softcap, kv_heads):
    """2 sequences of 40 tokens in 4 documents: 8 sequences of 10, cu_seqlens 0, 10, ..., 80, causal inside each."""
    calls = fake_release(FA2_2_6, FA2_2_6)
    rs = spec(mask="documents:4", causal=False, score_mod=softcap, kv_heads=kv_heads, dtype="fp16")
    out, (name, kwargs, q_shape) = _run(rs, calls)
    assert name == "flash_attn_varlen_func" and q_shape == (2 * 40, 4, 32)  # [B·S, H, D]: a view, no copy
    cu = kwargs.pop("cu_seqlens_q")
    assert cu.dtype == torch.int32 and cu.tolist() == list(range(0, 81, 10)) and kwargs.pop("cu_seqlens_k") is cu
    assert kwargs == {"max_seqlen_q": 10, "max_seqlen_k": 10, "softmax_scale": rs.head_dim ** -0.5, "causal": True,
                      **({"softcap": 5.0} if softcap else {})}
    torch.testing.assert_close(out.double(), _expected(rs), atol=2e-3, rtol=0)


def test_fa4_takes_the_same_arguments_and_returns_a_tuple(fake_release):
    calls = fake_release(("softmax_scale", "causal", "window_size", "softcap"), ("softmax_scale", "causal", "softcap"),
                         fa4=True)
    for mask in ("sliding_window:3", "documents:2"):
        rs = spec(mask=mask, causal=False, dtype="fp16")
        out, (name, kwargs, _shape) = _run(rs, calls)
        assert fa.find_interface().label == "FA4 (flash_attn.cute)"
        assert kwargs["causal"] is True and ("window_size" in kwargs) == (name == "flash_attn_func")
        torch.testing.assert_close(out.double(), _expected(rs), atol=2e-3, rtol=0)


@pytest.mark.parametrize(
    ("params", "varlen", "overrides", "reason"),
    [
        (FA2_2_2, FA2_2_2, dict(mask="sliding_window:8"),
         "sliding_window needs flash_attn_func(window_size=...), which FA2 (flash_attn) lacks "
         "(flash-attn 2.3 added it)"),
        (FA2_2_3, FA2_2_3, dict(score_mod="softcap:30"),
         "softcap needs flash_attn_func(softcap=...), which FA2 (flash_attn) lacks (flash-attn 2.6 added it)"),
        (FA2_2_6, None, dict(mask="documents:2"),
         "documents needs flash_attn_varlen_func, which FA2 (flash_attn) lacks (flash-attn 2.0 added it)"),
        (FA2_2_6, FA2_2_3, dict(mask="documents:2", score_mod="softcap:30"),
         "softcap needs flash_attn_varlen_func(softcap=...), which FA2 (flash_attn) lacks (flash-attn 2.6 added it)"),
        (FA2_2_6, FA2_2_6, dict(mask="documents:2", q_len=20),
         "q_len 20 != kv_len 40 not supported by flash-attn without a paged KV cache"),
    ],
)
def test_what_the_installed_release_lacks_is_a_skip_with_the_release_that_added_it(fake_release, params, varlen,
                                                                                     overrides, reason):
    fake_release(params, varlen)
    rs = spec(causal=False, **overrides)
    assert fa.check(rs) == reason
    with pytest.raises(RuntimeError, match="needs|not supported"):  # never run with another mask
        fa.setup(rs)


# --- packed variable-length batches (seq_lens) through flash_attn_varlen_func ---------------------------

PACKED = (11, 3, 26)


def packed_spec(**overrides) -> RunSpec:
    fields = dict(device="cpu", dtype="fp16", batch=1, heads=4, seq=sum(PACKED), head_dim=32, causal=True)
    return RunSpec(**(fields | overrides), seq_lens=PACKED)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_seq_lens_go_through_varlen_with_their_cu_seqlens(fake_release, causal, kv_heads):
    """3 sequences of 11, 3 and 26 tokens: cu_seqlens 0, 11, 14, 40, the longest 26, causal as the cell is."""
    calls = fake_release(FA2_2_6, FA2_2_6)
    rs = packed_spec(causal=causal, kv_heads=kv_heads)
    assert fa.make_variant().varlen
    out, (name, kwargs, q_shape) = _run(rs, calls)
    assert name == "flash_attn_varlen_func" and q_shape == (40, 4, 32)  # [total, H, D]: a view, no copy
    cu = kwargs.pop("cu_seqlens_q")
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 11, 14, 40] and kwargs.pop("cu_seqlens_k") is cu
    assert kwargs == {"max_seqlen_q": 26, "max_seqlen_k": 26, "softmax_scale": 32 ** -0.5, "causal": causal}
    q, k, v = make_inputs(rs, seed=5)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal, seq_lens=PACKED), atol=2e-3, rtol=0)


def test_seq_lens_without_varlen_is_a_skip_with_the_release_that_added_it(fake_release):
    fake_release(FA2_2_6, None)
    assert fa.check(packed_spec()) == (
        "seq_lens needs flash_attn_varlen_func, which FA2 (flash_attn) lacks (flash-attn 2.0 added it)"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_gpu_seq_lens_match_float64(causal, mode):
    """The installed library's flash_attn_varlen_func on 5 packed sequences, output and gradients per sequence."""
    found = fa.find_interface(refresh=True)
    if isinstance(found, str):
        pytest.skip(found)
    lengths = (1000, 17, 4096, 300, 2048)
    _check_on_gpu(RunSpec(device="cuda", dtype="bf16", batch=1, heads=8, kv_heads=2, seq=sum(lengths), head_dim=128,
                          causal=causal, mode=mode, seq_lens=lengths))


def test_plain_masks_need_nothing_new(fake_release):
    """causal and none call flash_attn_func as before, with nothing but the scale and causal."""
    calls = fake_release(FA2_2_2, None)
    for causal in (True, False):
        rs = spec(causal=causal, dtype="fp16")
        out, (name, kwargs, _shape) = _run(rs, calls)
        assert (name, kwargs) == ("flash_attn_func", {"softmax_scale": rs.head_dim ** -0.5, "causal": causal})
        torch.testing.assert_close(out.double(), _expected(rs), atol=2e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("overrides", [
    dict(mask="sliding_window:1"), dict(mask="sliding_window:256"), dict(mask="documents:4"),
    dict(score_mod="softcap:30"), dict(mask="sliding_window:256", score_mod="softcap:30"),
    dict(mask="documents:4", score_mod="softcap:30"),
], ids=str)
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_gpu_masks_match_float64(overrides, mode):
    """The installed library under each mask (skipped where it lacks the feature), output and gradients."""
    found = fa.find_interface(refresh=True)
    if isinstance(found, str):
        pytest.skip(found)
    _check_on_gpu(RunSpec(device="cuda", dtype="bf16", batch=2, heads=8, kv_heads=2, seq=1000, head_dim=64,
                          causal=False, mode=mode, **overrides))


def _check_on_gpu(rs):
    """setup and the forward (fwd) or a whole step (otherwise) of the installed library at `rs`, against float64."""
    from attnprof.profiling.gradcheck import check_grads
    from attnprof.profiling.steps import build_step

    variant = fa.make_variant()
    if reason := variant.unavailable_reason(rs):
        pytest.skip(reason)
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=0, layout="bshd")
    if rs.mode == "fwd":
        out = to_bhsd(variant.forward(q, k, v, rs.causal, state), "bshd")
        torch.testing.assert_close(out.double(), _expected_on(rs, q.device), atol=2e-2, rtol=0)
        return
    step = build_step(rs, lambda q, k, v: variant.forward(q, k, v, rs.causal, state), (q, k, v), seed=0)
    result = step.call()
    check = check_grads(result.grads, q, k, v, step.grad_out, causal=rs.causal, dtype="bf16", layout="bshd",
                        mask=rs.mask, score_mod=rs.score_mod, seq_lens=rs.seq_lens)
    assert check.passed, (check.reason, check.rel_errors)


def _expected_on(rs, device):
    q, k, v = make_inputs(rs, seed=0)
    return reference_attention(q, k, v, rs.causal, mask=rs.mask, score_mod=rs.score_mod, device=device,
                               seq_lens=rs.seq_lens)


def test_decode_without_a_paged_cache_is_refused(fake_flash):
    """q_len < kv_len runs over a paged cache only: without one it is a skipped cell."""
    fake_flash("fa2")
    variant = fa.make_variant()
    assert variant.paged_kv
    assert variant.check(spec(q_len=1)) == (
        "q_len 1 != kv_len 40 not supported by flash-attn without a paged KV cache")


# --- a paged KV cache through flash_attn_with_kvcache, with a stand-in FA2 -------------

PAGED = dict(device="cpu", dtype="bf16", batch=2, heads=4, kv_heads=2, seq=512, head_dim=32, q_len=3, page_size=256)


def _fake_kvcache(calls: list):
    """A stand-in FA2 flash_attn_with_kvcache with FA2's signature: gathers each sequence's pages by the
    block table and attends with SDPA, causal bottom-right, in float64."""

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                                return_softmax_lse=False):
        calls.append(dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                          block_table=block_table, softmax_scale=softmax_scale, causal=causal))
        batch, q_len, heads, _ = q.shape
        out = []
        for b in range(batch):
            n = int(cache_seqlens[b])
            keys = k_cache[block_table[b].long()].flatten(0, 1)[:n].transpose(0, 1).double()  # [H_kv, n, D]
            values = v_cache[block_table[b].long()].flatten(0, 1)[:n].transpose(0, 1).double()
            group = heads // keys.shape[0]
            keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
            keep = torch.arange(q_len)[:, None] + (n - q_len) >= torch.arange(n)[None, :]
            scores = q[b].transpose(0, 1).double() @ keys.transpose(-1, -2) * softmax_scale
            if causal:
                scores = scores.masked_fill(~keep, float("-inf"))
            out.append((scores.softmax(-1) @ values).transpose(0, 1))
        return torch.stack(out).to(q.dtype)

    return flash_attn_with_kvcache


@pytest.fixture
def fake_kvcache(fake_flash, monkeypatch):
    """FA2 stand-in with flash_attn_with_kvcache; returns the list of its calls."""
    fake_flash("fa2")
    calls: list = []
    monkeypatch.setattr(sys.modules["flash_attn"], "flash_attn_with_kvcache", _fake_kvcache(calls), raising=False)
    return calls


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_paged_decode_calls_flash_attn_with_kvcache(fake_kvcache, causal):
    from attnprof.kv_cache import shuffled_page_table
    from attnprof.profiling.correctness import reference_attention

    variant = fa.make_variant()
    rs = RunSpec(**PAGED, causal=causal)
    assert rs.shape_label == "2x4x3/512x32/kv2 paged256"
    assert variant.check(rs) is None
    state = variant.setup(rs)
    assert state.label == fa.KVCACHE_LABEL and state.paged is None
    q, k, v = make_inputs(rs, seed=5, layout="bshd")
    state = variant.prepare_inputs(rs, state, q, k, v, 5)
    out = variant.forward(q, k, v, causal, state)
    (call,) = fake_kvcache  # no warm-up call in setup
    assert call["q"] is q and call["k"] is None and call["v"] is None  # nothing appended to the cache
    assert call["k_cache"].shape == call["v_cache"].shape == (2 * 2, 256, 2, 32)  # [pages, page, H_kv, D]
    table = call["block_table"]
    assert table.dtype == torch.int32 and table.shape == (2, 2)
    assert torch.equal(table.long(), shuffled_page_table(2, 512, 256, 5))
    assert sorted(table.flatten().tolist()) == [0, 1, 2, 3]
    assert call["cache_seqlens"].dtype == torch.int32 and call["cache_seqlens"].tolist() == [512, 512]
    assert call["causal"] is causal and call["softmax_scale"] == 32 ** -0.5
    # page table[b, i] holds positions i·256 ... of sequence b
    assert torch.equal(call["k_cache"][table[1, 1].long()], k[1, 256:512])
    qr, kr, vr = make_inputs(rs, seed=5)
    ref = reference_attention(qr, kr, vr, causal, mask="causal" if causal else "none")
    torch.testing.assert_close(to_bhsd(out, "bshd").double(), ref, atol=2e-2, rtol=0)


def test_paged_reasons(fake_flash, monkeypatch):
    variant = fa.make_variant()
    fake_flash("fa2")  # flash_attn_func only: an FA2 before flash_attn_with_kvcache
    why = "a paged KV cache in flash-attn needs FA2's flash_attn.flash_attn_with_kvcache with block_table"
    assert variant.check(RunSpec(**PAGED)) == f"{why}: the installed flash_attn has no flash_attn_with_kvcache"

    def no_table(q, k_cache, v_cache, cache_seqlens=None, softmax_scale=None, causal=False):
        raise AssertionError("not called")

    monkeypatch.setattr(sys.modules["flash_attn"], "flash_attn_with_kvcache", no_table, raising=False)
    assert variant.check(RunSpec(**PAGED)) == f"{why}: the installed one takes no block_table (flash-attn >= 2.5 does)"
    monkeypatch.setattr(sys.modules["flash_attn"], "flash_attn_with_kvcache", _fake_kvcache([]))
    assert variant.check(RunSpec(**PAGED | {"page_size": 64})) == (
        "FA2 (flash_attn.flash_attn_with_kvcache) needs page_size divisible by 256 (got 64)")
    assert variant.unavailable_reason(RunSpec(**PAGED | {"device": "cuda"}, mode="bwd")) == (
        "no backward (a paged KV cache is timed forward only)")


def test_paged_reason_without_flash_attn(no_flash_attn):
    assert fa.find_kvcache() == ("a paged KV cache in flash-attn needs FA2's flash_attn.flash_attn_with_kvcache "
                                 "with block_table: No module named 'flash_attn'")


def test_unpaged_state_is_left_alone(fake_flash):
    fake_flash("fa2")
    variant = fa.make_variant()
    rs = spec()
    state = variant.setup(rs)
    assert variant.prepare_inputs(rs, state, None, None, None, 0) is state and state.paged is None


def test_a_paged_cache_runs_plain_masks_only(fake_flash, monkeypatch):
    """flash_attn_with_kvcache gets no window or softcap here: a paged cell with one is a skip, not a run
    with another mask."""
    fake_flash("fa2")
    monkeypatch.setattr(sys.modules["flash_attn"], "flash_attn_with_kvcache", _fake_kvcache([]), raising=False)
    variant = fa.make_variant()
    assert variant.check(RunSpec(**PAGED)) is None
    for extra in (dict(mask="sliding_window:64"), dict(score_mod="softcap:30")):
        reason = variant.check(RunSpec(**PAGED | extra))
        assert reason is not None and "paged KV cache" in reason and "(use flex)" in reason


# --- attention sinks through FA4's learnable_sink, with a stand-in FA4 ----------------------


def _fa4_with_sinks(calls: list):
    """A stand-in FA4 `flash_attn_func` that takes `learnable_sink` (bf16, one logit per query head) and applies it
    as gpt-oss does: one more logit in each row's softmax denominator."""

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                        softcap=0.0):
        calls.append(dict(sink_dtype=None if learnable_sink is None else learnable_sink.dtype, causal=causal))
        qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
        group = qt.shape[1] // kt.shape[1]
        kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
        scores = qt @ kt.transpose(-1, -2) * softmax_scale
        if causal:
            s = scores.shape[-1]
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        if learnable_sink is not None:
            column = learnable_sink.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
            weights = torch.cat([scores, column], -1).softmax(-1)[..., :-1]
        else:
            weights = scores.softmax(-1)
        out = (weights @ vt).transpose(1, 2).to(q.dtype).contiguous()
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    return flash_attn_func


@pytest.fixture
def fa4_sinks(monkeypatch, no_flash_attn):
    calls: list = []
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = _fa4_with_sinks(calls)
    pkg.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return calls


def test_sinks_go_to_fa4_as_learnable_sink_in_bf16_converted_once(fa4_sinks):
    from attnprof.profiling.inputs import make_sinks

    rs = spec(score_mod="sinks", kv_heads=2, dtype="fp16")
    assert fa.check(rs) is None
    state = fa.setup(rs)
    q, k, v = make_inputs(rs, seed=0, layout="bshd")
    sinks = make_sinks(rs, seed=0)
    out = to_bhsd(fa.forward(q, k, v, True, state, sinks=sinks), "bshd")
    first = state.sinks[1]
    fa.forward(q, k, v, True, state, sinks=sinks)
    assert state.sinks[1] is first  # the timed calls reuse the bf16 copy
    assert fa4_sinks[-1]["sink_dtype"] == torch.bfloat16
    qb, kb, vb = make_inputs(rs, seed=0)
    expected = reference_attention(qb, kb, vb, True, sinks=sinks.to(torch.bfloat16).double())
    torch.testing.assert_close(out.double(), expected, atol=3e-3, rtol=0)


def test_sinks_need_fa4_and_are_forward_only(fake_flash, fa4_sinks):
    rs = spec(score_mod="sinks")
    assert fa.check(replace(rs, mode="fwd+bwd")) == (
        "no backward with sinks: FA4's autograd returns no learnable_sink gradient (dsinks)")


def test_an_interface_without_learnable_sink_says_so(fake_flash):
    fake_flash("fa2")
    assert fa.check(spec(score_mod="sinks")) == (
        "sinks needs flash_attn_func(learnable_sink=...), which FA2 (flash_attn) lacks (FA4, flash_attn.cute, has it)")
