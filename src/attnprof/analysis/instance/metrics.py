"""Per-forward metrics from an `Attribution`, and the `KernelStats` record (computed in `kernels`).

Name tests are made once per analysis (`index.TraceIndex`), not per op. Counts are summarised by the low
median over forwards (always a count some forward really had) and times by the median; `spread`
holds min/max where forwards differ. Fields that the trace cannot give (GPU metrics of a CPU-only
trace) are None, never 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import add

from attnprof.analysis.attribution.forward import Attribution, Forward
from attnprof.analysis.base import KERNEL, KIND_NAMES, MEMCPY, MEMSET
from attnprof.analysis.instance.cpu_ops import OpTimes, op_times
from attnprof.analysis.instance.index import MASK_OPS as MASK_OPS
from attnprof.analysis.instance.index import SAFE_SOFTMAX as SAFE_SOFTMAX
from attnprof.analysis.instance.index import OpFacts, TraceIndex, is_dtod
from attnprof.analysis.instance.ledger import ForwardLedger, cpu_forward_ledger, forward_ledger
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.phases import (
    PhaseMetrics,
    Work,
    backward_outside_region,
    backward_roles,
    cpu_work_us,
    phase_metrics,
)
from attnprof.analysis.instance.stalls import Stalls, forward_stalls
from attnprof.analysis.short_names import short_kernel_name
from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.stats import median_count_of

#: Input-type spellings in `record_shapes` traces, by short dtype name.
TRACE_DTYPES = {
    "c10::BFloat16": "bf16",
    "BFloat16": "bf16",
    "c10::Half": "fp16",
    "Half": "fp16",
    "float": "fp32",
    "Float": "fp32",
    "double": "fp64",
    "Double": "fp64",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}
DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
    "torch.float64": "fp64",
    "fp8": "fp8",  # e4m3 and e5m2 alike, as TRACE_DTYPES reads them
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}
SIXTEEN_BIT = frozenset({"bf16", "fp16"})
SIXTEEN_BIT_INPUT_TYPES = frozenset({"c10::BFloat16", "c10::Half", "BFloat16", "Half"})


def normalize_dtype(value: str | None) -> str | None:
    """The short dtype name (bf16, fp16, fp32, fp64, fp8) for a spelling like "bfloat16"; None if unknown."""
    if value is None:
        return None
    return DTYPE_ALIASES.get(str(value).strip().lower())


@dataclass(slots=True)
class ForwardMetrics:
    """What one forward did. Device-side fields are None when the trace has no device events.
    `launch_apis` and `op_counts` are read-only views of the `TraceIndex`'s entries for its launch
    calls and its op names, one per distinct sequence (the index counts the forwards that share one)."""

    cpu_time_us: float
    launch_apis: Mapping[str, int]
    transposes: int
    cpu_ops: int
    op_counts: Mapping[str, int]
    upcasts: int  # aten::_to_copy ops from 16-bit inputs (every aten::_to_copy when the types are unknown)
    upcast_types_known: bool  # some aten::_to_copy carried its input types
    mask_ops: Counter  # mask-building ops (MASK_OPS) by name, not counting those nested in one another
    kernels: int | None = None
    memcpy: int | None = None
    memset: int | None = None
    dtod_memcpy: int | None = None
    gpu_time_us: float | None = None  # first device event start to last end of its attributed work
    gpu_annotation_us: float | None = None  # extent of its gpu_user_annotation ranges
    kernel_time_us: float | None = None
    device_time_us: float | None = None  # sum of kernel + memcpy + memset durations
    metadata_transposes: int | None = None  # transposes that launched nothing
    metadata_transpose_parents: Counter = field(default_factory=lambda: _counter())  # their enclosing op, by name
    mask_kernels: list[str] | None = None  # short names of the kernels the mask ops launched
    mask_host_us: float = 0.0  # CPU time of the mask ops (those not nested in one another)
    mask_device_us: float | None = None  # device time of the kernels they launched
    safe_softmax_kernels: list[str] | None = None  # short names of the kernels aten::_safe_softmax launched
    safe_softmax_extra_us: float | None = None  # device time of those kernels beyond the softmax kernel itself
    cpu_work_us: float = 0.0  # cpu_time_us without the wait inside the autograd engine (see phases)
    phases: dict[str, PhaseMetrics] | None = None  # forward and backward work (None without device events)
    backward_outside_region: bool = False  # some backward op ran after the region ended
    backward_roles: dict[str, list[Work]] = field(default_factory=dict)  # see phases.backward_roles
    attention: ForwardLedger | None = None  # attention calls and overhead (see ledger)
    cpu_attention: ForwardLedger | None = None  # a CPU-only trace's calls, timed on the CPU (findings skip it)
    op_times: dict[int, OpTimes] | None = None  # a CPU-only trace: each op name's calls and CPU time (cpu_ops)
    stalls: Stalls | None = None  # host syncs and device idle time (see stalls)


@dataclass
class KernelStats:
    """One distinct kernel (or memcpy/memset) name across the forwards."""

    name: str
    short_name: str
    kind: str  # kernel, memcpy, memset
    family: str
    library: str | None
    count_per_forward: int
    time_us: float  # median over forwards of this name's total time in the forward
    grid: list[int] | None = None
    block: list[int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    blocks_per_sm: float | None = None
    warps_per_sm: float | None = None
    achieved_occupancy_pct: float | None = None  # None when the profiler reported 0 or nothing
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    occupancy_arithmetic: str | None = None
    occupancy_note: str | None = None  # why the achieved figure is missing, when it is
    tensor_cores: bool | None = None
    launch_api: str | None = None
    first_seen: float = 0.0  # for ordering (position in the first forward that ran it)
    forwards_run: int = 0  # how many forwards ran it (this and the next are not in the JSON)
    total_count: int = 0  # how often it ran in all the forwards together
    launch_ops: list[str] = field(default_factory=list)  # memcpys, FP32 CUDA-core GEMMs: their op chains
    flops_per_forward: float | None = None  # FP32 CUDA-core GEMMs: median FLOPs per forward (record_shapes)
    launch_op_ids: list[int] = field(default_factory=list)  # FP32 CUDA-core GEMMs: the ops that launched each run

    @property
    def is_dtod_memcpy(self) -> bool:
        """True for a device-to-device memcpy."""
        return self.kind == KIND_NAMES[MEMCPY] and is_dtod(self.name)


def _counter() -> Counter:
    """A new empty Counter, made without `Counter.__init__` (Python-level, several times slower)."""
    return Counter.__new__(Counter)


def _mask_roots(fwd: Forward, positions: Sequence[int], op_name: Sequence[int], wanted: frozenset[int]) -> set[int]:
    """The ops at these positions of `fwd.ops` that no op with a name id in `wanted` encloses."""
    ops, roots = fwd.ops, set()
    for p in positions:
        op = ops[p]
        parent = fwd.op_parent.get(op, -1)
        while parent >= 0 and op_name[parent] not in wanted:
            parent = fwd.op_parent.get(parent, -1)
        if parent < 0:
            roots.add(op)
    return roots


def _kernels_under(tree: OpTree, roots: Iterable[int]) -> list[tuple[str, float]]:
    """Short names and durations of the instance's forward kernels launched under one of the ops in
    `roots`, in time order."""
    inside = {e for root in roots for e in tree.events(root)}
    dev, names = tree.trace.device, tree.trace.names
    return [
        (short_kernel_name(names[dev.name[e]]), dev.dur[e])
        for e in tree.fwd.device
        if e in inside and dev.kind[e] == KERNEL
    ]


def _upcasts(trace: ParsedTrace, ops: list[int]) -> tuple[int, bool]:
    """Of these aten::_to_copy ops: those from 16-bit inputs (all of them where the input types
    are unknown), and whether any carried its input types."""
    count, typed = 0, False
    for i in ops:
        t = trace.cpu_ops.input_types[i]
        if t < 0:
            count += 1
            continue
        typed = True
        first = trace.input_types[t][0] if trace.input_types[t] else ""
        if first in SIXTEEN_BIT_INPUT_TYPES:
            count += 1
    return count, typed


def forward_metrics(attribution: Attribution, fwd: Forward, index: TraceIndex) -> ForwardMetrics:
    """Counts, times and the op facts that findings read, for one forward. `index`: the analysis's
    `TraceIndex` (each forward is looked up in it once)."""
    trace = attribution.trace
    names, op_name, op_list = trace.names, trace.cpu_ops.name, fwd.ops
    key = tuple(
        op_name[op_list.start : op_list.stop] if isinstance(op_list, range) else map(op_name.__getitem__, op_list)
    )
    facts = index.op_facts(key)
    transposes = list(map(op_list.__getitem__, facts.transposes))
    mask_roots = _mask_roots(fwd, facts.mask_ops, op_name, index.mask_nesting) if facts.mask_ops else set()
    upcasts, upcast_types_known = (
        _upcasts(trace, list(map(op_list.__getitem__, facts.to_copy))) if facts.to_copy else (0, False)
    )
    metrics = ForwardMetrics(
        cpu_time_us=fwd.cpu_time_us,
        launch_apis=index.launch_counts(tuple(map(trace.runtime.name.__getitem__, fwd.launches))),
        transposes=len(transposes),
        cpu_ops=len(fwd.ops),
        op_counts=facts.counts,
        upcasts=upcasts,
        upcast_types_known=upcast_types_known,
        mask_ops=Counter(map(names.__getitem__, map(op_name.__getitem__, mask_roots))) if mask_roots else _counter(),
        mask_host_us=sum(map(trace.cpu_ops.dur.__getitem__, mask_roots)) if mask_roots else 0.0,
        cpu_work_us=cpu_work_us(trace, fwd) if fwd.backward_tops else fwd.cpu_time_us,
        backward_outside_region=backward_outside_region(trace, fwd) if fwd.backward_tops else False,
    )
    if attribution.device_traced:
        tree = OpTree(trace, fwd, facts.roles, key)
        _device_metrics(metrics, tree, index)
        _op_device_metrics(metrics, tree, facts, transposes, mask_roots)
        metrics.attention = forward_ledger(tree, index, metrics.gpu_time_us)
        metrics.stalls = forward_stalls(trace, fwd, tree.roots, index.device_end, index.sync_calls, index.timeline)
    else:
        metrics.op_times = op_times(trace, fwd)
        if any(facts.roles):
            metrics.cpu_attention = cpu_forward_ledger(OpTree(trace, fwd, facts.roles, key), index)
    return metrics


def _device_metrics(metrics: ForwardMetrics, tree: OpTree, index: TraceIndex) -> None:
    """Fill the device-side counts and times of `metrics` and its phases, from the forward's device work."""
    trace, fwd = tree.trace, tree.fwd
    dev, device = trace.device, fwd.device
    kinds = list(map(dev.kind.__getitem__, device))
    metrics.kernels, metrics.memcpy, metrics.memset = kinds.count(KERNEL), kinds.count(MEMCPY), kinds.count(MEMSET)
    metrics.dtod_memcpy = (
        sum(1 for e, kind in zip(device, kinds, strict=True) if kind == MEMCPY and dev.name[e] in index.dtod)
        if metrics.memcpy
        else 0
    )
    if device:
        metrics.gpu_time_us = max(map(index.device_end.__getitem__, device)) - min(map(dev.ts.__getitem__, device))
    if fwd.gpu_annotations:
        gann, annotations = trace.gpu_annotations, fwd.gpu_annotations
        if len(annotations) == 1:
            a = annotations[0]
            metrics.gpu_annotation_us = (gann.ts[a] + gann.dur[a]) - gann.ts[a]
        else:
            starts = list(map(gann.ts.__getitem__, annotations))
            metrics.gpu_annotation_us = max(map(add, starts, map(gann.dur.__getitem__, annotations))) - min(starts)
    durations = list(map(dev.dur.__getitem__, device))
    metrics.device_time_us = sum(durations)
    metrics.kernel_time_us = (
        metrics.device_time_us
        if metrics.kernels == len(device)
        else sum(compress(durations, map(KERNEL.__eq__, kinds)))
    )
    if fwd.backward_device:
        metrics.phases = phase_metrics(trace, fwd)
        metrics.backward_roles = backward_roles(trace, fwd)
    else:  # all of it is forward work, counted above
        metrics.phases = {
            "forward": PhaseMetrics(
                metrics.kernels, metrics.memcpy, metrics.memset, metrics.kernel_time_us, metrics.gpu_time_us or 0.0
            ),
            "backward": PhaseMetrics(),
        }


