"""The Triton kernel behind `triton-flash-fp8`: an e4m3 forward with per-head descales, and its launcher.

Importing this module imports triton and torch; `attnprof_triton._fp8_variant` imports it only when a
kernel is about to run. The tiling, the grid, the masks (`_kernel._key_range`, `_block_bounds`, `_keep`:
every mask kind of triton-flash, bottom-right aligned) and GQA are triton-flash's (`_kernel`); what differs:

* Q, K and V are e4m3. S = Q·Kᵀ is an fp8 x fp8 dot accumulated in fp32 (Hopper's wgmma), then scaled by
  descale_q[b, h] · descale_k[b, h_kv] · log2(e)/√D, one scalar per program, so the softmax runs in fp32 on
  the true scores;
* P·V is an fp8 x fp8 dot as well: Hopper's fp8 tensor cores take both operands in fp8, so P is cast to
  e4m3 rather than V to bf16 (which would halve the P·V dot's rate and dequantize every V tile). P lies in
  [0, 1]; it is computed as exp2(s − m + log2 448), i.e. scaled onto e4m3's largest value 448 (as cuDNN
  scales S), so small probabilities stay out of e4m3's subnormals (below 2⁻⁶) and off zero (below 2⁻⁹).
  In a torch emulation (S 2048, D 128, per-head e4m3 inputs) that changed nothing at standard-normal
  scores (2.5e-2 either way, no mask) and took 1.50e-2 to 1.26e-2 with scores 3x sharper. It costs
  nothing: the scale is folded into the subtraction of the row maximum, and the row sum l is summed in
  the same units, so O = acc / l needs no unscaling;
* wgmma wants fp8 operands K-major: Kᵀ's contraction dim is D, contiguous in K's rows; V's is the key
  dim, so V is read keys-contiguous (a [B, H_kv, D, S] copy, viewed as [B, H_kv, S, D]). The variant
  makes that copy in `prepare_inputs`, outside the timed region; `attention_fp8` makes it if given a
  V laid out otherwise;
* O = acc · descale_v[b, h_kv] / l, written in bf16; pointer loads only (no TMA path).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from attnprof_triton._fp8_variant import check_launch, keys_contiguous
from attnprof_triton._kernel import (
    AUTOTUNE_SPACE,
    LOG2E,
    MASKED,
    BlockConfig,
    _block_bounds,
    _keep,
    _key_range,
    _prune_configs,
    default_config,
    mask_args,
    tunes,
)

E4M3_MAX = 448.0
#: log2 of P's scale: exp2(s − m + P_SHIFT) lies in (0, 448].
P_SHIFT = tl.constexpr(math.log2(E4M3_MAX))


@triton.jit
def _fp8_block_loop(acc, l_i, m_i, q, k_base, v_base, lo, hi, offs_m, offs_n, offs_d, offset, kv_len, mask_size,
                    stride_kn, stride_vd, qk_scale,
                    MASK: tl.constexpr, MASKED_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key/value blocks [lo, hi) into one query tile's running (acc, l_i, m_i); acc and l_i are in
    units of 448 · P. MASKED_BLOCKS evaluates the element mask (keys past kv_len included)."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
        vt_ptrs = v_base + offs_d[:, None] * stride_vd + cols[None, :]  # Vᵀ [D, BLOCK_N], keys contiguous
        if MASKED_BLOCKS:
            k = tl.load(k_ptrs, mask=cols[:, None] < kv_len, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))  # e4m3 x e4m3, fp32 accumulation
        if MASKED_BLOCKS:
            keep = _keep(offs_m[:, None] + offset, cols[None, :], kv_len, MASK, mask_size)
            qk = qk * qk_scale + tl.where(keep, 0.0, MASKED)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - (m_ij - P_SHIFT)[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - (m_ij - P_SHIFT)[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED_BLOCKS:
            vt = tl.load(vt_ptrs, mask=cols[None, :] < kv_len, other=0.0)
        else:
            vt = tl.load(vt_ptrs)
        acc = tl.dot(p.to(tl.float8e4nv), tl.trans(vt), acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_fp8(Q, K, V, Out, Descale_q, Descale_k, Descale_v,
                  stride_qb, stride_qh, stride_qs,
                  stride_kb, stride_kh, stride_ks,
                  stride_vb, stride_vh, stride_vd,
                  stride_ob, stride_oh, stride_os,
                  n_heads, group, q_len, kv_len, mask_size, sm_scale_log2,
                  HEAD_DIM: tl.constexpr, MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # triton-flash's flat grid: one head's query tiles fastest, the longest causal rows first.
    n_tiles = tl.cdiv(q_len, BLOCK_M)
    start_m = n_tiles - 1 - tl.program_id(0) % n_tiles
    pid_bh = tl.program_id(0) // n_tiles
    off_b = pid_bh // n_heads
    off_h = pid_bh % n_heads
    off_kvh = off_h // group
    pid_kv = off_b * (n_heads // group) + off_kvh

    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
    o_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < q_len, other=0.0)
    qk_scale = sm_scale_log2 * tl.load(Descale_q + pid_bh) * tl.load(Descale_k + pid_kv)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    offset = kv_len - q_len  # bottom-right alignment: query row i sits at key position i + offset
    p_lo = start_m * BLOCK_M + offset
    p_hi = tl.minimum(start_m * BLOCK_M + BLOCK_M, q_len) - 1 + offset
    lo, hi, full_lo, full_hi = _key_range(p_lo, p_hi, kv_len, MASK, mask_size)
    first, mid_lo, mid_hi = _block_bounds(lo, hi, full_lo, full_hi, BLOCK_N)
    acc, l_i, m_i = _fp8_block_loop(acc, l_i, m_i, q, k_base, v_base, first, mid_lo, offs_m, offs_n, offs_d,
                                    offset, kv_len, mask_size, stride_ks, stride_vd, qk_scale,
                                    MASK, True, BLOCK_N)
    acc, l_i, m_i = _fp8_block_loop(acc, l_i, m_i, q, k_base, v_base, mid_lo, mid_hi, offs_m, offs_n, offs_d,
                                    offset, kv_len, mask_size, stride_ks, stride_vd, qk_scale,
                                    MASK, False, BLOCK_N)
    acc, l_i, m_i = _fp8_block_loop(acc, l_i, m_i, q, k_base, v_base, mid_hi, hi, offs_m, offs_n, offs_d,
                                    offset, kv_len, mask_size, stride_ks, stride_vd, qk_scale,
                                    MASK, True, BLOCK_N)

    out = (acc * (tl.load(Descale_v + pid_kv) / l_i)[:, None]).to(Out.dtype.element_ty)
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out, mask=offs_m[:, None] < q_len)


# triton-flash's search space, pruned per shape as there (one-byte elements: more stages fit in shared memory).
_attn_fwd_fp8_tuned = triton.autotune(
    configs=[c.as_triton() for c in AUTOTUNE_SPACE],
    key=["q_len", "kv_len", "HEAD_DIM", "MASK"],
    prune_configs_by={"early_config_prune": _prune_configs},
)(_attn_fwd_fp8)


def attention_fp8(q: Any, k: Any, v: Any, descale_q: Any, descale_k: Any, descale_v: Any, mask: str = "causal",
                  config: BlockConfig | None = None) -> Any:
    """softmax(q kᵀ / √D) v in bf16 for e4m3 q [B, H, q_len, D] and k, v [B, H_kv, kv_len, D], each the fp8
    values of a tensor whose (batch, head) slices are those values times `descale_*` (float32 [B, H] for q,
    [B, H_kv] for k and v). `mask` as in `_kernel.attention`. v is read keys-contiguous (v.stride(2) == 1);
    another layout is copied so first. Without `config` the autotuner picks the launch configuration."""
    check_launch(q, k, v, descale_q, descale_k, descale_v)
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    mask_code, mask_size = mask_args(mask, kv_len)
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    v = keys_contiguous(v)
    out = torch.empty(q.shape, device=q.device, dtype=torch.bfloat16)
    args = (q, k, v, out, descale_q, descale_k, descale_v,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(3),
            out.stride(0), out.stride(1), out.stride(2),
            heads, heads // kv_heads, q_len, kv_len, mask_size, LOG2E / math.sqrt(head_dim))
    if config is None and not tunes(q):
        config = default_config(q_len, head_dim, q.element_size())
    if config is None:
        def grid(meta: dict) -> tuple[int]:
            return (triton.cdiv(q_len, meta["BLOCK_M"]) * batch * heads,)

        _attn_fwd_fp8_tuned[grid](*args, HEAD_DIM=head_dim, MASK=mask_code)
    else:
        _attn_fwd_fp8[(triton.cdiv(q_len, config.block_m) * batch * heads,)](
            *args, HEAD_DIM=head_dim, MASK=mask_code, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
            num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def launched_config(q: Any, k: Any, mask: str) -> BlockConfig | None:
    """The configuration `attention_fp8(q, k, ..., mask=mask)` launches: the autotuner's pick for these
    lengths, head_dim and mask kind (None before it has run), or `default_config` where it does not tune."""
    if not tunes(q):
        return default_config(q.shape[2], q.shape[3], q.element_size())
    wanted = (q.shape[2], k.shape[2], q.shape[3], mask_args(mask, k.shape[2])[0])
    for key, cfg in _attn_fwd_fp8_tuned.cache.items():
        if tuple(key[:4]) == wanted:
            return BlockConfig(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)
    return None
