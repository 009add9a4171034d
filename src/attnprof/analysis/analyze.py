"""`analyze_trace`: per-forward facts, per-kernel facts and findings for one region.

The JSON contract is `results.schema.Analysis`, built from a `TraceAnalysis` by
`results.records.analysis_record`:

    forwards, kernels_per_forward, memcpy_per_forward, memset_per_forward, gpu_time_us,
    gpu_annotation_time_us, kernel_time_us, cpu_time_us, self_device_time_total_us, launch_apis,
    transposes_per_forward, cpu_ops_per_forward, kernels, findings, spread, device,
    input_dtype, annotation_mismatches, notes, region, region_choice, phases, attention, comm,
    top_cpu_ops, counters

`region` is the name or pattern analysed; `region_choice` says why, in one line, when the caller
named no region (null when it did). GPU fields are null for a CPU-only trace; `spread` maps a
metric to {min, max} where forwards differ; `device` is {name, compute_capability, num_sms} when
the trace says. `phases` is {forward, backward} (null for a CPU-only trace), each with the
medians of kernels, memcpy, memset, kernel_time_us and gpu_time_us per instance, and backward with
`outside_region` (true when some instance's backward ran after its region); the `*_per_forward`
counts hold both phases together (see `analysis.backward` for which backward work is counted).
`comm` is the communication per forward (`analysis.comm.CommStats.to_dict`), null when the trace
shows none.
`attention` is the attention ledger (see `analysis.instance.ledger_summary`, `attention_impl` there: the
implementation that served each call, from its kernels' names and the trace's `cudnn_version` metadata;
in a CPU-only trace its calls are timed on the CPU, `time_base` "cpu", and null without any). `top_cpu_ops` is,
for a CPU-only trace, the op names
with the most self CPU time per forward (see `analysis.instance.cpu_ops`; null with device activity).
`counters` is null unless the hardware counters of an Nsight Compute report were attached
(`attach_counters`, `analyze --ncu-report`): then `analysis.counters.CellCounters.to_dict`, with
`occupancy_measured` (see `attach_counters`).
A trace without annotations is analysed as one window (`region` "(whole trace)"). `input_dtype`
comes from the dtype hint, else an `Input type` (record_shapes), else the kernels' names (see
`kernel_dtype`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from attnprof.analysis.attainable import AttainableLookup
from attnprof.analysis.attribution.attribute import find_forwards
from attnprof.analysis.attribution.forward import Attribution
from attnprof.analysis.attribution.regions import choose_region
from attnprof.analysis.findings import Finding, FindingContext, RecordingCost, Verdict, build_findings, judge
from attnprof.analysis.findings.attainable import attainable_facts
from attnprof.analysis.hardware import PeaksLookup, datasheet
from attnprof.analysis.instance.call_names import SDPA_BACKEND_OPS
from attnprof.analysis.instance.comm import CommStats, comm_stats
from attnprof.analysis.instance.cpu_ops import CpuOpStats, top_cpu_ops
from attnprof.analysis.instance.index import TraceIndex
from attnprof.analysis.instance.kernels import kernel_stats
from attnprof.analysis.instance.ledger_summary import AttentionLedger, summarize
from attnprof.analysis.instance.metrics import (
    TRACE_DTYPES,
    ForwardMetrics,
    KernelStats,
    forward_metrics,
    median_counts,
    normalize_dtype,
)
from attnprof.analysis.instance.phases import PHASES, instance_unit
from attnprof.analysis.names import cudnn_version_text, explain_kernel
from attnprof.analysis.trace.load import gc_paused, load_trace
from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.errors import TraceError
from attnprof.stats import median, median_count, spread

#: The trace's top-level metadata key for cuDNN's version, as `torch.backends.cudnn.version()` gives it
#: (attnprof's profiler writes it: `profiling.profiler.profile_forward`).
CUDNN_VERSION_KEY = "cudnn_version"

if TYPE_CHECKING:
    from attnprof.analysis.counters.cell import CellCounters
    from attnprof.analysis.counters.kernel import CounterReport


class PerOpCost(Protocol):
    """The profiler's recording cost per op, calibrated on this machine (`profiling.profiler_cost.ProfilerCost`
    is one): µs per op, whether CUDA activity was recorded too, and the date it was measured (YYYY-MM-DD)."""

    @property
    def per_op_us(self) -> float: ...
    @property
    def cuda(self) -> bool: ...
    @property
    def measured_on(self) -> str: ...


#: The profiler's cost per op for a trace recorded with (or without) record_shapes and with (or without)
#: device activity; None: not calibrated.
RecordingLookup = Callable[[bool, bool], PerOpCost | None]


@dataclass
class TraceAnalysis:
    """Everything `analyze_trace` found for one region of one trace."""

    region: str
    forwards: int
    kernels_per_forward: int | None
    memcpy_per_forward: int | None
    memset_per_forward: int | None
    gpu_time_us: float | None
    gpu_annotation_time_us: float | None
    kernel_time_us: float | None
    cpu_time_us: float
    self_device_time_total_us: float | None
    launch_apis: dict[str, int]
    transposes_per_forward: int
    cpu_ops_per_forward: int
    kernels: list[KernelStats]
    findings: list[Finding]
    spread: dict[str, dict[str, float]]
    device: dict[str, Any] | None
    input_dtype: str | None
    annotation_mismatches: int | None
    notes: list[str] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)  # median per forward, by op name
    per_forward: list[ForwardMetrics] = field(default_factory=list, repr=False)
    region_choice: str | None = None  # why this region, when the caller named none
    phases: dict[str, dict[str, Any]] | None = None  # see the module docstring
    comm: CommStats | None = None  # communication kernels or c10d ops per forward; None without any
    attention: AttentionLedger | None = None  # the attention ledger (see the module docstring)
    top_cpu_ops: list[CpuOpStats] | None = None  # a CPU-only trace's ops by self CPU time
    counters: CellCounters | None = None  # an Nsight Compute report's counters (attach_counters)
    occupancy_measured: list[str] = field(default_factory=list)  # kernels whose occupancy the counters gave

    @property
    def finding_ids(self) -> list[str]:
        """The ids of the findings, in order."""
        return [f.id for f in self.findings]

    def finding(self, finding_id: str) -> Finding | None:
        """The finding with this id, or None."""
        return next((f for f in self.findings if f.id == finding_id), None)


def _infer_dtype(attribution: Attribution) -> tuple[str | None, str | None]:
    """The inputs' dtype from `Input type` of the first top-level op that has a tensor input."""
    trace = attribution.trace
    names, ops = trace.names, trace.cpu_ops
    for fwd in attribution.forwards:
        for i in fwd.ops:
            if fwd.op_parent.get(i, -1) != -1 or ops.input_types[i] < 0:
                continue
            for t in trace.input_types[ops.input_types[i]]:
                dtype = TRACE_DTYPES.get(t)
                if dtype:
                    return dtype, f"Input type of {names[ops.name[i]]}"
        break
    return None, None


