"""Tests of the attnprof-triton plugin.

CPU: entry-point discovery, the unavailable path and its reasons, and (when triton is
installed) the kernel itself under the Triton interpreter against a float64 reference.
GPU (`-m gpu`): the autotuned kernel through the Variant, at several shapes, and one
kernel launch per forward.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import attnprof_triton
import pytest
import torch

from attnprof import RunSpec
from attnprof.plugins import PLUGINS_ENV, load_variants
from attnprof.profiling.inputs import make_inputs
from attnprof.registry import ExecutedPairs

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
requires_gpu = pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs a CUDA GPU and triton")


def spec(**overrides) -> RunSpec:
    fields = dict(device="cuda", dtype="bf16", batch=1, heads=4, seq=128, head_dim=64, kv_heads=None, causal=True)
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


class _HideTriton:
    """A meta-path finder that makes `import triton` fail as on a machine without it."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def no_triton(monkeypatch):
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_HideTriton(), *sys.meta_path])


# --- discovery and availability (CPU) -------------------------------------------------


def test_entry_point_is_declared():
    try:
        dist = metadata.distribution("attnprof-triton")
    except metadata.PackageNotFoundError:
        pytest.skip("attnprof-triton is not installed: pip install -e plugins/attnprof-triton")
    points = [ep for ep in dist.entry_points if ep.group == "attnprof.variants"]
    assert [(ep.name, ep.value) for ep in points] == [("triton", "attnprof_triton")]


def test_discovered_through_entry_point(monkeypatch):
    try:
        version = metadata.version("attnprof-triton")
    except metadata.PackageNotFoundError:
        pytest.skip("attnprof-triton is not installed: pip install -e plugins/attnprof-triton")
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    loaded = load_variants(refresh=True)
    status = next(p for p in loaded.plugins if p.entry_point == "triton")
    assert status.ok, status.error
    assert status.variants == ["triton-flash", "triton-flash-fp8"]
    variant = loaded.registry.get("triton-flash")
    assert variant.source == f"attnprof-triton {version}"
    assert variant.layout == "bhsd" and variant.devices == ("cuda",)
    assert variant.setup is not None and variant.check is not None


def test_selected_by_name(monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, "attnprof-triton")
    registry = load_variants(refresh=True).registry
    if "triton-flash" not in registry:
        pytest.skip("attnprof-triton is not installed")
    monkeypatch.setenv(PLUGINS_ENV, "")
    assert "triton-flash" not in load_variants(refresh=True).registry


def test_module_imports_without_triton(no_triton, monkeypatch):
    monkeypatch.delitem(sys.modules, "attnprof_triton")
    module = importlib.import_module("attnprof_triton")
    assert module.register_variants
    assert "attnprof_triton._kernel" not in sys.modules or HAS_TRITON


def test_unavailable_without_triton(no_triton):
    variant = attnprof_triton.make_variant()
    assert variant.unavailable_reason(spec()) == "needs triton: No module named 'triton'"


def test_unavailable_on_cpu_device():
    variant = attnprof_triton.make_variant()
    assert variant.unavailable_reason(spec(device="cpu")) == "needs CUDA"


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_unavailable_on_cpu_only_machine():
    reason = attnprof_triton.make_variant().unavailable_reason(spec())
    assert reason in ("needs a CUDA GPU (torch sees none)", "needs triton: No module named 'triton'")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (dict(head_dim=80), "head_dim must be a power of two from 16 to 256 (got 80)"),
        (dict(head_dim=8), "head_dim must be a power of two from 16 to 256 (got 8)"),
        (dict(head_dim=512), "head_dim must be a power of two from 16 to 256 (got 512)"),
        (dict(heads=6, kv_heads=4), "heads (6) must be a multiple of kv_heads (4)"),
        (dict(dtype="fp32", head_dim=256), "fp32 needs head_dim <= 128"),
    ],
)
def test_check_reasons(overrides, expected):
    reason = attnprof_triton.check(spec(**overrides))
    assert reason is not None and reason.startswith(expected)


def test_check_passes_shape_rules_for_supported_specs():
    for head_dim in (16, 32, 64, 128, 256):
        reason = attnprof_triton.check(spec(head_dim=head_dim, heads=8, kv_heads=2))
        assert reason is None or not reason.startswith(("head_dim", "heads", "fp32")), reason


# --- the kernel under the Triton interpreter (CPU) ------------------------------------
#
# interp_runner.py runs every case in one fresh process with TRITON_INTERPRET=1 (the
# interpreter must be on before triton is first imported); each test checks its case.
# fp16 and fp32 only: the interpreter's bf16 tl.dot is broken (seen with triton 3.9).

