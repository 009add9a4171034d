"""The masks an instance builds for its attention calls, outside them: a FlexAttention BlockMask or a
dense mask tensor, with the host and device time the building took (`mask-build` reads them).

Two kinds, told apart by how they show in a trace:

- ``BlockMask``: `create_block_mask` run eagerly shows as functorch's vmapped ops (names holding
  `call_names.VMAPPED`: the mask_mod evaluated over every index), then reductions, sorts and small copies
  that turn the dense block map into the BlockMask's index tensors. The build is the run of ops
  around the vmapped ones at their level that are not attention calls or compiled graphs and launch
  no GEMM or attention kernel; its host time is that run's span (the Python between the ops is part
  of the cost), its device time their work. Compiled, it is one graph of Inductor kernels that the
  overhead ledger already calls mask-build (`overhead._builds_mask`): its host time is the graph's.
- ``dense``: the overhead ledger's other mask-build ops (index comparisons, `where`), each with its
  own CPU time. Those holding tril or triu are left to `mask-rebuilt` (a causal triangle, the math
  backend's or the code's), so one finding speaks of each op.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnprof.analysis.base import KERNEL
from attnprof.analysis.instance.call_names import LedgerNames
from attnprof.analysis.instance.calls import Call
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.overhead import OverheadUnit
from attnprof.analysis.names import explain_kernel

#: mask-build ops left to `mask-rebuilt`: a causal triangle.
TRIANGLES = frozenset({"aten::tril", "aten::triu"})
_NOT_MASK_FAMILIES = frozenset({"gemm", "fused-attention", "triton-template"})


@dataclass(frozen=True, slots=True)
class MaskBuild:
    """One kind of mask built in one instance: how many top-level ops, their host (CPU) time and
    device time, and how many device events they ran."""

    kind: str  # "BlockMask" or "dense"
    ops: int
    host_us: float
    device_us: float
    events: int
    compiled: bool = False


def mask_builds(
    tree: OpTree, names: LedgerNames, calls: list[Call], units: list[OverheadUnit], in_call: list[bool]
) -> list[MaskBuild]:
    """The masks the instance built outside its calls, BlockMask first (see the module docstring);
    [] when it built none."""
    if not calls:
        return []
    runs = _vmapped_runs(tree, names.vmapped, in_call) if names.vmapped else []
    if not runs and all(u.kind != "mask-build" for u in units):
        return []
    inside = {op for run in runs for root in run for op in tree.subtree(root)}
    compiled = [u.root for u in units if u.kind == "mask-build" and tree.role(u.root) == "container"]
    dense = [
        u.root
        for u in units
        if u.kind == "mask-build"
        and u.root not in inside
        and tree.role(u.root) != "container"
        and not any(tree.name(op) in TRIANGLES for op in u.ops)
    ]
    builds = []
    if runs or compiled:
        ops = tree.trace.cpu_ops
        host = sum(ops.ts[run[-1]] + ops.dur[run[-1]] - ops.ts[run[0]] for run in runs)
        host += sum(ops.dur[root] for root in compiled)
        roots = [root for run in runs for root in run] + compiled
        builds.append(_build(tree, "BlockMask", roots, host, compiled=bool(compiled) and not runs))
    if dense:
        builds.append(_build(tree, "dense", dense, sum(tree.trace.cpu_ops.dur[root] for root in dense)))
    return builds


def _build(tree: OpTree, kind: str, roots: list[int], host_us: float, compiled: bool = False) -> MaskBuild:
    events = [e for root in roots for e in tree.events(root)]
    dur = tree.trace.device.dur
    return MaskBuild(kind, len(roots), host_us, sum(map(dur.__getitem__, events)), len(events), compiled)


def _vmapped_runs(tree: OpTree, vmapped: frozenset[int], in_call: list[bool]) -> list[list[int]]:
    """Each run of ops that builds a BlockMask eagerly: around an outermost vmapped op, its siblings
    that are no call, no compiled graph and launch no GEMM or attention kernel, in order."""
    op_name = tree.trace.cpu_ops.name
    runs: list[list[int]] = []
    i, n = 0, len(tree.order)
    while i < n:
        op = tree.order[i]
        if op_name[op] not in vmapped or in_call[i]:
            i += 1
            continue
        kids = tree.kids(tree.parent(op))  # the outermost vmapped op: the ones inside it are skipped
        j = kids.index(op)
        lo = hi = j
        while lo > 0 and _builds(tree, kids[lo - 1], in_call):
            lo -= 1
        while hi + 1 < len(kids) and _builds(tree, kids[hi + 1], in_call):
            hi += 1
        runs.append(kids[lo : hi + 1])
        i = tree.end[tree.pos[kids[hi]]]
    return runs


def _builds(tree: OpTree, op: int, in_call: list[bool]) -> bool:
    """True when `op` may be part of a mask build: no call, no compiled graph, no GEMM or attention work."""
    if in_call[tree.pos[op]] or tree.role(op) == "container":
        return False
    dev, names = tree.trace.device, tree.trace.names
    return not any(
        dev.kind[e] == KERNEL and explain_kernel(names[dev.name[e]]).family in _NOT_MASK_FAMILIES
        for e in tree.events(op)
    )
