"""The backward of `triton-flash`: dQ, dK and dV in Triton, from the forward's online-softmax statistics.

The forward (`_kernel.attention(..., return_lse=True)`) saves each query row's log-sum-exp in
the exp2 domain, so P = exp2(q·kᵀ · log2(e)/√D − lse) is recomputed tile by tile and the
[S, S] matrix never exists, as in FlashAttention-2's backward:

* `_attn_bwd_delta`: delta = rowsum(dO ∘ O) per query row, float32, one read of O and dO;
* `_attn_bwd_dkdv`: one program per BLOCK_N keys of one (batch, key/value head) holds K and V
  and walks the query tiles of every query head in its group (GQA: their contributions add up
  in the program, no atomics): dV += Pᵀ·dO, dK += dSᵀ·Q with dS = P ∘ (dO·Vᵀ − delta); only the
  query tiles holding a row that keeps one of its keys (`_query_range`: causal from the key
  block down, a sliding window W − 1 rows past it, documents to the document's end);
* `_attn_bwd_dq`: one program per BLOCK_M query rows of one (batch, query head) walks the key
  tiles the forward visits (`_kernel._key_range`): dQ += dS·K; the tiles with the most key
  blocks (the bottom of a causal matrix) are launched first, as in the forward;
* as in the forward, only the boundary tiles evaluate the element mask (`_kernel._keep`); the
  tiles every row keeps whole (`_query_full_range`, `_kernel._key_range`) go without it;
* dK and dQ are scaled by 1/√D at the end (the scores' scale);
* sinks: the forward's lse includes each row's sink, so P is already right and delta unchanged (the sink's
  value is zero); dsinks = −Σ exp2(s·log2(e) − lse)·delta over each head's rows (`sink_grad`, torch ops);
* a packed batch (VARLEN): as in the forward, the batch index is the sequence; each program's key block
  (dK/dV) or query tile (dQ) lies in one sequence, and a program past its sequence's end returns.

Each program's accumulators are float32; the gradients are written in the inputs' dtype. The two
kernels tile differently (dK/dV: few query rows against many keys; dQ: many query rows against
few keys); the autotuner picks each kernel's tiles per shape and mask kind (`DKDV_SPACE`,
`DQ_SPACE`), and `default_configs` gives them without timing (ATTNPROF_TRITON_AUTOTUNE=0, fp32).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from attnprof_triton._kernel import (
    _SMEM_LIMIT,
    LOG2E,
    BlockConfig,
    _block_bounds,
    _keep,
    _key_range,
    _sequence,
    attention,
    mask_args,
    packed_args,
    tuned_config,
    tunes,
)


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
def _query_full_range(n_lo, n_hi, kv_len, MASK: tl.constexpr, mask_size):
    """For the keys [n_lo, n_hi] of one block: the query positions [lo, hi) that keep every one of them
    (empty when hi <= lo), within kv_len: the rows whose tiles need no element mask."""
    lo = n_hi
    hi = n_hi * 0 + kv_len
    if MASK == 0:
        lo = n_lo * 0
    if MASK == 2:
        hi = n_lo + mask_size
    if MASK == 3:
        hi = tl.where(n_lo // mask_size == n_hi // mask_size, (n_hi // mask_size + 1) * mask_size, lo)
    if MASK == 4:
        lo = tl.where(n_hi < mask_size, 0, n_hi)
    return lo, tl.minimum(hi, kv_len)


@triton.jit
def _attn_bwd_delta(Out, DO, Delta, stride_b, stride_h, stride_s, n_heads, q_len,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO ∘ O) in float32, [B, H, q_len]: one read of O and dO."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pid = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    rows_in = offs_m < q_len
    base = (pid // n_heads).to(tl.int64) * stride_b + (pid % n_heads).to(tl.int64) * stride_h
    tile = base + offs_m[:, None] * stride_s + offs_d[None, :]
    o = tl.load(Out + tile, mask=rows_in[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + tile, mask=rows_in[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + pid.to(tl.int64) * q_len + offs_m, tl.sum(o * do, 1), mask=rows_in)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_off, row_off, stride_qs, lo, hi, offs_n, offs_d, offset,
                q_len, kv_len, mask_size, qk_scale,
                MASK: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
    """Fold the query tiles [lo, hi) of one query head into one key block's (dk, dv). MASKED evaluates the
    element mask and the rows past q_len; without it every row of every tile keeps every key."""
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = Q + q_off + offs_m[:, None] * stride_qs + offs_d[None, :]
        do_ptrs = DO + q_off + offs_m[:, None] * stride_qs + offs_d[None, :]
        if MASKED:
            rows_in = offs_m < q_len
            q = tl.load(q_ptrs, mask=rows_in[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=rows_in[:, None], other=0.0)
            lse = tl.load(Lse + row_off + offs_m, mask=rows_in, other=0.0)
            delta = tl.load(Delta + row_off + offs_m, mask=rows_in, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(Lse + row_off + offs_m)
            delta = tl.load(Delta + row_off + offs_m)
        # Transposed tiles: [BLOCK_N keys, BLOCK_M query rows].
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        p_t = tl.math.exp2(s_t - lse[None, :])
        if MASKED:
            keep = rows_in[None, :] & _keep(offs_m[None, :] + offset, offs_n[:, None], kv_len, MASK, mask_size)
            p_t = tl.where(keep, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, Lse, Delta, CuSeqlens,
                   stride_qb, stride_qh, stride_qs,
                   stride_kb, stride_kh, stride_ks,
                   n_heads, n_kv_heads, group, q_len, kv_len, n_seqs, mask_size, qk_scale, sm_scale,
                   HEAD_DIM: tl.constexpr, MASK: tl.constexpr, DOT_PRECISION: tl.constexpr, VARLEN: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    pid = tl.program_id(1)
    off_b = pid // n_kv_heads
    off_kvh = pid % n_kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_off = off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    if VARLEN:  # off_b is a packed batch's sequence (the batch strides are 0); past its keys, nothing to do
        seq_start, q_len, total = _sequence(CuSeqlens, off_b, n_seqs)
        kv_len = q_len
        if start_n >= kv_len:
            return
        seq_start = seq_start.to(tl.int64)
        kv_off += seq_start * stride_ks
    keys_in = offs_n[:, None] < kv_len

    kv_tile = offs_n[:, None] * stride_ks + offs_d[None, :]
    k = tl.load(K + kv_off + kv_tile, mask=keys_in, other=0.0)
    v = tl.load(V + kv_off + kv_tile, mask=keys_in, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # The query tiles holding a row that keeps one of these keys (query row i sits at i + offset), and
    # among them those whose rows all keep all of them.
    offset = kv_len - q_len
    n_hi = tl.minimum(start_n + BLOCK_N, kv_len) - 1
    p_lo, p_hi = _query_range(start_n, n_hi, kv_len, MASK, mask_size)
    f_lo, f_hi = _query_full_range(start_n, n_hi, kv_len, MASK, mask_size)
    row_hi = tl.minimum(p_hi - offset, q_len)
    first, mid_lo, mid_hi = _block_bounds(tl.maximum(p_lo - offset, 0), row_hi, tl.maximum(f_lo - offset, 0),
                                          tl.minimum(f_hi - offset, q_len), BLOCK_M)
    for g in range(0, group):
        off_h = off_kvh * group + g
        q_off = off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        if VARLEN:
            q_off += seq_start * stride_qs
            row_off = off_h.to(tl.int64) * total + seq_start
        else:
            row_off = (off_b * n_heads + off_h).to(tl.int64) * q_len
        dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_off, row_off, stride_qs, first, mid_lo, offs_n,
                             offs_d, offset, q_len, kv_len, mask_size, qk_scale, MASK, True, DOT_PRECISION, BLOCK_M)
        dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_off, row_off, stride_qs, mid_lo, mid_hi, offs_n,
                             offs_d, offset, q_len, kv_len, mask_size, qk_scale, MASK, False, DOT_PRECISION, BLOCK_M)
        dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_off, row_off, stride_qs, mid_hi, row_hi, offs_n,
                             offs_d, offset, q_len, kv_len, mask_size, qk_scale, MASK, True, DOT_PRECISION, BLOCK_M)

    tl.store(DK + kv_off + kv_tile, (dk * sm_scale).to(DK.dtype.element_ty), mask=keys_in)
    tl.store(DV + kv_off + kv_tile, dv.to(DV.dtype.element_ty), mask=keys_in)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K, V, kv_off, stride_ks, lo, hi, offs_m, offs_d, offset, kv_len, mask_size,
              qk_scale, MASK: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """Fold the key blocks [lo, hi) into one query tile's dq. MASKED evaluates the element mask (and the keys
    past kv_len); without it every row keeps every key of every block."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        kv_ptrs = kv_off + cols[:, None] * stride_ks + offs_d[None, :]
        if MASKED:
            k = tl.load(K + kv_ptrs, mask=cols[:, None] < kv_len, other=0.0)
            v = tl.load(V + kv_ptrs, mask=cols[:, None] < kv_len, other=0.0)
        else:
            k = tl.load(K + kv_ptrs)
            v = tl.load(V + kv_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where(_keep(offs_m[:, None] + offset, cols[None, :], kv_len, MASK, mask_size), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, DQ, Lse, Delta, CuSeqlens,
                 stride_qb, stride_qh, stride_qs,
                 stride_kb, stride_kh, stride_ks,
                 n_heads, group, q_len, kv_len, n_seqs, mask_size, qk_scale, sm_scale,
                 HEAD_DIM: tl.constexpr, MASK: tl.constexpr, DOT_PRECISION: tl.constexpr, VARLEN: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The last query tiles (the most key blocks under a causal mask) go out in the first wave.
    n_tiles = tl.num_programs(0)
    pid = tl.program_id(1)
    off_b = pid // n_heads
    off_h = pid % n_heads
    off_kvh = off_h // group
    q_off = off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    kv_off = off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    row_off = pid.to(tl.int64) * q_len
    if VARLEN:  # off_b is a packed batch's sequence (the batch strides are 0); past its rows, nothing to do
        seq_start, q_len, total = _sequence(CuSeqlens, off_b, n_seqs)
        kv_len = q_len
        n_tiles = tl.cdiv(q_len, BLOCK_M)
        if tl.program_id(0) >= n_tiles:
            return
        seq_start = seq_start.to(tl.int64)
        q_off += seq_start * stride_qs
        kv_off += seq_start * stride_ks
        row_off = off_h.to(tl.int64) * total + seq_start
    start_m = (n_tiles - 1 - tl.program_id(0)) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows_in = offs_m < q_len

    q_tile = offs_m[:, None] * stride_qs + offs_d[None, :]
    q = tl.load(Q + q_off + q_tile, mask=rows_in[:, None], other=0.0)
    do = tl.load(DO + q_off + q_tile, mask=rows_in[:, None], other=0.0)
    lse = tl.load(Lse + row_off + offs_m, mask=rows_in, other=0.0)
    delta = tl.load(Delta + row_off + offs_m, mask=rows_in, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # The key blocks the forward visits for this tile (`_kernel._key_range`); the boundary ones masked.
    offset = kv_len - q_len
    p_hi = tl.minimum(start_m + BLOCK_M, q_len) - 1 + offset
    lo, hi, full_lo, full_hi = _key_range(start_m + offset, p_hi, kv_len, MASK, mask_size)
    first, mid_lo, mid_hi = _block_bounds(lo, hi, full_lo, full_hi, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, kv_off, stride_ks, first, mid_lo, offs_m, offs_d, offset, kv_len,
                   mask_size, qk_scale, MASK, True, DOT_PRECISION, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, kv_off, stride_ks, mid_lo, mid_hi, offs_m, offs_d, offset, kv_len,
                   mask_size, qk_scale, MASK, False, DOT_PRECISION, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, kv_off, stride_ks, mid_hi, hi, offs_m, offs_d, offset, kv_len,
                   mask_size, qk_scale, MASK, True, DOT_PRECISION, BLOCK_N)

    tl.store(DQ + q_off + q_tile, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows_in[:, None])


# What the autotuner times for each kernel (BLOCK_M query rows, BLOCK_N keys, warps, stages), pruned per
# head_dim by `_keep_backward`: dK/dV keep a key block in registers and stream query tiles past it, so
# wide key blocks and narrow query tiles; dQ the other way round.
DKDV_SPACE = [
    BlockConfig(64, 64, 8, 2),
    BlockConfig(64, 64, 4, 3),
    BlockConfig(32, 64, 4, 3),
    BlockConfig(32, 128, 4, 3),
    BlockConfig(32, 128, 8, 3),
    BlockConfig(64, 128, 8, 2),
    BlockConfig(64, 128, 8, 3),
    BlockConfig(32, 32, 4, 1),  # head_dim 256 (or fp32 128)
]
DQ_SPACE = [
    BlockConfig(64, 64, 8, 2),
    BlockConfig(64, 64, 4, 3),
    BlockConfig(128, 32, 4, 3),
    BlockConfig(128, 32, 8, 3),
    BlockConfig(128, 64, 8, 2),
    BlockConfig(128, 64, 8, 3),
    BlockConfig(32, 32, 4, 1),  # head_dim 256 (or fp32 128)
]
DELTA_BLOCK_M = 64


def _wide(head_dim: int, elem: int) -> bool:
    return head_dim * elem > 256


def _keep_backward(cfg: BlockConfig, head_dim: int, elem: int, key_block: bool) -> bool:
    """Whether the search times `cfg`: the narrow tiles only (and only them) for wide heads, and the tiles
    that stream (num_stages buffers) plus the block held in place fit in shared memory."""
    if (cfg.block_m == cfg.block_n == 32 and cfg.num_stages == 1) != _wide(head_dim, elem):
        return False
    held, streamed = (cfg.block_n, cfg.block_m) if key_block else (cfg.block_m, cfg.block_n)
    return (2 * held + 2 * max(cfg.num_stages, 1) * streamed) * head_dim * elem <= _SMEM_LIMIT


def backward_space(head_dim: int, elem: int = 2) -> tuple[list[BlockConfig], list[BlockConfig]]:
    """The (dK/dV, dQ) configurations the autotuner times for this head_dim and element size."""
    return ([c for c in DKDV_SPACE if _keep_backward(c, head_dim, elem, True)],
            [c for c in DQ_SPACE if _keep_backward(c, head_dim, elem, False)])


def _pruner(key_block: bool) -> Any:
    def prune(configs: list, named_args: dict, **kwargs: Any) -> list:
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        elem = named_args["Q"].element_size()
        kept = [c for c in configs
                if _keep_backward(BlockConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages),
                                  head_dim, elem, key_block)]
        return kept or configs[-1:]
    return prune


_TUNING_KEY = ["q_len", "kv_len", "HEAD_DIM", "MASK", "DOT_PRECISION", "VARLEN", "n_seqs"]
_attn_bwd_dkdv_tuned = triton.autotune(configs=[c.as_triton() for c in DKDV_SPACE], key=_TUNING_KEY,
                                       prune_configs_by={"early_config_prune": _pruner(True)})(_attn_bwd_dkdv)
_attn_bwd_dq_tuned = triton.autotune(configs=[c.as_triton() for c in DQ_SPACE], key=_TUNING_KEY,
                                     prune_configs_by={"early_config_prune": _pruner(False)})(_attn_bwd_dq)


def default_configs(head_dim: int, elem: int) -> tuple[BlockConfig, BlockConfig]:
    """(dK/dV, dQ) configurations without timing anything: square tiles for each head_dim."""
    if _wide(head_dim, elem):  # head_dim 256 (or fp32 128): small tiles keep K, V and two fp32 accumulators
        cfg = BlockConfig(32, 32, 4, 1)
    elif head_dim * elem == 256:  # head_dim 128 (fp32 64): twice the threads share the fp32 accumulators
        cfg = BlockConfig(64, 64, 8, 2)
    else:
        cfg = BlockConfig(64, 64, 4, 2)
    return cfg, cfg


def launched_configs(q: Any, k: Any, mask: str, max_seqlen: int | None = None,
                     n_seqs: int = 1) -> tuple[BlockConfig, BlockConfig] | None:
    """The (dK/dV, dQ) configurations the backward launches for these shapes and mask (a packed batch: its
    longest sequence and sequence count): the autotuner's picks (None before it has run), or
    `default_configs` where it does not tune."""
    if not tunes(q):
        return default_configs(q.shape[3], q.element_size())
    lengths = (q.shape[2], k.shape[2]) if max_seqlen is None else (max_seqlen, max_seqlen)
    packed = dict(VARLEN=max_seqlen is not None, n_seqs=n_seqs)
    kernels = (_attn_bwd_dkdv_tuned, _attn_bwd_dq_tuned)
    dkdv, dq = (tuned_config(kernel, q, lengths, mask, **packed) for kernel in kernels)
    return (dkdv, dq) if dkdv is not None and dq is not None else None


def attention_backward(do: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, mask: str,
                       configs: tuple[BlockConfig, BlockConfig] | None = None, sinks: Any = None,
                       cu_seqlens: Any = None, max_seqlen: int | None = None) -> tuple[Any, ...]:
    """(dq, dk, dv) for q [B, H, q_len, D] and k, v [B, H_kv, kv_len, D], given the forward's output, its
    `lse` (`_kernel.attention(..., return_lse=True)`), the output's gradient `do` and the forward's mask
    (its text: `causal`, `sliding_window:W`, ...). `configs` (dK/dV, dQ) launches those tiles as given;
    without it the autotuner picks them (or `default_configs`, where it does not tune). With the forward's
    `sinks` ([H]), dsinks follows as a fourth gradient: each head's −Σ over its rows of the sink's weight
    exp2(s·log2(e) − lse) times delta (the lse includes the sink, so dQ, dK, dV need nothing more). A packed
    batch (`cu_seqlens`, `max_seqlen`) as in `_kernel.attention`."""
    q, k, v, do, out = (t.contiguous() for t in (q, k, v, do, out))
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    packed = packed_args(q, k, mask, cu_seqlens, max_seqlen)
    lengths = (q_len, kv_len) if packed is None else (packed.max_seqlen, packed.max_seqlen)
    mask_code, mask_size = mask_args(mask, lengths[1])
    delta = torch.empty((batch, heads, q_len), device=q.device, dtype=torch.float32)
    _attn_bwd_delta[(triton.cdiv(q_len, DELTA_BLOCK_M), batch * heads)](
        out, do, delta, out.stride(0), out.stride(1), out.stride(2), heads, q_len,
        HEAD_DIM=head_dim, BLOCK_M=DELTA_BLOCK_M)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sm_scale = head_dim ** -0.5
    qk_scale = sm_scale * LOG2E
    meta = dict(HEAD_DIM=head_dim, MASK=mask_code, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                VARLEN=packed is not None)
    # a packed batch: its sequences stand for the batch (stride 0: each program adds its sequence's start)
    rows, n_seqs = (batch, 1) if packed is None else (packed.n_seqs, packed.n_seqs)
    strides = (q.stride(0) if packed is None else 0, q.stride(1), q.stride(2),
               k.stride(0) if packed is None else 0, k.stride(1), k.stride(2))
    cu = packed.cu_seqlens if packed is not None else delta
    dkdv_args = (q, k, v, do, dk, dv, lse, delta, cu, *strides,
                 heads, kv_heads, heads // kv_heads, *lengths, n_seqs, mask_size, qk_scale, sm_scale)
    dq_args = (q, k, v, do, dq, lse, delta, cu, *strides,
               heads, heads // kv_heads, *lengths, n_seqs, mask_size, qk_scale, sm_scale)
    if configs is None and not tunes(q):
        configs = default_configs(head_dim, q.element_size())
    if configs is None:
        _attn_bwd_dkdv_tuned[lambda m: (triton.cdiv(lengths[1], m["BLOCK_N"]), rows * kv_heads)](*dkdv_args, **meta)
        _attn_bwd_dq_tuned[lambda m: (triton.cdiv(lengths[0], m["BLOCK_M"]), rows * heads)](*dq_args, **meta)
    else:
        dkdv_cfg, dq_cfg = configs
        _attn_bwd_dkdv[(triton.cdiv(lengths[1], dkdv_cfg.block_n), rows * kv_heads)](
            *dkdv_args, **meta, BLOCK_M=dkdv_cfg.block_m, BLOCK_N=dkdv_cfg.block_n,
            num_warps=dkdv_cfg.num_warps, num_stages=dkdv_cfg.num_stages)
        _attn_bwd_dq[(triton.cdiv(lengths[0], dq_cfg.block_m), rows * heads)](
            *dq_args, **meta, BLOCK_M=dq_cfg.block_m, BLOCK_N=dq_cfg.block_n,
            num_warps=dq_cfg.num_warps, num_stages=dq_cfg.num_stages)
    if sinks is None:
        return dq, dk, dv
    return dq, dk, dv, sink_grad(sinks, lse, delta)


def sink_grad(sinks: Any, lse: Any, delta: Any) -> Any:
    """dsinks [H] from the forward's lse and the backward's delta ([B, H, S] float32, base 2 lse): the sink is
    one more softmax column with a zero value, so its dS is −P_sink·delta, summed over batch and rows."""
    weight = torch.exp2(sinks.float()[None, :, None] * LOG2E - lse)
    return (weight * delta).sum((0, 2)).neg().to(sinks.dtype)


class FlashAttention(torch.autograd.Function):
    """`triton-flash` with its own backward: the forward saves q, k, v, the output and the row
    statistics (and the sinks, a packed batch's offsets); the backward runs `attention_backward` under
    the same mask, and gives the sinks their gradient."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: str, sinks: Any = None, cu_seqlens: Any = None,
                max_seqlen: int | None = None) -> Any:
        """The forward kernel under `mask` (its text), keeping what the backward needs."""
        out, lse = attention(q, k, v, return_lse=True, mask=mask, sinks=sinks, cu_seqlens=cu_seqlens,
                             max_seqlen=max_seqlen)
        ctx.save_for_backward(q, k, v, out, lse, sinks, cu_seqlens)
        ctx.mask = mask
        ctx.max_seqlen = max_seqlen
        return out

    @staticmethod
    def backward(ctx: Any, do: Any) -> tuple[Any, ...]:
        """dq, dk, dv (and dsinks) from the saved tensors and the output's gradient."""
        q, k, v, out, lse, sinks, cu_seqlens = ctx.saved_tensors
        grads = attention_backward(do, q, k, v, out, lse, ctx.mask, sinks=sinks, cu_seqlens=cu_seqlens,
                                   max_seqlen=ctx.max_seqlen)
        dsinks = grads[3] if sinks is not None and ctx.needs_input_grad[4] else None
        return *grads[:3], None, dsinks, None, None
