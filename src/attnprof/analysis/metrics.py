"""Per-forward metrics from an `Attribution`, and the `KernelStats` record (computed in `kernels`).

Name tests are made once per trace (`name_ids`), not per op. Counts are summarised by the low
median over forwards (always a count some forward really had) and times by the median; `spread`
holds min/max where forwards differ. Fields that the trace cannot give (GPU metrics of a CPU-only
trace) are None, never 0.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import compress, repeat
from operator import add
from typing import Any

from attnprof.analysis.forwards import Attribution, Forward
from attnprof.analysis.ledger import ForwardLedger, forward_ledger
from attnprof.analysis.names import short_kernel_name
from attnprof.analysis.optree import OpTree
from attnprof.analysis.phases import (
    NO_WORK,
    PhaseMetrics,
    Work,
    backward_outside_region,
    backward_roles,
    cpu_work_us,
    phase_metrics,
)
from attnprof.analysis.stalls import Stalls, forward_stalls
from attnprof.analysis.trace import KERNEL, KIND_NAMES, MEMCPY, MEMSET, ParsedTrace
from attnprof.stats import median_count

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
    """What one forward did. Device-side fields are None when the trace has no device events."""

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
    metadata_transpose_parents: Counter = field(default_factory=Counter)  # their enclosing op, by name
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
    launch_ops: list[str] = field(default_factory=list)  # memcpy only: the op chains that launched it

    @property
    def is_dtod_memcpy(self) -> bool:
        """True for a device-to-device memcpy."""
        return self.kind == KIND_NAMES[MEMCPY] and _is_dtod(self.name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields (ordering and launch-op bookkeeping left out)."""
        data = asdict(self)
        data.pop("first_seen")
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
    )


def _launching_ops(fwd: Forward) -> set[int]:
    """The ops of `fwd` under which some launch call ran (the innermost op and its ancestors)."""
    launching: set[int] = set()
    parent, launch_op = fwd.op_parent.get, fwd.launch_op.get
    for call in fwd.launches:
        op = launch_op(call, -1)
        while op >= 0 and op not in launching:
            launching.add(op)
            op = parent(op, -1)
    return launching


def _nested_in(fwd: Forward, op: int, op_name: Sequence[int], wanted: frozenset[int]) -> bool:
    """True when an op enclosing `op` has a name id in `wanted`."""
    parent = fwd.op_parent.get(op, -1)
    while parent >= 0:
        if op_name[parent] in wanted:
            return True
        parent = fwd.op_parent.get(parent, -1)
    return False