# (batch, heads, kv_heads, seq, head_dim, (BLOCK_M, BLOCK_N, warps, stages)): seq a multiple
# of the tiles and not, BLOCK_M > BLOCK_N (several masked key blocks on the diagonal), GQA
# groups of 2 and 4.
INTERP_SHAPES = [
    (1, 2, 2, 64, 16, (32, 16, 4, 1)),
    (2, 2, 1, 45, 16, (32, 16, 4, 1)),
    (1, 4, 2, 70, 32, (32, 32, 4, 1)),
    (1, 4, 1, 33, 64, (16, 16, 4, 1)),
]


def _interp_cases() -> list[dict]:
    cases = []
    for batch, heads, kv_heads, seq, head_dim, config in INTERP_SHAPES:
        for causal in (False, True):
            for tma in (False, True):
                label = f"{batch}x{heads}/kv{kv_heads}x{seq}x{head_dim}-{'causal' if causal else 'full'}-" + (
                    "tma" if tma else "pointers")
                cases.append(dict(id=label, batch=batch, heads=heads, kv_heads=kv_heads, seq=seq,
                                  head_dim=head_dim, config=config, causal=causal, tma=tma, dtype="fp16", seed=3))
    for causal in (False, True):
        cases.append(dict(id=f"fp32-{'causal' if causal else 'full'}", batch=1, heads=4, kv_heads=2, seq=50,
                          head_dim=32, config=(32, 16, 4, 1), causal=causal, tma=False, dtype="fp32", seed=5))
    cases.append(dict(id="strided-causal", batch=2, heads=2, kv_heads=None, seq=40, head_dim=16,
                      config=(16, 16, 4, 1), causal=True, tma=False, dtype="fp16", seed=1, strided=True))
    return cases + MASK_CASES + GRAD_CASES + MASK_GRAD_CASES + UNEVEN_GRAD_CASES + SINK_CASES + PACKED_CASES + (
        VARIANT_CASES)


# The sized masks and decode (q_len < kv_len, bottom-right aligned): lengths that are multiples of the
# tiles and not, tiles with BLOCK_M > BLOCK_N, a window or a document narrower and wider than a tile.
MASK_SHAPES = [
    # (q_len or None, kv_len, (BLOCK_M, BLOCK_N, warps, stages))
    (None, 64, (16, 16, 4, 1)),
    (None, 77, (32, 16, 4, 1)),
    (23, 77, (16, 16, 4, 1)),
    (1, 50, (16, 16, 4, 1)),
]
MASKS = ["sliding_window:5", "sliding_window:40", "documents:1", "documents:7", "prefix:20", "causal", "none"]


def _mask_cases() -> list[dict]:
    cases = []
    for q_len, kv_len, config in MASK_SHAPES:
        for mask in MASKS:
            if mask.startswith("documents") and kv_len % int(mask.split(":")[1]):
                continue
            for tma in (False, True) if q_len is None and kv_len == 77 else (False,):
                label = f"{mask}-{q_len or kv_len}/{kv_len}-{config[0]}x{config[1]}" + ("-tma" if tma else "")
                cases.append(dict(id=label, batch=1, heads=4, kv_heads=2, seq=kv_len, q_len=q_len, head_dim=16,
                                  config=config, causal=mask == "causal", mask=mask, tma=tma, dtype="fp16",
                                  seed=11))
    # Keys no query keeps (decode against a window, the last documents): NaN there must not reach the
    # output, so their blocks were never loaded.
    for mask, q_len, poison in (("sliding_window:9", 20, 96), ("documents:4", 24, 96)):
        cases.append(dict(id=f"skips-{mask}", batch=1, heads=2, kv_heads=1, seq=128, q_len=q_len, head_dim=16,
                          config=(16, 16, 4, 1), causal=False, mask=mask, tma=False, dtype="fp16", seed=4,
                          poison_below=poison))
    return cases


MASK_CASES = _mask_cases()


# The backward kernels (at `_backward.default_configs`: the interpreter cannot autotune): seq a multiple of
# the tiles and not, GQA groups of 1, 2 and 4, head_dim 16 to 256, the forward with TMA once, fp32 once.
GRAD_CASES = [
    dict(id=f"grad-{b}x{h}/kv{kv}x{s}x{d}-{dtype}-{'causal' if causal else 'full'}" + ("-tma" if tma else ""),
         grad=True, batch=b, heads=h, kv_heads=kv, seq=s, head_dim=d, causal=causal, tma=tma, dtype=dtype, seed=7)
    for b, h, kv, s, d, causal, tma, dtype in [
        (1, 2, 2, 64, 16, False, False, "fp16"),
        (1, 2, 2, 64, 16, True, False, "fp16"),
        (2, 4, 2, 70, 32, True, False, "fp16"),
        (1, 4, 1, 45, 32, False, True, "fp16"),
        (1, 2, 1, 130, 64, True, False, "fp16"),
        (1, 2, 2, 40, 256, True, False, "fp16"),
        (1, 4, 2, 50, 32, True, False, "fp32"),
    ]
]


