"""The Triton kernel behind `triton-flash`, and the host code that launches it.

Importing this module imports triton and torch; `attnprof_triton` imports it only when a
kernel is about to run, so the plugin itself loads on machines without triton.

One program computes one BLOCK_M-row tile of queries for one (batch, head):

* the query tile stays in registers; key and value tiles of BLOCK_N rows stream past it;
* softmax is computed online: a running row maximum `m_i` and row sum `l_i`, with the
  fp32 accumulator rescaled by exp2(m_old - m_new) whenever the maximum grows, so the
  [S, S] score matrix never exists anywhere;
* the softmax scale 1/sqrt(D) is multiplied by log2(e) once, so every exponential is an
  exp2 (one MUFU instruction);
* masks (`MASK_CODES`: none, causal, sliding window, documents, prefix), bottom-right aligned
  (query row i sits at position p = i + kv_len − q_len): each query tile visits only the key
  blocks that hold a key one of its rows keeps (`_key_range`: causal up to the diagonal, a
  sliding window from the block of p − W + 1, documents from the document's start); the
  blocks every row keeps whole go without any mask, and only the boundary blocks evaluate
  the element mask (`_keep`); the other blocks are never loaded;
* the grid runs query tiles fastest, so the programs in flight belong to one or two heads and
  share their K/V in L2 (with heads fastest, an H200 at 1x64x16384x128/kv8 causal read 2.1 GB
  from DRAM against cuDNN's 0.34 GB); within a head the query tiles with the most key blocks
  (the bottom rows of a causal matrix) are launched first, which trims the tail of each head;
* with grouped-query attention, query head h reads key/value head h // (H // H_kv);
* attention sinks (SINKS, gpt-oss: one logit s_h per query head in the softmax's denominator, never
  its numerator): each row's running maximum starts at s_h·log2(e) and its running sum at 1, as if
  the sink were one more key with a zero value; the stored lse includes it, so the backward's P is
  already right (`_backward.py` adds dsinks);
* packed variable-length batches (VARLEN, `cu_seqlens`): the "batch" index is a sequence, whose
  tokens [start, end) of the packed [1, H, total, D] tensors are its queries and keys; the grid
  covers the longest sequence's tiles for every sequence, and a program past its sequence's last
  tile returns at once, so only the sequence's own tiles run;
* tiles move by pointer loads, masked only where a tile crosses the sequence's end; with
  ATTNPROF_TRITON_TMA=1 on Hopper and newer they move by TMA instead, through on-device
  tensor descriptors bounded by one head's [S, D] slab (rows past S read as zero). On an
  H200 (triton 3.6) both ran 4x16x8192x128 bf16 causal in the same time, so the simpler
  path is the default. (triton 3.6 cannot warp-specialize this loop on Hopper: the
  NVGPUWarpSpecialization pass fails.)
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# A finite "minus infinity" for masked scores: exp2 of it is 0, and a fully masked row can
# never turn the running maximum into -inf (which would make exp2(-inf - -inf) = NaN).
MASKED = tl.constexpr(-1.0e6)
SINK_SCALE = tl.constexpr(LOG2E)  # a sink logit into the exp2 domain of the scaled scores

TMA_ENV = "ATTNPROF_TRITON_TMA"  # "1": TMA descriptor loads on Hopper+ (default: pointer loads)
AUTOTUNE_ENV = "ATTNPROF_TRITON_AUTOTUNE"  # "0": skip the search, launch default_config()
#: The kernels' MASK constexpr per mask kind (attnprof.masks); `mask_size` carries the window W, the
#: document length kv_len / N, or the prefix length P.
MASK_CODES = {"none": 0, "causal": 1, "sliding_window": 2, "documents": 3, "prefix": 4}


def mask_args(mask: str, kv_len: int) -> tuple[int, int]:
    """(MASK, mask_size) of a mask's text (`causal`, `sliding_window:256`, ...) for kv_len keys."""
    from attnprof.masks import parse_mask

    parsed = parse_mask(mask)
    if parsed.kind not in MASK_CODES:
        raise ValueError(f"mask {parsed.kind} is not supported by the triton-flash kernels")
    if parsed.size is not None and (problem := parsed.problem(kv_len, kv_len)):
        raise ValueError(problem)
    size = kv_len // parsed.size if parsed.kind == "documents" else parsed.size or 0
    return MASK_CODES[parsed.kind], size