#: 16-bit element types in kernel names: template arguments and ATen's cast kernels.
_KERNEL_DTYPES = {
    "bf16": re.compile(r"c10::BFloat16|\bbfloat16_copy_kernel"),
    "fp16": re.compile(r"c10::Half|(?<!b)float16_copy_kernel"),
}


def kernel_dtype(kernels: list[KernelStats]) -> tuple[str | None, str | None]:
    """The inputs' 16-bit dtype from the kernels' names, for a trace without `Input type`: kernels
    templated on c10::BFloat16 (c10::Half), or ATen's casts back to it (bfloat16_copy_kernel_cuda,
    float16_copy_kernel_cuda). None when they name neither, or both."""
    found = {dtype for dtype, pattern in _KERNEL_DTYPES.items() for k in kernels if pattern.search(k.name)}
    if len(found) != 1:
        return None, None
    dtype = found.pop()
    spelled = "c10::BFloat16" if dtype == "bf16" else "c10::Half"
    return dtype, f"{spelled} in the kernels' names; the trace has no Input type"


def _device_info(trace: ParsedTrace) -> dict[str, Any] | None:
    used = sorted({d for d in trace.device.device if d >= 0}) or [0]
    props = trace.device_properties_for(used[0])
    if not props:
        return None
    info: dict[str, Any] = {"name": props.get("name")}
    if "computeMajor" in props:
        info["compute_capability"] = f"{props.get('computeMajor')}.{props.get('computeMinor', 0)}"
    if props.get("numSms"):
        info["num_sms"] = props.get("numSms")
    return info


