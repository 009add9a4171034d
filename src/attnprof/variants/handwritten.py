"""Attention written by hand from primitives: matmul, scale, mask, softmax, matmul.

Attention sinks (score_mod `sinks`): the forward takes `sinks`, one logit per query head, appended to the
masked scores as one more column before the softmax and dropped after it (gpt-oss's reference form; the
concatenation copies the scores in both variants)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from attnprof.masks import MASK_KINDS, SCORE_MODS, alibi_slopes, dense_mask, softcap_value
from attnprof.registry import RunSpec, Variant
from attnprof.varlen import packed_dense_mask


class ScoreState(NamedTuple):
    """What setup builds once for a score mod: the hidden positions, ALiBi's bias, the softcap."""

    hide: Any  # bool [q_len, kv_len], True = hide; None: no mask
    bias: Any  # float [heads, q_len, kv_len] added to the scores (ALiBi); None: none
    softcap: float | None


def build_causal_mask(spec: RunSpec) -> Any:
    """The boolean [q_len, kv_len] mask that is True where the spec's mask hides a key (above the
    diagonal when causal, bottom-right aligned; a packed batch's other sequences); None without a mask."""
    if spec.seq_lens is not None:
        return ~packed_dense_mask(spec.seq_lens, spec.causal, spec.device)
    if spec.mask.kind == "none":
        return None
    return ~dense_mask(spec.mask, spec.n_queries, spec.n_keys, spec.device)


def build_state(spec: RunSpec) -> Any:
    """The mask of `build_causal_mask`, or a `ScoreState` with a score mod."""
    hide = build_causal_mask(spec)
    if spec.score_mod is None:
        return hide
    return ScoreState(hide, alibi_bias(spec), softcap_value(spec.score_mod))


def alibi_bias(spec: RunSpec) -> Any:
    """ALiBi's [heads, q_len, kv_len] bias −slope_h·(p − j) (p the query's position), or None."""
    import torch

    if spec.score_mod != "alibi":
        return None
    p = torch.arange(spec.n_queries, device=spec.device)[:, None] + (spec.n_keys - spec.n_queries)
    j = torch.arange(spec.n_keys, device=spec.device)[None, :]
    slopes = alibi_slopes(spec.heads, spec.device)
    return -(slopes[:, None, None] * (p - j)[None].float()).to(torch.float32)


def _parts(state: Any) -> tuple[Any, Any, float | None]:
    if isinstance(state, ScoreState):
        return state.hide, state.bias, state.softcap
    return state, None, None


def _score_mod(scores: Any, bias: Any, softcap: float | None) -> Any:
    import torch

    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    return scores


def expand_kv(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Repeat key/value heads to match the query heads (grouped-query attention)."""
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def softmax_with_sinks(scores: Any, sinks: Any) -> Any:
    """Softmax over the keys with one more logit per head (`sinks`, [heads]) in each row's denominator;
    plain softmax when `sinks` is None."""
    import torch

    if sinks is None:
        return torch.softmax(scores, dim=-1)
    column = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def naive_forward(q: Any, k: Any, v: Any, causal: bool, state: Any, attn_mask: Any = None, sinks: Any = None) -> Any:
    """Out-of-place masking: `masked_fill` returns a new tensor, so it copies the scores.

    `attn_mask` (bool, True = may attend) is only used by the masking probe; `sinks` (a `sinks` cell's
    logits, one per query head) join the softmax's denominator.
    """
    import torch

    hide, bias, softcap = _parts(state)
    k, v = expand_kv(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores = _score_mod(scores * (1.0 / math.sqrt(q.shape[-1])), bias, softcap)
    if hide is not None:
        scores = scores.masked_fill(hide, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = softmax_with_sinks(scores, sinks)
    return torch.matmul(weights, v)


def inplace_forward(q: Any, k: Any, v: Any, causal: bool, state: Any, attn_mask: Any = None, sinks: Any = None) -> Any:
    """In-place masking with `masked_fill_`: no copy of the scores (`sinks` as in `naive_forward`)."""
    import torch

    hide, bias, softcap = _parts(state)
    k, v = expand_kv(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores = _score_mod(torch.mul(scores, 1.0 / math.sqrt(q.shape[-1])), bias, softcap)
    if hide is not None:
        scores.masked_fill_(hide, float("-inf"))
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, float("-inf"))
    weights = softmax_with_sinks(scores, sinks)
    return torch.matmul(weights, v)


#: Every mask, as a dense tensor built in setup (causal too; a packed batch's block diagonal), every score
#: mod, decode, packed seq_lens.
HANDWRITTEN_MASKING: dict[str, Any] = {
    "masks": frozenset(MASK_KINDS),
    "dense_masks": frozenset(MASK_KINDS) - {"none"},
    "score_mods": frozenset(SCORE_MODS),
    "unequal_lengths": True,
    "varlen": True,
}


def variants() -> list[Variant]:
    """The `naive` and `inplace` variants."""
    return [
        Variant(
            name="naive",
            description="hand-written matmul, scale, out-of-place masked_fill, softmax, matmul; mask built once",
            forward=naive_forward,
            setup=build_state,
            **HANDWRITTEN_MASKING,
        ),
        Variant(
            name="inplace",
            description="like naive, but masks in place with masked_fill_",
            forward=inplace_forward,
            setup=build_state,
            **HANDWRITTEN_MASKING,
        ),
    ]
