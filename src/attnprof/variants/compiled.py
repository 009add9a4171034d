"""Variants built by torch.compile: FlexAttention with the cell's block mask (over a paged KV cache when the
cell has one), and compiled in-place attention.

Paged flex (`RunSpec.page_size`): setup builds the logical block mask with key blocks of one page
(B = batch: each sequence has its own pages); `prepare_inputs` lays k and v out in a page pool by a
seeded shuffled page table (`attnprof.kv_cache`), loads that table into torch's `PagedAttention`
(torch >= 2.6), and converts the block mask and score mod to physical positions with it. The forward
reads the pool, [1, kv_heads, pages · page_size, head_dim], every query batch sharing it.

Attention sinks through flex: its score_mod rewrites the score of a key that exists, and a sink adds a term
to each row's denominator with no key. Flex returns each row's log-sum-exp L of its scores, though, and
Σ exp(z) / (Σ exp(z) + exp(s)) = sigmoid(L − s), so the output with a sink is flex's output times
sigmoid(L − s_h) per row: exact, and differentiable (flex's backward takes the gradient of L), in one
compiled function with flex (torch >= 2.9, which returns L through `AuxRequest`; on CUDA only: the CPU
kernel of torch.compile'd flex returns no L).
"""

from __future__ import annotations

from typing import Any

from attnprof import devices
from attnprof.kv_cache import paged_pool, shuffled_page_table
from attnprof.masks import MASK_KINDS, SCORE_MODS, Mask, alibi_slopes, softcap_value
from attnprof.registry import ExecutedPairs, RunSpec, Variant
from attnprof.variants.handwritten import HANDWRITTEN_MASKING, build_state, inplace_forward

FLEX_Q_BLOCK = 128  # flex's default sparse block size, kept for the queries of a paged block mask
PAGED_TORCH = (2, 6)  # torch.nn.attention.experimental's PagedAttention, and K/V shared across the batch
TRITON_MIN_TILE = 16  # Triton's smallest dot tile: flex decoding's key tile is at most one page
FLEX_DECODE_MAX_Q = 128  # flex runs its decoding kernel below this many queries, its attention kernel from it
FLEX_MAX_KEY_TILE = 128  # the largest key tile (BLOCK_N) of flex's attention kernel's default configs
FLEX_SINKS_TORCH = (2, 9)  # flex_attention(return_aux=AuxRequest(lse=True))


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


