"""The overhead ledger: device work tied to attention that is not the attention call itself.

Kinds, in `OVERHEAD_KINDS` order:

- ``mask-build``   building the mask or BlockMask
- ``kv-repeat``    repeating or expanding K/V for grouped-query attention
- ``dtype-cast``   dtype casts of attention's inputs or outputs
- ``layout-copy``  layout or contiguous copies of them

Where they are looked for, outside every call:

1. next to each call, at the level of its outermost op (a compiled graph around a call stands for
   it): the launching ops just before it, back to the first that is none of the kinds, and the casts
   and copies just after it, up to the first that is neither. Ops that launch nothing (views,
   transposes, expands) are passed over. A reshape, contiguous, clone or flatten copy right after an
   `aten::expand` (transformers' `repeat_kv`), or a repeat op, is kv-repeat; a cast op that moved
   data between host and device is no cast and ends the walk.
2. anywhere else in the instance: `MASK_BUILD_OPS` (triangles, `where`, index comparisons), and a
   compiled graph whose Inductor kernels fuse tril/triu, or arange with a comparison, and run no
   GEMM or attention kernel (FlexAttention's `create_block_mask`, compiled).

Backward work linked by sequence number to these ops (a training step) adds to their time.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field

from attnprof.analysis.base import KERNEL, MEMCPY
from attnprof.analysis.instance.calls import Call
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.names import explain_kernel

OVERHEAD_KINDS = ("mask-build", "kv-repeat", "dtype-cast", "layout-copy")
CAST_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::type_as", "aten::float", "aten::half", "aten::bfloat16"})
REPEAT_OPS = frozenset({"aten::repeat_interleave", "aten::repeat", "aten::tile"})
COPY_OPS = frozenset({"aten::contiguous", "aten::clone", "aten::reshape", "aten::flatten", "aten::copy_"})
EXPAND_OPS = frozenset({"aten::expand", "aten::unsqueeze"})  # what repeat_kv does before its copy
MASK_BUILD_OPS = frozenset({"aten::tril", "aten::triu", "aten::where", "aten::le", "aten::lt", "aten::ge", "aten::gt"})
ADJACENT_MASK_OPS = MASK_BUILD_OPS | {
    "aten::ones",
    "aten::full",
    "aten::scalar_tensor",
    "aten::masked_fill",
    "aten::eq",
    "aten::ne",
    "aten::logical_and",
    "aten::logical_or",
    "aten::logical_not",
    "aten::bitwise_and",
    "aten::bitwise_or",
}
_INDUCTOR_OPS = re.compile(r"^triton_(?:poi|red|per)_fused_(\w+?)_\d+$")
_COMPARISONS = frozenset({"le", "lt", "ge", "gt", "eq"})
_NOT_MASK_FAMILIES = frozenset({"gemm", "fused-attention", "triton-template"})


@dataclass
class Overhead:
    """One kind of overhead in one instance: how many ops, their device time and the op chains."""

    count: int = 0
    time_us: float = 0.0
    chains: Counter = field(default_factory=Counter)


@dataclass
class OverheadUnit:
    """Overhead ops: their kind, the op whose work is counted, and the ops whose backward work is."""

    kind: str
    root: int
    ops: list[int]


def _transfers(tree: OpTree, op: int) -> bool:
    """True when `op` moved data between host and device (a memcpy other than device to device)."""
    dev, names = tree.trace.device, tree.trace.names
    return any(dev.kind[e] == MEMCPY and "DtoD" not in names[dev.name[e]] for e in tree.events(op))


def _kind(tree: OpTree, kids: list[int], j: int, before: bool) -> str | None:
    """The overhead kind of the launching op `kids[j]` next to a call (before or after it), or None."""
    name = tree.name(kids[j])
    if name in CAST_OPS:
        return None if _transfers(tree, kids[j]) else "dtype-cast"
    if name in COPY_OPS:
        if before and j > 0 and tree.name(kids[j - 1]) in EXPAND_OPS and not tree.launched(kids[j - 1]):
            return "kv-repeat"
        return "layout-copy"
    if before and name in REPEAT_OPS:
        return "kv-repeat"
    if before and name in ADJACENT_MASK_OPS:
        return "mask-build"
    return None


def _level(tree: OpTree, call: Call) -> tuple[list[int], int, int]:
    """The ops of the call's level and the indices of its first and last op there."""
    if call.first < 0:  # a kernel under no op: place it among the region's top-level ops by time
        kids = tree.roots
        ts = tree.trace.cpu_ops.ts
        at = bisect_right([ts[o] for o in kids], call.start)
        return kids, at, at - 1
    first, last = call.first, call.last
    while (parent := tree.parent(first)) >= 0 and tree.role(parent) == "container":
        first = last = parent
    kids = tree.kids(tree.parent(first))
    return kids, kids.index(first), kids.index(last)


