"""attnprof plugin: `triton-flash`, a FlashAttention-style forward kernel written in Triton.

This module imports neither triton nor torch: `check` and `setup` import them when asked,
so `attnprof list` shows the variant (as unavailable, with the reason) on machines without
them. The forward kernel lives in `attnprof_triton._kernel`; the backward kernels (dQ, dK, dV
from the row statistics the forward saves) in `attnprof_triton._backward`. `forward` launches
the bare forward kernel unless autograd is recording (the `bwd` and `fwd+bwd` modes give q, k, v
`requires_grad=True`); then it goes through `_backward.FlashAttention`, which also saves them.

Attention sinks (score_mod `sinks`) reach `forward` as `sinks=`, one logit per query head, and the
kernels fold them into each row's softmax (their gradient too). A packed batch (a shape's `seq_lens`)
comes in as [1, H, total, D]; setup leaves its `cu_seqlens` in the state, and each sequence attends
within itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attnprof import RunSpec, Variant
from attnprof.masks import Mask
from attnprof.registry import ExecutedPairs

__version__ = "0.1.0"

VARIANT_NAME = "triton-flash"
HEAD_DIMS = (16, 32, 64, 128, 256)
MASKS = ("causal", "none", "sliding_window", "documents", "prefix")  # the kernels' MASK codes
PLAIN_MASKS = ("causal", "none")  # what `forward`'s `causal` argument says alone
DESCRIPTION = (
    "FlashAttention-style forward and backward in Triton (this plugin): Q/KV tiling, online softmax, "
    "masks by key-block ranges (causal, sliding window, documents, prefix), decode, GQA, attention sinks, "
    "packed seq_lens (cu_seqlens); autotuned per shape"
)


def triton_missing() -> str | None:
    """Why triton cannot be used here, or None when it imports."""
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising something else
        return f"needs triton: {exc}"
    return None


def check(spec: RunSpec) -> str | None:
    """Why `triton-flash` cannot run `spec`, or None."""
    if spec.head_dim not in HEAD_DIMS:
        return f"head_dim must be a power of two from 16 to 256 (got {spec.head_dim})"
    if spec.heads % spec.n_kv_heads:
        return f"heads ({spec.heads}) must be a multiple of kv_heads ({spec.n_kv_heads})"
    if spec.dtype == "fp32" and spec.head_dim > 128:
        return f"fp32 needs head_dim <= 128 (got {spec.head_dim}): the tiles would not fit in shared memory"
    if reason := grid_problem(spec):
        return reason
    missing = triton_missing()
    if missing:
        return missing
    if spec.device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch sees none)"
        major, minor = torch.cuda.get_device_capability(spec.device)
        if major < 8:
            return f"needs compute capability 8.0 or newer (got {major}.{minor})"
    return None


MAX_GRID_ROWS = 65_535  # CUDA's limit on a grid's second axis: the backward's (batch or sequences) x heads
MAX_GRID_PROGRAMS = 2**31 - 1  # and on its first: the forward's flat axis
SMALLEST_BLOCK_M = 64  # the forward's narrowest query tile (AUTOTUNE_SPACE, default_config)


def grid_problem(spec: RunSpec) -> str | None:
    """Why the kernels' grids cannot hold `spec`, or None: the forward's programs (query tiles of the longest
    sequence x sequences x heads) on one axis, the backward's (batch or sequences) x heads on the second."""
    rows, longest = (spec.batch, spec.n_queries) if spec.seq_lens is None else (len(spec.seq_lens), max(spec.seq_lens))
    what = "batch" if spec.seq_lens is None else "sequences"
    programs = -(-longest // SMALLEST_BLOCK_M) * rows * spec.heads
    if programs > MAX_GRID_PROGRAMS:
        return f"the forward would launch {programs:,} programs, above CUDA's {MAX_GRID_PROGRAMS:,} on one axis"
    if spec.backward and rows * spec.heads > MAX_GRID_ROWS:
        return (f"the backward's grid has {what} x heads = {rows * spec.heads:,} rows, "
                f"above CUDA's {MAX_GRID_ROWS:,}")
    return None


@dataclass(frozen=True)
class TritonState:
    """What setup leaves for forward and for `executed_pairs`: the cell's mask (its text) and the tiles
    the kernels launch with: the forward's (BLOCK_M, BLOCK_N) as the autotuner chose them, and the
    backward's kernels' (BLOCK_M, BLOCK_N), dK/dV's then dQ's (None in the fwd mode, or not yet tuned).
    A packed batch's: `cu_seqlens` (int32 offsets on the cell's device) and its longest sequence."""

    mask: str
    forward_tiles: tuple[int, int] | None
    backward_tiles: tuple[tuple[int, int], tuple[int, int]] | None = None
    cu_seqlens: Any = None
    max_seqlen: int | None = None

    def packed(self) -> dict[str, Any]:
        """The kernels' packed-batch keywords (none when not packed)."""
        return {} if self.cu_seqlens is None else {"cu_seqlens": self.cu_seqlens, "max_seqlen": self.max_seqlen}


def setup(spec: RunSpec) -> TritonState:
    """Compile and autotune for this shape, mask, sinks and mode on throw-away inputs, outside any timed region.

    The autotuner keeps its choice per shape and mask kind (with sinks or not, packed or not), so `forward`
    launches the tuned kernel; the state carries the mask, a packed batch's offsets and the tiles it chose
    (`_kernel.launched_config`). In the backward modes a backward runs as well, which tunes its two kernels
    (`_backward.launched_configs`).
    """
    import torch

    from attnprof_triton import _kernel

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    q = torch.randn(spec.batch, spec.heads, spec.n_queries, spec.head_dim, device=spec.device, dtype=dtype)
    k = torch.randn(spec.batch, spec.n_kv_heads, spec.n_keys, spec.head_dim, device=spec.device, dtype=dtype)
    v = torch.randn_like(k)
    sinks = torch.zeros(spec.heads, device=spec.device, dtype=dtype) if spec.score_mod == "sinks" else None
    state = TritonState(spec.mask.text, None)
    if spec.seq_lens is not None:
        from attnprof.varlen import cu_seqlens_tensor

        state = TritonState(spec.mask.text, None, None, cu_seqlens_tensor(spec.seq_lens, spec.device),
                            max(spec.seq_lens))
    # the backward modes' forward saves lse: tune that kernel, and the backward's two
    if spec.backward:
        from attnprof_triton import _backward

        leaves = (q, k, v) if sinks is None else (q, k, v, sinks)
        for tensor in leaves:
            tensor.requires_grad_(True)
        with torch.enable_grad():
            out = _backward.FlashAttention.apply(q, k, v, spec.mask.text, sinks, state.cu_seqlens, state.max_seqlen)
        torch.autograd.grad(out, leaves, torch.randn_like(out))
    else:
        _kernel.attention(q, k, v, mask=spec.mask.text, sinks=sinks, **state.packed())
    if q.is_cuda:
        torch.cuda.synchronize(q.device)
    tuned = dict(max_seqlen=state.max_seqlen, n_seqs=len(spec.seq_lens or (1,)))
    config = _kernel.launched_config(q, k, spec.mask.text, sinks is not None, lse=spec.backward, **tuned)
    backward_tiles = None
    if spec.backward:
        configs = _backward.launched_configs(q, k, spec.mask.text, **tuned)
        if configs is not None:
            backward_tiles = ((configs[0].block_m, configs[0].block_n), (configs[1].block_m, configs[1].block_n))
    forward_tiles = (config.block_m, config.block_n) if config is not None else None
    return replace(state, forward_tiles=forward_tiles, backward_tiles=backward_tiles)


def forward(q: Any, k: Any, v: Any, causal: bool, state: TritonState | None = None, sinks: Any = None) -> Any:
    """One attention forward: [B, H, q_len, D] in, [B, H, q_len, D] out, a single kernel launch. The mask
    is the state's (a sized mask), else causal or none as `causal` says; `sinks` (one logit per query head)
    join every row's denominator; a packed batch's offsets come from the state. When autograd records (an
    input requires grad), the output's backward is ours too."""
    import torch

    from attnprof_triton import _kernel

    mask = state.mask if state is not None and state.mask not in PLAIN_MASKS else ("causal" if causal else "none")
    packed = state.packed() if state is not None else {}
    leaves = (q, k, v) if sinks is None else (q, k, v, sinks)
    if torch.is_grad_enabled() and any(t.requires_grad for t in leaves):
        from attnprof_triton._backward import FlashAttention

        return FlashAttention.apply(q, k, v, mask, sinks, packed.get("cu_seqlens"), packed.get("max_seqlen"))
    if sinks is not None:
        packed["sinks"] = sinks
    return _kernel.attention(q, k, v, mask=mask, **packed)


def key_range(mask: Mask, p_lo: int, p_hi: int, kv_len: int) -> tuple[int, int]:
    """The keys [lo, hi) some query of positions [p_lo, p_hi] keeps: the range a forward tile visits
    (the mirror of `_kernel._key_range`, without triton)."""
    lo, hi = 0, p_hi + 1
    if mask.kind == "none":
        hi = kv_len
    elif mask.kind == "sliding_window":
        lo = max(p_lo - (mask.size or 0) + 1, 0)
    elif mask.kind == "documents":
        length = kv_len // (mask.size or 1)
        lo = p_lo // length * length
    elif mask.kind == "prefix":
        hi = max(p_hi + 1, mask.size or 0)
    return lo, min(hi, kv_len)


def tile_pairs(mask: Mask, q_len: int, kv_len: int, block_m: int, block_n: int) -> int:
    """The (query, key) pairs of one head inside the tiles the kernels visit with BLOCK_M x BLOCK_N tiles:
    per query tile, every key block that overlaps its `key_range`, cut at q_len and kv_len."""
    offset = kv_len - q_len
    total = 0
    for start in range(0, q_len, block_m):
        rows = min(block_m, q_len - start)
        lo, hi = key_range(mask, start + offset, start + rows - 1 + offset, kv_len)
        first, last = lo // block_n * block_n, min(-(-hi // block_n) * block_n, kv_len)
        total += rows * max(last - first, 0)
    return total


def executed_pairs(spec: RunSpec, state: TritonState) -> ExecutedPairs | None:
    """The pairs the forward's tiles compute, summed over batch and query heads, and the backward's: its dK/dV
    kernel computes four of the seven tile products (S, dP, dV, dK) over its tiles and dQ three (S, dP, dQ)
    over its own, so the backward's pairs weigh them 4:3; None when the forward's tiles are unknown. A packed
    batch's tiles are each sequence's own (a program past its sequence's last tile computes nothing)."""
    if state.forward_tiles is None:
        return None
    mask = spec.mask
    lengths = [(spec.n_queries, spec.n_keys)] if spec.seq_lens is None else [(n, n) for n in spec.seq_lens]
    heads = spec.batch * spec.heads

    def pairs(tiles: tuple[int, int]) -> int:
        return sum(tile_pairs(mask, q_len, kv_len, *tiles) for q_len, kv_len in lengths)

    forward_pairs = heads * pairs(state.forward_tiles)
    if state.backward_tiles is None:
        return ExecutedPairs(forward_pairs)
    dkdv, dq = (pairs(tiles) for tiles in state.backward_tiles)
    return ExecutedPairs(forward_pairs, round(heads * (4 * dkdv + 3 * dq) / 7))


def make_variant() -> Variant:
    """The `triton-flash` Variant (also handy for tests that skip the entry point)."""
    return Variant(
        name=VARIANT_NAME,
        description=DESCRIPTION,
        forward=forward,
        devices=("cuda",),
        dtypes=("bf16", "fp16", "fp32"),
        check=check,
        setup=setup,
        layout="bhsd",
        has_backward=True,  # `_backward.py`: dQ, dK, dV kernels of our own
        # the kernels skip the key blocks no row of a tile keeps and mask only the boundary ones
        masks=frozenset(MASKS),
        score_mods=frozenset({"sinks"}),  # in the running max and denominator; dsinks in the backward
        unequal_lengths=True,  # q_len < kv_len, bottom-right aligned, forward and backward
        varlen=True,  # seq_lens: cu_seqlens, each sequence's own tiles, forward and backward
        executed_pairs=executed_pairs,
    )


def register_variants(register: Any) -> None:
    """The `attnprof.variants` entry-point hook."""
    register(make_variant())
    register_fp8_variant(register)


FP8_VARIANT_NAME = "triton-flash-fp8"


def register_fp8_variant(register: Any) -> None:
    """`triton-flash-fp8`, the e4m3 forward (`_fp8_variant`; imports neither torch nor triton)."""
    from attnprof_triton._fp8_variant import make_fp8_variant

    register(make_fp8_variant())
