"""Paged KV caches: the config's `kv_cache: {page_size: N}`, and the fragmented page pool a paged cell
reads. Imports nothing of attnprof; torch only inside `shuffled_page_table` and `paged_pool`.

A paged cell keeps each sequence's kv_len keys (and values) in kv_len / page_size pages of a shared
pool of batch · kv_len / page_size pages. The page table maps sequence b's logical page i to a
physical page: a seeded random permutation of the whole pool (`shuffled_page_table`), so neighbouring
pages of one sequence are scattered as in a long-running server's cache, not laid out in order.
Every page is full: page_size divides kv_len.
"""

from __future__ import annotations

import difflib
from typing import Any

KV_CACHE_KEYS = ("page_size",)
PAGE_TABLE_ENTRY_BYTES = 4  # an int32 physical page index (flash-attn's block_table, flex's kv_indices)
PAGE_SEED_OFFSET = 2  # the page table's generator seed = the inputs' seed + this, so the two differ


def parse_kv_cache(value: Any) -> int | None:
    """The page size of a config's `kv_cache` (None or null: not paged; `{page_size: N}`); ValueError
    (one line, with a close match for an unknown key) otherwise."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("kv_cache must be null or {page_size: N}")
    for key in value:
        if key not in KV_CACHE_KEYS:
            close = difflib.get_close_matches(str(key), KV_CACHE_KEYS, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(KV_CACHE_KEYS)}"
            raise ValueError(f"unknown kv_cache key {key!r}{hint}")
    if "page_size" not in value:
        raise ValueError("kv_cache needs a page_size: {page_size: N}")
    return positive_page_size(value["page_size"])


def positive_page_size(value: Any) -> int:
    """`value` as a page size: a positive integer (not a bool, not a fraction); ValueError otherwise."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"page_size must be a positive integer (got {value!r})")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"page_size must be a positive integer (got {value!r})") from None
    if number <= 0:
        raise ValueError(f"page_size must be a positive integer (got {value!r})")
    return number


def page_size_problem(page_size: int | None, kv_len: int) -> str | None:
    """Why pages of `page_size` positions do not hold kv_len keys exactly, or None (also when not paged)."""
    if page_size is not None and kv_len % page_size:
        return f"page_size {page_size} does not divide kv_len {kv_len}"
    return None


def page_label(page_size: int | None) -> str:
    """The shape label's suffix: '' when not paged, else `paged64`."""
    return "" if page_size is None else f"paged{page_size}"


def page_table_entries(batch: int, kv_len: int, page_size: int) -> int:
    """Entries of the page table: one physical page index per page of each sequence."""
    return batch * (kv_len // page_size)


def shuffled_page_table(batch: int, kv_len: int, page_size: int, seed: int, device: Any = "cpu") -> Any:
    """The [batch, kv_len / page_size] int64 page table: sequence b's logical page i lives in physical
    page table[b, i], a seeded random permutation of the batch · kv_len / page_size pages of the pool."""
    import torch

    pages = kv_len // page_size
    generator = torch.Generator().manual_seed(seed + PAGE_SEED_OFFSET)
    return torch.randperm(batch * pages, generator=generator).view(batch, pages).to(device)


def paged_pool(cache: Any, table: Any, page_size: int) -> Any:
    """The page pool of a logical [batch, kv_heads, kv_len, head_dim] cache laid out by `table`: a
    [pages, page_size, kv_heads, head_dim] tensor (flash-attn's paged k_cache layout) whose page
    table[b, i] holds positions i · page_size ... (i + 1) · page_size − 1 of sequence b."""
    batch, heads, kv_len, head_dim = cache.shape
    pages = table.shape[1]
    by_page = cache.reshape(batch, heads, pages, page_size, head_dim).permute(0, 2, 3, 1, 4)
    pool = cache.new_empty(batch * pages, page_size, heads, head_dim)
    pool[table.reshape(-1).to(cache.device)] = by_page.reshape(batch * pages, page_size, heads, head_dim)
    return pool
