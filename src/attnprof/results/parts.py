"""The parts of a result row (`schema.Row`) and of `attnprof analyze`'s document (`Analysis`): typed records,
encoded field by field. Field names are those of the JSON."""

from __future__ import annotations

import msgspec


class Record(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A part of a row: a typed struct, encoded field by field."""


class FindingRecord(Record):
    """A finding as the judge finished it: its id, the sentence, its severity, its impact per instance
    (µs and % of the instance's time; None where nothing measured it, and for a problem `no_impact_reason`
    says why) and `evidence`, the numbers behind the sentence by name, so tables, diff and check read them
    instead of parsing words."""

    id: str
    message: str = ""
    severity: str = "problem"
    impact_us: float | None = None
    impact_pct: float | None = None
    evidence: dict[str, int | float | str | bool | None] = {}
    no_impact_reason: str | None = None  # a problem without impact: why (`findings.registry.NO_IMPACT_REASONS`)


class KernelRecord(Record):
    """One distinct kernel (memcpy, memset) name across the instances (`analysis.instance.metrics.KernelStats`)."""

    name: str
    short_name: str = ""
    kind: str = "kernel"
    family: str = ""
    library: str | None = None
    count_per_forward: int = 0
    time_us: float = 0.0
    grid: list[int] | None = None
    block: list[int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    blocks_per_sm: float | None = None
    warps_per_sm: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    occupancy_arithmetic: str | None = None
    occupancy_note: str | None = None
    tensor_cores: bool | None = None
    launch_api: str | None = None


class VarlenRecord(Record):
    """A call on packed variable-length sequences (`analysis.instance.varlen_calls`): its kind ("nested",
    "flash-attn varlen"), its sequences and its forward FLOPs summed per sequence, each where the trace records
    them."""

    kind: str
    sequences: int | None = None
    flops: float | None = None


class CallRecord(Record):
    """One attention call of the ledger: its op, backend, the implementation that served it (read from its
    kernels' names; None where they do not tell), phase, kernels and device time, its bytes and GB/s (over its
    device time) and their % of the read bandwidth."""

    op: str
    backend: str
    attention_impl: str | None = None
    phase: str = "forward"
    kernels: list[str] = []
    time_us: float | None = None
    bytes: float | None = None
    achieved_gbps: float | None = None
    pct_of_read_bandwidth: float | None = None
    forward_call: int | None = None
    varlen: VarlenRecord | None = None  # a call on packed variable-length sequences; None: not one


class OverheadRecord(Record):
    """Work around the attention calls of one kind (mask-build, kv-repeat, dtype-cast, layout-copy)."""

    kind: str
    ops: list[str] = []
    count_per_forward: int = 0
    time_us: float = 0.0


class AttentionRecord(Record):
    """The attention ledger per instance (`analysis.instance.ledger`): calls, backends, their device time
    (CPU time with `time_base` "cpu"), overhead, bytes and achieved GB/s over the calls' device time;
    `attention_impl`: the implementations that served the calls (`analysis.instance.ledger_summary`)."""

    time_base: str = "device"
    calls_per_forward: int = 0
    backends: dict[str, int] = {}
    attention_impl: str | None = None
    kernel_time_us: float | None = None
    backward_kernel_time_us: float | None = None
    gpu_time_pct: float | None = None
    cpu_time_pct: float | None = None
    overhead_us: float | None = None
    bytes_per_forward: float | None = None
    achieved_gbps: float | None = None
    pct_of_read_bandwidth: float | None = None
    read_bandwidth_gbps: float | None = None
    read_bandwidth_basis: str | None = None
    read_bandwidth_source: str | None = None
    calls: list[CallRecord] = []
    overhead: list[OverheadRecord] = []

    @property
    def backends_text(self) -> str | None:
        """ "cudnn:2" ("eager:1 flex:1" for several); None without calls."""
        return " ".join(f"{name}:{count}" for name, count in self.backends.items()) or None


class PhaseRecord(Record):
    """One phase (forward or backward) of an instance: medians of its counts and times."""

    kernels: int | None = None
    memcpy: int | None = None
    memset: int | None = None
    kernel_time_us: float | None = None
    gpu_time_us: float | None = None


class BackwardPhaseRecord(PhaseRecord):
    """The backward phase, and whether some instance's backward ran after its region."""

    outside_region: bool | None = None


class PhasesRecord(Record):
    """Forward and backward work per instance."""

    forward: PhaseRecord
    backward: BackwardPhaseRecord


class CommRecord(Record):
    """Communication per forward (`analysis.instance.comm.CommStats`)."""

    source: str = "device"
    kernels_per_forward: int | None = None
    ops_per_forward: int = 0
    kernels: list[str] = []
    comm_time_us: float | None = None
    compute_time_us: float | None = None
    overlapped_us: float | None = None
    exposed_us: float | None = None
    overlap_pct: float | None = None


class CpuOpRecord(Record):
    """One op name of a CPU-only trace by self CPU time (`analysis.instance.cpu_ops`)."""

    name: str
    calls_per_forward: int = 0
    self_cpu_us: float = 0.0
    self_cpu_pct: float | None = None
    cpu_total_us: float = 0.0
    input_shapes: str | None = None


class DeviceRecord(Record):
    """The GPU a trace names."""

    name: str | None = None
    compute_capability: str | None = None
    num_sms: int | None = None


class MinMax(Record):
    """The range of a metric over instances that differ."""

    min: float
    max: float


class MaskAlternative(Record):
    """The way to give a dense-mask cell its mask without the dense tensor, and what it measured: `kind`
    `is_causal` or `block-mask`, run by `variant` at the cell labelled `cell`. `source` is `this run` (a
    cell of the same run) or `measured for comparison` (timed after the dense cell, outside its profiled
    region). `latency_us` is None when it did not run, and `reason` says why; `speedup` is the dense cell's
    latency over it."""

    kind: str
    variant: str
    cell: str
    source: str
    latency_us: float | None = None
    speedup: float | None = None
    reason: str | None = None


class StallRecord(Record):
    """One warp-stall reason (`StallShare`); `label` and `words` are for readers."""

    reason: str
    label: str = ""
    words: str = ""
    per_issue: float = 0.0
    share_pct: float = 0.0


class KernelCountersRecord(Record):
    """What Nsight Compute measured of one kernel launch (`KernelCounters`)."""

    name: str
    short_name: str = ""
    index: int = 0
    duration_us: float | None = None
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    dram_gbps: float | None = None
    dram_pct_of_peak: float | None = None
    sm_throughput_pct: float | None = None
    tensor_pipe_pct: float | None = None
    gmma_instructions: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    block: list[int] | None = None
    grid: list[int] | None = None
    stalls: list[StallRecord] = []
    tensor_pipe: str | None = None


class PlacementRecord(Record):
    """One kernel on the roofline (`KernelPlacement`)."""

    index: int
    step: int = 0
    flops: float | None = None
    flops_share_pct: float | None = None
    intensity: float | None = None
    tflops: float | None = None
    bound: str | None = None
    pct_of_ceiling: float | None = None
    text: str = ""


class PeaksRecord(Record):
    """The ceilings the placements use (`analysis.hardware.Peaks`) and their line in words."""

    tflops: float
    read_gbps: float
    ridge: float | None = None
    basis: str = "datasheet"
    source: str = ""
    text: str = ""


class TraceMatchRecord(Record):
    """How a report's kernels met a trace's launches (`TraceMatch`)."""

    matched: int
    total: int
    attention: int = 0
    unmatched: list[str] = []
    text: str = ""


class CountersRecord(Record):
    """A row's (and `analyze --ncu-report`'s) hardware counters, with `occupancy_measured`: the notes on the
    trace's kernels whose achieved occupancy Nsight Compute measured."""

    kernels: list[KernelCountersRecord] = []
    placements: list[PlacementRecord] = []
    counted: list[int] = []
    kernels_per_step: int = 0
    steps: int = 0
    shown_step: int = 0
    flops_per_step: float | None = None
    flops_source: str | None = None
    compulsory_bytes: float | None = None
    peaks: PeaksRecord | None = None
    unit: str = "forward"
    device: str | None = None
    seconds: float | None = None
    report_path: str | None = None
    notes: list[str] = []
    match: TraceMatchRecord | None = None
    occupancy_measured: list[str] = []


class Analysis(Record):
    """What `analyze` found for one region of one trace: the JSON contract of `attnprof analyze`, and the
    trace part of a row (see `analysis.analyze`). GPU fields are None for a CPU-only trace."""

    region: str = ""
    forwards: int = 0
    kernels_per_forward: int | None = None
    memcpy_per_forward: int | None = None
    memset_per_forward: int | None = None
    gpu_time_us: float | None = None
    gpu_annotation_time_us: float | None = None
    kernel_time_us: float | None = None
    cpu_time_us: float | None = None
    self_device_time_total_us: float | None = None
    launch_apis: dict[str, int] = {}
    transposes_per_forward: int | None = None
    cpu_ops_per_forward: int | None = None
    kernels: list[KernelRecord] = []
    findings: list[FindingRecord] = []
    spread: dict[str, MinMax] = {}
    device: DeviceRecord | None = None
    input_dtype: str | None = None
    annotation_mismatches: int | None = None
    notes: list[str] = []
    region_choice: str | None = None
    phases: PhasesRecord | None = None
    comm: CommRecord | None = None
    attention: AttentionRecord | None = None
    top_cpu_ops: list[CpuOpRecord] | None = None
    counters: CountersRecord | None = None
