"""The attention ledger of one region instance: the attention calls that `calls` finds, with their
kernels and time, the overhead that `overhead` finds, the masks it builds outside its calls
(`masks`) and the masks it converts for them (`mask_convert`; like an SDPA call's input types and an
eager call's GEMM time, read by the findings and not in the JSON).

`forward_ledger` times an instance's calls by their device work; a CPU-only trace has none, and its
calls are timed on the CPU instead (`cpu_forward_ledger`), a ledger only the findings that say so
read (`FindingContext.ledgers`: unfused-attention, mask-convert).
`ledger_summary.summarize` takes the ledgers of all instances into the analysis's `AttentionLedger`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from attnprof.analysis.instance.bandwidth import Traffic, is_causal
from attnprof.analysis.instance.call_names import CONTAINER_PREFIXES, ENGINE_PREFIX, SDPA_OP, LedgerNames
from attnprof.analysis.instance.calls import Call, backward_calls, find_calls, sdpa_prep
from attnprof.analysis.instance.index import TraceIndex
from attnprof.analysis.instance.mask_convert import MaskConvert, mask_converts
from attnprof.analysis.instance.masks import MaskBuild, mask_builds
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.overhead import Overhead, overhead_ledger, overhead_units
from attnprof.analysis.instance.varlen_calls import LOOKBACK, VarlenCall, varlen_call
from attnprof.analysis.names import attention_impl
from attnprof.analysis.short_names import short_kernel_name
from attnprof.analysis.trace.tables import ParsedTrace

_time_us = attrgetter("time_us")
FA4 = "FA4"
#: flex_attention's FLASH backend (kernel_options BACKEND "FLASH"): FA4's CuTe DSL kernels, called from the
#: compiled flex graph.
FLEX_FLASH = "flex FLASH (FA4)"


@dataclass(slots=True)
class CallFacts:
    """One attention call: what ran, on which backend, in which phase, and its device time.
    `kernel_ids` are its device events' name ids in `names` (the trace's); `kernels` reads them."""

    op: str
    backend: str
    phase: str
    kernel_ids: tuple[int, ...]
    time_us: float
    forward_call: int | None = None
    traffic: Traffic | None = None  # what a forward call moves and computes, from its recorded shapes
    names: Sequence[str] = field(default=(), compare=False, repr=False)
    #: An SDPA call's `Input type` (record_shapes; () without), and the name ids and device time of
    #: its work outside the backend it dispatched to (a mask converted to the backend's form). Not
    #: in the JSON; the findings read them (see `sdpa_facts`).
    input_types: tuple[str, ...] = ()
    prep_ids: tuple[int, ...] = ()
    prep_time_us: float = 0.0
    #: An eager call's matrix products: the device time of its GEMM kernels, or in a CPU-only trace
    #: the CPU time of its GEMM ops (None for another backend). Not in the JSON; unfused-attention reads it.
    gemm_time_us: float | None = None
    #: The trace's op ids of the call's first and last outermost ops (-1: none) and of every op it covers,
    #: which re-creating the call reads (`analysis.recreate`). Not in the JSON.
    first_op: int = field(default=-1, compare=False, repr=False)
    last_op: int = field(default=-1, compare=False, repr=False)
    op_ids: Sequence[int] = field(default=(), compare=False, repr=False)
    varlen: VarlenCall | None = None  # a packed variable-length call (varlen_calls); None: not one

    @property
    def mask_type(self) -> str | None:
        """The type of the mask an `aten::scaled_dot_product_attention` call was given (its 4th input:
        "bool", "c10::BFloat16", ...), None without one or where the types were not recorded."""
        if self.op != SDPA_OP or len(self.input_types) < 4:
            return None
        return self.input_types[3] if self.input_types[3] not in ("", "Scalar") else None

    @property
    def achieved_gbps(self) -> float | None:
        """The call's bytes over its device time, GB/s; None without bytes or time."""
        return gbps(self.traffic.bytes, self.time_us) if self.traffic else None

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte moved (arithmetic intensity); None without recorded shapes."""
        return self.traffic.flops / self.traffic.bytes if self.traffic and self.traffic.bytes else None

    @property
    def kernels(self) -> tuple[str, ...]:
        """The short names of its kernels, memcpys and memsets, in launch order."""
        names = self.names
        return tuple(short_kernel_name(names[n]) for n in self.kernel_ids)

    def attention_impl(self, cudnn_version: str | None = None) -> str | None:
        """The implementation that served the call, read from its kernels' names (`names.attention_impl`);
        FA4's CuTe kernels under flex's op or inside a compiled graph are flex's FLASH backend. None on the CPU
        (no kernels) and where the names do not tell."""
        names = self.names
        impl = attention_impl((names[n] for n in self.kernel_ids), cudnn_version)
        if impl == FA4 and ("flex" in self.op or self.op.startswith(CONTAINER_PREFIXES)):
            return FLEX_FLASH
        return impl

    @property
    def signature(self) -> tuple[str, str, str, int | None]:
        """What must match for two instances' calls to be the same call."""
        return (self.op, self.backend, self.phase, self.forward_call)


