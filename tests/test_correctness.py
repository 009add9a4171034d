import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnprof.profiling.correctness import (
    THRESHOLDS,
    check_output,
    check_variant_output,
    reference_attention,
    reference_subset,
    relative_error,
    threshold_for,
)
from attnprof.profiling.inputs import make_inputs, torch_dtype
from attnprof.profiling.masking_probe import accepts_attn_mask, fully_masked_mask, masking_probe, probe_fully_masked
from attnprof.registry import RunSpec, Variant

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def qkv(b=1, h=2, s=64, d=32, kv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = kv or h
    return (torch.randn(b, h, s, d, generator=g).to(dtype), torch.randn(b, kv, s, d, generator=g).to(dtype),
            torch.randn(b, kv, s, d, generator=g).to(dtype))


def sdpa_math(q, k, v, causal, state=None, attn_mask=None):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal and attn_mask is None,
                                              enable_gqa=k.shape[1] != q.shape[1])


def naive(q, k, v, causal, state=None, attn_mask=None):
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    s = q.shape[-2]
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_sdpa_in_float64(causal):
    q, k, v = qkv(b=2, h=3, s=40, d=16, dtype=torch.float64)
    ref = reference_attention(q, k, v, causal)
    assert ref.dtype == torch.float64 and ref.device.type == "cpu"
    assert relative_error(sdpa_math(q, k, v, causal), ref) < 1e-12


def test_reference_gqa_repeats_kv_heads():
    q, k, v = qkv(b=1, h=4, s=24, d=8, kv=2, dtype=torch.float64)
    ref = reference_attention(q, k, v, True)
    expected = sdpa_math(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), True)
    assert relative_error(expected, ref) < 1e-12


def test_reference_on_row_subset_is_exact():
    q, k, v = qkv(s=50, d=8, dtype=torch.float64)
    rows = torch.tensor([0, 7, 49])
    full = reference_attention(q, k, v, True)
    part = reference_attention(q, k, v, True, q_rows=rows)
    assert torch.allclose(part, full[:, :, rows], atol=1e-14)
    assert torch.allclose(part[:, :, 0], v[:, :, 0].double())  # causal row 0 sees only key 0


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("causal", [True, False])
def test_cpu_sdpa_and_naive_pass_their_dtype_threshold(dtype, causal):
    q, k, v = qkv(b=1, h=4, s=256, d=64, dtype=DTYPES[dtype])
    ref = reference_attention(q, k, v, causal)
    for fn in (sdpa_math, naive):
        check = check_output(fn(q, k, v, causal), ref, dtype)
        assert check.passed, (fn.__name__, check)
        assert check.rel_error < THRESHOLDS[dtype]
        assert check.reason is None


def test_fp32_sdpa_error_is_far_below_threshold():
    q, k, v = qkv(dtype=torch.float32)
    err = relative_error(sdpa_math(q, k, v, True), reference_attention(q, k, v, True))
    assert 0 < err < THRESHOLDS["fp32"] / 10


def test_wrong_mask_fails():
    q, k, v = qkv(dtype=torch.bfloat16)
    check = check_output(sdpa_math(q, k, v, False), reference_attention(q, k, v, True), "bf16")
    assert not check.passed
    assert check.reason.startswith("relative error") and "bf16 limit" in check.reason
    assert check.rel_error > THRESHOLDS["bf16"]


def test_nan_fails_with_reason():
    q, k, v = qkv()
    out = sdpa_math(q, k, v, True)
    out[0, 0, 3, 1] = float("nan")
    check = check_output(out, reference_attention(q, k, v, True), "fp32")
    assert not check.passed and check.reason == "NaN in output" and check.rel_error is None


def test_inf_fails_with_reason():
    q, k, v = qkv()
    out = sdpa_math(q, k, v, True)
    out[0, 1, 0, 0] = float("inf")
    assert check_output(out, reference_attention(q, k, v, True), "fp32").reason == "Inf in output"


def test_shape_mismatch_fails():
    q, k, v = qkv()
    ref = reference_attention(q, k, v, True)
    check = check_output(ref[:, :1], ref, "fp32")
    assert not check.passed and "shape" in check.reason


def test_threshold_for_unknown_dtype():
    assert threshold_for("fp16") == THRESHOLDS["fp16"]
    with pytest.raises(ValueError):
        threshold_for("int8")