def _adjacent(tree: OpTree, call: Call, in_call: list[bool], taken: set[int]) -> list[OverheadUnit]:
    kids, lo, hi = _level(tree, call)
    units = []
    for step, start in ((-1, lo - 1), (1, hi + 1)):
        j = start
        while 0 <= j < len(kids):
            op = kids[j]
            if in_call[tree.pos[op]]:
                break
            if tree.launched(op):
                kind = _kind(tree, kids, j, before=step < 0)
                if kind is None:
                    break
                if op not in taken:
                    ops = tree.subtree(op)
                    if kind == "kv-repeat":  # its expand (and unsqueeze) too, for their backward
                        k = j - 1
                        while k >= 0 and tree.name(kids[k]) in EXPAND_OPS and not tree.launched(kids[k]):
                            ops = tree.subtree(kids[k]) + ops
                            k -= 1
                    units.append(OverheadUnit(kind, op, ops))
                    taken.add(op)
            j += step
    return units


def _builds_mask(tree: OpTree, op: int) -> bool:
    """True for a compiled graph whose Inductor kernels build a mask (see the module docstring)."""
    names, dev = tree.trace.names, tree.trace.device
    tokens: set[str] = set()
    kernels = [e for e in tree.events(op) if dev.kind[e] == KERNEL]
    for e in kernels:
        name = names[dev.name[e]]
        if explain_kernel(name).family in _NOT_MASK_FAMILIES:
            return False
        match = _INDUCTOR_OPS.match(name)
        if match:
            tokens.update(match.group(1).split("_"))
    return bool(kernels) and bool(tokens & {"tril", "triu"} or (tokens & _COMPARISONS and "arange" in tokens))


def _elsewhere(tree: OpTree, in_call: list[bool], taken: set[int]) -> list[OverheadUnit]:
    units, i = [], 0
    while i < len(tree.order):
        op = tree.order[i]
        if in_call[i] or op in taken or not tree.launched(op):
            i = tree.end[i]
            continue
        if tree.name(op) in MASK_BUILD_OPS or (tree.roles[i] == "container" and _builds_mask(tree, op)):
            units.append(OverheadUnit("mask-build", op, tree.subtree(op)))
            i = tree.end[i]
            continue
        i += 1
    return units


def overhead_units(tree: OpTree, calls: list[Call], in_call: list[bool]) -> list[OverheadUnit]:
    """The overhead ops of one instance (see the module docstring), in the order they are tallied:
    next to each forward call in turn, then anywhere else."""
    if not calls:
        return []
    taken: set[int] = set()
    units = [u for c in calls if c.phase == "forward" for u in _adjacent(tree, c, in_call, taken)]
    return units + _elsewhere(tree, in_call, taken)


def overhead_ledger(tree: OpTree, units: list[OverheadUnit], backward: dict[int, list[int]]) -> dict[str, Overhead]:
    """The overhead of one instance by kind (kinds it has none of are left out), from its
    `overhead_units`. `backward` holds the backward work linked to forward ops outside the calls
    (see `attention.backward_calls`)."""
    dev, fwd = tree.trace.device, tree.fwd
    result: dict[str, Overhead] = {}
    for unit in units:
        item = result.setdefault(unit.kind, Overhead())
        item.count += 1
        compiled = tree.role(unit.root) == "container"  # a compiled graph: named as a whole
        for e in tree.events(unit.root):
            item.time_us += dev.dur[e]
            call = fwd.device_launch.get(e)
            op = fwd.launch_op.get(call, -1) if call is not None else -1
            item.chains[tree.name(unit.root) if compiled else tree.chain(unit.root, op)] += 1
        for op in unit.ops:
            item.time_us += sum(dev.dur[e] for e in backward.get(op, ()))
    return {kind: result[kind] for kind in OVERHEAD_KINDS if kind in result}
