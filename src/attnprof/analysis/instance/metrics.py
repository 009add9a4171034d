"""Per-forward metrics from an `Attribution`, and the `KernelStats` record (computed in `kernels`).

Name tests are made once per trace (`name_ids`), not per op. Counts are summarised by the low
median over forwards (always a count some forward really had) and times by the median; `spread`
holds min/max where forwards differ. Fields that the trace cannot give (GPU metrics of a CPU-only
trace) are None, never 0.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import compress
from operator import add
from typing import Any

from attnprof.analysis.attribution.forward import Attribution, Forward
from attnprof.analysis.base import KERNEL, KIND_NAMES, MEMCPY, MEMSET
from attnprof.analysis.instance.calls import LedgerNames, ledger_names
from attnprof.analysis.instance.ledger import ForwardLedger, forward_ledger
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.phases import (
    PhaseMetrics,
    Work,
    backward_outside_region,
    backward_roles,
    cpu_work_us,
    phase_metrics,
)
from attnprof.analysis.instance.stalls import Stalls, forward_stalls, sync_name_ids
from attnprof.analysis.names import short_kernel_name
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
}
SIXTEEN_BIT = frozenset({"bf16", "fp16"})
SIXTEEN_BIT_INPUT_TYPES = frozenset({"c10::BFloat16", "c10::Half", "BFloat16", "Half"})
#: Ops that build a causal mask; MASK_OPS nested in one another (or in the softmax) count once.
MASK_OPS = ("aten::ones", "aten::tril", "aten::triu", "aten::scalar_tensor", "aten::where")
SAFE_SOFTMAX = "aten::_safe_softmax"
_MASK_SET = frozenset(MASK_OPS)
_MASK_NESTING = _MASK_SET | {SAFE_SOFTMAX}


def normalize_dtype(value: str | None) -> str | None:
    """The short dtype name (bf16, fp16, fp32, fp64) for a spelling like "bfloat16"; None if unknown."""
    if value is None:
        return None
    return DTYPE_ALIASES.get(str(value).strip().lower())


def _is_dtod(name: str) -> bool:
    return "DtoD" in name or "Device -> Device" in name


@dataclass(slots=True)
class ForwardMetrics:
    """What one forward did. Device-side fields are None when the trace has no device events.
    `launch_apis` and `op_counts` are shared by the forwards that made the same calls and ran the
    same ops: read them, never change them."""

    cpu_time_us: float
    launch_apis: Counter
    transposes: int
    cpu_ops: int
    op_counts: Counter
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
    safe_softmax_kernels: list[str] | None = None  # short names of the kernels aten::_safe_softmax launched
    cpu_work_us: float = 0.0  # cpu_time_us without the wait inside the autograd engine (see phases)
    phases: dict[str, PhaseMetrics] | None = None  # forward and backward work (None without device events)
    backward_outside_region: bool = False  # some backward op ran after the region ended
    backward_roles: dict[str, list[Work]] = field(default_factory=dict)  # see phases.backward_roles
    attention: ForwardLedger | None = None  # attention calls and overhead (see ledger)
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

    @property
    def is_dtod_memcpy(self) -> bool:
        """True for a device-to-device memcpy."""
        return self.kind == KIND_NAMES[MEMCPY] and _is_dtod(self.name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields (ordering and launch-op bookkeeping left out)."""
        data = asdict(self)
        data.pop("first_seen")
        data.pop("forwards_run")
        data.pop("total_count")
        data.pop("launch_ops")
        return data


