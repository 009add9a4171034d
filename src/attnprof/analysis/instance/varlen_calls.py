"""Packed variable-length attention calls in any trace: which calls run on sequences of different lengths
packed together, how many, and their FLOPs summed per sequence where the recorded shapes give the lengths.

Three kinds are recognised, by the names `call_names.varlen_kind` finds once per trace and by shapes:

- `nested`: SDPA on nested jagged tensors (`torch.nested`, layout jagged). On the CPU torch's math path
  pads them inside the call (`aten::to_padded_tensor`) after unbinding them just before it
  (`aten::_nested_tensor_from_tensor_list`, whose `Input Dims` list each sequence's [length, heads,
  head_dim]: the lengths, so the FLOPs are exact; the nearest one before the call, at most `LOOKBACK` ops
  back, is q's); on CUDA the backend op gets the packed values with `cum_seq_q` (its fourth input, 1-D:
  the sequences are its length less one);
- `flash-attn varlen`: flash-attn's varlen functions (an op whose name holds "varlen" in any case,
  e.g. `flash_attn::_flash_attn_varlen_forward`), q [total, heads, head_dim] and cu_seqlens [count + 1];
- a backend op called with `cum_seq_q` directly is `nested` too (that is how SDPA passes jagged inputs).

FlexAttention with a document mask cannot be told from another flex call in a trace: the mask is in its
compiled graph, not in the recorded shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnprof.analysis.trace.tables import ParsedTrace

NESTED = "nested"
FLASH_VARLEN = "flash-attn varlen"
#: The op whose `Input Dims` list the sequences one by one (nested math on the CPU).
UNBOUND_OP = "aten::_nested_tensor_from_tensor_list"
#: Backend ops whose fourth input is `cum_seq_q` (None for dense inputs, a 1-D tensor for jagged ones).
CUM_SEQ_OPS = frozenset({"aten::_flash_attention_forward", "aten::_efficient_attention_forward"})
_CUM_SEQ_INPUT = 3
LOOKBACK = 256  # ops before a nested call searched for its unbinding (about 50 before it in torch 2.13)


def varlen_kind(name: str) -> str | None:
    """`nested` or `flash-attn varlen` for an op name that marks a varlen call; None for any other."""
    if "varlen" in name.lower():
        return FLASH_VARLEN
    if name.startswith("aten::_nested_") or name == "aten::to_padded_tensor" or name in CUM_SEQ_OPS:
        return NESTED
    return None


@dataclass(frozen=True, slots=True)
class VarlenCall:
    """A varlen call: its `kind`, its `sequences` and their `lengths` where recorded (None: not), and the
    forward FLOPs summed per sequence (4·heads·head_dim per kept pair; None without the lengths)."""

    kind: str
    sequences: int | None = None
    lengths: tuple[int, ...] | None = None
    flops: int | None = None


def varlen_call(
    trace: ParsedTrace, ops: Sequence[int], before: Sequence[int], marked: dict[int, str], causal: bool | None
) -> VarlenCall | None:
    """The `VarlenCall` of a call covering `ops`, or None when none of them is `marked` (name id → kind,
    `call_names.LedgerNames.varlen`) or a backend op with a 1-D `cum_seq_q`. `before`: the instance's ops
    before the call, in order (a nested call's unbinding). `causal`: the call's recorded is_causal (None:
    unknown, every pair of each sequence counted)."""
    names = trace.cpu_ops.name
    kinds = [(op, marked[names[op]]) for op in ops if names[op] in marked]
    if not kinds:
        return None
    if any(kind == NESTED for _, kind in kinds) and (found := _unbound(trace, before, causal)) is not None:
        return found
    for op, kind in kinds:
        name = trace.names[names[op]]
        dims = trace.input_dims_of(op)
        if name in CUM_SEQ_OPS and not (dims and _is_1d(dims, _CUM_SEQ_INPUT)):
            continue  # dense inputs: an ordinary SDPA backend call
        if dims and (at := _first_1d(dims)) is not None:
            return VarlenCall(kind, dims[at][0] - 1)
        return VarlenCall(kind)
    return None


def _unbound(trace: ParsedTrace, before: Sequence[int], causal: bool | None) -> VarlenCall | None:
    """The nested call whose q was unbound by the nearest `UNBOUND_OP` of `before`, or None."""
    names = trace.cpu_ops.name
    for op in reversed(before[-LOOKBACK:]):
        if trace.names[names[op]] != UNBOUND_OP:
            continue
        dims = trace.input_dims_of(op)
        lengths = _lengths(dims[0]) if dims else None
        if lengths is None or dims is None:
            return None
        heads, head_dim = dims[0][0][1], dims[0][0][2]
        pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lengths)
        return VarlenCall(NESTED, len(lengths), lengths, 4 * heads * head_dim * pairs)
    return None


def _lengths(tensors: object) -> tuple[int, ...] | None:
    """The first dims of a TensorList's 3-D [length, heads, head_dim] tensors, or None."""
    if not isinstance(tensors, list) or not tensors:
        return None
    if not all(isinstance(t, list) and len(t) == 3 and all(isinstance(d, int) for d in t) for t in tensors):
        return None
    return tuple(t[0] for t in tensors)


def _is_1d(dims: list[object], at: int) -> bool:
    entry = dims[at] if len(dims) > at else None
    return isinstance(entry, list) and len(entry) == 1 and isinstance(entry[0], int)


def _first_1d(dims: list[object]) -> int | None:
    """The first 1-D tensor input after q, k and v (cu_seqlens_q / cum_seq_q), or None."""
    return next((i for i in range(3, len(dims)) if _is_1d(dims, i)), None)
