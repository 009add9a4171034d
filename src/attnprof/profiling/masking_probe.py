"""The masking probe: does a variant return NaN in query rows that see no key? (`probe_fully_masked`, the
row field `nan_on_fully_masked`.) A variant takes part when its forward declares an `attn_mask` keyword."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from attnprof.profiling.inputs import make_inputs, to_bhsd
from attnprof.registry import RunSpec, Variant

PROBE_SHAPE = (1, 2, 32, 32)  # batch, heads, seq, head_dim of the masking probe
PROBE_PADDING = 4  # left-padding positions; with causal masking their query rows see no key


def accepts_attn_mask(variant: Variant) -> bool:
    """True when the variant's forward has an `attn_mask` parameter (the masking-probe protocol)."""
    try:
        params = inspect.signature(variant.forward).parameters
    except (TypeError, ValueError):
        return False
    param = params.get("attn_mask")
    return param is not None and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)


def fully_masked_mask(batch: int, seq: int, padding: int, device: Any) -> Any:
    """A [B, 1, S, S] bool mask (True = may attend): causal plus `padding` left-padded keys.

    Query rows 0..padding-1 can see only padding keys, so every key is masked for them.
    """
    import torch

    pos = torch.arange(seq, device=device)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= padding)
    return allowed.expand(batch, 1, seq, seq).contiguous()


def masking_probe(variant: Variant, spec: RunSpec, seed: int = 0) -> bool | None:
    """Whether the variant returns NaN in fully masked query rows; None when not probed.

    Protocol: the variant's forward declares an `attn_mask` keyword; it is called as
    `forward(q, k, v, False, state, attn_mask=mask)` with the [B, 1, S, S] bool mask of
    `fully_masked_mask` (SDPA's convention: True = may attend; causality is in the mask, so
    `causal` is False). None when the forward has no `attn_mask`, the variant cannot run the
    spec, or it raises with a mask (e.g. the flash backend, which takes no mask).
    """
    import torch

    if not accepts_attn_mask(variant) or variant.unavailable_reason(spec) is not None:
        return None
    padding = min(PROBE_PADDING, spec.seq - 1)
    q, k, v = make_inputs(spec, seed, variant.layout)
    mask = fully_masked_mask(spec.batch, spec.seq, padding, q.device)
    try:
        state = variant.setup(spec) if variant.setup is not None else None
        with warnings.catch_warnings():  # SDPA explains at length why a backend refuses a mask
            warnings.simplefilter("ignore")
            out = variant.forward(q, k, v, False, state, attn_mask=mask)
    except Exception:
        return None
    rows = to_bhsd(out, variant.layout)[:, :, :padding]
    return bool(torch.isnan(rows).any().item())


def probe_fully_masked(variant: Variant, device: str, dtype: str, seed: int = 0) -> bool | None:
    """`masking_probe` on a small non-causal shape (1x2x32x32) on `device` in `dtype`."""
    batch, heads, seq, head_dim = PROBE_SHAPE
    spec = RunSpec(device=device, dtype=dtype, batch=batch, heads=heads, seq=seq, head_dim=head_dim, causal=False)
    return masking_probe(variant, spec, seed)
