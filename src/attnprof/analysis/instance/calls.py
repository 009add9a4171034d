"""Find every attention call in one region instance: its backend, its device work and its time.

Four recognisers, in this order, each skipping the ops an earlier one claimed:

1. SDPA: an outermost `aten::scaled_dot_product_attention` (or a backend op called directly);
   the backend is the dispatch op inside it (`SDPA_BACKEND_OPS`: on the CPU `math` or the CPU flash
   kernel), else its kernels' backend.
2. PyTorch's fused modules (`MODULE_OPS`): `aten::_native_multi_head_attention` (nn.MultiheadAttention's
   fast path: the QKV and output projections with the attention between them, backend "native-mha"),
   and `aten::_transformer_encoder_layer_fwd` (nn.TransformerEncoderLayer's fast path, backend
   "encoder-layer") where no attention op inside it was recorded. An op holding an SDPA call is not one.
3. fused kernels: a kernel whose name rule is a fused-attention one (FlexAttention, FlashAttention,
   Triton and other plugin kernels, see `names`), outside any SDPA op. The call is the outermost op
   around it below any compiled-graph container (`CONTAINER_PREFIXES`), or the kernel alone when
   it was launched under no op; its backend comes from `KERNEL_BACKENDS`, else the rule's backend.
   Several kernels can be one call (`_continues`): a fused-attention reduction, pointwise or combine
   kernel (split-KV flex decoding's merge of the partial outputs) joins the call of the latest template
   kernel of the same backend in the same compiled graph; launched under no op (a CUDA graph replay),
   a combine or reduction kernel joins the op-less call just before it (flash's split-KV combine).
4. eager: among the ops of one level, a batched matmul, then a softmax, then a batched matmul,
   with at most `MAX_OPS_BEFORE_SOFTMAX` launching ops between the first two (scale, mask, casts)
   and `MAX_OPS_AFTER_SOFTMAX` between the last two (cast back, dropout); in a CPU-only trace every
   op counts as launching (each one runs on the CPU). The call covers all of
   them: matmuls, scaling, masking, softmax and its casts. Compiled graphs match too (an Inductor
   softmax kernel's op has "softmax" in its name).

A call's device work is every kernel, memcpy and memset launched inside its ops; a CPU-only trace has
none, and its calls are timed by their ops on the CPU (`ledger.cpu_forward_ledger`). Backward work (a
training step) is linked to the call whose op carries the backward op's sequence number; a backward
op linked to nothing in a call (e.g. only to a compiled graph around it, or to a forward outside the
region) still counts when it ran fused-attention kernels: those kernels form a backward call of their
own, tied to the one call inside the linked op when there is exactly one.

The names each recogniser looks for, and the backends they stand for, are in `call_names`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from attnprof.analysis.base import KERNEL
from attnprof.analysis.instance.call_names import (
    ENGINE_PREFIX,
    MODULE_OPS,
    SDPA_BACKEND_OPS,
    LedgerNames,
)
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.names import explain_kernel
from attnprof.analysis.short_names import short_kernel_name

#: The backward ops of SDPA's backends: a backward call's backend (`_backward_backend`).
_BACKWARD_BACKEND_OPS = {
    **{f"{op}_backward": backend for op, backend in SDPA_BACKEND_OPS.items()},
    "aten::_flash_attention_backward": "flash",
    "aten::_efficient_attention_backward": "efficient",
    "aten::_cudnn_attention_backward": "cudnn",
}
#: A compiled template kernel (FlexAttention's) and the Inductor kernels after it in the same graph that
#: finish the same call: split-KV decoding's reduction over the partial outputs (`_kernel_calls`).
TEMPLATE_PREFIX = "triton_tem_"
CONTINUATION_PREFIXES = ("triton_per_", "triton_red_", "triton_poi_")
MAX_OPS_BEFORE_SOFTMAX = 6
MAX_OPS_AFTER_SOFTMAX = 3


@dataclass
class Call:
    """One attention call of one instance: `events` are its device work (launch order), `ops` every op
    it covers, `first`/`last` its outermost ops at their level (-1: a kernel launched under no op)."""

    op: str
    backend: str
    events: list[int]
    ops: list[int] = field(default_factory=list)
    first: int = -1
    last: int = -1
    start: float = 0.0  # CPU time of its first op or launch: orders the calls
    phase: str = "forward"
    forward_call: int | None = None  # backward calls: the index of the forward call they belong to
    #: The positions in `events` of an SDPA call's work outside the backend op it dispatched to (a
    #: mask turned into the backend's bias); found once per shape (`sdpa_prep`), None: not looked for.
    prep: tuple[int, ...] | None = None


def _mark(tree: OpTree, in_call: list[bool], op: int) -> list[int]:
    i = tree.pos[op]
    end = tree.end[i]
    in_call[i:end] = [True] * (end - i)
    return tree.ops_at(i, end)


def _free_positions(tree: OpTree, role: str, in_call: list[bool]) -> Iterator[int]:
    """The positions of the ops with `role`, in order, but those inside a call found so far (`in_call`
    is read as the caller marks it)."""
    roles, i = tree.roles, -1
    while True:
        try:
            i = roles.index(role, i + 1)
        except ValueError:
            return
        if not in_call[i]:
            yield i


def _sdpa_calls(tree: OpTree, names: LedgerNames, in_call: list[bool]) -> list[Call]:
    calls, ts, op_name = [], tree.trace.cpu_ops.ts, tree.trace.cpu_ops.name
    for i in _free_positions(tree, "sdpa", in_call):
        op = tree.order[i]
        ops = _mark(tree, in_call, op)
        backend = next((b for o in ops if (b := names.sdpa_backend.get(op_name[o])) is not None), None)
        events = tree.events(op)
        if backend is None:
            dev_names = tree.trace.names
            found = (explain_kernel(dev_names[tree.trace.device.name[e]]).backend for e in events)
            backend = next((b for b in found if b), "sdpa")
        calls.append(Call(tree.name(op), backend, events, ops, op, op, ts[op]))
    return calls


def _module_calls(tree: OpTree, in_call: list[bool]) -> list[Call]:
    """The outermost ops of PyTorch's fused attention modules (`MODULE_OPS`) that hold no call found so
    far, each one call."""
    calls, ts = [], tree.trace.cpu_ops.ts
    for backend, role in MODULE_OPS.values():
        for i in _free_positions(tree, role, in_call):
            if any(in_call[i : tree.end[i]]):  # an SDPA call (or the module's own attention op) inside
                continue
            op = tree.order[i]
            ops = _mark(tree, in_call, op)
            calls.append(Call(tree.name(op), backend, tree.events(op), ops, op, op, ts[op]))
    calls.sort(key=lambda c: c.start)
    return calls


def _continues(name: str) -> bool:
    """Whether a fused-attention kernel (its short name) finishes the call of the one before it: a
    split-KV combine (flash's `flash_fwd_splitkv_combine_kernel`) or an Inductor reduction or pointwise
    kernel after a template (compiled flex decoding's merge of the partial outputs)."""
    return "combine" in name or name.startswith(CONTINUATION_PREFIXES)


def _anchor(tree: OpTree, op: int) -> int:
    """The outermost op around `op` below any container (`op` itself when its parent is one)."""
    while (parent := tree.parent(op)) >= 0 and tree.role(parent) != "container":
        op = parent
    return op


def _kernel_calls(tree: OpTree, names: LedgerNames, in_call: list[bool]) -> list[Call]:
    trace = tree.trace
    dev, rt = trace.device, trace.runtime
    fused, dev_name = names.fused, dev.name
    by_anchor: dict[int, str] = {}
    calls: list[Call] = []
    for op, events in list(tree.direct.items()):
        if op >= 0 and in_call[tree.pos[op]]:
            continue
        for e in events:
            backend = fused.get(dev_name[e])
            if backend is None or dev.kind[e] != KERNEL:
                continue
            if op < 0:  # launched under no op (a CUDA graph replay): the kernel alone is the call...
                name = short_kernel_name(trace.names[dev_name[e]])
                last = calls[-1] if calls else None
                if last is not None and last.first < 0 and last.backend == backend and _continues(name):
                    last.events.append(e)  # ...but a combine or reduction kernel finishes the call before it
                    continue
                launch = tree.fwd.device_launch.get(e)
                start = rt.ts[launch] if launch is not None else dev.ts[e]
                calls.append(Call(name, backend, [e], start=start))
                continue
            anchor = _anchor(tree, op)
            if anchor not in by_anchor and not in_call[tree.pos[anchor]]:
                by_anchor[anchor] = backend
    template: dict[int, Call] = {}  # container -> its latest template call (the call a reduction joins)
    for anchor, backend in by_anchor.items():
        ops = _mark(tree, in_call, anchor)
        parent, name = tree.parent(anchor), tree.name(anchor)
        before = template.get(parent) if parent >= 0 and tree.role(parent) == "container" else None
        if before is not None and before.backend == backend and _continues(name):
            before.events += tree.events(anchor)  # a split-KV reduction: part of the template's call
            before.ops += ops
            before.last = anchor
            continue
        call = Call(name, backend, tree.events(anchor), ops, anchor, anchor, trace.cpu_ops.ts[anchor])
        calls.append(call)
        if name.startswith(TEMPLATE_PREFIX):
            template[parent] = call
    return calls


def _batched(tree: OpTree, names: LedgerNames, op: int) -> bool:
    return not names.batched.isdisjoint(map(tree.trace.cpu_ops.name.__getitem__, tree.subtree(op)))


def _matmul_beside(
    tree: OpTree, names: LedgerNames, kids: list[int], j: int, step: int, in_call: list[bool]
) -> int | None:
    """From the softmax `kids[j]`, the index of the nearest batched matmul that launched work in
    direction `step` (-1: before it, 1: after it), passing at most MAX_OPS_BEFORE_SOFTMAX (after:
    MAX_OPS_AFTER_SOFTMAX) other launching ops; None when another softmax, a call or an unbatched
    matmul comes first."""
    budget = MAX_OPS_BEFORE_SOFTMAX if step < 0 else MAX_OPS_AFTER_SOFTMAX
    k = j + step
    while 0 <= k < len(kids):
        op = kids[k]
        if in_call[tree.pos[op]]:
            return None
        role = tree.role(op)
        launched = tree.worked(op)
        if role == "matmul" and launched:
            return k if _batched(tree, names, op) else None
        if role == "softmax":
            return None
        if launched:
            budget -= 1
            if budget < 0:
                return None
        k += step
    return None


def _eager_calls(tree: OpTree, names: LedgerNames, in_call: list[bool]) -> list[Call]:
    calls: list[Call] = []
    ts = tree.trace.cpu_ops.ts
    index: dict[int, dict[int, int]] = {}  # parent -> its children's indices
    for i in _free_positions(tree, "softmax", in_call):
        softmax = tree.order[i]
        parent = tree.parent(softmax)
        kids = tree.kids(parent)
        if parent not in index:
            index[parent] = {op: k for k, op in enumerate(kids)}
        j = index[parent][softmax]
        first = _matmul_beside(tree, names, kids, j, -1, in_call)
        last = _matmul_beside(tree, names, kids, j, 1, in_call)
        if first is None or last is None:
            continue
        head, tail = kids[first], kids[last]
        label = " → ".join((tree.name(head), tree.name(softmax), tree.name(tail)))
        start, stop = tree.pos[head], tree.end[tree.pos[tail]]  # the kids between them, with their subtrees
        in_call[start:stop] = [True] * (stop - start)
        events = tree.span_events(start, stop)
        calls.append(Call(label, "eager", events, tree.ops_at(start, stop), head, tail, ts[head]))
    return calls


def find_calls(tree: OpTree, found: ShapeCalls) -> list[Call]:
    """The forward attention calls of one instance in launch order, placed from the calls of its
    shape (`found`: `shape_calls` of an instance of the same `OpTree.shape()`) and ordered by their
    own start times."""
    calls = [p.place(tree) for p in found.calls]
    if len(calls) > 1:
        calls.sort(key=lambda c: c.start)
    return calls


@dataclass(slots=True)
class ShapeCalls:
    """The forward attention calls of the instances of one shape by position, in the order the
    recognisers found them, and which op positions they cover. Shared by those instances (see
    `index.TraceIndex.shape_facts`): read it, never change it."""

    calls: list[CallAt]
    in_call: list[bool]


def shape_calls(tree: OpTree, names: LedgerNames) -> ShapeCalls:
    """The `ShapeCalls` of `tree`, found by the three recognisers (see the module docstring). `tree`
    carries the roles of `names` (each op's `names.role`)."""
    in_call = [False] * len(tree.order)
    roles = tree.roles
    calls = _sdpa_calls(tree, names, in_call) if "sdpa" in roles else []
    if "mha" in roles or "encoder" in roles:
        calls += _module_calls(tree, in_call)
    if names.fused and not names.fused.keys().isdisjoint(map(tree.trace.device.name.__getitem__, tree.fwd.device)):
        calls += _kernel_calls(tree, names, in_call)
    if "softmax" in roles:
        calls += _eager_calls(tree, names, in_call)
    return ShapeCalls([CallAt.of(tree, c, sdpa_prep(tree, names, c)) for c in calls], in_call)


def sdpa_prep(tree: OpTree, names: LedgerNames, call: Call) -> tuple[int, ...]:
    """The positions in `call.events` of an SDPA call's work outside the backend op it dispatched to
    (for a dense mask: the kernels that turn it into the backend's additive bias); () for another call,
    or where all its work ran inside that op."""
    ops = tree.trace.cpu_ops
    if call.first < 0 or names.role.get(ops.name[call.first]) != "sdpa":
        return ()
    backend_ops = names.sdpa_backend
    dispatch = next((o for o in call.ops if ops.name[o] in backend_ops), -1)
    if dispatch < 0 or dispatch == call.first:
        return ()
    inside = tree.events(dispatch)
    if len(inside) == len(call.events):
        return ()
    inside_set = set(inside)
    return tuple(i for i, e in enumerate(call.events) if e not in inside_set)


@dataclass(frozen=True, slots=True)
class CallAt:
    """A call by position: its ops in `tree.order` (a range where they follow one another, as a call's
    subtree does), its events in `fwd.device` (first/last: -1, none)."""

    op: str
    backend: str
    events: tuple[int, ...]
    ops: tuple[int, ...] | range
    first: int
    last: int
    prep: tuple[int, ...] = ()  # see Call.prep

    @classmethod
    def of(cls, tree: OpTree, call: Call, prep: tuple[int, ...] = ()) -> CallAt:
        """The positions of a call found in `tree` (`prep`: see `Call.prep`)."""
        at_event = {e: i for i, e in enumerate(tree.fwd.device)}
        pos = tree.pos
        ops: tuple[int, ...] | range = tuple(map(pos.__getitem__, call.ops))
        if ops and ops == tuple(range(ops[0], ops[-1] + 1)):
            ops = range(ops[0], ops[-1] + 1)
        return cls(
            call.op,
            call.backend,
            tuple(map(at_event.__getitem__, call.events)),
            ops,
            pos[call.first] if call.first >= 0 else -1,
            pos[call.last] if call.last >= 0 else -1,
            prep,
        )

    def place(self, tree: OpTree) -> Call:
        """The call at these positions in `tree` (an instance of the shape it was found in). Its start is
        its first op's, or for a kernel launched under no op, its launch call's (else the kernel's)."""
        order, fwd, trace = tree.order, tree.fwd, tree.trace
        events = list(map(fwd.device.__getitem__, self.events))
        first = order[self.first] if self.first >= 0 else -1
        if first >= 0:
            start = trace.cpu_ops.ts[first]
        else:
            launch = fwd.device_launch.get(events[0])
            start = trace.runtime.ts[launch] if launch is not None else trace.device.ts[events[0]]
        at = self.ops
        ops = list(order[at.start : at.stop]) if isinstance(at, range) else list(map(order.__getitem__, at))
        last = order[self.last] if self.last >= 0 else -1
        return Call(self.op, self.backend, events, ops, first, last, start, prep=self.prep)


def backward_calls(tree: OpTree, names: LedgerNames, calls: list[Call]) -> tuple[list[Call], dict[int, list[int]]]:
    """The backward work of the calls (see the module docstring), and the backward ops' work that no
    call claimed, by the forward op each is linked to (for the overhead ledger)."""
    trace = tree.trace
    ops, op_names, dev = trace.cpu_ops, trace.names, trace.device
    fused_backend = names.fused
    if not tree.backward:
        return [], {}
    seq_op = {ops.seq[o]: o for o in tree.order if ops.seq[o] >= 0}  # the latest op with each number
    call_of = {o: k for k, c in enumerate(calls) for o in c.ops}
    work: dict[int, list[int]] = defaultdict(list)
    labels: dict[int, list[str]] = defaultdict(list)
    unclaimed: dict[int, list[int]] = {}
    loose: list[Call] = []
    for top, events in tree.backward.items():
        linked = seq_op.get(ops.seq[top]) if top >= 0 and ops.seq[top] >= 0 else None
        label = op_names[ops.name[top]].removeprefix(ENGINE_PREFIX) if top >= 0 else "backward"
        k = call_of.get(linked) if linked is not None else None
        fused = [e for e in events if dev.kind[e] == KERNEL and dev.name[e] in fused_backend]
        if k is None and linked is not None:
            inside = {call_of[o] for o in tree.subtree(linked) if o in call_of}
            if len(inside) == 1:
                k = inside.pop()
                if set(tree.events(linked)) != set(calls[k].events):  # a graph that ran more than the call
                    events = fused
        if k is not None and events:
            work[k] += events
            if label not in labels[k]:
                labels[k].append(label)
        elif fused:
            backend = _backward_backend(tree, names, fused)
            loose.append(Call(label, backend, fused, start=trace.device.ts[fused[0]], phase="backward"))
        elif linked is not None:
            unclaimed.setdefault(linked, []).extend(events)
    result = [
        Call(", ".join(labels[k]), calls[k].backend, work[k], phase="backward", forward_call=k, start=calls[k].start)
        for k in sorted(work)
    ]
    return result + loose, unclaimed


def _backward_backend(tree: OpTree, names: LedgerNames, events: list[int]) -> str:
    """The backend of backward attention kernels: the SDPA backward op above them, else the kernels'."""
    for e in events:
        call = tree.fwd.device_launch.get(e)
        op = tree.fwd.launch_op.get(call, -1) if call is not None else -1
        while op >= 0:
            backend = _BACKWARD_BACKEND_OPS.get(tree.name(op))
            if backend:
                return backend
            op = tree.fwd.op_parent.get(op, -1)  # backward ops are not in the tree
    return names.fused[tree.trace.device.name[events[0]]]
