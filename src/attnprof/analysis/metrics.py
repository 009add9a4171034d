"""Per-forward metrics and per-kernel statistics from an `Attribution`.

Counts are summarised by the low median over forwards (always a count some forward really
had) and times by the median; `spread` holds min/max where forwards differ. Fields that the
trace cannot give (GPU metrics of a CPU-only trace) are None, never 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from attnprof.analysis.forwards import Attribution, Forward
from attnprof.analysis.ledger import ForwardLedger, forward_ledger
from attnprof.analysis.names import explain_kernel, short_kernel_name
from attnprof.analysis.occupancy import SmLimits, kineto_estimate_pct, limits_for, theoretical_occupancy
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
from attnprof.stats import median, median_count

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
_MASK_NESTING = frozenset(MASK_OPS) | {SAFE_SOFTMAX}


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


def _launching_ops(fwd: Forward) -> set[int]:
    """The ops of `fwd` under which some launch call ran (the innermost op and its ancestors)."""
    launching: set[int] = set()
    for call in fwd.launches:
        op = fwd.launch_op.get(call, -1)
        while op >= 0 and op not in launching:
            launching.add(op)
            op = fwd.op_parent.get(op, -1)
    return launching


def _nested_in(fwd: Forward, op: int, op_name: dict[int, str], wanted: frozenset[str]) -> bool:
    """True when an op enclosing `op` is named in `wanted`."""
    parent = fwd.op_parent.get(op, -1)
    while parent >= 0:
        if op_name[parent] in wanted:
            return True
        parent = fwd.op_parent.get(parent, -1)
    return False


def _kernels_under(trace: ParsedTrace, fwd: Forward, roots: set[int]) -> list[str]:
    """Short names of the kernels of `fwd` launched under one of the ops in `roots`, in time order."""
    dev, names = trace.device, trace.names
    found = []
    for e in fwd.device:
        if dev.kind[e] != KERNEL:
            continue
        call = fwd.device_launch.get(e)
        op = fwd.launch_op.get(call, -1) if call is not None else -1
        while op >= 0:
            if op in roots:
                found.append(short_kernel_name(names[dev.name[e]]))
                break
            op = fwd.op_parent.get(op, -1)
    return found


def _upcasts(trace: ParsedTrace, fwd: Forward, op_name: dict[int, str]) -> tuple[int, bool]:
    """aten::_to_copy ops from 16-bit inputs (all of them where the input types are unknown), and
    whether any aten::_to_copy carried its input types."""
    count, typed = 0, False
    for i in fwd.ops:
        if op_name[i] != "aten::_to_copy":
            continue
        t = trace.cpu_ops.input_types[i]
        if t < 0:
            count += 1
            continue
        typed = True
        first = trace.input_types[t][0] if trace.input_types[t] else ""
        if first in SIXTEEN_BIT_INPUT_TYPES:
            count += 1
    return count, typed


def forward_metrics(attribution: Attribution, fwd: Forward) -> ForwardMetrics:
    """Counts, times and the op facts that findings read, for one forward."""
    trace = attribution.trace
    names, dev, rt, ops = trace.names, trace.device, trace.runtime, trace.cpu_ops
    op_name = {i: names[ops.name[i]] for i in fwd.ops}
    transposes = [i for i in fwd.ops if op_name[i] == "aten::transpose"]
    mask_roots = {i for i in fwd.ops if op_name[i] in MASK_OPS and not _nested_in(fwd, i, op_name, _MASK_NESTING)}
    upcasts, upcast_types_known = _upcasts(trace, fwd, op_name)
    metrics = ForwardMetrics(
        cpu_time_us=fwd.cpu_time_us,
        launch_apis=Counter(names[rt.name[c]] for c in fwd.launches),
        transposes=len(transposes),
        cpu_ops=len(fwd.ops),
        op_counts=Counter(op_name.values()),
        upcasts=upcasts,
        upcast_types_known=upcast_types_known,
        mask_ops=Counter(op_name[i] for i in mask_roots),
        cpu_work_us=cpu_work_us(trace, fwd),
        backward_outside_region=backward_outside_region(trace, fwd),
    )
    if not attribution.device_traced:
        return metrics
    kinds = Counter(dev.kind[e] for e in fwd.device)
    metrics.kernels, metrics.memcpy, metrics.memset = kinds[KERNEL], kinds[MEMCPY], kinds[MEMSET]
    metrics.dtod_memcpy = sum(1 for e in fwd.device if dev.kind[e] == MEMCPY and _is_dtod(names[dev.name[e]]))
    if fwd.device:
        start = min(dev.ts[e] for e in fwd.device)
        metrics.gpu_time_us = max(dev.ts[e] + dev.dur[e] for e in fwd.device) - start
    gann = trace.gpu_annotations
    if fwd.gpu_annotations:
        metrics.gpu_annotation_us = max(gann.ts[a] + gann.dur[a] for a in fwd.gpu_annotations) - min(
            gann.ts[a] for a in fwd.gpu_annotations
        )
    metrics.kernel_time_us = sum(dev.dur[e] for e in fwd.device if dev.kind[e] == KERNEL)
    metrics.device_time_us = sum(dev.dur[e] for e in fwd.device)
    launching = _launching_ops(fwd)
    metadata = [i for i in transposes if i not in launching]
    metrics.metadata_transposes = len(metadata)
    for i in metadata:
        parent = fwd.op_parent.get(i, -1)
        metrics.metadata_transpose_parents[op_name[parent] if parent >= 0 else "the region itself"] += 1
    metrics.mask_kernels = _kernels_under(trace, fwd, mask_roots) if mask_roots else []
    softmax_roots = {i for i in fwd.ops if op_name[i] == SAFE_SOFTMAX}
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
    metrics.backward_roles = backward_roles(trace, fwd)
    tree = OpTree(trace, fwd)
    metrics.attention = forward_ledger(tree, metrics.gpu_time_us)
    metrics.stalls = forward_stalls(trace, fwd, tree.roots)
    return metrics


def device_limits(trace: ParsedTrace, device: int) -> SmLimits | None:
    """The SM limits of `device` from the trace's deviceProperties, or None when it has none."""
    props = trace.device_properties_for(device)
    return limits_for(device_properties=props) if props else None