# The backward under every sized mask, square and decode-like, GQA, fp16 and fp32.
MASK_GRAD_CASES = [
    dict(id=f"grad-{mask}-{q_len or s}/{s}x{d}-{dtype}", grad=True, batch=1, heads=4, kv_heads=2, seq=s,
         q_len=q_len, head_dim=d, causal=mask == "causal", mask=mask, tma=False, dtype=dtype, seed=9)
    for mask, q_len, s, d, dtype in [
        ("sliding_window:9", None, 70, 32, "fp16"),
        ("sliding_window:100", None, 130, 16, "fp32"),
        ("documents:5", None, 70, 32, "fp16"),
        ("prefix:33", None, 70, 16, "fp16"),
        ("causal", 30, 70, 32, "fp16"),
        ("none", 30, 70, 16, "fp16"),
        ("sliding_window:9", 30, 70, 16, "fp32"),
        ("documents:7", 30, 70, 16, "fp16"),
        ("prefix:50", 1, 70, 16, "fp16"),
    ]
]


# The backward with uneven tiles, as the autotuner may pick them (dK/dV: 16 query rows x 32 keys; dQ: 32 x 16):
# the unmasked middle tiles, the masked boundary ones and ragged ends under every mask, square and decode-like.
UNEVEN_GRAD_CASES = [
    dict(id=f"grad-uneven-{mask}-{q_len or s}/{s}", grad=True, batch=1, heads=4, kv_heads=2, seq=s, q_len=q_len,
         head_dim=16, causal=mask == "causal", mask=mask, tma=False, dtype="fp16", seed=5,
         bwd_configs=[(16, 32, 4, 1), (32, 16, 4, 1)])
    for mask, q_len, s in [
        ("causal", None, 100),
        ("none", None, 70),
        ("sliding_window:40", None, 128),
        ("documents:4", None, 128),
        ("prefix:40", None, 100),
        ("causal", 40, 100),
        ("sliding_window:20", 33, 96),
    ]
]

# Attention sinks (make_sinks' logits: large enough that a kernel without them fails), forward and backward with
# dsinks: causal and none, GQA, q_len < kv_len, a sized mask, ragged lengths, fp16 and fp32, TMA once.
SINK_CASES = [
    dict(id=f"sinks-{'grad-' if grad else ''}{mask}-{q_len or s}/{s}x{d}/kv{kv}-{dtype}" + ("-tma" if tma else ""),
         grad=grad, sinks=True, batch=2, heads=4, kv_heads=kv, seq=s, q_len=q_len, head_dim=d,
         causal=mask == "causal", mask=mask, tma=tma, dtype=dtype, seed=13, config=(32, 16, 4, 1))
    for grad in (False, True)
    for mask, q_len, s, d, kv, dtype, tma in [
        ("causal", None, 45, 16, 2, "fp16", False),
        ("none", None, 64, 32, 1, "fp16", False),
        ("causal", 20, 70, 16, 4, "fp16", False),
        ("none", 1, 50, 16, 2, "fp16", False),
        ("sliding_window:9", None, 70, 16, 2, "fp16", False),
        ("causal", None, 50, 32, 2, "fp32", False),
        ("none", None, 77, 16, 2, "fp16", True),
    ]
    if not (grad and tma)  # the backward takes no TMA path
]

# Packed batches (cu_seqlens): ragged lengths, one of 1 token, lengths that are and are not multiples of the tiles,
# a single sequence; GQA; causal and none; the forward at square and uneven tiles, the backward at the default
# tiles and at uneven ones (dK/dV 16 x 32, dQ 32 x 16).
PACKED_LENGTHS = [[17, 1, 33, 5], [64, 40, 16], [1], [70], [3, 31, 1, 48, 9]]
PACKED_CASES = [
    dict(id=f"packed-{'grad-' if grad else ''}{'-'.join(map(str, lengths))}-{'causal' if causal else 'none'}"
         + ("-uneven" if uneven else ""),
         grad=grad, seq_lens=lengths, batch=1, heads=4, kv_heads=2, head_dim=16, causal=causal, tma=False,
         dtype="fp16", seed=17, config=(32, 16, 4, 1) if uneven else (16, 16, 4, 1),
         bwd_configs=[(16, 32, 4, 1), (32, 16, 4, 1)] if uneven and grad else None)
    for grad in (False, True)
    for lengths in PACKED_LENGTHS
    for causal in (True, False)
    for uneven in (False, True)
    if not (uneven and len(lengths) == 1)
] + [dict(id="packed-grad-fp32-gqa4", grad=True, seq_lens=[20, 7, 45], batch=1, heads=4, kv_heads=1, head_dim=32,
          causal=True, tma=False, dtype="fp32", seed=19)]

