"""The backward of `triton-flash`: dQ, dK and dV in Triton, from the forward's online-softmax statistics.

The forward (`_kernel.attention(..., return_lse=True)`) saves each query row's log-sum-exp in
the exp2 domain, so P = exp2(q·kᵀ · log2(e)/√D − lse) is recomputed tile by tile and the
[S, S] matrix never exists, as in FlashAttention-2's backward:

* delta = rowsum(dO ∘ O) per query row (float32, in torch: one small reduction);
* `_attn_bwd_dkdv`: one program per BLOCK_N keys of one (batch, key/value head) holds K and V
  in registers and walks the query tiles of every query head in its group (GQA: their
  contributions add up in the program, no atomics): dV += Pᵀ·dO, dK += dSᵀ·Q with
  dS = P ∘ (dO·Vᵀ − delta); only the query tiles holding a row that keeps one of its keys
  (`_query_range`: causal from the key block down, a sliding window W − 1 rows past it, documents
  to the document's end);
* `_attn_bwd_dq`: one program per BLOCK_M query rows of one (batch, query head) walks the key
  tiles the forward visits (`_kernel._key_range`): dQ += dS·K;
* every tile evaluates the element mask (`_kernel._keep`), bottom-right aligned as the forward;
  both kernels use square tiles, so they visit the same (query tile, key block) pairs;
* dK and dQ are scaled by 1/√D at the end (the scores' scale).

Each program's accumulators are float32; the gradients are written in the inputs' dtype.
Tile sizes are fixed (no autotuning): `block_sizes` gives them per head_dim.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from attnprof_triton._kernel import LOG2E, _keep, _key_range, attention, mask_args


@triton.jit
def _query_range(n_lo, n_hi, kv_len, MASK: tl.constexpr, mask_size):
    """For the keys [n_lo, n_hi] of one block: the query positions [lo, hi) that keep one of them, within
    kv_len (the mirror of `_kernel._key_range`)."""
    lo = n_lo
    hi = n_hi * 0 + kv_len
    if MASK == 0:
        lo = n_lo * 0
    if MASK == 2:
        hi = n_hi + mask_size
    if MASK == 3:
        hi = (n_hi // mask_size + 1) * mask_size
    if MASK == 4:
        lo = tl.where(n_lo < mask_size, 0, n_lo)
    return lo, tl.minimum(hi, kv_len)


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, Lse, Delta,
                   stride_qb, stride_qh, stride_qs,
                   stride_kb, stride_kh, stride_ks,
                   n_heads, n_kv_heads, group, q_len, kv_len, mask_size, qk_scale, sm_scale,
                   HEAD_DIM: tl.constexpr, MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    pid = tl.program_id(1)
    off_b = pid // n_kv_heads
    off_kvh = pid % n_kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys_in = offs_n[:, None] < kv_len

    kv_off = off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    kv_tile = offs_n[:, None] * stride_ks + offs_d[None, :]
    k = tl.load(K + kv_off + kv_tile, mask=keys_in, other=0.0)
    v = tl.load(V + kv_off + kv_tile, mask=keys_in, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Only the query tiles holding a row that keeps one of these keys (query row i sits at i + offset).
    offset = kv_len - q_len
    p_lo, p_hi = _query_range(start_n, tl.minimum(start_n + BLOCK_N, kv_len) - 1, kv_len, MASK, mask_size)
    row_lo = tl.maximum(p_lo - offset, 0)
    row_hi = tl.minimum(p_hi - offset, q_len)
    first = (row_lo // BLOCK_M) * BLOCK_M
    for g in range(0, group):
        off_h = off_kvh * group + g
        q_off = off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        row_off = (off_b * n_heads + off_h).to(tl.int64) * q_len
        for start_m in tl.range(first, row_hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows_in = offs_m < q_len
            q_tile = offs_m[:, None] * stride_qs + offs_d[None, :]
            q = tl.load(Q + q_off + q_tile, mask=rows_in[:, None], other=0.0)
            do = tl.load(DO + q_off + q_tile, mask=rows_in[:, None], other=0.0)
            lse = tl.load(Lse + row_off + offs_m, mask=rows_in, other=0.0)
            delta = tl.load(Delta + row_off + offs_m, mask=rows_in, other=0.0)
            # Transposed tiles: [BLOCK_N keys, BLOCK_M query rows].
            s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
            keep = rows_in[None, :] & _keep(offs_m[None, :] + offset, offs_n[:, None], kv_len, MASK, mask_size)
            p_t = tl.where(keep, tl.math.exp2(s_t - lse[None, :]), 0.0)
            dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)

    tl.store(DK + kv_off + kv_tile, (dk * sm_scale).to(DK.dtype.element_ty), mask=keys_in)
    tl.store(DV + kv_off + kv_tile, dv.to(DV.dtype.element_ty), mask=keys_in)


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, DQ, Lse, Delta,
                 stride_qb, stride_qh, stride_qs,
                 stride_kb, stride_kh, stride_ks,
                 n_heads, group, q_len, kv_len, mask_size, qk_scale, sm_scale,
                 HEAD_DIM: tl.constexpr, MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    pid = tl.program_id(1)
    off_b = pid // n_heads
    off_h = pid % n_heads
    off_kvh = off_h // group
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows_in = offs_m < q_len

    q_off = off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    kv_off = off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    q_tile = offs_m[:, None] * stride_qs + offs_d[None, :]
    q = tl.load(Q + q_off + q_tile, mask=rows_in[:, None], other=0.0)
    do = tl.load(DO + q_off + q_tile, mask=rows_in[:, None], other=0.0)
    row_off = pid.to(tl.int64) * q_len
    lse = tl.load(Lse + row_off + offs_m, mask=rows_in, other=0.0)
    delta = tl.load(Delta + row_off + offs_m, mask=rows_in, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # The key blocks the forward visits for this tile (`_kernel._key_range`), each masked.
    offset = kv_len - q_len
    p_hi = tl.minimum(start_m + BLOCK_M, q_len) - 1 + offset
    lo, hi, _full_lo, _full_hi = _key_range(start_m + offset, p_hi, kv_len, MASK, mask_size)
    for start_n in tl.range((lo // BLOCK_N) * BLOCK_N, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys_in = offs_n < kv_len
        kv_tile = offs_n[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv_off + kv_tile, mask=keys_in[:, None], other=0.0)
        v = tl.load(V + kv_off + kv_tile, mask=keys_in[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        keep = rows_in[:, None] & _keep(offs_m[:, None] + offset, offs_n[None, :], kv_len, MASK, mask_size)
        p = tl.where(keep, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)

    tl.store(DQ + q_off + q_tile, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows_in[:, None])


def block_sizes(head_dim: int, elem: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of both backward kernels for this head_dim."""
    if head_dim * elem > 256:  # head_dim 256 (or fp32 128): small tiles keep K, V and two fp32 accumulators
        return 32, 32, 4, 1
    if head_dim * elem == 256:  # head_dim 128 (fp32 64): twice the threads share the fp32 accumulators
        return 64, 64, 8, 2
    return 64, 64, 4, 2