@dataclass
class ForwardLedger:
    """The attention calls (forward ones first, then backward ones) and overhead of one instance."""

    calls: list[CallFacts]
    overhead: dict[str, Overhead]
    gpu_time_us: float | None
    forward_count: int = 0  # how many of the calls are forward calls
    masks: list[MaskBuild] = field(default_factory=list)  # the masks built outside the calls (see masks)
    busy_us: float | None = None  # the calls' work intervals merged; None: kernel_time_us (no overlap)
    cpu_time_us: float | None = None  # a CPU-only trace's instance: its CPU time (the calls are timed on it)
    converts: list[MaskConvert] = field(default_factory=list)  # the masks converted for them (see mask_convert)

    @property
    def on_cpu(self) -> bool:
        """True for the ledger of a CPU-only trace (`cpu_forward_ledger`)."""
        return self.cpu_time_us is not None

    @property
    def forward_calls(self) -> list[CallFacts]:
        """The forward-phase calls."""
        return self.calls[: self.forward_count]

    @property
    def kernel_time_us(self) -> float:
        """The device time of every call's work, both phases."""
        return sum(map(_time_us, self.calls))

    @property
    def backward_time_us(self) -> float:
        """The device time of the backward calls' work."""
        return sum(c.time_us for c in self.calls if c.phase == "backward")

    @property
    def overhead_us(self) -> float:
        """The overhead items' time together (none on the CPU: not measured there)."""
        return sum(map(_time_us, self.overhead.values()))

    @property
    def cpu_time_pct(self) -> float | None:
        """On the CPU: the calls' CPU time over the instance's, in percent (at most 100); else None."""
        if not self.cpu_time_us:
            return None
        return min(100.0, 100.0 * self.kernel_time_us / self.cpu_time_us)

    @property
    def gpu_time_pct(self) -> float | None:
        """The calls' busy time over the instance's GPU time, in percent; None without GPU time."""
        busy = self.kernel_time_us if self.busy_us is None else self.busy_us
        return _share_pct(busy, self.gpu_time_us)


def _share_pct(busy_us: float, gpu_time_us: float | None) -> float | None:
    """`busy_us` in percent of `gpu_time_us`, at most 100: the merged intervals of the calls' work lie
    inside the instance's span of device work, and what rounding carries past it is clipped."""
    return min(100.0, 100.0 * busy_us / gpu_time_us) if gpu_time_us else None


def gbps(nbytes: int, time_us: float) -> float | None:
    """`nbytes` moved in `time_us`, in GB/s (10^9 bytes per second); None without time."""
    return nbytes / time_us / 1e3 if time_us > 0 else None


def _busy_us(trace: ParsedTrace, calls: list[Call]) -> float | None:
    """The union of the calls' device intervals, or None when none overlaps another (then the plain
    sum, `kernel_time_us`, is that union)."""
    dev = trace.device
    ts, dur = dev.ts, dev.dur
    end = float("-inf")
    for c in calls:  # the common case: the calls' work in launch order, one after another
        for e in c.events:
            if ts[e] < end:
                break
            end = ts[e] + dur[e]
        else:
            continue
        break
    else:
        return None
    spans = sorted((ts[e], ts[e] + dur[e]) for c in calls for e in c.events)
    busy, overlap, end = 0.0, False, float("-inf")
    for start, stop in spans:
        if start < end:
            overlap = True
            if stop > end:
                busy += stop - end
                end = stop
        else:
            busy += stop - start
            end = stop
    return busy if overlap else None


def _facts(tree: OpTree, index: TraceIndex, call: Call) -> CallFacts:
    trace, names = tree.trace, index.ledger
    dev = trace.device
    events = call.events
    facts = CallFacts(
        op=call.op,
        backend=call.backend,
        phase=call.phase,
        kernel_ids=tuple(map(dev.name.__getitem__, events)),
        time_us=sum(map(dev.dur.__getitem__, events)),
        forward_call=call.forward_call,
        traffic=index.traffic(call),
        names=trace.names,
        first_op=call.first,
        last_op=call.last,
        op_ids=call.ops,
    )
    _varlen_facts(tree, names, call, facts)
    if call.first >= 0 and names.role.get(trace.cpu_ops.name[call.first]) == "sdpa":
        sdpa_facts(tree, names, call, facts)
    elif call.backend == "eager" and call.phase == "forward":
        gemm = names.gemm_kernels
        facts.gemm_time_us = sum(dev.dur[e] for e in events if dev.name[e] in gemm)
    return facts


def _varlen_facts(tree: OpTree, names: LedgerNames, call: Call, facts: CallFacts) -> None:
    """A forward call's `VarlenCall` (`varlen_calls`), with the is_causal its op recorded; nothing to look
    for in a trace without a varlen op name."""
    if not names.varlen or call.phase != "forward" or call.first < 0:
        return
    trace, first = tree.trace, call.first
    causal = is_causal(trace, first, trace.names[trace.cpu_ops.name[first]])
    before = tree.order[max(0, tree.pos[first] - LOOKBACK) : tree.pos[first]]
    facts.varlen = varlen_call(trace, call.ops, before, names.varlen, causal)


