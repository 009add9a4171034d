"""Packed variable-length batches (`RunSpec.seq_lens`) through SDPA: padded to a dense batch, the way a user
without a varlen kernel writes it, or as torch's nested jagged tensors.

Both take the packed [1, total, heads, head_dim] tensors (`bshd`, so a sequence is a contiguous run of rows)
and return the packed output, so the timed step includes what each needs around SDPA: `padded-sdpa` copies
the tokens into a zeroed [count, max, heads, head_dim] batch and gathers the output back; `nested-sdpa`
wraps the same memory as a nested tensor (`nested_tensor_from_jagged`, a view).

`padded-sdpa` right-pads each sequence: causal runs as `is_causal` (the padded keys come after every real
query's position, so no real query sees one), non-causal with a [count, 1, 1, max] key-padding mask. Its
executed FLOPs are the padded batch's under the same convention (`varlen.padded_pairs`), beside the useful
ones summed per sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from attnprof.errors import VariantUnavailableError, one_line
from attnprof.registry import ExecutedPairs, RunSpec, Variant
from attnprof.variants.sdpa import _sdpa, refusal_line
from attnprof.varlen import pad_index, padded_pairs

NESTED_SDPA_LOGGER = "torch.nested._internal.sdpa"  # where torch says why no backend takes nested inputs


@dataclass(frozen=True)
class Padded:
    """What `padded-sdpa` builds once per cell: each packed token's row in the padded batch, its size, and the
    key-padding mask (None when causal: is_causal hides the padding)."""

    index: Any
    count: int
    longest: int
    key_mask: Any


def _padded_setup(spec: RunSpec) -> Padded:
    import torch

    assert spec.seq_lens is not None
    longest = max(spec.seq_lens)
    key_mask = None
    if not spec.causal:
        lengths = torch.tensor(spec.seq_lens, device=spec.device)
        key_mask = (torch.arange(longest, device=spec.device)[None, :] < lengths[:, None])[:, None, None, :]
    return Padded(pad_index(spec.seq_lens, spec.device), len(spec.seq_lens), longest, key_mask)


def _padded_forward(q: Any, k: Any, v: Any, causal: bool, state: Padded) -> Any:
    def pad(t: Any) -> Any:
        rows = t.new_zeros(state.count * state.longest, *t.shape[2:]).index_copy(0, state.index, t[0])
        return rows.view(state.count, state.longest, *t.shape[2:]).transpose(1, 2)

    out = _sdpa(pad(q), pad(k), pad(v), causal, state.key_mask)
    return out.transpose(1, 2).reshape(-1, *q.shape[2:]).index_select(0, state.index)[None]


def _padded_executed_pairs(spec: RunSpec, state: Padded) -> ExecutedPairs:
    assert spec.seq_lens is not None
    return ExecutedPairs(spec.heads * padded_pairs(spec.seq_lens, spec.causal), padded=True)


def _nested(t: Any, offsets: Any) -> Any:
    """Packed [1, total, H, D] as a nested [count, H, j, D] tensor over the same memory."""
    import torch

    return torch.nested.nested_tensor_from_jagged(t[0], offsets).transpose(1, 2)


def _nested_setup(spec: RunSpec) -> Any:
    """The int64 offsets; first a call on 2 short sequences of the cell's dtype, heads and causality, so a
    refusal is a skip with torch's own reason (`NESTED_SDPA_LOGGER`) before anything is timed."""
    import torch

    from attnprof.profiling.inputs import torch_dtype
    from attnprof.varlen import offsets

    assert spec.seq_lens is not None
    probe = torch.tensor([0, 3, 8], device=spec.device)
    q = torch.zeros(1, 8, spec.heads, spec.head_dim, device=spec.device, dtype=torch_dtype(spec.dtype))
    k = torch.zeros(1, 8, spec.n_kv_heads, spec.head_dim, device=spec.device, dtype=q.dtype)
    try:
        _nested_forward(q, k, k, spec.causal, probe)
    except RuntimeError as exc:  # the math fallback's own refusals (GQA on the CPU: a nested matmul's batch)
        raise VariantUnavailableError(f"SDPA on nested jagged tensors: {one_line(exc, with_type=False)}") from None
    return torch.tensor(offsets(spec.seq_lens), device=spec.device)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _nested_forward(q: Any, k: Any, v: Any, causal: bool, state: Any) -> Any:
    import torch.nn.functional as F

    qn, kn, vn = (_nested(t, state) for t in (q, k, v))
    logger = logging.getLogger(NESTED_SDPA_LOGGER)
    handler = _Lines()
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False  # only a refusal logs: its lines become the reason
    try:
        out = F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    except RuntimeError as exc:
        if "No viable backend" not in str(exc):
            raise
        reason = refusal_line(handler.lines, "") or str(exc).splitlines()[0]
        raise VariantUnavailableError(f"SDPA on nested jagged tensors: {reason}") from None
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    return out.transpose(1, 2).values()[None]


def variants() -> list[Variant]:
    """`padded-sdpa` and `nested-sdpa`: packed seq_lens cells only."""
    packed = {"layout": "bshd", "varlen": True, "varlen_only": True}
    return [
        Variant(
            name="padded-sdpa",
            description="packed seq_lens padded to a dense batch (count x longest), SDPA dispatched, output unpadded",
            forward=_padded_forward,
            setup=_padded_setup,
            executed_pairs=_padded_executed_pairs,
            **packed,  # type: ignore[arg-type]
        ),
        Variant(
            name="nested-sdpa",
            description="packed seq_lens as nested jagged tensors (torch.nested), SDPA dispatched",
            forward=_nested_forward,
            setup=_nested_setup,
            **packed,  # type: ignore[arg-type]
        ),
    ]
