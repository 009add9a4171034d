"""Variants built by torch.compile: FlexAttention with a causal block mask, and compiled in-place attention."""

from __future__ import annotations

from typing import Any

from attnprof import devices
from attnprof.masks import MASK_KINDS, SCORE_MODS, Mask, alibi_slopes, softcap_value
from attnprof.registry import ExecutedPairs, RunSpec, Variant
from attnprof.variants.handwritten import HANDWRITTEN_MASKING, build_state, inplace_forward


def fresh_compile_state() -> None:
    """Forget what torch.compile compiled for earlier cells, so this cell compiles as a new process would.

    `dynamic=False` compiles once per shape, and Dynamo keeps at most `recompile_limit` (8) graphs per
    function: past that it silently runs the function uncompiled. In a sweep, FlexAttention at the 9th
    shape then fell back to its eager path (116 kernels and S×S scores instead of 1 fused kernel: seen on
    the H200 at 4x16x8192x64) while still reported as `flex`. Resetting in setup (outside the timed and
    profiled region) gives every cell its own compile.
    """
    import torch

    torch._dynamo.reset()


def mask_mod(mask: Mask, q_len: int, kv_len: int) -> Any:
    """FlexAttention's mask_mod of `mask` (attnprof.masks' rules, bottom-right aligned); None for none."""
    offset = kv_len - q_len
    size = mask.size or 0
    length = kv_len // size if mask.kind == "documents" else 0

    def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx + offset >= kv_idx

    def sliding_window(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx + offset >= kv_idx) & (q_idx + offset - kv_idx < size)

    def documents(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx + offset >= kv_idx) & ((q_idx + offset) // length == kv_idx // length)

    def prefix(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx + offset >= kv_idx) | (kv_idx < size)

    mods = {"causal": causal, "sliding_window": sliding_window, "documents": documents, "prefix": prefix}
    return mods.get(mask.kind)


def score_mod_fn(spec: RunSpec) -> Any:
    """FlexAttention's score_mod of the spec's score mod (softcap, ALiBi), or None."""
    import torch

    cap = softcap_value(spec.score_mod)
    if cap is not None:

        def softcap(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return cap * torch.tanh(score / cap)

        return softcap
    if spec.score_mod == "alibi":
        slopes = alibi_slopes(spec.heads, spec.device)
        offset = spec.n_keys - spec.n_queries

        def alibi(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return score - slopes[h] * (q_idx + offset - kv_idx)

        return alibi
    return None


# Checks read versions and find modules without importing torch, so `attnprof list` stays fast.


def _compile_check(spec: RunSpec) -> str | None:
    version = devices.torch_version()
    if version is None or version < (2, 0):
        return "needs torch.compile (torch >= 2.0)"
    if spec.device_type == "cuda" and not devices.triton_installed():
        return "torch.compile on CUDA needs triton"
    return None


def _flex_check(spec: RunSpec) -> str | None:
    version = devices.torch_version()
    if version is None or version < (2, 5):
        return "needs torch.nn.attention.flex_attention (torch >= 2.5)"
    if spec.head_dim < 16 or spec.head_dim & (spec.head_dim - 1):
        return f"flex attention needs a power-of-two head_dim >= 16 (got {spec.head_dim})"
    return _compile_check(spec)


def _flex_setup(spec: RunSpec) -> dict[str, Any]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fresh_compile_state()
    block_mask = None
    mod = mask_mod(spec.mask_spec, spec.n_queries, spec.n_keys)
    if mod is not None:
        block_mask = create_block_mask(
            mod, B=None, H=None, Q_LEN=spec.n_queries, KV_LEN=spec.n_keys, device=spec.device
        )
    return {
        "fn": torch.compile(flex_attention, dynamic=False),
        "block_mask": block_mask,
        "score_mod": score_mod_fn(spec),
        "gqa": spec.n_kv_heads != spec.heads,
    }


def _flex_forward(q: Any, k: Any, v: Any, causal: bool, state: dict[str, Any]) -> Any:
    return state["fn"](q, k, v, score_mod=state["score_mod"], block_mask=state["block_mask"], enable_gqa=state["gqa"])


def block_mask_pairs(block_mask: Any, batch: int, heads: int, q_len: int, kv_len: int) -> int:
    """The (query, key) pairs FlexAttention computes under `block_mask`, summed over batch and query heads:
    every pair of its full and partial blocks (BLOCK_SIZE each), cut at q_len and kv_len. None (no mask):
    every pair. A mask made with B or H None (size 1) holds for every batch or head alike."""
    import torch

    if block_mask is None:
        return batch * heads * q_len * kv_len
    q_block, kv_block = block_mask.BLOCK_SIZE
    lists = [(block_mask.kv_num_blocks, block_mask.kv_indices)]
    if block_mask.full_kv_num_blocks is not None:
        lists.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices))
    total = 0
    for counts, indices in lists:
        counts, indices = counts.to("cpu", torch.int64), indices.to("cpu", torch.int64)
        starts = indices * kv_block
        cols = (kv_len - starts).clamp(min=0, max=kv_block)  # keys of each listed block, cut at kv_len
        listed = torch.arange(indices.shape[-1]) < counts[..., None]  # the first counts[...] entries are real
        per_q_block = (cols * listed).sum(-1)  # [b, h, q blocks]
        q_starts = torch.arange(per_q_block.shape[-1]) * q_block
        rows = (q_len - q_starts).clamp(min=0, max=q_block)
        b, h = per_q_block.shape[:2]
        total += int((per_q_block * rows).sum()) * (batch // b) * (heads // h)
    return total


def _flex_executed_pairs(spec: RunSpec, state: dict[str, Any]) -> ExecutedPairs:
    """The pairs of the block mask's non-empty blocks; the backward walks the same blocks (transposed)."""
    return ExecutedPairs(block_mask_pairs(state["block_mask"], spec.batch, spec.heads, spec.n_queries, spec.n_keys))


def _compiled_setup(spec: RunSpec) -> dict[str, Any]:
    import torch

    fresh_compile_state()
    return {"fn": torch.compile(inplace_forward, dynamic=False), "mask": build_state(spec)}


def _compiled_forward(q: Any, k: Any, v: Any, causal: bool, state: dict[str, Any]) -> Any:
    return state["fn"](q, k, v, causal, state["mask"])


def variants() -> list[Variant]:
    """`flex` and `compiled`."""
    return [
        Variant(
            name="flex",
            description="torch.compile'd FlexAttention with the mask as a block mask, score mods as score_mod",
            forward=_flex_forward,
            setup=_flex_setup,
            check=_flex_check,
            masks=frozenset(MASK_KINDS),
            score_mods=frozenset(SCORE_MODS),
            unequal_lengths=True,
            executed_pairs=_flex_executed_pairs,
        ),
        Variant(
            name="compiled",
            description="torch.compile of the in-place variant",
            forward=_compiled_forward,
            setup=_compiled_setup,
            check=_compile_check,
            **HANDWRITTEN_MASKING,
            # its compiled backward mutates what the forward saved: run again on the same graph it gives
            # NaN or "modified by an inplace operation", so `bwd` runs a fresh forward before each one
            repeatable_backward=False,
        ),
    ]