def sdpa_facts(tree: OpTree, names: LedgerNames, call: Call, facts: CallFacts) -> None:
    """Fill an SDPA call's input types and the work it ran outside the backend op it dispatched to
    (for a dense mask: the kernels that turn it into the backend's additive bias; `calls.sdpa_prep`,
    found once per shape for the forward calls)."""
    trace = tree.trace
    types = trace.cpu_ops.input_types[call.first]
    facts.input_types = trace.input_types[types] if types >= 0 else ()
    prep_at = call.prep if call.prep is not None else sdpa_prep(tree, names, call)
    if prep_at:
        dev, events = trace.device, call.events
        facts.prep_ids = tuple(dev.name[events[i]] for i in prep_at)
        facts.prep_time_us = sum(dev.dur[events[i]] for i in prep_at)


def forward_ledger(tree: OpTree, index: TraceIndex, gpu_time_us: float | None) -> ForwardLedger:
    """The attention calls and overhead of one instance whose device work was traced (`tree`: its
    ops, with the roles of `index.ledger`): its forward calls, placed from those of its shape
    (`index.shape_facts`), their backward work, and the overhead around them."""
    shape = index.shape_facts(tree)
    found = shape.calls
    calls = find_calls(tree, found)
    names = index.ledger
    backward, unclaimed = backward_calls(tree, names, calls)
    units = overhead_units(tree, calls, found.in_call)
    overhead = overhead_ledger(tree, units, unclaimed)
    every = calls + backward
    facts = [_facts(tree, index, c) for c in every]
    masks = mask_builds(tree, names, calls, units, found.in_call)
    ledger = ForwardLedger(facts, overhead, gpu_time_us, len(calls), masks, _busy_us(tree.trace, every))
    ledger.converts = mask_converts(tree, calls, found.in_call, shape.converts, index.input_dims)
    return ledger


def cpu_forward_ledger(tree: OpTree, index: TraceIndex) -> ForwardLedger:
    """The attention calls of one instance of a CPU-only trace, timed by their ops on the CPU: a forward
    call from its first op's start to its last op's end, its backward work as the total time of the
    outermost autograd ops linked to its ops by sequence number. No overhead (it is device work)."""
    trace = tree.trace
    ops = trace.cpu_ops
    shape = index.shape_facts(tree)
    calls = find_calls(tree, shape.calls)
    gemm = index.ledger.gemm_ops
    facts = []
    for call in calls:
        fact = CallFacts(
            op=call.op,
            backend=call.backend,
            phase="forward",
            kernel_ids=(),
            time_us=ops.dur[call.first]
            if call.first == call.last
            else ops.ts[call.last] + ops.dur[call.last] - ops.ts[call.first],
            traffic=index.traffic(call),
            names=trace.names,
            first_op=call.first,
            last_op=call.last,
            op_ids=call.ops,
        )
        _varlen_facts(tree, index.ledger, call, fact)
        if index.ledger.role.get(ops.name[call.first]) == "sdpa":
            types = ops.input_types[call.first]
            fact.input_types = trace.input_types[types] if types >= 0 else ()
        elif call.backend == "eager":
            fact.gemm_time_us = sum(ops.dur[o] for o in call.ops if ops.name[o] in gemm)
        facts.append(fact)
    facts += _cpu_backward(tree, calls)
    converts = mask_converts(tree, calls, shape.calls.in_call, shape.converts, index.input_dims)
    return ForwardLedger(facts, {}, None, len(calls), cpu_time_us=tree.fwd.cpu_time_us, converts=converts)


def _cpu_backward(tree: OpTree, calls: list[Call]) -> list[CallFacts]:
    """The backward calls of a CPU-only instance: its outermost backward ops linked (by sequence number) to
    an op of a forward call, timed by their CPU time, one call per forward call."""
    fwd, trace = tree.fwd, tree.trace
    if not fwd.backward_tops or not calls:
        return []
    ops, names = trace.cpu_ops, trace.names
    # the latest forward op with each number (on the CPU the backward may run on the region's thread)
    seq_op = {ops.seq[o]: o for o in tree.order if ops.seq[o] >= 0 and ops.fwd_tid[o] <= 0}
    call_of = {o: k for k, c in enumerate(calls) for o in c.ops}
    time: dict[int, float] = {}
    labels: dict[int, list[str]] = {}
    for top in fwd.backward_tops:
        linked = seq_op.get(ops.seq[top]) if ops.seq[top] >= 0 else None
        k = call_of.get(linked) if linked is not None else None
        if k is None:
            continue
        time[k] = time.get(k, 0.0) + ops.dur[top]
        label = names[ops.name[top]].removeprefix(ENGINE_PREFIX)
        if label not in labels.setdefault(k, []):
            labels[k].append(label)
    return [
        CallFacts(", ".join(labels[k]), calls[k].backend, "backward", (), time[k], k, names=names) for k in sorted(time)
    ]