# Whole steps through the Variant as a cell runs them (setup, `sinks=` through bound_forward, the packed state).
VARIANT_CASES = [
    dict(id=f"variant-{what}-{mode}", variant=True, mode=mode, batch=2, heads=4, kv_heads=2, seq=40, head_dim=16,
         causal=True, dtype="fp16", seed=23, **extra)
    for what, extra in (("sinks", {"sinks": True}), ("packed", {"seq_lens": [9, 1, 30]}))
    for mode in ("fwd", "bwd", "fwd+bwd")
]

INTERP_CASES = _interp_cases()


@pytest.fixture(scope="module")
def interp_results() -> dict:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("interp_runner.py"))],
                          input=json.dumps(INTERP_CASES), capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    if "__skip__" in results:
        pytest.skip(results["__skip__"])
    return results


_GRAD_CASES = GRAD_CASES + MASK_GRAD_CASES + UNEVEN_GRAD_CASES + [
    c for c in SINK_CASES + PACKED_CASES if c["grad"]]


@needs_triton
@pytest.mark.parametrize("case", _GRAD_CASES, ids=[c["id"] for c in _GRAD_CASES])
def test_interpreter_gradients_match_float64_autograd(interp_results, case):
    result = interp_results[case["id"]]
    assert "error" not in result, result["error"]
    assert result["passed"], result["reason"]
    assert set(result["grad_rel_errors"]) == {"dq", "dk", "dv"} | ({"dsinks"} if case.get("sinks") else set())


@needs_triton
@pytest.mark.parametrize("case", VARIANT_CASES, ids=[c["id"] for c in VARIANT_CASES])
def test_interpreter_variant_step_passes_the_cell_checks(interp_results, case):
    """setup, the forward with `sinks=` or the packed state, and the backward modes' gradients (dsinks too)."""
    result = interp_results[case["id"]]
    assert "error" not in result, result["error"]
    assert result["passed"], result["reason"]
    assert result["state"][0] == [64, 32]  # default_config for a short sequence: the tiles executed_pairs counts
    if case["mode"] != "fwd":
        assert result["grad_passed"], (result["grad_reason"], result["grad_rel_errors"])
        assert ("dsinks" in result["grad_rel_errors"]) == bool(case.get("sinks"))


_FORWARD_CASES = [c for c in INTERP_CASES if not c.get("grad") and not c.get("variant")]


@needs_triton
@pytest.mark.parametrize("case", _FORWARD_CASES, ids=[c["id"] for c in _FORWARD_CASES])
def test_interpreter_matches_float64(interp_results, case):
    result = interp_results[case["id"]]
    assert "error" not in result, result["error"]
    tolerance = 1e-5 if case["dtype"] == "fp32" else 2e-3
    assert result["max_err"] <= tolerance, f"max |error| {result['max_err']:.3e} > {tolerance}"


@needs_triton
def test_autotune_space():
    from attnprof_triton import _kernel

    space = _kernel.autotune_space(8192, 128)
    assert 4 <= len(space) <= 10
    assert all(c.block_n <= c.block_m for c in space)
    assert {c.block_m for c in space} == {64, 128} and {c.block_n for c in space} == {32, 64, 128}
    assert {c.num_warps for c in space} == {4, 8} and {c.num_stages for c in space} == {2, 3, 4}
    wide = _kernel.autotune_space(8192, 256)
    assert wide and all(c.block_n <= 64 for c in wide)
    assert all(c.block_m == 64 for c in _kernel.autotune_space(48, 64))


@needs_triton
def test_tuned_configs_are_read_back_by_key_name(monkeypatch):
    """The autotuner's cache keys an entry by TUNING_KEY's values then the tensors' dtypes: a dense, a sinks, a
    packed and an lse-storing entry of one shape each give back their own tiles, and another dtype none."""
    import triton
    from attnprof_triton import _backward, _kernel

    q, k = torch.zeros(1, 4, 100, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 100, 64, dtype=torch.bfloat16)
    dense = dict(q_len=100, kv_len=100, HEAD_DIM=64, MASK=1, USE_TMA=False, STORE_LSE=False, SINKS=False,
                 VARLEN=False, n_seqs=1)

    def entry(block_m, **changed):
        key = tuple({**dense, **changed}[name] for name in _kernel.TUNING_KEY) + ("torch.bfloat16",) * 7
        return key, triton.Config({"BLOCK_M": block_m, "BLOCK_N": 32}, num_warps=4, num_stages=2)

    cache = dict([entry(64), entry(128, SINKS=True), entry(32, STORE_LSE=True),
                  entry(16, VARLEN=True, q_len=60, kv_len=60, n_seqs=3)])
    monkeypatch.setattr(_kernel._attn_fwd_tuned, "cache", cache)
    assert _kernel.best_config(q, k, "causal", lse=False).block_m == 64
    assert _kernel.best_config(q, k, "causal", sinks=True).block_m == 128
    assert _kernel.best_config(q, k, "causal", lse=True).block_m == 32
    assert _kernel.best_config(q, k, "causal", max_seqlen=60, n_seqs=3).block_m == 16
    assert _kernel.best_config(q, k, "causal", max_seqlen=60, n_seqs=4) is None
    assert _kernel.best_config(q, k, "none") is None
    assert _kernel.best_config(q.half(), k.half(), "causal") is None
    monkeypatch.setattr(_backward._attn_bwd_dkdv_tuned, "cache", {})
    monkeypatch.setenv(_kernel.AUTOTUNE_ENV, "1")
    assert _backward.launched_configs(q, k, "causal") is None  # not tuned yet


