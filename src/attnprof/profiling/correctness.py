"""Is a variant's output right? A float64 reference, relative error, per-dtype thresholds.

Thresholds (relative Frobenius error ‖out − ref‖ / ‖ref‖, the reference computed in float64
from the same low-precision inputs). Measured on CPU with torch 2.13, standard-normal inputs,
D in {16, 64, 128, 256}, S up to 8192, causal and not: SDPA math gave 1.7e-3 (bf16),
2.1e-4 (fp16), 5e-7 (fp32); the naive matmul-softmax-matmul, which rounds the score matrix
to the working dtype, gave at most 6.0e-3 (bf16), 7.4e-4 (fp16), 5.4e-7 (fp32). The limits
sit about 2.5x above the worst of those; a wrong mask or scale gives errors of 0.1 and more.

Big shapes: the full float64 reference costs B·H·S² scores, so above `FULL_REFERENCE_LIMIT`
scores it is computed on a subset: the first and last batch element, up to `SUBSET_HEADS`
evenly spaced query heads (first and last included, so GQA groups at both ends are
covered) and up to `SUBSET_ROWS` evenly spaced query rows (row 0 and the last row included),
each row against all its keys, so the subset is exact, not an approximation. It runs in
float64 on the device the inputs are on (CPU, or the GPU, where it is cheap). NaN and Inf are
always checked on the whole output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnprof.errors import VariantFailure
from attnprof.masks import Mask
from attnprof.profiling.fp8 import FP8_THRESHOLDS, Fp8Accuracy, Quantized, fp8_accuracy
from attnprof.profiling.inputs import to_bhsd

THRESHOLDS = {"bf16": 1.5e-2, "fp16": 2e-3, "fp32": 1e-5, **FP8_THRESHOLDS}  # fp8: profiling/fp8.py
FULL_REFERENCE_LIMIT = 1 << 22  # B·H·S_q·S_kv scores (32 MiB of float64)
SUBSET_HEADS = 4
SUBSET_ROWS = 256


@dataclass(frozen=True)
class Check:
    """The verdict on one output: error, pass/fail, and why it failed (None when it passed).

    `scope` says what the error was computed on: 'full' or the subset used.
    """

    rel_error: float | None
    passed: bool
    reason: str | None = None
    threshold: float | None = None
    scope: str = "full"
    fp8: Fp8Accuracy | None = None  # an fp8 cell's errors and SQNR against both references


def threshold_for(dtype: str, limits: dict[str, float] = THRESHOLDS) -> float:
    """The relative-error limit for `bf16`, `fp16` or `fp32` in `limits` (the output's by default)."""
    try:
        return limits[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(limits)}") from None


def reference_attention(
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    *,
    q_rows: Any = None,
    device: Any = "cpu",
    differentiable: bool = False,
    mask: Mask | str | None = None,
    score_mod: str | None = None,
    head_ids: Sequence[int] | None = None,
    total_heads: int | None = None,
    sinks: Any = None,
    seq_lens: Sequence[int] | None = None,
) -> Any:
    """Softmax(mask(score_mod(q·kᵀ/√D)))·v in float64 on `device` (CPU by default), inputs in [B, H, S, D].

    GQA: k and v may have fewer heads, each repeated for its group of H / H_kv query heads.
    `mask` (an attnprof.masks Mask or its text; None: `causal` or none) is bottom-right aligned: the S_q
    queries are the last of the S_kv positions. `score_mod` (softcap:C, alibi) applies before the mask; ALiBi's
    slopes follow the absolute query heads `head_ids` of `total_heads` (default: all, in order). A
    query row whose every key is masked gives zeros (none of attnprof's masks has one). `q_rows`
    (1-D indices) computes only those query rows, each against all the keys it may see.
    `sinks` (score_mod `sinks`: one logit per head of q, in q's head order) joins each row's softmax as one
    more column after the mask, which is dropped before the product with v (gpt-oss's form).
    `differentiable` keeps q, k, v (and sinks) in autograd's graph (pass float64 leaves to get float64 gradients).
    `seq_lens`: q, k and v pack sequences of these lengths (batch 1, `attnprof.varlen`); each is computed on
    its own, `causal` or not, so the reference costs Σ L² scores rather than (Σ L)².
    """
    import torch

    if seq_lens is not None:
        return _packed_reference(q, k, v, causal, seq_lens, q_rows, device, differentiable)

    from attnprof.masks import alibi_slopes, dense_mask, parse_mask, softcap_value

    q, k, v = (t if differentiable else t.detach() for t in (q, k, v))
    q, k, v = (t.to(device=device, dtype=torch.float64) for t in (q, k, v))
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads {heads} are not a multiple of key/value heads {kv_heads}")
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    q_len, kv_len = q.shape[2], k.shape[2]
    positions = torch.arange(q_len, device=q.device)
    if q_rows is not None:
        positions = torch.as_tensor(q_rows, device=q.device, dtype=torch.long)
        q = q.index_select(2, positions)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    cap = softcap_value(score_mod)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    if score_mod == "alibi":
        ids = torch.as_tensor(list(head_ids) if head_ids is not None else range(heads), device=q.device)
        slopes = alibi_slopes(total_heads or heads, q.device).to(torch.float64).index_select(0, ids)
        distance = (positions[:, None] + (kv_len - q_len) - torch.arange(kv_len, device=q.device)[None, :]).double()
        scores = scores - slopes[:, None, None] * distance[None]
    chosen = parse_mask(mask) if mask is not None else Mask.plain(causal)
    if chosen.kind != "none":
        keep = dense_mask(chosen, q_len, kv_len, q.device).index_select(0, positions)
        scores = scores.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sinks = (sinks if differentiable else sinks.detach()).to(device=q.device, dtype=torch.float64)
        scores = torch.cat([scores, sinks[None, :, None, None].expand(*scores.shape[:-1], 1)], dim=-1)
    weights = torch.softmax(scores, dim=-1)
    if sinks is not None:
        weights = weights[..., :-1]
    weights = torch.where(torch.isnan(weights), torch.zeros_like(weights), weights)  # fully masked rows: zeros
    return torch.matmul(weights, v)


def _packed_reference(
    q: Any, k: Any, v: Any, causal: bool, seq_lens: Sequence[int], q_rows: Any, device: Any, differentiable: bool
) -> Any:
    """`reference_attention` of a packed batch: each sequence's rows (those of `q_rows` in it) against its own
    keys, put back in the order of the rows asked for."""
    import torch

    from attnprof.varlen import offsets

    bounds = offsets(seq_lens)
    if bounds[-1] != q.shape[2] or bounds[-1] != k.shape[2]:
        raise ValueError(f"seq_lens total {bounds[-1]} != the packed length {q.shape[2]}")
    rows = torch.arange(q.shape[2], device=q.device) if q_rows is None else torch.as_tensor(q_rows, device=q.device)
    parts, order = [], []
    for start, end in zip(bounds, bounds[1:], strict=False):
        inside = torch.nonzero((rows >= start) & (rows < end)).flatten()
        if inside.numel() == 0:
            continue
        local = rows.index_select(0, inside) - start
        one = slice(start, end)
        parts.append(
            reference_attention(
                q[:, :, one],
                k[:, :, one],
                v[:, :, one],
                causal,
                q_rows=local,
                device=device,
                differentiable=differentiable,
            )
        )
        order.append(inside)
    out = torch.cat(parts, dim=2)
    return out.index_select(2, torch.argsort(torch.cat(order)).to(out.device))


def relative_error(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ (Frobenius), in float64; ‖out − ref‖ when ref is all zeros."""
    import torch

    ref64 = ref.detach().to(torch.float64)
    diff = out.detach().to(device=ref64.device, dtype=torch.float64) - ref64
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(diff).item()
    return num / denom if denom > 0 else num


def nonfinite_reason(out: Any) -> str | None:
    """'NaN in output', 'Inf in output', or None when every element is finite."""
    import torch

    if torch.isnan(out).any().item():
        return "NaN in output"
    if torch.isinf(out).any().item():
        return "Inf in output"
    return None


def check_output(out: Any, ref: Any, dtype: str, *, scope: str = "full") -> Check:
    """Compare `out` with the float64 `ref`: fail on NaN/Inf, a shape mismatch, or an error over the dtype's limit."""
    limit = threshold_for(dtype)
    if tuple(out.shape) != tuple(ref.shape):
        return Check(None, False, f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}", limit, scope)
    bad = nonfinite_reason(out)
    if bad:
        return Check(None, False, bad, limit, scope)
    err = relative_error(out, ref)
    if not err <= limit:
        return Check(err, False, f"relative error {err:.1e} > {limit:.0e} ({dtype} limit)", limit, scope)
    return Check(err, True, None, limit, scope)


def _spaced(n: int, count: int) -> list[int]:
    """Up to `count` evenly spaced indices in [0, n), first and last included."""
    if n <= count:
        return list(range(n))
    if count == 1:
        return [0]
    return sorted({round(i * (n - 1) / (count - 1)) for i in range(count)})


def reference_subset(
    batch: int,
    heads: int,
    seq: int,
    *,
    limit: int = FULL_REFERENCE_LIMIT,
    max_heads: int = SUBSET_HEADS,
    max_rows: int = SUBSET_ROWS,
) -> dict | None:
    """The batches, heads and query rows the reference is computed on, or None for all of them."""
    if batch * heads * seq * seq <= limit:
        return None
    return {"batches": sorted({0, batch - 1}), "heads": _spaced(heads, max_heads), "rows": _spaced(seq, max_rows)}


def check_variant_output(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    dtype: str,
    layout: str = "bhsd",
    limit: int = FULL_REFERENCE_LIMIT,
    rows: Sequence[int] | None = None,
    mask: Mask | str | None = None,
    score_mod: str | None = None,
    sinks: Any = None,
    seq_lens: Sequence[int] | None = None,
) -> Check:
    """Check a variant's output against the float64 reference (the same `mask`, `score_mod`, `sinks` and packed
    `seq_lens`, see `reference_attention`); q, k, v and out in `layout`.

    `rows` (a sequence shard, see `Variant.output_rows`) are the global query positions that the
    output's sequence dimension holds, in order; None: all of them. NaN/Inf are looked for in the
    whole output; the error uses the whole reference when B·H·rows·S ≤ `limit`, else the subset
    `reference_subset` picks among the output's rows (see the module docstring).
    """
    out, q, k, v = (to_bhsd(t, layout) for t in (out, q, k, v))
    threshold = threshold_for(dtype)
    batch, heads, seq, head_dim = q.shape
    positions = list(range(seq)) if rows is None else list(rows)
    expected = (batch, heads, len(positions), head_dim)
    if tuple(out.shape) != expected:
        return Check(None, False, f"output shape {tuple(out.shape)} != expected {expected} (bhsd)", threshold)
    bad = nonfinite_reason(out)
    if bad:
        return Check(None, False, bad, threshold)
    got, ref, scope = compared_with_reference(
        out, q, k, v, causal, positions, rows, mask, score_mod, limit, sinks=sinks, seq_lens=seq_lens
    )
    return check_output(got, ref, dtype, scope=scope)


def compared_with_reference(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    positions: list[int],
    rows: Sequence[int] | None,
    mask: Mask | str | None,
    score_mod: str | None,
    limit: int = FULL_REFERENCE_LIMIT,
    sinks: Any = None,
    seq_lens: Sequence[int] | None = None,
) -> tuple[Any, Any, str]:
    """The output (bhsd) and the float64 reference it is compared with: whole, or the subset
    `reference_subset` picks, and the scope that says which; `positions` are the output's query rows;
    `sinks` and `seq_lens` as in `reference_attention`."""
    import torch

    batch, heads, seq, _ = q.shape
    shard = "" if rows is None else f"this process's {len(positions)} of {seq} query rows"
    subset = reference_subset(batch, heads, len(positions), limit=limit * len(positions) // seq)
    if subset is None:
        q_rows = None if rows is None else torch.tensor(positions, device=q.device)
        ref = reference_attention(
            q, k, v, causal, q_rows=q_rows, mask=mask, score_mod=score_mod, sinks=sinks, seq_lens=seq_lens
        )
        return out, ref, shard or "full"
    group = heads // k.shape[1]
    b_idx = torch.tensor(subset["batches"], device=q.device)
    h_idx = torch.tensor(subset["heads"], device=q.device)
    # Each chosen query head with its own key/value head (GQA: head h uses kv head h // group).
    kv_idx = torch.tensor([h // group for h in subset["heads"]], device=q.device)
    local = torch.tensor(subset["rows"], device=q.device)  # indices into the output's rows
    qs = q.index_select(0, b_idx).index_select(1, h_idx)
    ks = k.index_select(0, b_idx).index_select(1, kv_idx)
    vs = v.index_select(0, b_idx).index_select(1, kv_idx)
    global_rows = torch.tensor([positions[i] for i in subset["rows"]], device=q.device)
    ref = reference_attention(
        qs,
        ks,
        vs,
        causal,
        q_rows=global_rows,
        device=q.device,
        mask=mask,
        score_mod=score_mod,
        head_ids=subset["heads"],
        total_heads=heads,
        sinks=None if sinks is None else sinks.index_select(0, h_idx),
        seq_lens=seq_lens,
    )
    got = out.index_select(0, b_idx).index_select(1, h_idx).index_select(2, local)
    scope = (
        f"subset: batches {subset['batches']}, {len(subset['heads'])} of {heads} heads, "
        f"{len(subset['rows'])} of {len(positions)} query rows" + (f" ({shard})" if shard else "")
    )
    return got, ref, scope


def check_against_reference(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    dtype: str,
    rows: Sequence[int] | None = None,
    mask: Mask | str | None = None,
    score_mod: str | None = None,
    sinks: Any = None,
    seq_lens: Sequence[int] | None = None,
) -> Check:
    """`check_variant_output` for output and inputs already in [B, H, S, D]; `rows`, `mask`, `score_mod`, `sinks`
    and `seq_lens` as there."""
    return check_variant_output(
        out,
        q,
        k,
        v,
        causal=causal,
        dtype=dtype,
        layout="bhsd",
        rows=rows,
        mask=mask,
        score_mod=score_mod,
        sinks=sinks,
        seq_lens=seq_lens,
    )


def check_fp8_output(
    out: Any,
    quantized: Quantized,
    sources: tuple[Any, Any, Any],
    causal: bool,
    layout: str = "bhsd",
    rows: Sequence[int] | None = None,
    mask: Mask | str | None = None,
    score_mod: str | None = None,
) -> Check:
    """An fp8 cell's output (in float, `layout`) against the float64 reference of the dequantized inputs
    (the verdict, with the fp8 dtype's limit) and of the bf16 `sources` (reported in `Check.fp8`)."""
    out = to_bhsd(out, layout)
    dequantized = quantized.dequantized(layout)
    positions = list(range(dequantized[0].shape[2])) if rows is None else list(rows)
    threshold = threshold_for(quantized.dtype)
    bad = nonfinite_reason(out)
    if bad:
        return Check(None, False, bad, threshold)
    dq, dk, dv = dequantized
    got, ref, scope = compared_with_reference(out, dq, dk, dv, causal, positions, rows, mask, score_mod)
    check = check_output(got, ref, quantized.dtype, scope=scope)
    sq, sk, sv = (to_bhsd(t, layout) for t in sources)
    _, ref_source, _ = compared_with_reference(out, sq, sk, sv, causal, positions, rows, mask, score_mod)
    accuracy = fp8_accuracy(got, ref, ref_source, quantized.dtype)
    return Check(check.rel_error, check.passed, check.reason, check.threshold, check.scope, accuracy)


@dataclass(frozen=True)
class LogitsDiff:
    """A model's logits against the baseline implementation's on the same inputs and weights."""

    baseline: str
    max_abs_diff: float
    rel_diff: float  # ‖logits − baseline‖ / ‖baseline‖


def logits_difference(logits: Any, reference: Any, baseline: str) -> LogitsDiff:
    """Compare `logits` with `reference` (the baseline's); VariantFailure for NaN/Inf logits or shapes that differ."""
    bad = nonfinite_reason(logits)
    if bad:
        raise VariantFailure(bad.replace("output", "the logits"))
    if tuple(logits.shape) != tuple(reference.shape):
        raise VariantFailure(f"logits shape {tuple(logits.shape)} != {baseline}'s {tuple(reference.shape)}")
    max_abs = (logits.float() - reference.float()).abs().max().item()
    return LogitsDiff(baseline, max_abs, relative_error(logits, reference))