@triton.jit
def _keep(p, j, kv_len, MASK: tl.constexpr, mask_size):
    """Which (query position p, key j) pairs the mask keeps (attnprof.masks' rules); keys past kv_len never."""
    keep = (j < kv_len) & (p == p)
    if MASK == 1:
        keep = keep & (j <= p)
    if MASK == 2:
        keep = keep & (j <= p) & (j > p - mask_size)
    if MASK == 3:
        keep = keep & (j <= p) & (j // mask_size == p // mask_size)
    if MASK == 4:
        keep = keep & ((j <= p) | (j < mask_size))
    return keep


@triton.jit
def _sequence(CuSeqlens, seq, n_seqs):
    """A packed batch's sequence `seq`: its first token, its length, and the packed batch's total tokens."""
    start = tl.load(CuSeqlens + seq)
    return start, tl.load(CuSeqlens + seq + 1) - start, tl.load(CuSeqlens + n_seqs)


@triton.jit
def _key_range(p_lo, p_hi, kv_len, MASK: tl.constexpr, mask_size):
    """For the query positions [p_lo, p_hi] of one tile: the keys [lo, hi) that some row keeps and the
    keys [full_lo, full_hi) that every row keeps (empty when full_hi <= full_lo), both within kv_len."""
    lo = p_lo * 0
    hi = p_hi + 1
    full_lo = p_lo * 0
    full_hi = p_lo + 1
    if MASK == 0:
        hi = p_hi * 0 + kv_len
        full_hi = p_lo * 0 + kv_len
    if MASK == 2:
        lo = tl.maximum(p_lo - mask_size + 1, 0)
        full_lo = tl.maximum(p_hi - mask_size + 1, 0)
    if MASK == 3:
        lo = (p_lo // mask_size) * mask_size
        full_lo = (p_hi // mask_size) * mask_size
    if MASK == 4:
        hi = tl.maximum(p_hi + 1, mask_size)
        full_hi = tl.maximum(p_lo + 1, mask_size)
    return lo, tl.minimum(hi, kv_len), full_lo, tl.minimum(full_hi, kv_len)


@triton.jit
def _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, lo, hi, offs_m, offs_n, offs_d, offset, kv_len, mask_size,
                     stride_kn, stride_vn, qk_scale,
                     MASK: tl.constexpr, MASKED_BLOCKS: tl.constexpr, USE_TMA: tl.constexpr,
                     BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key/value blocks [lo, hi) into the running (acc, l_i, m_i) of one query tile.

    MASKED_BLOCKS evaluates the element mask (`_keep`, keys past kv_len included; with pointer loads
    those loads stay in bounds); without it the blocks are wholly kept by every row and inside kv_len.
    """
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if USE_TMA:
            k = k_src.load([start_n, 0])
        else:
            k_ptrs = k_src + cols[:, None] * stride_kn + offs_d[None, :]
            if MASKED_BLOCKS:
                k = tl.load(k_ptrs, mask=cols[:, None] < kv_len, other=0.0)
            else:
                k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED_BLOCKS:
            keep = _keep(offs_m[:, None] + offset, cols[None, :], kv_len, MASK, mask_size)
            qk = qk * qk_scale + tl.where(keep, 0.0, MASKED)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:
            v = v_src.load([start_n, 0])
        else:
            v_ptrs = v_src + cols[:, None] * stride_vn + offs_d[None, :]
            if MASKED_BLOCKS:
                v = tl.load(v_ptrs, mask=cols[:, None] < kv_len, other=0.0)
            else:
                v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _block_bounds(lo, hi, full_lo, full_hi, BLOCK_N: tl.constexpr):
    """The key blocks a tile visits, cut at BLOCK_N: [first, mid_lo) and [mid_hi, hi) masked, [mid_lo, mid_hi)
    unmasked (blocks wholly inside [full_lo, full_hi)); every block that overlaps [lo, hi) exactly once."""
    first = (lo // BLOCK_N) * BLOCK_N
    last = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    mid_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, first), last)
    mid_hi = tl.minimum(tl.maximum((full_hi // BLOCK_N) * BLOCK_N, mid_lo), last)
    return first, mid_lo, mid_hi


@triton.jit
def _attn_fwd(Q, K, V, Out, Lse, Sinks, CuSeqlens,
              stride_qb, stride_qh, stride_qs,
              stride_kb, stride_kh, stride_ks,
              stride_vb, stride_vh, stride_vs,
              stride_ob, stride_oh, stride_os,
              n_heads, group, q_len, kv_len, n_seqs, mask_size, qk_scale,
              HEAD_DIM: tl.constexpr, MASK: tl.constexpr, USE_TMA: tl.constexpr,
              DOT_PRECISION: tl.constexpr, STORE_LSE: tl.constexpr, SINKS: tl.constexpr, VARLEN: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One flat axis (no 65,535 limit on batch x heads): one head's query tiles run fastest, from the
    # last one backwards, so the longest causal rows go out first and the programs in flight share
    # that head's K/V in L2; then (batch, head), the query heads of one GQA group next to each other.
    # VARLEN: the batch index is the sequence, q_len and kv_len the longest one's (its tiles set the grid).
    n_tiles = tl.cdiv(q_len, BLOCK_M)
    tile = tl.program_id(0) % n_tiles
    pid_bh = tl.program_id(0) // n_tiles
    off_b = pid_bh // n_heads
    off_h = pid_bh % n_heads
    off_kvh = off_h // group

    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
    o_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    lse_row = pid_bh.to(tl.int64) * q_len
    if VARLEN:  # the sequence's own tokens (the batch strides are 0); past its last tile, nothing to do
        seq_start, q_len, total = _sequence(CuSeqlens, off_b, n_seqs)
        kv_len = q_len
        n_tiles = tl.cdiv(q_len, BLOCK_M)
        if tile >= n_tiles:
            return
        seq_start = seq_start.to(tl.int64)
        q_base += seq_start * stride_qs
        k_base += seq_start * stride_ks
        v_base += seq_start * stride_vs
        o_base += seq_start * stride_os
        lse_row = off_h.to(tl.int64) * total + seq_start
    start_m = n_tiles - 1 - tile

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    if USE_TMA:
        desc_q = tl.make_tensor_descriptor(q_base, shape=[q_len, HEAD_DIM], strides=[stride_qs, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        desc_k = tl.make_tensor_descriptor(k_base, shape=[kv_len, HEAD_DIM], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(v_base, shape=[kv_len, HEAD_DIM], strides=[stride_vs, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_o = tl.make_tensor_descriptor(o_base, shape=[q_len, HEAD_DIM], strides=[stride_os, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        q = desc_q.load([start_m * BLOCK_M, 0])
        k_src = desc_k
        v_src = desc_v
    else:
        q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < q_len,
                    other=0.0)
        k_src = k_base
        v_src = v_base

    if SINKS:  # the sink as one more key with a zero value: the running max starts at it, the sum at 1
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(Sinks + off_h).to(tl.float32) * SINK_SCALE
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Bottom-right alignment: query row i sits at key position i + offset.
    offset = kv_len - q_len
    p_lo = start_m * BLOCK_M + offset
    p_hi = tl.minimum(start_m * BLOCK_M + BLOCK_M, q_len) - 1 + offset
    lo, hi, full_lo, full_hi = _key_range(p_lo, p_hi, kv_len, MASK, mask_size)
    first, mid_lo, mid_hi = _block_bounds(lo, hi, full_lo, full_hi, BLOCK_N)
    # Blocks before the wholly kept ones (a window's or a document's start), masked.
    acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, first, mid_lo, offs_m, offs_n, offs_d,
                                     offset, kv_len, mask_size, stride_ks, stride_vs, qk_scale,
                                     MASK, True, USE_TMA, BLOCK_N, DOT_PRECISION)
    # Blocks every row keeps whole, without any mask.
    acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, mid_lo, mid_hi, offs_m, offs_n, offs_d,
                                     offset, kv_len, mask_size, stride_ks, stride_vs, qk_scale,
                                     MASK, False, USE_TMA, BLOCK_N, DOT_PRECISION)
    # The diagonal and the ragged end, masked.
    acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, mid_hi, hi, offs_m, offs_n, offs_d,
                                     offset, kv_len, mask_size, stride_ks, stride_vs, qk_scale,
                                     MASK, True, USE_TMA, BLOCK_N, DOT_PRECISION)

    if STORE_LSE:  # the row's log-sum-exp in the exp2 domain, [B, H, q_len] float32: what the backward needs
        tl.store(Lse + lse_row + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < q_len)
    out = (acc / l_i[:, None]).to(Out.dtype.element_ty)
    if USE_TMA:
        desc_o.store([start_m * BLOCK_M, 0], out)
    else:
        tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out, mask=offs_m[:, None] < q_len)


class BlockConfig(NamedTuple):
    """One launch configuration: tile sizes, warps and software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def as_triton(self) -> Any:
        """This configuration as a triton.Config."""
        return triton.Config({"BLOCK_M": self.block_m, "BLOCK_N": self.block_n},
                             num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} warps={self.num_warps} stages={self.num_stages}"


# The search space the autotuner times, pruned per shape by _keep: BLOCK_M in {64, 128},
# BLOCK_N in {32, 64, 128}, 4 or 8 warps, 2 to 4 pipeline stages, in the combinations that
# make sense together (the whole product would cost minutes of compiling for nothing).
AUTOTUNE_SPACE = [
    BlockConfig(64, 32, 4, 4),
    BlockConfig(64, 64, 4, 3),
    BlockConfig(64, 64, 4, 4),
    BlockConfig(128, 32, 4, 4),
    BlockConfig(128, 64, 4, 3),
    BlockConfig(128, 64, 8, 3),
    BlockConfig(128, 64, 8, 4),
    BlockConfig(128, 128, 8, 2),
    BlockConfig(128, 128, 8, 3),
    # head_dim 256: narrow key tiles, shallow pipelines
    BlockConfig(64, 32, 4, 2),
    BlockConfig(64, 32, 4, 3),
    BlockConfig(64, 64, 4, 2),
    BlockConfig(128, 32, 8, 2),
    BlockConfig(128, 64, 8, 2),
]
_WIDE_HEAD_ONLY = set(AUTOTUNE_SPACE[9:])

# Shared memory per block on Hopper (227 KiB usable); larger configs fail to compile and
# the autotuner skips them, but pruning them first saves the compile time.
_SMEM_LIMIT = 227 * 1024


def _smem_bytes(cfg: BlockConfig, head_dim: int, elem: int) -> int:
    # the query tile plus (num_stages - 1) in-flight buffers of one key and one value tile
    return (cfg.block_m + 2 * max(cfg.num_stages - 1, 1) * cfg.block_n) * head_dim * elem


def _keep_config(cfg: BlockConfig, seq_len: int, head_dim: int, elem: int) -> bool:
    """Whether the search times `cfg` for seq_len query rows (shared memory, tile sizes)."""
    if cfg.block_n > cfg.block_m:  # kept from the diagonal split: key tiles no wider than query tiles
        return False
    if (cfg in _WIDE_HEAD_ONLY) != (head_dim * elem > 256):
        return False
    if cfg.block_m > 64 and seq_len <= 64:
        return False
    return _smem_bytes(cfg, head_dim, elem) <= _SMEM_LIMIT


def _prune_configs(configs: list, named_args: dict, **_kwargs: Any) -> list:
    seq_len = named_args["q_len"]
    head_dim = _kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    elem = named_args["Q"].element_size()
    kept = [c for c in configs
            if _keep_config(BlockConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages),
                     seq_len, head_dim, elem)]
    return kept or [min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_stages))]


