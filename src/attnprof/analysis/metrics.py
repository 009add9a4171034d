"""Per-forward metrics and per-kernel statistics from an `Attribution`.

Counts are summarised by the low median over forwards (always a count some forward really
had) and times by the median; `spread` holds min/max where forwards differ. Fields that the
trace cannot give (GPU metrics of a CPU-only trace) are None, never 0.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from attnprof.analysis.forwards import Attribution, Forward
from attnprof.analysis.names import explain_kernel
from attnprof.analysis.occupancy import SmLimits, kineto_estimate_pct, limits_for, theoretical_occupancy
from attnprof.analysis.trace import KERNEL, KIND_NAMES, MEMCPY, MEMSET, ParsedTrace

#: Input-type spellings in `record_shapes` traces, by short dtype name.
TRACE_DTYPES = {"c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16",
                "float": "fp32", "Float": "fp32", "double": "fp64", "Double": "fp64",
                "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
                 "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
                 "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
                 "fp64": "fp64", "float64": "fp64", "double": "fp64", "torch.float64": "fp64"}
SIXTEEN_BIT = frozenset({"bf16", "fp16"})


def normalize_dtype(value: str | None) -> str | None:
    if value is None:
        return None
    return DTYPE_ALIASES.get(str(value).strip().lower())


def _is_dtod(name: str) -> bool:
    return "DtoD" in name or "Device -> Device" in name


@dataclass(slots=True)
class ForwardMetrics:
    """What one forward did."""

    kernels: int | None
    memcpy: int | None
    memset: int | None
    dtod_memcpy: int | None
    gpu_time_us: float | None  # first device event start to last end of its attributed work
    gpu_annotation_us: float | None  # extent of its gpu_user_annotation ranges
    kernel_time_us: float | None
    device_time_us: float | None  # sum of kernel + memcpy + memset durations
    cpu_time_us: float
    launch_apis: Counter
    transposes: int
    metadata_transposes: int | None  # transposes that launched nothing (None: no CUDA trace)
    cpu_ops: int
    op_counts: Counter


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("first_seen")
        data.pop("launch_ops")
        return data


def median_count(values: list[int]) -> int:
    return int(statistics.median_low(values)) if values else 0


def median_value(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def spread_of(values: list[float]) -> dict[str, float] | None:
    if len(values) < 2 or min(values) == max(values):
        return None
    return {"min": round(min(values), 3), "max": round(max(values), 3)}


def forward_metrics(attribution: Attribution, fwd: Forward) -> ForwardMetrics:
    trace = attribution.trace
    names, dev, rt, ops = trace.names, trace.device, trace.runtime, trace.cpu_ops
    op_counts: Counter = Counter(names[ops.name[i]] for i in fwd.ops)
    transposes = [i for i in fwd.ops if names[ops.name[i]] == "aten::transpose"]
    launching: set[int] = set()
    for call in fwd.launches:
        op = fwd.launch_op.get(call, -1)
        while op >= 0 and op not in launching:
            launching.add(op)
            op = fwd.op_parent.get(op, -1)
    traced = attribution.device_traced
    launch_apis = Counter(names[rt.name[c]] for c in fwd.launches)
    if not traced:
        return ForwardMetrics(None, None, None, None, None, None, None, None, fwd.cpu_time_us,
                              launch_apis, len(transposes), None, len(fwd.ops), op_counts)
    kinds = Counter(dev.kind[e] for e in fwd.device)
    dtod = sum(1 for e in fwd.device if dev.kind[e] == MEMCPY and _is_dtod(names[dev.name[e]]))
    if fwd.device:
        start = min(dev.ts[e] for e in fwd.device)
        gpu_time = max(dev.ts[e] + dev.dur[e] for e in fwd.device) - start
    else:
        gpu_time = None
    gann = trace.gpu_annotations
    gpu_ann = None
    if fwd.gpu_annotations:
        gpu_ann = (max(gann.ts[a] + gann.dur[a] for a in fwd.gpu_annotations)
                   - min(gann.ts[a] for a in fwd.gpu_annotations))
    kernel_time = sum(dev.dur[e] for e in fwd.device if dev.kind[e] == KERNEL)
    device_time = sum(dev.dur[e] for e in fwd.device)
    return ForwardMetrics(kernels=kinds[KERNEL], memcpy=kinds[MEMCPY], memset=kinds[MEMSET], dtod_memcpy=dtod,
                          gpu_time_us=gpu_time, gpu_annotation_us=gpu_ann, kernel_time_us=kernel_time,
                          device_time_us=device_time, cpu_time_us=fwd.cpu_time_us, launch_apis=launch_apis,
                          transposes=len(transposes),
                          metadata_transposes=sum(1 for i in transposes if i not in launching),
                          cpu_ops=len(fwd.ops), op_counts=op_counts)


def device_limits(trace: ParsedTrace, device: int) -> SmLimits | None:
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
        stats = KernelStats(name=name, short_name=expl.short_name, kind=KIND_NAMES[kinds[nid]],
                            family=expl.family, library=expl.library, count_per_forward=median_count(counts_list),
                            time_us=round(median_value(times_list), 3), tensor_cores=expl.tensor_cores,
                            first_seen=first_seen[nid])
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


def _fill_launch_facts(stats: KernelStats, info, limits: SmLimits | None) -> None:  # noqa: ANN001
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


def unreported_cause(stats: KernelStats, info, limits: SmLimits | None, occ) -> str:  # noqa: ANN001
    """The likeliest reason the profiler's achieved-occupancy figure is 0 or missing."""
    if info.achieved_occupancy_pct is None:
        return "the trace has no occupancy field for this kernel"
    smem = info.shared_memory_bytes or 0
    default_limit = limits.default_smem_per_block if limits else 48 * 1024
    if smem > default_limit:
        return (f"its {smem:,} B of shared memory per block exceed the {default_limit // 1024} KB default "
                "per-block limit that Kineto's estimate assumes, so the estimate finds no resident block")
    if limits is not None and occ is not None and info.grid and info.threads_per_block:
        grid_blocks = 1
        for d in info.grid:
            grid_blocks *= d
        estimate = kineto_estimate_pct(grid_blocks, info.threads_per_block, occ.active_blocks, limits)
        if estimate is not None and estimate < 0.5:
            return (f"its grid of {grid_blocks} block(s) over {limits.num_sms} SMs keeps the estimate "
                    f"under 0.5%, which rounds to 0")
    if stats.launch_api and stats.launch_api.startswith("cu") and not stats.launch_api.startswith("cuda"):
        return f"it was launched through the driver API ({stats.launch_api}), which the estimate may not cover"
    return "none visible in the trace"


def launch_api_summary(per_forward: list[ForwardMetrics]) -> dict[str, int]:
    apis = sorted({api for m in per_forward for api in m.launch_apis})
    return {api: median_count([m.launch_apis.get(api, 0) for m in per_forward]) for api in apis}