def _phases(per_forward: list[ForwardMetrics]) -> dict[str, dict[str, Any]] | None:
    """Per phase, the low median of each count and the median of each time over the instances."""
    if any(m.phases is None for m in per_forward):
        return None
    result: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        facts = [m.phases[phase] for m in per_forward]  # type: ignore[index]
        counts = {key: median_count([getattr(f, key) for f in facts]) for key in ("kernels", "memcpy", "memset")}
        times = {key: median([getattr(f, key) for f in facts]) for key in ("kernel_time_us", "gpu_time_us")}
        result[phase] = {**counts, **times}
    result["backward"]["outside_region"] = any(m.backward_outside_region for m in per_forward)
    return result


def analyze_trace(
    source: str | Path | dict[str, Any] | ParsedTrace,
    region: str | None = None,
    dtype: str | None = None,
    ceiling_tflops: float | None = None,
    peaks: PeaksLookup | None = None,
    recording: RecordingLookup | None = None,
    attainable: AttainableLookup | None = None,
) -> TraceAnalysis:
    """Analyse the forwards marked by `record_function(region)` in a trace.

    `source` is a path (`.json`/`.json.gz`), a loaded trace dict or a `ParsedTrace`. `region` is a
    record_function name or a glob pattern such as `ProfilerStep#*` (each match is one forward);
    None chooses one (see `choose_region`) and records why in `region_choice`. `dtype`
    (bf16/fp16/fp32) states the inputs' dtype when the trace lacks `Input type` (record_shapes).
    `ceiling_tflops` is the measured matmul ceiling of that dtype, when the caller has one: findings
    that price work against it (fp32-cuda-cores, backend-fallback) have no impact without it.
    `peaks(gpu name, input dtype)` gives the peaks measured on this machine for the GPU the trace names
    (None: none), which the attention's % of read bandwidth and ridge point then use; without it, or
    when it gives None, they use the datasheet of that GPU (`analysis.hardware`).
    `recording(record_shapes, device traced)` gives the profiler's cost per recorded op on this machine
    (None: not calibrated); with one, the judge weighs `cpu-bound` and `gpu-idle` net of the recording
    (`findings.judge.net_of_recording`). Without it nothing is calibrated.
    `attainable(gpu name, peaks)` gives the best known rates by shape for the GPU the trace names
    (`analysis.attainable.table_reference`, the shipped table): with it the judge weighs `memory-bound`
    against them (`findings.attainable`); a run's cells leave it out (their reference is the run's fastest).
    Raises TraceError for an unreadable or empty trace, a missing region, or no forward in
    the profiled steps.
    """
    with gc_paused():
        return _analyze(source, region, dtype, ceiling_tflops, peaks, recording, attainable)


def _ledger(per_forward: list[ForwardMetrics], traced: bool) -> AttentionLedger | None:
    """The attention ledger over the instances: of their device work, or in a CPU-only trace of the
    calls timed on the CPU (None when no instance of a CPU-only trace has an attention call)."""
    if traced:
        return summarize([m.attention for m in per_forward if m.attention])
    cpu = [m.cpu_attention for m in per_forward if m.cpu_attention is not None]
    if not any(ledger.calls for ledger in cpu):
        return None
    return summarize(cpu)