def autotune_space(seq_len: int, head_dim: int, elem: int = 2) -> list[BlockConfig]:
    """The configurations the autotuner will time for this shape (for reports and tests)."""
    return [c for c in AUTOTUNE_SPACE if _keep_config(c, seq_len, head_dim, elem)]


#: What the autotuner keys its choice on (besides the tensors' dtypes); `tuned_config` reads the key back.
TUNING_KEY = ["q_len", "kv_len", "HEAD_DIM", "MASK", "USE_TMA", "STORE_LSE", "SINKS", "VARLEN", "n_seqs"]
_attn_fwd_tuned = triton.autotune(
    configs=[c.as_triton() for c in AUTOTUNE_SPACE],
    key=TUNING_KEY,
    prune_configs_by={"early_config_prune": _prune_configs},
)(_attn_fwd)


def default_config(seq_len: int, head_dim: int, elem: int = 2) -> BlockConfig:
    """A reasonable configuration without timing anything (ATTNPROF_TRITON_AUTOTUNE=0)."""
    if head_dim * elem > 256:
        return BlockConfig(64, 32, 4, 2)
    if seq_len <= 64:
        return BlockConfig(64, 32, 4, 3)
    return BlockConfig(128, 64, 8, 3)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _tma_ok(*tensors: Any) -> bool:
    """Device-side TMA descriptors: Hopper or newer, 16-byte aligned bases and row strides."""
    env = os.environ.get(TMA_ENV)
    if env != "1":
        return False
    if not hasattr(tl, "make_tensor_descriptor") or not hasattr(triton, "set_allocator"):
        return False
    if _interpreting():
        return True
    if tensors[0].device.type != "cuda" or torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
        return False
    for t in tensors:
        es = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * es) % 16 for s in t.stride()[:-1]):
            return False
    return True