def _op_device_metrics(
    metrics: ForwardMetrics, tree: OpTree, facts: OpFacts, transposes: list[int], mask_roots: set[int]
) -> None:
    """Fill what `metrics` says of named ops' device work: transposes that launched nothing (and
    their parents), the kernels of the mask ops and of aten::_safe_softmax."""
    fwd, names, op_name = tree.fwd, tree.trace.names, tree.trace.cpu_ops.name
    if transposes:  # those that launched nothing, not even inside them
        launch_ops = set(map(fwd.launch_op.get, fwd.launches))
        metadata = [i for i in transposes if launch_ops.isdisjoint(tree.subtree(i))]
    else:
        metadata = []
    metrics.metadata_transposes = len(metadata)
    for i in metadata:
        parent = tree.parent(i)
        metrics.metadata_transpose_parents[names[op_name[parent]] if parent >= 0 else "the region itself"] += 1
    mask = _kernels_under(tree, mask_roots) if mask_roots else []
    metrics.mask_kernels = [name for name, _ in mask]
    metrics.mask_device_us = sum(time for _, time in mask)
    softmax = _kernels_under(tree, list(map(fwd.ops.__getitem__, facts.safe_softmax))) if facts.safe_softmax else []
    metrics.safe_softmax_kernels = [name for name, _ in softmax]
    metrics.safe_softmax_extra_us = sum(time for name, time in softmax if "softmax" not in name.lower())


def median_counts(counts: Iterable[tuple[Mapping[str, int], int]]) -> dict[str, int]:
    """Per key of any of the counters, sorted: the low median of its count over the instances, from
    each distinct counter with how many instances had it (`TraceIndex.op_counts`, `launch_apis`)."""
    pairs = list(counts)
    keys = sorted(set().union(*(c for c, _ in pairs)))
    return {key: median_count_of((c.get(key, 0), n) for c, n in pairs) for key in keys}