def _analyze(
    source: str | Path | dict[str, Any] | ParsedTrace,
    region: str | None,
    dtype: str | None,
    ceiling: float | None,
    peaks: PeaksLookup | None,
    recording: RecordingLookup | None = None,
    attainable: AttainableLookup | None = None,
) -> TraceAnalysis:
    trace = load_trace(source)
    region_choice = None
    if region is None:
        region, region_choice = choose_region(trace)
    attribution = find_forwards(trace, region)
    index = TraceIndex(trace)  # this analysis's name facts and caches, passed down
    per_forward = [forward_metrics(attribution, f, index) for f in attribution.forwards]
    if not per_forward:  # find_forwards raises first; kept as a guard
        raise TraceError(f"region {region!r} has no forward in the trace")
    hint = normalize_dtype(dtype)
    if dtype is not None and hint is None:
        raise TraceError(f"unknown dtype hint {dtype!r}; expected bf16, fp16, fp32 or fp8")
    kernels = kernel_stats(attribution)
    inferred, inferred_from = _infer_dtype(attribution)
    if inferred is None:
        inferred, inferred_from = kernel_dtype(kernels)
    analysis = _summary(attribution, index, per_forward, kernels, region, region_choice, hint or inferred, peaks)
    dtype_source = "the --dtype hint" if hint else (inferred_from and f"per the {inferred_from}")
    context = FindingContext(
        per_forward=per_forward,
        kernels=kernels,
        dtype=analysis.input_dtype,
        dtype_source=dtype_source,
        cpu_time_us=analysis.cpu_time_us,
        gpu_time_us=analysis.gpu_time_us,
        cpu_work_us=median([m.cpu_work_us for m in per_forward]),
        comm=analysis.comm,
        attention=analysis.attention if analysis.attention and analysis.attention.time_base == "device" else None,
        unit=instance_unit(analysis.phases),
        ceiling_tflops=ceiling,
    )
    analysis.findings = build_findings(context)
    per_op = recording(bool(trace.input_dims), attribution.device_traced) if recording else None
    cost = None
    if per_op is not None:
        cost = RecordingCost(
            analysis.cpu_ops_per_forward,
            per_op.per_op_us,
            per_op.measured_on,
            lower_bound=attribution.device_traced and not per_op.cuda,
        )
    against = _attainable_facts(analysis, attainable)
    if cost is not None or against:
        verdict = Verdict(
            analysis.findings, kernels, unit=context.unit, recording=cost, host_device=context.host_device(), **against
        )
        analysis.findings = judge(verdict)
    return analysis


def _attainable_facts(analysis: TraceAnalysis, attainable: AttainableLookup | None) -> dict[str, Any]:
    """The Verdict's fields that weigh findings against the best known at the trace GPU's shapes."""
    gpu = analysis.device.get("name") if analysis.device else None
    return attainable_facts(gpu, analysis.attention, analysis.input_dtype, attainable)