# --- on the GPU -----------------------------------------------------------------------

GPU_CASES = [
    # batch, heads, kv_heads, seq, head_dim
    (2, 4, None, 256, 64),
    (1, 4, None, 1000, 64),  # seq not a multiple of any tile
    (2, 8, 2, 777, 128),  # GQA, ragged seq
    (1, 2, None, 4096, 128),
    (1, 4, 1, 300, 256),
    (1, 2, None, 200, 16),
]


def _gpu_spec(case, dtype, causal):
    batch, heads, kv_heads, seq, head_dim = case
    return RunSpec(device="cuda", dtype=dtype, batch=batch, heads=heads, seq=seq, head_dim=head_dim,
                   kv_heads=kv_heads, causal=causal)


TOL = {"bf16": 2e-2, "fp16": 4e-3, "fp32": 1e-4}


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "x".join(str(x) for x in c if x is not None))
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_kernel_matches_float64(case, dtype, causal):
    """The kernel at its default configuration (no autotuning: that is tested below)."""
    from attnprof_triton import _kernel

    rs = _gpu_spec(case, dtype, causal)
    q, k, v = make_inputs(rs, seed=0)
    out = _kernel.attention(q, k, v, causal, config=_kernel.default_config(rs.seq, rs.head_dim))
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), atol=TOL[dtype], rtol=0)


# Sized masks and decode on the GPU: (batch, heads, kv_heads, q_len, kv_len, head_dim); lengths that are
# no multiple of any tile, decode, GQA.
GPU_MASK_CASES = [
    (2, 4, None, None, 1000, 64),
    (1, 8, 2, 777, 777, 128),
    (2, 8, 2, 300, 1000, 64),
    (4, 8, 2, 1, 4100, 128),
    (1, 2, None, 200, 200, 256),
]
GPU_MASKS = ["sliding_window:1", "sliding_window:100", "sliding_window:256", "documents:4", "documents:5",
             "prefix:129", "causal", "none"]


def _gpu_mask_spec(case, dtype, mask, mode="fwd"):
    batch, heads, kv_heads, q_len, kv_len, head_dim = case
    return RunSpec(device="cuda", dtype=dtype, batch=batch, heads=heads, seq=kv_len, q_len=q_len,
                   head_dim=head_dim, kv_heads=kv_heads, mask=mask, causal=mask == "causal", mode=mode)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("mask", GPU_MASKS)
@pytest.mark.parametrize("case", GPU_MASK_CASES, ids=lambda c: "x".join(str(x) for x in c if x is not None))
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_masks_match_float64(monkeypatch, case, dtype, mask):
    """Every mask through the Variant, against the masked float64 reference (the default configuration: the
    search's configurations are checked below, the autotuned cells in test_triton_backward_gpu.py)."""
    from attnprof_triton import _kernel

    from attnprof.profiling.correctness import reference_attention

    monkeypatch.setenv(_kernel.AUTOTUNE_ENV, "0")
    rs = _gpu_mask_spec(case, dtype, mask)
    if rs.mask.problem(rs.n_queries, rs.n_keys):
        pytest.skip(rs.mask.problem(rs.n_queries, rs.n_keys))
    variant = attnprof_triton.make_variant()
    assert variant.unavailable_reason(rs) is None
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=0)
    out = variant.forward(q, k, v, rs.causal, state)
    expected = reference_attention(q, k, v, rs.causal, mask=rs.mask, device=q.device)
    torch.testing.assert_close(out.double(), expected, atol=TOL[dtype], rtol=0)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "tma"])