@dataclass(frozen=True, slots=True)
class NameIds:
    """Facts of the trace's names that per-forward metrics test, found once per trace so that no
    forward tests names as text."""

    transpose: int  # the name id of aten::transpose (-1: none)
    to_copy: int  # aten::_to_copy
    safe_softmax: int  # SAFE_SOFTMAX
    mask_nesting: frozenset[int]  # MASK_OPS and SAFE_SOFTMAX
    dtod: frozenset[int]  # device-event names of device-to-device memcpys
    device_end: Sequence[float]  # ts + dur of each device event
    sync_calls: frozenset[int]  # runtime-call names that are host syncs (see stalls)
    ledger: LedgerNames  # what the attention ledger tests
    # op-name sequence -> its `_OpFacts`; launch-call names -> their counts by name (shared by the
    # forwards that ran the same ops, the same launches)
    op_facts: dict[tuple[int, ...], _OpFacts] = field(default_factory=dict, compare=False, repr=False)
    launch_counts: dict[tuple[int, ...], Counter] = field(default_factory=dict, compare=False, repr=False)


def _counter() -> Counter:
    """A new empty Counter, made without `Counter.__init__` (Python-level, several times slower)."""
    return Counter.__new__(Counter)


@dataclass(frozen=True, slots=True)
class _OpFacts:
    """What `forward_metrics` reads of a forward's op names alone, shared by the forwards that ran
    the same op names: the op counts by name, each op's ledger role, and the positions of the
    named ops it looks at (empty where the name does not occur)."""

    counts: Counter
    roles: list[str | None]
    transposes: list[int]
    to_copy: list[int]
    safe_softmax: list[int]
    mask_ops: list[int]  # MASK_OPS (one may nest in another, or in the softmax)


def _op_facts(names: Sequence[str], op_names: Sequence[int], ids: NameIds) -> _OpFacts:
    counts = Counter(map(names.__getitem__, op_names))
    positions = range(len(op_names))

    def named(name: str, name_id: int) -> list[int]:  # the positions of the ops with this name
        return list(compress(positions, map(name_id.__eq__, op_names))) if name in counts else []

    mask_ids = ids.mask_nesting - {ids.safe_softmax}  # MASK_OPS
    return _OpFacts(
        counts,
        list(map(ids.ledger.role.get, op_names)),
        named("aten::transpose", ids.transpose),
        named("aten::_to_copy", ids.to_copy),
        named(SAFE_SOFTMAX, ids.safe_softmax),
        list(compress(positions, map(mask_ids.__contains__, op_names))) if not _MASK_SET.isdisjoint(counts) else [],
    )


def name_ids(trace: ParsedTrace) -> NameIds:
    """The `NameIds` of a trace."""
    names, dev = trace.names, trace.device
    ids = {names[n]: n for n in set(trace.cpu_ops.name)}
    return NameIds(
        transpose=ids.get("aten::transpose", -1),
        to_copy=ids.get("aten::_to_copy", -1),
        safe_softmax=ids.get(SAFE_SOFTMAX, -1),
        mask_nesting=frozenset(ids[n] for n in _MASK_NESTING if n in ids),
        dtod=frozenset(n for n in set(dev.name) if _is_dtod(names[n])),
        device_end=array("d", map(add, dev.ts, dev.dur)),
        sync_calls=sync_name_ids(trace),
        ledger=ledger_names(trace),
    )


def _mask_roots(fwd: Forward, positions: list[int], op_name: Sequence[int], wanted: frozenset[int]) -> set[int]:
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


def _kernels_under(tree: OpTree, roots: Iterable[int]) -> list[str]:
    """Short names of the instance's forward kernels launched under one of the ops in `roots`, in time order."""
    inside = {e for root in roots for e in tree.events(root)}
    dev, names = tree.trace.device, tree.trace.names
    return [short_kernel_name(names[dev.name[e]]) for e in tree.fwd.device if e in inside and dev.kind[e] == KERNEL]


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