def _kernels_under(trace: ParsedTrace, fwd: Forward, roots: set[int]) -> list[str]:
    """Short names of the kernels of `fwd` launched under one of the ops in `roots`, in time order."""
    dev, names = trace.device, trace.names
    parent, launch_op, device_launch = fwd.op_parent.get, fwd.launch_op.get, fwd.device_launch.get
    under = {-1: False}  # op -> whether it or an op around it is in `roots`
    found = []
    for e in compress(fwd.device, map(KERNEL.__eq__, map(dev.kind.__getitem__, fwd.device))):
        call = device_launch(e)
        op = launch_op(call, -1) if call is not None else -1
        chain = []
        while op not in under:
            if op in roots:
                under[op] = True
                break
            chain.append(op)
            op = parent(op, -1)
        inside = under[op]
        for o in chain:
            under[o] = inside
        if inside:
            found.append(short_kernel_name(names[dev.name[e]]))
    return found


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
    op_names = [op_name[i] for i in fwd.ops]
    op_counts = Counter([names[n] for n in op_names])

    def named(name_id: int) -> list[int]:  # the ops with this name id, in order
        return [i for i, n in zip(fwd.ops, op_names, strict=True) if n == name_id]

    transposes = named(ids.transpose) if "aten::transpose" in op_counts else []
    mask_roots = (
        {
            i
            for i, n in zip(fwd.ops, op_names, strict=True)
            if names[n] in _MASK_SET and not _nested_in(fwd, i, ops.name, ids.mask_nesting)
        }
        if not _MASK_SET.isdisjoint(op_counts)
        else set()
    )
    upcasts, upcast_types_known = _upcasts(trace, named(ids.to_copy)) if "aten::_to_copy" in op_counts else (0, False)
    metrics = ForwardMetrics(
        cpu_time_us=fwd.cpu_time_us,
        launch_apis=Counter([names[rt_name[c]] for c in fwd.launches]),
        transposes=len(transposes),
        cpu_ops=len(fwd.ops),
        op_counts=op_counts,
        upcasts=upcasts,
        upcast_types_known=upcast_types_known,
        mask_ops=Counter([names[op_name[i]] for i in mask_roots]),
        cpu_work_us=cpu_work_us(trace, fwd) if fwd.backward_tops else fwd.cpu_time_us,
        backward_outside_region=backward_outside_region(trace, fwd) if fwd.backward_tops else False,
    )
    if not attribution.device_traced:
        return metrics
    device = fwd.device
    kind = dev.kind
    kinds = [kind[e] for e in device]
    metrics.kernels, metrics.memcpy, metrics.memset = kinds.count(KERNEL), kinds.count(MEMCPY), kinds.count(MEMSET)
    metrics.dtod_memcpy = (
        sum(1 for e, kind in zip(device, kinds, strict=True) if kind == MEMCPY and dev.name[e] in ids.dtod)
        if metrics.memcpy
        else 0
    )
    if device:
        ts, device_end = dev.ts, ids.device_end
        start = min([ts[e] for e in device])
        metrics.gpu_time_us = max([device_end[e] for e in device]) - start
    if fwd.gpu_annotations:
        gann, annotations = trace.gpu_annotations, fwd.gpu_annotations
        if len(annotations) == 1:
            a = annotations[0]
            metrics.gpu_annotation_us = (gann.ts[a] + gann.dur[a]) - gann.ts[a]
        else:
            starts = list(map(gann.ts.__getitem__, annotations))
            metrics.gpu_annotation_us = max(map(add, starts, map(gann.dur.__getitem__, annotations))) - min(starts)
    dur = dev.dur
    durations = [dur[e] for e in device]
    metrics.device_time_us = sum(durations)
    metrics.kernel_time_us = (
        metrics.device_time_us
        if metrics.kernels == len(device)
        else sum(compress(durations, map(KERNEL.__eq__, kinds)))
    )
    if transposes:
        launching = _launching_ops(fwd)
        metadata = [i for i in transposes if i not in launching]
    else:
        metadata = []
    metrics.metadata_transposes = len(metadata)
    for i in metadata:
        parent = fwd.op_parent.get(i, -1)
        metrics.metadata_transpose_parents[names[ops.name[parent]] if parent >= 0 else "the region itself"] += 1
    metrics.mask_kernels = _kernels_under(trace, fwd, mask_roots) if mask_roots else []
    softmax_roots = set(named(ids.safe_softmax)) if SAFE_SOFTMAX in op_counts else set()
    metrics.safe_softmax_kernels = _kernels_under(trace, fwd, softmax_roots) if softmax_roots else []
    if fwd.backward_device:
        metrics.phases = phase_metrics(trace, fwd)
    else:  # all of it is forward work, counted above
        metrics.phases = {
            "forward": PhaseMetrics(
                metrics.kernels, metrics.memcpy, metrics.memset, metrics.kernel_time_us, metrics.gpu_time_us or 0.0
            ),
            "backward": NO_WORK,
        }
    if fwd.backward_device:
        metrics.backward_roles = backward_roles(trace, fwd)
    tree = OpTree(trace, fwd)
    metrics.attention = forward_ledger(tree, metrics.gpu_time_us)
    metrics.stalls = forward_stalls(trace, fwd, tree.roots)
    return metrics


def launch_api_summary(per_forward: list[ForwardMetrics]) -> dict[str, int]:
    """Launch calls per forward by API name (the low median over forwards), APIs sorted by name."""
    return median_counts([m.launch_apis for m in per_forward])


def median_counts(counters: list[Counter]) -> dict[str, int]:
    """Per key of any of the counters, sorted: the low median of its count over all of them."""
    keys = sorted(set().union(*counters))
    return {key: median_count(list(map(dict.get, counters, repeat(key), repeat(0)))) for key in keys}