@pytest.mark.parametrize("mask", ["sliding_window:100", "documents:8"])
def test_gpu_masks_every_config(monkeypatch, tma, mask):
    """Each configuration the autotuner may pick, under a window and documents, decode-like lengths."""
    from attnprof_triton import _kernel

    from attnprof.profiling.correctness import reference_attention

    if tma == "1" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or newer")
    monkeypatch.setenv(_kernel.TMA_ENV, tma)
    rs = _gpu_mask_spec((1, 4, 2, 333, 1000, 128), "bf16", mask)
    q, k, v = make_inputs(rs, seed=1)
    expected = reference_attention(q, k, v, False, mask=mask, device=q.device)
    for cfg in _kernel.autotune_space(rs.n_queries, rs.head_dim):
        try:
            out = _kernel.attention(q, k, v, config=cfg, mask=mask)
        except Exception as exc:  # out of shared memory on a smaller GPU: the autotuner skips these too
            if "OutOfResources" in type(exc).__name__ or "out of resource" in str(exc):
                continue
            raise
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=0, msg=lambda m, c=cfg: f"{c}: {m}")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(("case", "dtype", "causal"), [
    ((2, 8, 2, 777, 128), "bf16", True),
    ((1, 4, None, 1024, 64), "fp16", False),
])
def test_gpu_variant_autotuned(case, dtype, causal):
    """Through the Variant as the runner calls it: check, setup (autotunes), forward."""
    from attnprof_triton import _kernel

    rs = _gpu_spec(case, dtype, causal)
    variant = attnprof_triton.make_variant()
    assert variant.unavailable_reason(rs) is None
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=0)
    config = _kernel.best_config(q, k, rs.mask.text)
    assert config is not None and state.forward_tiles == (config.block_m, config.block_n)  # tuned in setup
    out = variant.forward(q, k, v, causal, state)
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), atol=TOL[dtype], rtol=0)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "tma"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_every_config(monkeypatch, tma, causal):
    """Each configuration the autotuner may pick compiles and is right, both load paths."""
    from attnprof_triton import _kernel

    if tma == "1" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or newer")
    monkeypatch.setenv(_kernel.TMA_ENV, tma)
    rs = _gpu_spec((1, 4, 2, 1000, 128), "bf16", causal)
    q, k, v = make_inputs(rs, seed=1)
    expected = reference(q, k, v, causal)
    for cfg in _kernel.autotune_space(rs.seq, rs.head_dim):
        try:
            out = _kernel.attention(q, k, v, causal, config=cfg)
        except Exception as exc:  # out of shared memory on a smaller GPU: the autotuner skips these too
            if "OutOfResources" in type(exc).__name__ or "out of resource" in str(exc):
                continue
            raise
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=0, msg=lambda m, c=cfg: f"{c}: {m}")


@pytest.mark.gpu
@requires_gpu
def test_gpu_fp32():
    rs = _gpu_spec((1, 4, 2, 300, 64), "fp32", True)
    variant = attnprof_triton.make_variant()
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=2)
    torch.testing.assert_close(variant.forward(q, k, v, True, state).double(), reference(q, k, v, True),
                               atol=TOL["fp32"], rtol=0)


@pytest.mark.gpu
@requires_gpu
def test_gpu_one_kernel_per_forward():
    from torch.profiler import ProfilerActivity, profile

    rs = _gpu_spec((2, 8, 2, 1024, 128), "bf16", True)
    variant = attnprof_triton.make_variant()
    state = variant.setup(rs)  # autotunes: many launches, all before the profiled region
    q, k, v = make_inputs(rs, seed=0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        variant.forward(q, k, v, True, state)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    assert kernels == [kernels[0]] and "_attn_fwd" in kernels[0], kernels


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "tma"])
def test_gpu_cuda_graph_replay(monkeypatch, tma):
    """The forward can be captured in a CUDA graph (attnprof's timing may replay one)."""
    from attnprof_triton import _kernel

    if tma == "1" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or newer")
    monkeypatch.setenv(_kernel.TMA_ENV, tma)
    rs = _gpu_spec((2, 8, 2, 1024, 128), "bf16", True)
    variant = attnprof_triton.make_variant()
    state = variant.setup(rs)
    q, k, v = make_inputs(rs, seed=0)
    expected = variant.forward(q, k, v, True, state)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        variant.forward(q, k, v, True, state)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = variant.forward(q, k, v, True, state)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def test_the_backward_is_declared_and_runs_where_the_forward_does(no_triton):
    variant = attnprof_triton.make_variant()
    assert variant.has_backward is True
    for mode in ("bwd", "fwd+bwd"):  # no "no backward": the same reasons as the forward
        assert variant.unavailable_reason(spec(mode=mode)) == variant.unavailable_reason(spec())


def test_declares_its_masks_decode_sinks_and_packed_batches():
    """Every mask kind, forward and backward, q_len < kv_len, sinks, packed seq_lens; any other score mod is a
    skipped cell, never run without."""
    variant = attnprof_triton.make_variant()
    assert variant.masks == {"causal", "none", "sliding_window", "documents", "prefix"}
    assert variant.unequal_lengths and variant.score_mods == {"sinks"} and variant.executed_pairs is not None
    assert variant.varlen and not variant.varlen_only and not variant.score_mod_refusals
    for mode in ("fwd", "bwd", "fwd+bwd"):
        for mask in ("sliding_window:16", "documents:4", "prefix:8"):
            assert variant.masking_reason(spec(mask=mask, mode=mode)) is None
            assert variant.masking_reason(spec(mask=mask, mode=mode, score_mod="sinks")) is None
        assert variant.masking_reason(spec(q_len=1, seq=1024, mode=mode)) is None
        assert variant.masking_reason(spec(q_len=1, seq=1024, mode=mode, score_mod="sinks")) is None
        for causal in (True, False):
            packed = spec(batch=1, seq=70, seq_lens=(17, 1, 52), causal=causal, mode=mode)
            assert variant.masking_reason(packed) is None
    assert variant.masking_reason(spec(score_mod="softcap:30")) == (
        "score_mod softcap not supported by triton-flash (it applies sinks)")
    assert "score_mod alibi not supported" in variant.masking_reason(spec(score_mod="alibi", mask="documents:4"))


