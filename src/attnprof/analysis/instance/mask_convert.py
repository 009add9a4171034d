"""The attention masks an instance converts for its calls: cast to another dtype or device, expanded and
copied, or turned from boolean to additive, with the host and device time each conversion took
(`mask-convert` reads them, and fires when every instance converts one).

A conversion is one of these ops (the outermost of its kind):

- ``dtype`` / ``device``: a cast (`overhead.CAST_OPS`) that copied (`aten::_to_copy`), ``device``
  where it moved data between host and device;
- ``expand``: a copy (`overhead.COPY_OPS`) right after an `aten::expand` at its level: the broadcast
  mask materialised at the full batch x heads size;
- ``additive``: `aten::masked_fill(_)` right after a fresh tensor (`zeros_like`, `full`, ...): a boolean
  mask turned into an additive one (`F._canonical_mask`).

It is the mask's when, with `record_shapes`, the tensor it converts has the dims of, or broadcasts to, a
mask that a call takes (`MASK_INPUTS`: SDPA's attn_mask, the fused modules' mask, the mask of a
masked softmax, masked_fill or add inside the call), and it runs inside that call or before it in the
same instance. Without recorded shapes only a cast inside a fused module's call (`MODULE_OPS`:
nn.MultiheadAttention's or nn.TransformerEncoderLayer's fast path) counts: those ops cast nothing but
the mask. A cast of the scores (the call's own intermediates) has their dims, not a mask's, and SDPA's
conversion of a boolean mask to its bias (where kernels) is `dense-mask`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnprof.analysis.base import MEMCPY
from attnprof.analysis.instance.call_names import MODULE_OPS, SDPA_OP, LedgerNames
from attnprof.analysis.instance.calls import Call
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.overhead import CAST_OPS, COPY_OPS
from attnprof.analysis.trace.tables import ParsedTrace

FILL_OPS = frozenset({"aten::masked_fill", "aten::masked_fill_"})
#: The ops a boolean mask is filled into when it is made additive.
FRESH_OPS = frozenset(
    {"aten::zeros_like", "aten::zeros", "aten::full", "aten::full_like", "aten::new_zeros", "aten::new_full"}
)
CONVERT_OPS = CAST_OPS | COPY_OPS | FILL_OPS
#: Where an op that takes a mask has it among its inputs (native_functions.yaml).
MASK_INPUTS = {
    SDPA_OP: 3,
    "aten::_native_multi_head_attention": 9,
    "aten::_transformer_encoder_layer_fwd": 18,
    "aten::_masked_softmax": 1,
    "aten::masked_fill": 1,
    "aten::masked_fill_": 1,
    "aten::add": 1,
    "aten::add_": 1,
}
_MODULE_BACKENDS = frozenset(backend for backend, _ in MODULE_OPS.values())
_EXPAND = "aten::expand"
_COPIES = frozenset({"aten::_to_copy", "aten::copy_"})


@dataclass(frozen=True, slots=True)
class MaskConvert:
    """One mask conversion of one instance: its kind (see the module docstring), the op chain (outermost
    first), the converted tensor's dims and its dtypes ("float → bool") where recorded, the call it
    feeds (its index among the instance's forward calls) and whether it ran inside that call, its CPU
    time and its device time (None in a CPU-only trace)."""

    kind: str
    chain: str
    dims: tuple[int, ...] | None
    types: str | None
    call: int
    inside: bool
    host_us: float
    device_us: float | None
    op: int = -1  # the converting op's id in the trace (re-creating it reads its inputs: `analysis.recreate`)


def _dims(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and len(value) >= 2 and all(isinstance(d, int) for d in value):
        return tuple(value)
    return None


#: The dims of an op's input (op, at), as `input_dims` gives them.
InputDims = Callable[[int, int], "tuple[int, ...] | None"]


def input_dims(trace: ParsedTrace, op: int, at: int) -> tuple[int, ...] | None:
    """The dims of `op`'s input `at` where it recorded a tensor of two or more dims there."""
    dims = trace.input_dims_of(op)
    return _dims(dims[at]) if dims is not None and len(dims) > at else None


def broadcasts_to(dims: tuple[int, ...], mask: tuple[int, ...]) -> bool:
    """True when a tensor of `dims` is `mask`'s shape or broadcasts to it over leading dims of 1:
    the same last two dims (queries, keys), each other dim 1 or equal."""
    if len(dims) > len(mask) or dims[-2:] != mask[-2:]:
        return False
    return all(d in (1, m) for d, m in zip(reversed(dims[:-2]), reversed(mask[:-2]), strict=False))


def _kind(tree: OpTree, op: int) -> str | None:
    """The conversion kind of the op `op` by its name and the op before it at its level, or None."""
    name = tree.name(op)
    if name in CAST_OPS:
        if not any(tree.name(inner) in _COPIES for inner in tree.subtree(op)):
            return None  # a cast to the dtype it had returns its input: nothing converted
        dev, names = tree.trace.device, tree.trace.names
        moved = any(dev.kind[e] == MEMCPY and "DtoD" not in names[dev.name[e]] for e in tree.events(op))
        return "device" if moved else "dtype"
    kids = tree.kids(tree.parent(op))
    j = kids.index(op)
    before = tree.name(kids[j - 1]) if j > 0 else None
    if name in COPY_OPS and before == _EXPAND:
        return "expand"
    if name in FILL_OPS and before in FRESH_OPS:
        return "additive"
    return None


def _types(tree: OpTree, op: int) -> str | None:
    """ "float → bool": the source and destination dtypes of the copy inside `op` (its first
    `aten::copy_`, inputs (destination, source)), where recorded and different."""
    trace = tree.trace
    for inner in tree.subtree(op):
        if tree.name(inner) != "aten::copy_":
            continue
        at = trace.cpu_ops.input_types[inner]
        types = list(trace.input_types[at]) if at >= 0 else []
        if len(types) >= 2 and types[0] != types[1]:
            return f"{types[1]} → {types[0]}"
        return None
    return None


def _masks_taken(tree: OpTree, call: Call, dims_of: InputDims) -> list[tuple[int, ...]]:
    """The dims of every mask the call's ops take (`MASK_INPUTS`), where recorded."""
    found = []
    for op in call.ops:
        at = MASK_INPUTS.get(tree.name(op))
        dims = dims_of(op, at) if at is not None else None
        if dims is not None:
            found.append(dims)
    return found


def convert_kinds(tree: OpTree, names: LedgerNames) -> tuple[tuple[int, str], ...]:
    """The positions of the ops of `tree` that convert something, each with its kind (see the module
    docstring), in op order. A kind depends only on the instance's shape (op names, nesting, the device
    work each op launched: `OpTree.shape()`), so it is found once per shape (`index.TraceIndex.shape_facts`);
    whether a conversion is a mask's depends on the instance's own inputs and calls (`mask_converts`)."""
    converts = names.converts
    if not converts:
        return ()
    order = tree.order
    kinds = ((i, _kind(tree, order[i])) for i, name in enumerate(tree.op_names) if name in converts)
    return tuple((i, kind) for i, kind in kinds if kind is not None)


def mask_converts(
    tree: OpTree, calls: list[Call], in_call: list[bool], kinds: tuple[tuple[int, str], ...], dims_of: InputDims
) -> list[MaskConvert]:
    """The mask conversions of one instance whose forward calls are `calls` (launch order), whose op
    positions inside a call are marked in `in_call` and whose converting ops are `kinds` (`convert_kinds`
    of its shape), in op order (see the module docstring). `dims_of(op, at)` gives `input_dims`."""
    if not calls or not kinds:
        return []
    ops, order = tree.trace.cpu_ops, tree.order
    call_of = {op: k for k, c in enumerate(calls) for op in c.ops}
    masks = [_masks_taken(tree, c, dims_of) for c in calls]
    starts = [c.start for c in calls]
    found: list[MaskConvert] = []
    covered = -1  # the end of the last conversion's subtree: ops inside it are part of it
    for i, kind in kinds:
        if i < covered:
            continue
        op = order[i]
        k = call_of.get(op)
        if k is not None:
            fed = range(k, k + 1)
        elif in_call[i]:
            continue
        else:  # outside every call: it feeds the calls after it
            k = next((n for n, start in enumerate(starts) if start >= ops.ts[op]), None)
            if k is None:
                continue
            fed = range(k, len(calls))
        dims = dims_of(op, 0)
        if dims is not None:
            if not any(broadcasts_to(dims, mask) for n in fed for mask in masks[n]):
                continue
        elif not (kind in ("dtype", "device") and calls[k].backend in _MODULE_BACKENDS and op in call_of):
            continue
        covered = tree.end[i]
        events = tree.events(op)
        device = None if tree.cpu_only else sum(tree.trace.device.dur[e] for e in events)
        chain = " → ".join(tree.name(o) for o in tree.subtree(op) if o == op or tree.name(o) in CONVERT_OPS)
        found.append(MaskConvert(kind, chain, dims, _types(tree, op), k, op in call_of, ops.dur[op], device, op))
    return found