def test_check_variant_output_bshd_layout():
    spec = RunSpec("cpu", "fp32", 2, 4, 32, 16, kv_heads=2)
    q, k, v = make_inputs(spec, 0, "bshd")
    out = sdpa_math(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True).transpose(1, 2)
    check = check_variant_output(out, q, k, v, causal=True, dtype="fp32", layout="bshd")
    assert check.passed and check.scope == "full"


def test_check_variant_output_nan_anywhere_fails_even_with_subset():
    q, k, v = qkv(b=2, h=4, s=64)
    out = sdpa_math(q, k, v, True)
    out[1, 2, 33, 0] = float("nan")  # a row the subset would skip
    check = check_variant_output(out, q, k, v, causal=True, dtype="fp32", limit=0)
    assert check.reason == "NaN in output"


def test_subset_reference_passes_good_and_catches_bad_output():
    q, k, v = qkv(b=3, h=8, s=96, d=16, kv=2)
    out = sdpa_math(q, k, v, True)
    check = check_variant_output(out, q, k, v, causal=True, dtype="fp32", limit=0)
    assert check.passed and check.scope.startswith("subset")
    subset = reference_subset(3, 8, 96, limit=0)
    assert subset["batches"] == [0, 2] and subset["heads"][0] == 0 and subset["heads"][-1] == 7
    assert subset["rows"] == list(range(96))  # fewer rows than the cap: all rows
    bad = out.clone()
    bad[2, 7, -1] += 1.0  # last batch, last head, last row
    assert not check_variant_output(bad, q, k, v, causal=True, dtype="fp32", limit=0).passed


def test_subset_row_choice_covers_first_and_last():
    subset = reference_subset(1, 32, 8192)
    assert subset["rows"][0] == 0 and subset["rows"][-1] == 8191 and len(subset["rows"]) == 256
    assert len(subset["heads"]) == 4 and subset["heads"][-1] == 31
    assert reference_subset(1, 4, 256) is None  # small: full reference


def test_fully_masked_mask_rows():
    mask = fully_masked_mask(2, 8, 3, "cpu")
    assert mask.shape == (2, 1, 8, 8) and mask.dtype == torch.bool
    assert not mask[:, :, :3].any()  # rows 0..2 see only padding keys
    assert mask[:, :, 3:].any(dim=-1).all()


def variant(name, forward, **kw):
    return Variant(name=name, description=name, forward=forward, **kw)


def test_probe_plain_softmax_gives_nan():
    v = variant("naive-probe", naive)
    assert accepts_attn_mask(v)
    assert probe_fully_masked(v, "cpu", "fp32") is True


def test_probe_sdpa_math_safe_softmax_gives_no_nan():
    assert probe_fully_masked(variant("sdpa-probe", sdpa_math), "cpu", "fp32") is False


def test_probe_not_run_without_attn_mask_parameter():
    def fwd(q, k, v, causal, state):
        return q

    def fwd_kwargs(q, k, v, causal, state, **kwargs):
        return q

    assert probe_fully_masked(variant("plain", fwd), "cpu", "fp32") is None
    assert probe_fully_masked(variant("kw", fwd_kwargs), "cpu", "fp32") is None


def test_probe_not_run_when_variant_rejects_mask_or_device():
    def refuses(q, k, v, causal, state, attn_mask=None):
        raise RuntimeError("No available kernel")

    assert probe_fully_masked(variant("refuses", refuses), "cpu", "fp32") is None
    gpu_only = variant("gpu-only", naive, devices=("cuda",))
    assert masking_probe(gpu_only, RunSpec("cpu", "fp32", 1, 2, 16, 16, causal=False), 0) is None


def test_probe_bshd_layout_and_setup_state():
    seen = {}

    def setup(spec):
        return "state"

    def fwd(q, k, v, causal, state, attn_mask=None):
        seen["state"] = state
        seen["causal"] = causal
        out = naive(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, attn_mask=attn_mask)
        return out.transpose(1, 2)

    assert probe_fully_masked(variant("bshd-probe", fwd, layout="bshd", setup=setup), "cpu", "bf16") is True
    assert seen == {"state": "state", "causal": False}
    assert torch_dtype("bf16") == torch.bfloat16


def test_check_against_reference_takes_bhsd_positionally():
    from attnprof.profiling.correctness import check_against_reference

    q, k, v = qkv(dtype=torch.float16)
    check = check_against_reference(sdpa_math(q, k, v, True), q, k, v, True, "fp16")
    assert check.passed and check.rel_error < THRESHOLDS["fp16"]