def test_sinks_and_packed_cells_have_the_dense_cells_reasons(no_triton):
    """A sinks or packed spec is refused for what a dense one is (shape rules, no triton), nothing else."""
    variant = attnprof_triton.make_variant()
    for mode in ("fwd", "fwd+bwd"):
        dense = spec(mode=mode)
        assert variant.unavailable_reason(spec(mode=mode, score_mod="sinks")) == variant.unavailable_reason(dense)
        packed = spec(batch=1, seq=300, seq_lens=(100, 200), mode=mode)
        assert variant.unavailable_reason(packed) == "needs triton: No module named 'triton'"
    assert attnprof_triton.check(spec(batch=1, seq=60, seq_lens=(30, 30), head_dim=80)).startswith("head_dim must")
    assert attnprof_triton.check(spec(score_mod="sinks", dtype="fp32", head_dim=256)).startswith("fp32 needs")


def test_check_refuses_grids_cuda_cannot_launch(no_triton):
    """The backward's second grid axis holds (batch or sequences) x heads, at most 65,535; the forward's flat
    axis the longest sequence's 64-row tiles x sequences x heads, at most 2**31 - 1."""
    many = tuple([1] * 4096)
    assert attnprof_triton.check(spec(batch=1, heads=16, seq=4096, seq_lens=many, mode="fwd+bwd")) == (
        "the backward's grid has sequences x heads = 65,536 rows, above CUDA's 65,535")
    assert attnprof_triton.check(spec(batch=1, heads=16, seq=4096, seq_lens=many)).startswith("needs triton")
    assert attnprof_triton.check(spec(batch=4096, heads=16, seq=64, mode="bwd")) == (
        "the backward's grid has batch x heads = 65,536 rows, above CUDA's 65,535")
    # one long sequence beside many short ones: every sequence gets the long one's tiles
    lopsided = (1 << 23, *([1] * 65_000))
    reason = attnprof_triton.check(spec(batch=1, heads=64, seq=sum(lopsided), seq_lens=lopsided))
    programs = (1 << 23) // 64 * 65_001 * 64  # the long one's 64-row tiles x sequences x heads
    assert reason == f"the forward would launch {programs:,} programs, above CUDA's 2,147,483,647 on one axis"


def _nonempty_blocks(mask, q_len, kv_len, block_m, block_n):
    """Brute force: the pairs inside every (query tile, key block) that holds a kept pair, cut at the lengths."""
    from attnprof.masks import dense_mask

    keep = dense_mask(mask, q_len, kv_len)
    total = 0
    for m in range(0, q_len, block_m):
        for n in range(0, kv_len, block_n):
            if keep[m:m + block_m, n:n + block_n].any():
                total += min(block_m, q_len - m) * min(block_n, kv_len - n)
    return total


@pytest.mark.parametrize("mask", ["causal", "none", "sliding_window:1", "sliding_window:13", "sliding_window:70",
                                  "documents:1", "documents:5", "prefix:1", "prefix:33"])
@pytest.mark.parametrize(("q_len", "kv_len", "block_m", "block_n"),
                         [(70, 70, 16, 16), (70, 70, 32, 16), (1, 70, 16, 16), (23, 70, 64, 32), (70, 70, 128, 64)])
def test_the_kernels_visit_exactly_the_nonempty_tiles(mask, q_len, kv_len, block_m, block_n):
    """`key_range` (the mirror of the kernels' `_key_range`) skips every tile without a kept pair and no other."""
    from attnprof.masks import parse_mask

    parsed = parse_mask(mask)
    assert attnprof_triton.tile_pairs(parsed, q_len, kv_len, block_m, block_n) == _nonempty_blocks(
        parsed, q_len, kv_len, block_m, block_n)


