"""Attention written by hand from primitives: matmul, scale, mask, softmax, matmul."""

from __future__ import annotations

import math
from typing import Any

from attnprof.registry import RunSpec, Variant


def build_causal_mask(spec: RunSpec) -> Any:
    """The boolean [seq, seq] mask that is True above the diagonal (positions to hide)."""
    import torch

    if not spec.causal:
        return None
    return torch.ones(spec.seq, spec.seq, dtype=torch.bool, device=spec.device).triu_(1)


def expand_kv(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Repeat key/value heads to match the query heads (grouped-query attention)."""
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def naive_forward(q: Any, k: Any, v: Any, causal: bool, state: Any, attn_mask: Any = None) -> Any:
    """Out-of-place masking: `masked_fill` returns a new tensor, so it copies the scores.

    `attn_mask` (bool, True = may attend) is only used by the masking probe.
    """
    import torch

    k, v = expand_kv(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores = scores * (1.0 / math.sqrt(q.shape[-1]))
    if state is not None:
        scores = scores.masked_fill(state, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


def inplace_forward(q: Any, k: Any, v: Any, causal: bool, state: Any, attn_mask: Any = None) -> Any:
    """In-place masking with `masked_fill_`: no copy of the scores."""
    import torch

    k, v = expand_kv(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores = torch.mul(scores, 1.0 / math.sqrt(q.shape[-1]))
    if state is not None:
        scores.masked_fill_(state, float("-inf"))
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


def variants() -> list[Variant]:
    """The `naive` and `inplace` variants."""
    return [
        Variant(
            name="naive",
            description="hand-written matmul, scale, out-of-place masked_fill, softmax, matmul; mask built once",
            forward=naive_forward,
            setup=build_causal_mask,
        ),
        Variant(
            name="inplace",
            description="like naive, but masks in place with masked_fill_",
            forward=inplace_forward,
            setup=build_causal_mask,
        ),
    ]
