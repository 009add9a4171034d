"""Masks on CPU: exact pair counts and FLOPs/bytes against a boolean mask built independently, every
variant that declares a mask against the float64 reference, and the skip of one that does not."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnprof.analysis.roofline import attention_flops, bytes_moved, flops_convention, min_bytes, step_flops  # noqa: E402
from attnprof.profiling.correctness import check_against_reference  # noqa: E402
from attnprof.profiling.inputs import make_inputs  # noqa: E402
from attnprof.registry import RunSpec  # noqa: E402
from attnprof.variants import builtin_variants  # noqa: E402

MASKS = [
    "none",
    "causal",
    "sliding_window:1",
    "sliding_window:5",
    "sliding_window:24",
    "documents:1",
    "documents:4",
    "documents:24",
    "prefix:1",
    "prefix:7",
    "prefix:24",
]
LENGTHS = [(24, 24), (1, 24), (5, 24), (24, 24)]


def brute_pairs(mask: str, q_len: int, kv_len: int) -> int:
    """Kept pairs counted from the rules written out again, loop by loop."""
    kind, _, size = mask.partition(":")
    n = int(size) if size else 0
    count = 0
    for i in range(q_len):
        p = i + kv_len - q_len
        for j in range(kv_len):
            keep = {
                "none": True,
                "causal": j <= p,
                "sliding_window": p - n < j <= p,
                "documents": j <= p and j // (kv_len // max(n, 1)) == p // (kv_len // max(n, 1)),
                "prefix": j <= p or j < n,
            }[kind]
            count += keep
    return count


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("q_len,kv_len", LENGTHS)
def test_flops_count_every_kept_pair(mask, q_len, kv_len) -> None:
    spec = RunSpec("cpu", "bf16", 2, 3, kv_len, 16, mask=mask, causal=mask == "causal", q_len=q_len)
    assert attention_flops(spec) == 4 * 2 * 3 * 16 * brute_pairs(mask, q_len, kv_len)
    assert step_flops(
        RunSpec("cpu", "bf16", 2, 3, kv_len, 16, mask=mask, q_len=q_len, mode="fwd+bwd", causal=mask == "causal")
    ) == 3.5 * attention_flops(spec)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("q_len,kv_len", LENGTHS)
def test_no_query_row_is_fully_masked(mask, q_len, kv_len) -> None:
    from attnprof.masks import dense_mask, parse_mask

    spec = RunSpec("cpu", "bf16", 1, 1, kv_len, 16, mask=mask, causal=mask == "causal", q_len=q_len)
    empty = int((~dense_mask(parse_mask(mask), q_len, kv_len).any(dim=-1)).sum())
    assert spec.fully_masked_rows == empty == 0


def test_causal_is_exact_not_half() -> None:
    spec = RunSpec("cpu", "bf16", 1, 1, 8, 4)
    assert attention_flops(spec) == 4 * 4 * 36  # 8·9/2 pairs, not 32
    assert "36 (query, key) pairs causal keeps" in flops_convention(spec)
    assert "Sq·Skv" in flops_convention(RunSpec("cpu", "bf16", 1, 1, 8, 4, causal=False))


def test_large_counts_use_the_closed_forms() -> None:
    spec = RunSpec("cpu", "bf16", 1, 1, 1 << 17, 64, mask="sliding_window:4096")
    w, s = 4096, 1 << 17
    assert attention_flops(spec) == 4 * 64 * (w * (w + 1) // 2 + (s - w) * w)
    decode = RunSpec("cpu", "bf16", 8, 32, 16384, 128, 8, q_len=1)
    assert attention_flops(decode) == 4 * 8 * 32 * 128 * 16384


def test_bytes_moved_counts_q_k_v_o_and_a_dense_mask() -> None:
    decode = RunSpec("cpu", "bf16", 8, 32, 16384, 128, 8, q_len=1, mask="sliding_window:256")
    qo = 2 * 8 * 32 * 1 * 128 * 2
    kv = 2 * 8 * 8 * 16384 * 128 * 2
    assert min_bytes(decode) == bytes_moved(decode) == qo + kv
    assert bytes_moved(decode, dense_mask=True) == qo + kv + 16384
    both = RunSpec("cpu", "bf16", 8, 32, 16384, 128, 8, q_len=1, mask="sliding_window:256", mode="fwd+bwd")
    assert bytes_moved(both, dense_mask=True) == min_bytes(both) + 2 * 16384


VARIANTS = {v.name: v for v in builtin_variants()}
CPU_VARIANTS = ["naive", "inplace", "sdpa", "sdpa-math"]


def run(name: str, spec: RunSpec):
    variant = VARIANTS[name]
    q, k, v = make_inputs(spec, 0, variant.layout)
    state = variant.setup(spec) if variant.setup else None
    out = variant.forward(q, k, v, spec.causal, state)
    return check_against_reference(out, q, k, v, spec.causal, spec.dtype, mask=spec.mask, score_mod=spec.score_mod)


@pytest.mark.parametrize("name", CPU_VARIANTS)
@pytest.mark.parametrize("mask", ["causal", "none", "sliding_window:8", "documents:4", "prefix:12"])
@pytest.mark.parametrize("q_len", [32, 1, 7])
def test_variants_match_the_masked_reference(name, mask, q_len) -> None:
    spec = RunSpec("cpu", "fp32", 2, 4, 32, 16, 2, causal=mask == "causal", mask=mask, q_len=q_len)
    assert VARIANTS[name].unavailable_reason(spec) is None
    check = run(name, spec)
    assert check.passed, check.reason


@pytest.mark.parametrize("name", ["naive", "inplace"])
@pytest.mark.parametrize("score_mod", ["softcap:2", "alibi"])
def test_score_mods_match_the_reference(name, score_mod) -> None:
    spec = RunSpec("cpu", "fp32", 1, 4, 32, 16, 2, mask="sliding_window:8", score_mod=score_mod, q_len=9)
    check = run(name, spec)
    assert check.passed, check.reason


def test_the_reference_applies_the_mask() -> None:
    """A variant that ignores the mask fails: the check is not vacuous."""
    spec = RunSpec("cpu", "fp32", 1, 2, 32, 16, mask="sliding_window:4")
    q, k, v = make_inputs(spec, 0)
    out = VARIANTS["naive"].forward(q, k, v, False, None)
    assert not check_against_reference(out, q, k, v, False, "fp32", mask=spec.mask).passed


def test_fully_masked_rows_are_zeros() -> None:
    """More queries than keys (which configs refuse): bottom-right causal leaves the first rows no key."""
    from attnprof.profiling.correctness import reference_attention

    q, k, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    ref = reference_attention(q, k, v, True)
    assert torch.equal(ref[0, 0, :2], torch.zeros(2, 8, dtype=torch.float64))
    assert torch.isfinite(ref).all() and ref[0, 0, 2:].abs().sum() > 0


@pytest.mark.parametrize(
    "name,spec,reason",
    [
        (
            "sdpa-flash",
            RunSpec("cpu", "fp32", 1, 2, 32, 16, mask="documents:4"),
            "mask documents not supported by sdpa-flash (it runs causal, none)",
        ),
        (
            "sdpa",
            RunSpec("cpu", "fp32", 1, 2, 32, 16, score_mod="alibi"),
            "score_mod alibi not supported by sdpa (it applies none)",
        ),
        ("cp-ring", RunSpec("cpu", "fp32", 1, 2, 32, 16, q_len=1), "q_len 1 != kv_len 32 not supported by cp-ring"),
    ],
)
def test_unsupported_combinations_are_skipped_with_the_reason(name, spec, reason) -> None:
    assert VARIANTS[name].unavailable_reason(spec) == reason


def test_plugins_that_declare_nothing_run_plain_masks_only() -> None:
    from attnprof.registry import Variant

    plain = Variant("plug", "a plugin", forward=lambda *a: None)
    assert plain.unavailable_reason(RunSpec("cpu", "fp32", 1, 2, 32, 16, causal=False)) is None
    assert "not supported" in plain.unavailable_reason(RunSpec("cpu", "fp32", 1, 2, 32, 16, mask="prefix:4"))
    assert "not supported" in plain.unavailable_reason(RunSpec("cpu", "fp32", 1, 2, 32, 16, q_len=4))


def test_flex_builds_block_masks_and_score_mods_that_match_on_cpu() -> None:
    """FlexAttention compiles on CPU (torch.compile's C++ path): one block mask and score mod each."""
    flex = VARIANTS["flex"]
    spec = RunSpec("cpu", "fp32", 1, 4, 32, 16, 2, mask="documents:4", score_mod="alibi", q_len=7)
    if flex.unavailable_reason(spec):
        pytest.skip(flex.unavailable_reason(spec))
    check = run("flex", spec)
    assert check.passed, check.reason


@pytest.mark.parametrize("name", ["naive", "sdpa-math"])
def test_gradients_match_the_masked_reference(name) -> None:
    from attnprof.profiling.gradcheck import check_grads

    score_mod = "alibi" if name == "naive" else None
    spec = RunSpec("cpu", "fp32", 1, 4, 32, 16, 2, mask="documents:4", score_mod=score_mod, q_len=9, mode="bwd")
    variant = VARIANTS[name]
    q, k, v = (t.requires_grad_(True) for t in make_inputs(spec, 0))
    out = variant.forward(q, k, v, spec.causal, variant.setup(spec))
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    check = check_grads(grads, q, k, v, grad_out, causal=False, dtype="fp32", mask=spec.mask, score_mod=score_mod)
    assert check.passed, check.reason
    assert not check_grads(grads, q, k, v, grad_out, causal=False, dtype="fp32").passed  # the mask matters


def test_sdpa_decode_of_one_token_needs_no_mask_and_sees_the_whole_cache():
    """One query token, causal bottom-right: every key is visible, so SDPA gets no mask (cuDNN and math
    would build a dense one from a CausalBias) and not is_causal (top-left: only key 0)."""
    import torch

    from attnprof.variants.sdpa import dispatched_forward, sdpa_setup

    spec = RunSpec("cpu", "fp32", 2, 4, 64, 16, 2, q_len=1)
    assert sdpa_setup(spec) is None
    q = torch.randn(2, 4, 1, 16, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 64, 16, dtype=torch.float64) for _ in range(2))
    out = dispatched_forward(q, k, v, spec.causal, sdpa_setup(spec))
    k_all, v_all = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    want = torch.softmax(q @ k_all.transpose(-1, -2) / 16**0.5, dim=-1) @ v_all
    torch.testing.assert_close(out, want)
    assert sdpa_setup(RunSpec("cpu", "fp32", 2, 4, 64, 16, 2, q_len=4)) is not None  # a chunk keeps its bias