def test_executed_pairs_by_hand():
    """8 queries and keys, 4x4 tiles: causal visits 3 of the 4 tiles, a window of 2 the same 3, documents:2
    the 2 diagonal ones; a backward in 2x2 tiles counts its own (causal: the 10 tiles on or below the diagonal)."""
    from attnprof.masks import parse_mask

    assert attnprof_triton.tile_pairs(parse_mask("causal"), 8, 8, 4, 4) == 3 * 16
    assert attnprof_triton.tile_pairs(parse_mask("sliding_window:2"), 8, 8, 4, 4) == 3 * 16
    assert attnprof_triton.tile_pairs(parse_mask("documents:2"), 8, 8, 4, 4) == 2 * 16
    assert attnprof_triton.tile_pairs(parse_mask("none"), 8, 8, 4, 4) == 64
    # decode: one query at position 7 against a window of 3 keys (5, 6, 7): the block of keys 4..7 only
    assert attnprof_triton.tile_pairs(parse_mask("sliding_window:3"), 1, 8, 4, 4) == 4
    rs = spec(batch=2, heads=4, kv_heads=2, seq=8, mask="causal", mode="fwd+bwd")
    state = attnprof_triton.TritonState("causal", forward_tiles=(4, 4), backward_tiles=((2, 2), (2, 2)))
    assert attnprof_triton.executed_pairs(rs, state) == ExecutedPairs(forward=2 * 4 * 48, backward=2 * 4 * 10 * 4)
    # dK/dV in 2x4 tiles (query rows x keys) weighs 4 of the 7 tile products, dQ in 4x2 tiles 3 of them
    uneven = attnprof_triton.TritonState("causal", forward_tiles=(4, 4), backward_tiles=((2, 4), (4, 2)))
    dkdv = attnprof_triton.tile_pairs(parse_mask("causal"), 8, 8, 2, 4)
    dq = attnprof_triton.tile_pairs(parse_mask("causal"), 8, 8, 4, 2)
    assert (dkdv, dq) == (8 + 8 + 16 + 16, 16 + 32)
    assert attnprof_triton.executed_pairs(rs, uneven).backward == round(2 * 4 * (4 * dkdv + 3 * dq) / 7)
    fwd = attnprof_triton.TritonState("causal", forward_tiles=(4, 4))
    assert attnprof_triton.executed_pairs(spec(batch=2, heads=4, seq=8), fwd) == ExecutedPairs(2 * 4 * 48)
    assert attnprof_triton.executed_pairs(rs, attnprof_triton.TritonState("causal", None)) is None


def test_executed_pairs_of_a_packed_batch_are_each_sequences_own_tiles():
    """Each sequence's tiles, never the padding to the longest: programs past a sequence's last tile exit."""
    from attnprof.masks import parse_mask
    from attnprof.varlen import packed_pairs

    lengths = (17, 1, 33, 64)
    for causal in (True, False):
        mask = parse_mask("causal" if causal else "none")
        rs = spec(batch=1, heads=4, kv_heads=2, seq=sum(lengths), seq_lens=lengths, causal=causal, mode="fwd+bwd")
        state = attnprof_triton.TritonState(mask.text, forward_tiles=(16, 16), backward_tiles=((16, 32), (32, 16)))
        per_seq = [attnprof_triton.tile_pairs(mask, n, n, 16, 16) for n in lengths]
        # by hand: without a mask every key of the sequence (tiles cut at its length); causal, the tiles on and
        # below the diagonal: 17 tokens are one 16x16 tile and a last row of 17 keys; 33 are rows 0-15 against one
        # key block, rows 16-31 against two and row 32 against 33 keys; 64 are 1 + 2 + 3 + 4 whole tiles
        assert per_seq == ([256 + 17, 1, 256 + 2 * 256 + 33, 10 * 256] if causal else [n * n for n in lengths])
        pairs = attnprof_triton.executed_pairs(rs, state)
        assert pairs.forward == 4 * sum(per_seq) and not pairs.padded
        dkdv = sum(attnprof_triton.tile_pairs(mask, n, n, 16, 32) for n in lengths)
        dq = sum(attnprof_triton.tile_pairs(mask, n, n, 32, 16) for n in lengths)
        assert pairs.backward == round(4 * (4 * dkdv + 3 * dq) / 7)
        assert packed_pairs(lengths, causal) * 4 <= pairs.forward < 4 * max(lengths) ** 2 * len(lengths)


def test_forward_takes_a_sized_mask_from_the_state(monkeypatch):
    """A sized mask comes from setup's state; causal and none follow `causal`, as the model bridge passes it."""
    seen = []
    kernel = type(sys)("attnprof_triton._kernel")
    kernel.attention = lambda q, k, v, mask: seen.append(mask) or q
    monkeypatch.setitem(sys.modules, "attnprof_triton._kernel", kernel)
    monkeypatch.setattr(attnprof_triton, "_kernel", kernel, raising=False)
    q = torch.zeros(1, 1, 4, 16)
    attnprof_triton.forward(q, q, q, False, attnprof_triton.TritonState("sliding_window:2", (4, 4)))
    attnprof_triton.forward(q, q, q, True, attnprof_triton.TritonState("causal", (4, 4)))
    attnprof_triton.forward(q, q, q, False, attnprof_triton.TritonState("causal", (4, 4)))
    attnprof_triton.forward(q, q, q, True, None)
    assert seen == ["sliding_window:2", "causal", "none", "causal"]