def forward_metrics(attribution: Attribution, fwd: Forward, ids: NameIds | None = None) -> ForwardMetrics:
    """Counts, times and the op facts that findings read, for one forward. `ids`: the trace's
    `name_ids`, computed once by a caller that runs this on many forwards."""
    trace = attribution.trace
    ids = name_ids(trace) if ids is None else ids
    names, dev, ops, rt_name = trace.names, trace.device, trace.cpu_ops, trace.runtime.name
    op_name = ops.name
    op_list = fwd.ops
    key = tuple(
        op_name[op_list.start : op_list.stop] if isinstance(op_list, range) else map(op_name.__getitem__, op_list)
    )
    facts = ids.op_facts.get(key)
    if facts is None:
        facts = ids.op_facts[key] = _op_facts(names, key, ids)
    launch_key = tuple(map(rt_name.__getitem__, fwd.launches))
    launch_apis = ids.launch_counts.get(launch_key)
    if launch_apis is None:
        launch_apis = ids.launch_counts[launch_key] = Counter(map(names.__getitem__, launch_key))
    transposes = list(map(op_list.__getitem__, facts.transposes))
    mask_roots = _mask_roots(fwd, facts.mask_ops, op_name, ids.mask_nesting) if facts.mask_ops else set()
    upcasts, upcast_types_known = (
        _upcasts(trace, list(map(op_list.__getitem__, facts.to_copy))) if facts.to_copy else (0, False)
    )
    metrics = ForwardMetrics(
        cpu_time_us=fwd.cpu_time_us,
        launch_apis=launch_apis,
        transposes=len(transposes),
        cpu_ops=len(fwd.ops),
        op_counts=facts.counts,
        upcasts=upcasts,
        upcast_types_known=upcast_types_known,
        mask_ops=Counter(map(names.__getitem__, map(op_name.__getitem__, mask_roots))) if mask_roots else _counter(),
        cpu_work_us=cpu_work_us(trace, fwd) if fwd.backward_tops else fwd.cpu_time_us,
        backward_outside_region=backward_outside_region(trace, fwd) if fwd.backward_tops else False,
    )
    if not attribution.device_traced:
        return metrics
    tree = OpTree(trace, fwd, facts.roles, key)
    device = fwd.device
    kinds = list(map(dev.kind.__getitem__, device))
    metrics.kernels, metrics.memcpy, metrics.memset = kinds.count(KERNEL), kinds.count(MEMCPY), kinds.count(MEMSET)
    metrics.dtod_memcpy = (
        sum(1 for e, kind in zip(device, kinds, strict=True) if kind == MEMCPY and dev.name[e] in ids.dtod)
        if metrics.memcpy
        else 0
    )
    if device:
        metrics.gpu_time_us = max(map(ids.device_end.__getitem__, device)) - min(map(dev.ts.__getitem__, device))
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
    if transposes:  # those that launched nothing, not even inside them
        launch_ops = set(map(fwd.launch_op.get, fwd.launches))
        metadata = [i for i in transposes if launch_ops.isdisjoint(tree.subtree(i))]
    else:
        metadata = []
    metrics.metadata_transposes = len(metadata)
    for i in metadata:
        parent = tree.parent(i)
        metrics.metadata_transpose_parents[names[ops.name[parent]] if parent >= 0 else "the region itself"] += 1
    metrics.mask_kernels = _kernels_under(tree, mask_roots) if mask_roots else []
    metrics.safe_softmax_kernels = (
        _kernels_under(tree, list(map(op_list.__getitem__, facts.safe_softmax))) if facts.safe_softmax else []
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
    metrics.attention = forward_ledger(tree, ids.ledger, metrics.gpu_time_us)
    metrics.stalls = forward_stalls(trace, fwd, tree.roots, ids.device_end, ids.sync_calls)
    return metrics


def launch_api_summary(per_forward: list[ForwardMetrics]) -> dict[str, int]:
    """Launch calls per forward by API name (the low median over forwards), APIs sorted by name."""
    return median_counts([m.launch_apis for m in per_forward])


def median_counts(counters: list[Counter]) -> dict[str, int]:
    """Per key of any of the counters, sorted: the low median of its count over all of them. A
    counter that several forwards share (see `ForwardMetrics`) is read once, with its multiplicity."""
    times = Counter(map(id, counters))
    distinct = dict(zip(map(id, counters), counters, strict=True))
    keys = sorted(set().union(*distinct.values()))
    return {key: median_count_of((c.get(key, 0), times[i]) for i, c in distinct.items()) for key in keys}