def attention_backward(do: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, mask: str) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) for q [B, H, q_len, D] and k, v [B, H_kv, kv_len, D], given the forward's output, its
    `lse` (`_kernel.attention(..., return_lse=True)`), the output's gradient `do` and the forward's mask
    (its text: `causal`, `sliding_window:W`, ...)."""
    q, k, v, do = (t.contiguous() for t in (q, k, v, do))
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    mask_code, mask_size = mask_args(mask, kv_len)
    delta = (out.float() * do.float()).sum(-1)  # [B, H, q_len] float32
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_m, block_n, warps, stages = block_sizes(head_dim, q.element_size())
    sm_scale = head_dim ** -0.5
    qk_scale = sm_scale * LOG2E
    meta = dict(HEAD_DIM=head_dim, MASK=mask_code, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2))
    _attn_bwd_dkdv[(triton.cdiv(kv_len, block_n), batch * kv_heads)](
        q, k, v, do, dk, dv, lse, delta, *strides,
        heads, kv_heads, heads // kv_heads, q_len, kv_len, mask_size, qk_scale, sm_scale, **meta)
    _attn_bwd_dq[(triton.cdiv(q_len, block_m), batch * heads)](
        q, k, v, do, dq, lse, delta, *strides,
        heads, heads // kv_heads, q_len, kv_len, mask_size, qk_scale, sm_scale, **meta)
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """`triton-flash` with its own backward: the forward saves q, k, v, the output and the row
    statistics; the backward runs `attention_backward` under the same mask."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: str) -> Any:
        """The forward kernel under `mask` (its text), keeping what the backward needs."""
        out, lse = attention(q, k, v, return_lse=True, mask=mask)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask = mask
        return out

    @staticmethod
    def backward(ctx: Any, do: Any) -> tuple[Any, Any, Any, None]:
        """dq, dk, dv from the saved tensors and the output's gradient."""
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(do, q, k, v, out, lse, ctx.mask)
        return dq, dk, dv, None
