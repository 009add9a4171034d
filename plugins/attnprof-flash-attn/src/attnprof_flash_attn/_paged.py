"""A paged KV cache through FA2's `flash_attn.flash_attn_with_kvcache` (the `flash-attn` variant's paged cells):
finding the function, the cache `prepare_inputs` builds, the call, and why a spec cannot be run this way; and the
two helpers the package shares with it (`first_line`, `unwrap`)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnprof import RunSpec

KVCACHE_LABEL = "FA2 (flash_attn.flash_attn_with_kvcache)"
FA2_PAGE_MULTIPLE = 256  # FA2's paged kernel: "Paged KV cache block size must be divisible by 256"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unwrap(out: Any) -> Any:
    # FA4 (and some FA3 releases) return (out, softmax_lse).
    return out[0] if isinstance(out, (tuple, list)) else out


def find_kvcache() -> Callable[..., Any] | str:
    """FA2's `flash_attn.flash_attn_with_kvcache` when it takes a `block_table` (a paged KV cache), or a
    one-line reason why not. Not cached: the import is, by Python."""
    why = "a paged KV cache in flash-attn needs FA2's flash_attn.flash_attn_with_kvcache with block_table"
    try:
        func = getattr(importlib.import_module("flash_attn"), "flash_attn_with_kvcache", None)
    except Exception as exc:
        return f"{why}: {first_line(exc)}"
    if func is None:
        return f"{why}: the installed flash_attn has no flash_attn_with_kvcache"
    try:
        takes_table = "block_table" in inspect.signature(func).parameters
    except (TypeError, ValueError):  # a compiled function without a signature
        takes_table = False
    if not takes_table:
        return f"{why}: the installed one takes no block_table (flash-attn >= 2.5 does)"
    return func


@dataclass
class PagedCache:
    """A paged cell's cache, built by `prepare_inputs` outside the timed region: the k and v page pools
    [pages, page_size, kv_heads, head_dim], the int32 block table [batch, kv_len / page_size] and the
    int32 cache lengths [batch] (every sequence holds kv_len keys)."""

    k_cache: Any
    v_cache: Any
    block_table: Any
    cache_seqlens: Any


def call_paged(func: Callable[..., Any], q: Any, cache: PagedCache, causal: bool) -> Any:
    return unwrap(
        func(
            q,
            cache.k_cache,
            cache.v_cache,
            cache_seqlens=cache.cache_seqlens,
            block_table=cache.block_table,
            softmax_scale=q.shape[-1] ** -0.5,
            causal=causal,
        )
    )


def paged_reason(spec: RunSpec) -> str | None:
    """Why the installed FlashAttention cannot read the spec's paged cache (`find_kvcache`, FA2's page
    size rule), or None."""
    found = find_kvcache()
    if isinstance(found, str):
        return found
    if spec.page_size is not None and spec.page_size % FA2_PAGE_MULTIPLE:
        return f"{KVCACHE_LABEL} needs page_size divisible by {FA2_PAGE_MULTIPLE} (got {spec.page_size})"
    return None
