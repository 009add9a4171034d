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
* causal attention walks the key blocks left of the diagonal without any masking, then
  the diagonal block(s) with the mask; blocks right of the diagonal are never loaded;
* the grid is ordered so the query tiles with the most key blocks (the bottom rows of a
  causal matrix) are launched first, which trims the tail of the last wave;
* with grouped-query attention, query head h reads key/value head h // (H // H_kv);
* tiles move by pointer loads, masked only where a tile crosses S; with
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

TMA_ENV = "ATTNPROF_TRITON_TMA"  # "1": TMA descriptor loads on Hopper+ (default: pointer loads)
AUTOTUNE_ENV = "ATTNPROF_TRITON_AUTOTUNE"  # "0": skip the search, launch default_config()


@triton.jit
def _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, lo, hi, offs_m, offs_n, offs_d, seq_len,
                     stride_kn, stride_vn, qk_scale,
                     MASK_CAUSAL: tl.constexpr, MASK_KEYS: tl.constexpr, USE_TMA: tl.constexpr,
                     BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key/value blocks [lo, hi) into the running (acc, l_i, m_i) of one query tile.

    MASK_CAUSAL masks key > query; MASK_KEYS masks keys >= seq_len (and, with pointer
    loads, keeps those loads in bounds). Neither is set for blocks wholly inside both.
    """
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if USE_TMA:
            k = k_src.load([start_n, 0])
        else:
            k_ptrs = k_src + cols[:, None] * stride_kn + offs_d[None, :]
            if MASK_KEYS:
                k = tl.load(k_ptrs, mask=cols[:, None] < seq_len, other=0.0)
            else:
                k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASK_CAUSAL:
            # Key columns past seq_len are right of every real query row, so this also
            # masks them; rows past seq_len are never stored.
            qk = qk * qk_scale + tl.where(offs_m[:, None] >= cols[None, :], 0.0, MASKED)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        elif MASK_KEYS:
            qk = qk * qk_scale + tl.where(cols[None, :] < seq_len, 0.0, MASKED)
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
            if MASK_KEYS:
                v = tl.load(v_ptrs, mask=cols[:, None] < seq_len, other=0.0)
            else:
                v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, Out, Lse,
              stride_qb, stride_qh, stride_qs,
              stride_kb, stride_kh, stride_ks,
              stride_vb, stride_vh, stride_vs,
              stride_ob, stride_oh, stride_os,
              n_heads, group, seq_len, qk_scale,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
              DOT_PRECISION: tl.constexpr, STORE_LSE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Axis 0 (fastest in launch order) walks (batch, head); axis 1 walks query tiles from
    # the last one backwards, so the longest causal rows go out in the first wave.
    pid_bh = tl.program_id(0)
    start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    off_b = pid_bh // n_heads
    off_h = pid_bh % n_heads
    off_kvh = off_h // group

    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
    o_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    if USE_TMA:
        desc_q = tl.make_tensor_descriptor(q_base, shape=[seq_len, HEAD_DIM], strides=[stride_qs, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        desc_k = tl.make_tensor_descriptor(k_base, shape=[seq_len, HEAD_DIM], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(v_base, shape=[seq_len, HEAD_DIM], strides=[stride_vs, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_o = tl.make_tensor_descriptor(o_base, shape=[seq_len, HEAD_DIM], strides=[stride_os, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        q = desc_q.load([start_m * BLOCK_M, 0])
        k_src = desc_k
        v_src = desc_v
    else:
        q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < seq_len,
                    other=0.0)
        k_src = k_base
        v_src = v_base

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        # Off-diagonal: every key block wholly left of this tile's first row, unmasked.
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, 0, start_m * BLOCK_M,
                                         offs_m, offs_n, offs_d, seq_len, stride_ks, stride_vs, qk_scale,
                                         False, False, USE_TMA, BLOCK_N, DOT_PRECISION)
        # Diagonal: the BLOCK_M keys facing this tile, masked (BLOCK_M % BLOCK_N == 0).
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, start_m * BLOCK_M,
                                         tl.minimum((start_m + 1) * BLOCK_M, seq_len),
                                         offs_m, offs_n, offs_d, seq_len, stride_ks, stride_vs, qk_scale,
                                         True, True, USE_TMA, BLOCK_N, DOT_PRECISION)
    else:
        full = (seq_len // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, 0, full,
                                         offs_m, offs_n, offs_d, seq_len, stride_ks, stride_vs, qk_scale,
                                         False, False, USE_TMA, BLOCK_N, DOT_PRECISION)
        # The ragged last key block, when seq_len is not a multiple of BLOCK_N.
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_src, v_src, full, seq_len,
                                         offs_m, offs_n, offs_d, seq_len, stride_ks, stride_vs, qk_scale,
                                         False, True, USE_TMA, BLOCK_N, DOT_PRECISION)

    if STORE_LSE:  # the row's log-sum-exp in the exp2 domain, [B, H, S] float32: what the backward needs
        tl.store(Lse + pid_bh.to(tl.int64) * seq_len + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < seq_len)
    out = (acc / l_i[:, None]).to(Out.dtype.element_ty)
    if USE_TMA:
        desc_o.store([start_m * BLOCK_M, 0], out)
    else:
        tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out, mask=offs_m[:, None] < seq_len)


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


def _keep(cfg: BlockConfig, seq_len: int, head_dim: int, elem: int) -> bool:
    if cfg.block_n > cfg.block_m:  # the causal split walks the diagonal in whole key blocks
        return False
    if (cfg in _WIDE_HEAD_ONLY) != (head_dim * elem > 256):
        return False
    if cfg.block_m > 64 and seq_len <= 64:
        return False
    return _smem_bytes(cfg, head_dim, elem) <= _SMEM_LIMIT


def _prune_configs(configs: list, named_args: dict, **_kwargs: Any) -> list:
    seq_len = named_args["seq_len"]
    head_dim = _kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    elem = named_args["Q"].element_size()
    kept = [c for c in configs
            if _keep(BlockConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages),
                     seq_len, head_dim, elem)]
    return kept or [min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_stages))]


def autotune_space(seq_len: int, head_dim: int, elem: int = 2) -> list[BlockConfig]:
    """The configurations the autotuner will time for this shape (for reports and tests)."""
    return [c for c in AUTOTUNE_SPACE if _keep(c, seq_len, head_dim, elem)]


_attn_fwd_tuned = triton.autotune(
    configs=[c.as_triton() for c in AUTOTUNE_SPACE],
    key=["seq_len", "HEAD_DIM", "CAUSAL", "USE_TMA", "STORE_LSE"],
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


def attention(q: Any, k: Any, v: Any, causal: bool, config: BlockConfig | None = None,
              return_lse: bool = False) -> Any:
    """softmax(q kᵀ / sqrt(D)) v for [B, H, S, D] tensors (k, v may have fewer heads).

    Without `config` the autotuner picks the launch configuration (timed once per shape
    on first use); with it, that configuration is launched as given. `return_lse` also
    returns each row's log-sum-exp ([B, H, S] float32, base 2, scores scaled by
    log2(e)/sqrt(D)): the statistics the backward (`_backward.py`) recomputes P from.
    """
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    if k.shape != v.shape or k.shape[0] != batch or k.shape[2] != seq_len or k.shape[3] != head_dim:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: shapes do not match")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, seq_len), device=q.device, dtype=torch.float32) if return_lse else out
    use_tma = _tma_ok(q, k, v, out)
    if use_tma and not _interpreting():
        triton.set_allocator(_scratch)
    qk_scale = LOG2E / (head_dim ** 0.5)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    args = (q, k, v, out, lse,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            heads, heads // kv_heads, seq_len, qk_scale)
    meta = dict(HEAD_DIM=head_dim, CAUSAL=bool(causal), USE_TMA=use_tma, DOT_PRECISION=precision,
                STORE_LSE=bool(return_lse))
    if config is None and (os.environ.get(AUTOTUNE_ENV) == "0" or q.dtype == torch.float32):
        # fp32 is for checking, not speed: ieee-precision dots make the search slow for nothing.
        config = default_config(seq_len, head_dim, q.element_size())
    if config is None:
        def grid(m: dict) -> tuple[int, int]:
            return (batch * heads, triton.cdiv(seq_len, m["BLOCK_M"]))

        _attn_fwd_tuned[grid](*args, **meta)
    else:
        grid = (batch * heads, triton.cdiv(seq_len, config.block_m))
        _attn_fwd[grid](*args, **meta, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                        num_warps=config.num_warps, num_stages=config.num_stages)
    return (out, lse) if return_lse else out


def best_config(q: Any, causal: bool) -> BlockConfig | None:
    """The configuration the autotuner chose for this shape, once it has run."""
    seq_len, head_dim = q.shape[2], q.shape[3]
    for key, cfg in _attn_fwd_tuned.cache.items():
        if key[:3] == (seq_len, head_dim, bool(causal)) and str(q.dtype).replace("torch.", "") in str(key):
            return BlockConfig(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)
    return None