def _summary(
    attribution: Attribution,
    index: TraceIndex,
    per_forward: list[ForwardMetrics],
    kernels: list[KernelStats],
    region: str,
    region_choice: str | None,
    input_dtype: str | None,
    peaks: PeaksLookup | None,
) -> TraceAnalysis:
    """The `TraceAnalysis` of the forwards, with its notes; no findings yet. The attention's read bandwidth
    is `peaks(gpu, input_dtype)` when that gives one, else the GPU's datasheet."""
    trace = attribution.trace
    traced = attribution.device_traced
    spreads: dict[str, dict[str, float]] = {}

    def counted(attr: str, key: str) -> int | None:
        values = list(map(attrgetter(attr), per_forward))
        if None in values:
            return None
        s = spread(values)
        if s:
            spreads[key] = s
        return median_count(values)

    def timed(attr: str, key: str) -> float | None:
        values = list(map(attrgetter(attr), per_forward))
        known = [v for v in values if v is not None] if None in values else values
        if not known:
            return None
        s = spread(known)
        if s:
            spreads[key] = s
        return median(known)

    cpu_time = timed("cpu_time_us", "cpu_time_us")
    gpu_time = timed("gpu_time_us", "gpu_time_us") if traced else None  # the spreads' order: cpu, gpu, ...
    device_totals = [m.device_time_us for m in per_forward]
    analysis = TraceAnalysis(
        region=region,
        forwards=len(per_forward),
        kernels_per_forward=counted("kernels", "kernels_per_forward"),
        memcpy_per_forward=counted("memcpy", "memcpy_per_forward"),
        memset_per_forward=counted("memset", "memset_per_forward"),
        gpu_time_us=gpu_time,
        gpu_annotation_time_us=timed("gpu_annotation_us", "gpu_annotation_time_us"),
        kernel_time_us=timed("kernel_time_us", "kernel_time_us") if traced else None,
        cpu_time_us=cpu_time if cpu_time is not None else 0.0,
        self_device_time_total_us=sum(device_totals) if traced else None,  # type: ignore[arg-type]
        launch_apis=median_counts(index.launch_apis()),
        transposes_per_forward=counted("transposes", "transposes_per_forward") or 0,
        cpu_ops_per_forward=counted("cpu_ops", "cpu_ops_per_forward") or 0,
        kernels=kernels,
        findings=[],
        spread=spreads,
        device=_device_info(trace),
        input_dtype=input_dtype,
        annotation_mismatches=attribution.annotation_mismatches,
        notes=list(attribution.notes),
        op_counts=median_counts(index.op_counts()),
        per_forward=per_forward,
        region_choice=region_choice,
        phases=_phases(per_forward),
        comm=comm_stats(attribution),
        attention=_ledger(per_forward, traced),
        top_cpu_ops=None
        if traced
        else top_cpu_ops(trace, [m.op_times or {} for m in per_forward], [m.cpu_time_us for m in per_forward]),
    )
    if not traced:
        analysis.notes.append("no GPU activity in the trace (CPU-only profile): GPU fields are null")
    elif not trace.device_properties:
        analysis.notes.append("the trace has no deviceProperties: theoretical occupancy is not computed")
    if analysis.attention is not None:
        analysis.attention.cudnn_version = cudnn_version_text(trace.metadata.get(CUDNN_VERSION_KEY))
        gpu = analysis.device.get("name") if analysis.device else None
        sheet = datasheet(gpu)
        reference = (peaks(gpu, input_dtype) if peaks else None) or (sheet.peaks if sheet else None)
        analysis.notes += analysis.attention.read_bandwidth(reference, gpu, bool(trace.input_dims))
    if analysis.annotation_mismatches:
        analysis.notes.append(
            f"{analysis.annotation_mismatches} device event(s) differ between the "
            f"gpu_user_annotation ranges of {region!r} and the correlated work"
        )
    return analysis


def attach_counters(
    analysis: TraceAnalysis,
    trace: ParsedTrace,
    report: CounterReport,
    peaks: PeaksLookup | None = None,
    attainable: AttainableLookup | None = None,
) -> TraceAnalysis:
    """Attach an Nsight Compute report's counters to the analysis of `trace` (`analyze --ncu-report`): each
    report kernel meets its launch in the trace by name and order, the attention kernels among them are placed
    on the roofline (`analysis.counters.counters_for_trace`; the peaks `peaks(gpu, dtype)` gives for the
    report's GPU, else its datasheet), and the judge gives the findings with counters (`findings.judge`:
    `occupancy-unreported` without the kernels Nsight Compute measured, `occupancy_measured` saying what it
    measured, then the counter findings)."""
    from attnprof.analysis.counters.cell import counters_for_trace, occupancy_notes
    from attnprof.analysis.findings import Counted, Verdict, judge

    ledger = analysis.attention if analysis.attention and analysis.attention.time_base == "device" else None
    measured = peaks(report.device, analysis.input_dtype) if peaks else None
    counters = counters_for_trace(report, trace, ledger, instance_unit(analysis.phases), measured, report.path)
    counted = Counted.of(counters, analysis.kernels)
    against = _attainable_facts(analysis, attainable)  # tensor-pipe-underused against the best known
    analysis.findings = judge(Verdict(analysis.findings, analysis.kernels, counters=counted, **against))
    analysis.occupancy_measured = occupancy_notes(analysis.kernels, counters)
    analysis.counters = counters
    return analysis


# --------------------------------------------------------------------------- backend


def dispatched_backend(analysis: TraceAnalysis) -> str | None:
    """Which SDPA backend the forwards dispatched to: "flash", "efficient", "cudnn", "math" or None.

    Kernel names decide first (a kernel that belongs to a backend); then the SDPA ops on the CPU
    (needed for CPU-only traces); None when neither tells.
    """
    backends = [explain_kernel(k.name).backend for k in analysis.kernels]
    for backend in ("cudnn", "flash", "efficient"):
        if backend in backends:
            return backend
    for op, backend in SDPA_BACKEND_OPS.items():
        if analysis.op_counts.get(op):
            return backend
    return None