def kernel_stats(attribution: Attribution) -> list[KernelStats]:
    """Statistics per distinct device-event name, in order of first execution."""
    trace = attribution.trace
    if not attribution.device_traced:
        return []
    names, dev, rt, ops = trace.names, trace.device, trace.runtime, trace.cpu_ops
    n_fwd = len(attribution.forwards)
    per_name_counts: dict[int, list[int]] = {}
    per_name_times: dict[int, list[float]] = {}
    first_seen: dict[int, float] = {}
    infos: dict[int, Counter] = {}
    apis: dict[int, Counter] = {}
    chains: dict[int, Counter] = {}
    kinds: dict[int, int] = {}
    devices: dict[int, int] = {}
    for k, fwd in enumerate(attribution.forwards):
        counts: Counter = Counter()
        times: Counter = Counter()
        origin = fwd.device[0] if fwd.device else 0
        for e in fwd.device:
            nid = dev.name[e]
            counts[nid] += 1
            times[nid] += dev.dur[e]
            if nid not in first_seen:
                first_seen[nid] = k * 1e12 + (dev.ts[e] - dev.ts[origin])
                kinds[nid] = dev.kind[e]
                devices[nid] = dev.device[e]
            if dev.info[e] >= 0:
                infos.setdefault(nid, Counter())[dev.info[e]] += 1
            call = fwd.device_launch.get(e)
            if call is not None:
                apis.setdefault(nid, Counter())[names[rt.name[call]]] += 1
                op = fwd.launch_op.get(call, -1) if dev.kind[e] == MEMCPY else -1
                if op >= 0:
                    chain = " → ".join(names[ops.name[o]] for o in fwd.op_chain(op))
                    chains.setdefault(nid, Counter())[chain] += 1
        for nid in counts:
            per_name_counts.setdefault(nid, [])
            per_name_times.setdefault(nid, [])
        for nid in per_name_counts:
            per_name_counts[nid].append(counts.get(nid, 0))
            per_name_times[nid].append(times.get(nid, 0.0))
    result = []
    limits_cache: dict[int, SmLimits | None] = {}
    for nid, counts_list in per_name_counts.items():
        # forwards before this name first appeared count as zero
        counts_list = [0] * (n_fwd - len(counts_list)) + counts_list
        times_list = [0.0] * (n_fwd - len(per_name_times[nid])) + per_name_times[nid]
        name = names[nid]
        expl = explain_kernel(name)
        stats = KernelStats(
            name=name,
            short_name=expl.short_name,
            kind=KIND_NAMES[kinds[nid]],
            family=expl.family,
            library=expl.library,
            count_per_forward=median_count(counts_list),
            time_us=round(median(times_list), 3),
            tensor_cores=expl.tensor_cores,
            first_seen=first_seen[nid],
        )
        if nid in apis:
            stats.launch_api = apis[nid].most_common(1)[0][0]
        if nid in chains:
            stats.launch_ops = [c for c, _ in chains[nid].most_common()]
        if nid in infos:
            device = devices[nid]
            if device not in limits_cache:
                limits_cache[device] = device_limits(trace, device)
            _fill_launch_facts(stats, trace.kernel_infos[infos[nid].most_common(1)[0][0]], limits_cache[device])
        result.append(stats)
    result.sort(key=lambda s: s.first_seen)
    return result