def _scratch(size: int, alignment: int, stream: Any) -> Any:
    # Room for the on-device tensor descriptors (128 bytes per program per descriptor).
    return torch.empty(size, dtype=torch.int8, device="cuda")


def attention(q: Any, k: Any, v: Any, causal: bool = True, config: BlockConfig | None = None,
              return_lse: bool = False, mask: str | None = None, sinks: Any = None, cu_seqlens: Any = None,
              max_seqlen: int | None = None) -> Any:
    """softmax(q kᵀ / sqrt(D)) v for q [B, H, q_len, D] and k, v [B, H_kv, kv_len, D] (H_kv may divide H).

    `mask` is a mask's text (`causal`, `none`, `sliding_window:W`, `documents:N`, `prefix:P`; rules in
    attnprof.masks, bottom-right aligned when q_len < kv_len); None means `causal` or `none` as
    `causal` says. Without `config` the autotuner picks the launch configuration (timed once per
    shape and mask kind on first use); with it, that configuration is launched as given.
    `return_lse` also returns each row's log-sum-exp ([B, H, q_len] float32, base 2, scores scaled
    by log2(e)/sqrt(D)): the statistics the backward (`_backward.py`) recomputes P from.
    `sinks` ([H], one logit per query head) join every row's softmax denominator (and its lse).
    `cu_seqlens` (int32 [N + 1], the sequences' offsets) makes q, k, v a packed batch [1, H, total, D]
    of N sequences, the longest `max_seqlen` tokens, each attending within itself (causal or none).
    """
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim or q_len > kv_len:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: shapes do not match")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    if sinks is not None and tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks {tuple(sinks.shape)}: one logit per query head ({heads},) expected")
    mask_text = mask if mask is not None else ("causal" if causal else "none")
    packed = None if cu_seqlens is None else packed_args(q, k, mask_text, cu_seqlens, max_seqlen)
    # the lengths the tiles cover: a packed batch's longest sequence, whose tiles every sequence gets
    tiles_q, tiles_k = (q_len, kv_len) if packed is None else (packed.max_seqlen, packed.max_seqlen)
    mask_code, mask_size = mask_args(mask_text, tiles_k)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, q_len), device=q.device, dtype=torch.float32) if return_lse else out
    use_tma = packed is None and _tma_ok(q, k, v, out)
    if use_tma and not _interpreting():
        triton.set_allocator(_scratch)
    qk_scale = LOG2E / (head_dim ** 0.5)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if packed is None:
        rows, n_seqs, cu = batch, 1, out
        stride_b = (q.stride(0), k.stride(0), v.stride(0), out.stride(0))
    else:  # the sequences stand for the batch (stride 0: each program adds its sequence's start)
        rows, n_seqs, cu = packed.n_seqs, packed.n_seqs, packed.cu_seqlens
        stride_b = (0, 0, 0, 0)
    args = (q, k, v, out, lse, out if sinks is None else sinks, cu,
            stride_b[0], q.stride(1), q.stride(2),
            stride_b[1], k.stride(1), k.stride(2),
            stride_b[2], v.stride(1), v.stride(2),
            stride_b[3], out.stride(1), out.stride(2),
            heads, heads // kv_heads, tiles_q, tiles_k, n_seqs, mask_size, qk_scale)
    meta = dict(HEAD_DIM=head_dim, MASK=mask_code, USE_TMA=use_tma, DOT_PRECISION=precision,
                STORE_LSE=bool(return_lse), SINKS=sinks is not None, VARLEN=packed is not None)
    if config is None and not tunes(q):
        config = default_config(tiles_q, head_dim, q.element_size())
    if config is None:
        def grid(m: dict) -> tuple[int]:
            return (triton.cdiv(tiles_q, m["BLOCK_M"]) * rows * heads,)

        _attn_fwd_tuned[grid](*args, **meta)
    else:
        grid = (triton.cdiv(tiles_q, config.block_m) * rows * heads,)
        _attn_fwd[grid](*args, **meta, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                        num_warps=config.num_warps, num_stages=config.num_stages)
    return (out, lse) if return_lse else out


class PackedArgs(NamedTuple):
    """A packed batch as the kernels take it: the int32 offsets, their sequence count, the longest length."""

    cu_seqlens: Any
    n_seqs: int
    max_seqlen: int


def packed_args(q: Any, k: Any, mask: str, cu_seqlens: Any, max_seqlen: int | None) -> PackedArgs | None:
    """The checked packed batch of `attention`'s arguments (None without `cu_seqlens`); ValueError in one line."""
    if cu_seqlens is None:
        return None
    from attnprof.masks import PLAIN_KINDS, parse_mask

    if q.shape[0] != 1 or q.shape[2] != k.shape[2]:
        raise ValueError(f"a packed batch is q, k, v [1, H, total, D] (got q {tuple(q.shape)}, k {tuple(k.shape)})")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype != torch.int32:
        raise ValueError("cu_seqlens must be int32 [sequences + 1] offsets")
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, q on {q.device}")
    if parse_mask(mask).kind not in PLAIN_KINDS:
        raise ValueError(f"a packed batch takes the causal or none mask (got {mask})")
    if not max_seqlen or max_seqlen < 1:
        raise ValueError("a packed batch needs max_seqlen, its longest sequence's length")
    return PackedArgs(cu_seqlens, cu_seqlens.numel() - 1, int(max_seqlen))


def tunes(q: Any) -> bool:
    """Whether `attention` without a config autotunes for q: not with ATTNPROF_TRITON_AUTOTUNE=0, and not
    in fp32 (for checking, not speed: ieee-precision dots make the search slow for nothing)."""
    return os.environ.get(AUTOTUNE_ENV) != "0" and q.dtype != torch.float32


def tuned_config(kernel: Any, q: Any, lengths: tuple[int, int], mask: str, **key: Any) -> BlockConfig | None:
    """The configuration `kernel`'s autotuner chose for q's dtype and head_dim, these (q_len, kv_len) (a packed
    batch's: its longest sequence's) and mask kind, and the other key values given by name, once it has run."""
    wanted = dict(key, q_len=lengths[0], kv_len=lengths[1], HEAD_DIM=q.shape[3],
                  MASK=mask_args(mask, lengths[1])[0])
    names = kernel.keys
    for cache_key, cfg in kernel.cache.items():
        named = dict(zip(names, cache_key, strict=False))
        # after the key's values, triton appends each tensor argument's dtype, Q's first ("torch.bfloat16")
        q_dtype = cache_key[len(names)] if len(cache_key) > len(names) else None
        if all(named.get(n) == value for n, value in wanted.items()) and q_dtype == str(q.dtype):
            return BlockConfig(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)
    return None


def best_config(q: Any, k: Any, mask: str, sinks: bool = False, max_seqlen: int | None = None,
                n_seqs: int = 1, lse: bool | None = None) -> BlockConfig | None:
    """The configuration the autotuner chose for these shapes, mask kind and sinks (a packed batch: its
    longest sequence and sequence count), with the lse stored or not (None: either), once it has run."""
    lengths = (q.shape[2], k.shape[2]) if max_seqlen is None else (max_seqlen, max_seqlen)
    stored = {} if lse is None else {"STORE_LSE": lse}
    return tuned_config(_attn_fwd_tuned, q, lengths, mask, SINKS=sinks, VARLEN=max_seqlen is not None,
                        n_seqs=n_seqs, **stored)


def launched_config(q: Any, k: Any, mask: str, sinks: bool = False, max_seqlen: int | None = None,
                    n_seqs: int = 1, lse: bool | None = None) -> BlockConfig | None:
    """The configuration `attention(q, k, v, mask=mask, ...)` launches: the autotuner's pick (None before it has
    run), or `default_config` where it does not tune."""
    if not tunes(q):
        return default_config(max_seqlen or q.shape[2], q.shape[3], q.element_size())
    return best_config(q, k, mask, sinks, max_seqlen, n_seqs, lse)