def packed_mask_mod(spec: RunSpec) -> Any:
    """FlexAttention's document mask_mod of a packed batch: query and key in the same sequence (each token's
    sequence looked up in a [total] tensor), and key ≤ query when causal."""
    import torch

    assert spec.seq_lens is not None
    lengths = torch.tensor(spec.seq_lens, device=spec.device)
    document = torch.repeat_interleave(torch.arange(len(spec.seq_lens), device=spec.device), lengths)

    def same_sequence(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return document[q_idx] == document[kv_idx]

    def causal_in_sequence(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)

    return causal_in_sequence if spec.causal else same_sequence


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
    if spec.page_size is not None and (reason := _paged_reason(spec, version)):
        return reason
    if spec.score_mod == "sinks" and version < FLEX_SINKS_TORCH:
        return "sinks through flex need its log-sum-exp output, AuxRequest (torch >= 2.9)"
    if spec.score_mod == "sinks" and spec.device_type == "cpu":
        return "sinks through flex need its log-sum-exp output, which torch.compile's CPU flex kernel does not give"
    return _compile_check(spec)


def _paged_reason(spec: RunSpec, version: tuple[int, ...]) -> str | None:
    """Why flex cannot read the spec's paged cache: a key block of the block mask is one page, and
    inductor's Triton kernels need it to be a whole number of their key tiles (flex decoding shrinks its
    tile to the page, down to Triton's 16; the attention kernel keeps its own, up to 128). The CPU
    kernel takes any page size."""
    if version < PAGED_TORCH:
        return "a paged KV cache through flex needs torch >= 2.6 (torch.nn.attention.experimental.PagedAttention)"
    page = spec.page_size or 0
    if spec.device_type != "cuda":
        return None
    if page < TRITON_MIN_TILE or page & (page - 1):
        return f"flex on CUDA needs a power-of-two page_size >= {TRITON_MIN_TILE} (its key tile; got {page})"
    if spec.n_queries >= FLEX_DECODE_MAX_Q and page % FLEX_MAX_KEY_TILE:
        return (
            f"flex on CUDA needs page_size a multiple of {FLEX_MAX_KEY_TILE} at q_len >= {FLEX_DECODE_MAX_Q} "
            f"(its attention kernel's key tile; got {page})"
        )
    return None


def _flex_setup(spec: RunSpec) -> dict[str, Any]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention, noop_mask

    fresh_compile_state()
    block_mask = None
    mod = mask_mod(spec.mask, spec.n_queries, spec.n_keys) if spec.seq_lens is None else packed_mask_mod(spec)
    if spec.page_size is not None:  # one key block per page, per sequence: PagedAttention maps them
        block_mask = create_block_mask(
            mod or noop_mask,
            B=spec.batch,
            H=None,
            Q_LEN=spec.n_queries,
            KV_LEN=spec.n_keys,
            device=spec.device,
            BLOCK_SIZE=(FLEX_Q_BLOCK, spec.page_size),
        )
    elif mod is not None:
        block_mask = create_block_mask(
            mod, B=None, H=None, Q_LEN=spec.n_queries, KV_LEN=spec.n_keys, device=spec.device
        )
    attend: Any = flex_with_sinks if spec.score_mod == "sinks" else flex_attention
    return {
        "fn": torch.compile(attend, dynamic=False),
        "block_mask": block_mask,
        "score_mod": score_mod_fn(spec),
        "gqa": spec.n_kv_heads != spec.heads,
    }


def _flex_prepare_inputs(spec: RunSpec, state: dict[str, Any], q: Any, k: Any, v: Any, seed: int) -> dict[str, Any]:
    """For a paged cell: the page pool of k and v by a shuffled page table, and the block mask and score
    mod converted to physical positions (the module docstring); any other cell's state as it is."""
    if spec.page_size is None:
        return state
    import torch
    from torch.nn.attention.experimental._paged_attention import PagedAttention

    table = shuffled_page_table(spec.batch, spec.n_keys, spec.page_size, seed, spec.device)
    paged = PagedAttention(table.numel(), spec.page_size, spec.batch, device=spec.device)
    for b in range(spec.batch):
        paged.empty_pages = table[b].tolist()  # reserve() hands out these pages, in this order
        paged.reserve(torch.tensor(b, device=spec.device), torch.tensor(spec.n_keys, device=spec.device))
    if not torch.equal(paged.page_table[:, : table.shape[1]], table):
        raise RuntimeError("PagedAttention did not take the page table as given")
    score_mod = state["score_mod"]
    return state | {
        "k_cache": flex_pool(paged_pool(k, table, spec.page_size)),
        "v_cache": flex_pool(paged_pool(v, table, spec.page_size)),
        "page_table": table,
        "block_mask": paged.convert_logical_block_mask(state["block_mask"]),
        "score_mod": paged.get_score_mod(score_mod) if score_mod is not None else None,
    }


def flex_pool(pool: Any) -> Any:
    """A [pages, page_size, kv_heads, head_dim] page pool as flex reads it: [1, kv_heads, pages · page_size,
    head_dim], physical position page · page_size + offset (PagedAttention's addressing)."""
    pages, page_size, heads, head_dim = pool.shape
    return pool.permute(2, 0, 1, 3).reshape(1, heads, pages * page_size, head_dim)


def flex_with_sinks(q: Any, k: Any, v: Any, sinks: Any, **options: Any) -> Any:
    """flex_attention with one sink logit per query head (`sinks`, [heads]) in each row's denominator: its
    output times sigmoid(L − s_h), L the row's log-sum-exp (the module docstring); `options` go to flex."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    out, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True), **options)
    share = torch.sigmoid(aux.lse - sinks.float()[None, :, None])  # the keys' share of the row's weight
    return (out.float() * share[..., None]).to(out.dtype)


def _flex_forward(q: Any, k: Any, v: Any, causal: bool, state: dict[str, Any], sinks: Any = None) -> Any:
    if "k_cache" in state:  # paged: the pool, not the logical k and v
        k, v = state["k_cache"], state["v_cache"]
    options = {"score_mod": state["score_mod"], "block_mask": state["block_mask"], "enable_gqa": state["gqa"]}
    if sinks is not None:
        return state["fn"](q, k, v, sinks, **options)
    return state["fn"](q, k, v, **options)


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


def _compiled_forward(q: Any, k: Any, v: Any, causal: bool, state: dict[str, Any], sinks: Any = None) -> Any:
    return state["fn"](q, k, v, causal, state["mask"], sinks=sinks)


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
            paged_kv=True,
            prepare_inputs=_flex_prepare_inputs,
            varlen=True,  # a document mask_mod of the lengths (packed_mask_mod)
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