def _fill_launch_facts(stats: KernelStats, info, limits: SmLimits | None) -> None:
    stats.grid = list(info.grid) if info.grid else None
    stats.block = list(info.block) if info.block else None
    stats.registers_per_thread = info.registers_per_thread
    stats.shared_memory_bytes = info.shared_memory_bytes
    stats.blocks_per_sm = info.blocks_per_sm
    stats.warps_per_sm = info.warps_per_sm
    reported = info.achieved_occupancy_pct
    stats.achieved_occupancy_pct = reported if reported is not None and reported > 0 else None
    threads = info.threads_per_block
    occ = None
    if limits is not None and threads:
        occ = theoretical_occupancy(info.registers_per_thread, threads, info.shared_memory_bytes, limits)
        if occ is not None:
            stats.theoretical_occupancy_pct = occ.pct
            stats.occupancy_limiter = occ.limiter
            stats.occupancy_arithmetic = occ.arithmetic
    if stats.achieved_occupancy_pct is None:
        stats.occupancy_note = unreported_cause(stats, info, limits, occ)


def unreported_cause(stats: KernelStats, info, limits: SmLimits | None, occ) -> str:
    """The likeliest reason the profiler's achieved-occupancy figure is 0 or missing."""
    if info.achieved_occupancy_pct is None:
        return "the trace has no occupancy field for this kernel"
    smem = info.shared_memory_bytes or 0
    default_limit = limits.default_smem_per_block if limits else 48 * 1024
    if smem > default_limit:
        return (
            f"its {smem:,} B of shared memory per block exceed the {default_limit // 1024} KB default "
            "per-block limit that Kineto's estimate assumes, so the estimate finds no resident block"
        )
    if limits is not None and occ is not None and info.grid and info.threads_per_block:
        grid_blocks = 1
        for d in info.grid:
            grid_blocks *= d
        estimate = kineto_estimate_pct(grid_blocks, info.threads_per_block, occ.active_blocks, limits)
        if estimate is not None and estimate < 0.5:
            return (
                f"its grid of {grid_blocks} block(s) over {limits.num_sms} SMs keeps the estimate "
                f"under 0.5%, which rounds to 0"
            )
    if stats.launch_api and stats.launch_api.startswith("cu") and not stats.launch_api.startswith("cuda"):
        return f"it was launched through the driver API ({stats.launch_api}), which the estimate may not cover"
    return "none visible in the trace"


def launch_api_summary(per_forward: list[ForwardMetrics]) -> dict[str, int]:
    """Launch calls per forward by API name (the low median over forwards), APIs sorted by name."""
    apis = sorted({api for m in per_forward for api in m.launch_apis})
    return {api: median_count([m.launch_apis.get(api, 0) for m in per_forward]) for api in apis}
