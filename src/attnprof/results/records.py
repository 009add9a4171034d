"""The schema's records of the live analysis objects: `analysis_record` gives the typed `Analysis` of a
`TraceAnalysis` (the JSON contract of `attnprof analyze`, and the trace part of every row).

Fields are read by name from the live objects (`msgspec.convert(..., from_attributes=True)`), so a field added
to a record and to its object flows through without code here; only rounding (times to the nanosecond,
percentages to 0.01) and the few figures that take an argument are written out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from attnprof.results.parts import (
    Analysis,
    AttentionRecord,
    CallRecord,
    CommRecord,
    CountersRecord,
    CpuOpRecord,
    DeviceRecord,
    FindingRecord,
    KernelCountersRecord,
    KernelRecord,
    MinMax,
    OverheadRecord,
    PeaksRecord,
    PhasesRecord,
    StallRecord,
    VarlenRecord,
)

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis
    from attnprof.analysis.counters import CellCounters
    from attnprof.analysis.findings import Finding
    from attnprof.analysis.instance.ledger_summary import AttentionLedger

RecordT = TypeVar("RecordT", bound=msgspec.Struct)

#: Digits kept per field name, wherever it appears: µs to the nanosecond, percentages to 0.01.
DIGITS = {
    **dict.fromkeys(("impact_pct", "gpu_time_pct", "cpu_time_pct", "pct_of_read_bandwidth", "self_cpu_pct"), 2),
    **dict.fromkeys(("comm_time_us", "compute_time_us", "overlapped_us", "exposed_us"), 3),
    **dict.fromkeys(("impact_us", "kernel_time_us", "backward_kernel_time_us", "overhead_us", "time_us"), 3),
    **dict.fromkeys(("gpu_time_us", "gpu_annotation_time_us", "cpu_time_us", "self_device_time_total_us"), 3),
    **dict.fromkeys(("achieved_gbps", "read_bandwidth_gbps", "self_cpu_us", "cpu_total_us"), 3),
    "overlap_pct": 1,
}


def rounded(record: RecordT) -> RecordT:
    """The record with its float fields named in `DIGITS` rounded."""
    changes = {
        name: round(value, DIGITS[name])
        for name in record.__struct_fields__
        if name in DIGITS and isinstance(value := getattr(record, name), float)
    }
    return msgspec.structs.replace(record, **changes) if changes else record


def record(obj: Any, kind: type[RecordT]) -> RecordT:
    """`kind` filled from the attributes of `obj` of the same names, rounded."""
    return rounded(msgspec.convert(obj, kind, from_attributes=True))


def finding_record(finding: Finding) -> FindingRecord:
    """A finding as rows and `analyze` give it."""
    return record(finding, FindingRecord)


def finding_of(found: FindingRecord) -> Finding:
    """The live finding of a row's record (the inverse of `finding_record`, to judge a row made before)."""
    from attnprof.analysis.findings import read_finding

    return read_finding(found)


def attention_record(ledger: AttentionLedger) -> AttentionRecord:
    """The attention ledger: its calls with their bytes, GB/s and % of the read bandwidth; `overhead_us`
    None for a CPU-only trace's ledger."""
    calls = [
        rounded(
            CallRecord(
                op=c.op,
                backend=c.backend,
                attention_impl=ledger.call_impl(c),
                phase=c.phase,
                kernels=list(c.kernels),
                time_us=c.time_us,
                bytes=c.traffic.bytes if c.traffic else None,
                achieved_gbps=c.achieved_gbps,
                pct_of_read_bandwidth=ledger.pct_of_read_bandwidth(c.achieved_gbps),
                forward_call=c.forward_call,
                varlen=VarlenRecord(c.varlen.kind, c.varlen.sequences, c.varlen.flops) if c.varlen else None,
            )
        )
        for c in ledger.calls
    ]
    on_cpu = ledger.time_base == "cpu"
    return rounded(
        AttentionRecord(
            time_base=ledger.time_base,
            calls_per_forward=ledger.calls_per_forward,
            backends=dict(ledger.backends),
            attention_impl=ledger.attention_impl,
            kernel_time_us=ledger.kernel_time_us,
            backward_kernel_time_us=ledger.backward_kernel_time_us,
            gpu_time_pct=ledger.gpu_time_pct,
            cpu_time_pct=ledger.cpu_time_pct,
            overhead_us=None if on_cpu else ledger.overhead_us,
            bytes_per_forward=ledger.bytes_per_forward,
            achieved_gbps=ledger.achieved_gbps,
            pct_of_read_bandwidth=ledger.pct_of_read_bandwidth(ledger.achieved_gbps),
            read_bandwidth_gbps=ledger.read_bandwidth_gbps,
            read_bandwidth_basis=ledger.read_bandwidth_basis,
            read_bandwidth_source=ledger.read_bandwidth_source,
            calls=calls,
            overhead=[msgspec.convert(item, OverheadRecord) for item in ledger.overhead],
        )
    )


def analysis_record(analysis: TraceAnalysis) -> Analysis:
    """The typed `Analysis` of a trace analysis (see `schema.Analysis`)."""
    phases = None
    if analysis.phases is not None:
        phases = msgspec.convert(analysis.phases, PhasesRecord)
        phases = PhasesRecord(rounded(phases.forward), rounded(phases.backward))
    counters = None
    if analysis.counters is not None:
        counters = counters_record(analysis.counters, list(analysis.occupancy_measured))
    return rounded(
        Analysis(
            region=analysis.region,
            forwards=analysis.forwards,
            kernels_per_forward=analysis.kernels_per_forward,
            memcpy_per_forward=analysis.memcpy_per_forward,
            memset_per_forward=analysis.memset_per_forward,
            gpu_time_us=analysis.gpu_time_us,
            gpu_annotation_time_us=analysis.gpu_annotation_time_us,
            kernel_time_us=analysis.kernel_time_us,
            cpu_time_us=analysis.cpu_time_us,
            self_device_time_total_us=analysis.self_device_time_total_us,
            launch_apis=dict(analysis.launch_apis),
            transposes_per_forward=analysis.transposes_per_forward,
            cpu_ops_per_forward=analysis.cpu_ops_per_forward,
            kernels=[record(k, KernelRecord) for k in analysis.kernels],
            findings=[finding_record(f) for f in analysis.findings],
            spread=msgspec.convert(analysis.spread, dict[str, MinMax]),
            device=msgspec.convert(analysis.device, DeviceRecord) if analysis.device else None,
            input_dtype=analysis.input_dtype,
            annotation_mismatches=analysis.annotation_mismatches,
            notes=list(analysis.notes),
            region_choice=analysis.region_choice,
            phases=phases,
            comm=record(analysis.comm, CommRecord) if analysis.comm is not None else None,
            attention=attention_record(analysis.attention) if analysis.attention is not None else None,
            top_cpu_ops=None
            if analysis.top_cpu_ops is None
            else [record(op, CpuOpRecord) for op in analysis.top_cpu_ops],
            counters=counters,
        )
    )


def _rounded(record: RecordT, digits: int, names: tuple[str, ...] | None = None) -> RecordT:
    """The record with its float fields (those in `names`, or all) rounded to `digits`."""
    changes = {
        name: round(value, digits)
        for name in names or record.__struct_fields__
        if isinstance(value := getattr(record, name), float)
    }
    return msgspec.structs.replace(record, **changes) if changes else record


def _stall(stall: StallRecord) -> StallRecord:
    return _rounded(_rounded(stall, 2, ("share_pct",)), 4, ("per_issue",))


def counters_record(counters: CellCounters, occupancy_measured: list[str]) -> CountersRecord:
    """The record of `counters`: kernel figures to 4 digits, stall shares to 0.01, placements to 3 digits."""
    from attnprof.analysis.counters import ceilings_text

    found = msgspec.convert(replace(counters, peaks=None), CountersRecord, from_attributes=True)
    kernels = [_rounded(msgspec.structs.replace(k, stalls=[_stall(s) for s in k.stalls]), 4) for k in found.kernels]
    placements = [
        _rounded(p, 3, ("flops_share_pct", "intensity", "tflops", "pct_of_ceiling")) for p in found.placements
    ]
    peaks = None
    if counters.peaks is not None:
        p = counters.peaks
        peaks = PeaksRecord(
            tflops=p.tensor_tflops,
            read_gbps=p.read_gbps,
            ridge=round(p.ridge, 3),
            basis=p.basis,
            source=p.source,
            text=ceilings_text(p),
        )
    return msgspec.structs.replace(
        found,
        kernels=kernels,
        placements=placements,
        peaks=peaks,
        seconds=None if found.seconds is None else round(found.seconds, 3),
        occupancy_measured=list(occupancy_measured),
    )


def counters_of(found: CountersRecord) -> CellCounters:
    """The live counters of a record (the inverse of `counters_record`), for the tables and the roofline."""
    from attnprof.analysis.counters import CellCounters, KernelCounters, KernelPlacement, StallShare, TraceMatch
    from attnprof.analysis.hardware import Peaks

    def kernel(k: KernelCountersRecord) -> KernelCounters:
        values: dict[str, Any] = {
            name: getattr(k, name)
            for name in KernelCounters.__dataclass_fields__
            if name not in ("block", "grid", "stalls")
        }
        return KernelCounters(
            **values,
            block=None if k.block is None else tuple(k.block),  # type: ignore[arg-type]
            grid=None if k.grid is None else tuple(k.grid),  # type: ignore[arg-type]
            stalls=tuple(StallShare(s.reason, s.per_issue, s.share_pct) for s in k.stalls),
        )

    peaks = found.peaks
    match = found.match
    return CellCounters(
        kernels=[kernel(k) for k in found.kernels],
        placements=[msgspec.convert(p, KernelPlacement, from_attributes=True) for p in found.placements],
        counted=list(found.counted),
        kernels_per_step=found.kernels_per_step,
        shown_step=found.shown_step,
        flops_per_step=found.flops_per_step,
        flops_source=found.flops_source,
        compulsory_bytes=found.compulsory_bytes,
        peaks=None if peaks is None else Peaks(peaks.read_gbps, peaks.tflops, peaks.basis, peaks.source),  # type: ignore[arg-type]
        unit=found.unit,
        device=found.device,
        seconds=found.seconds,
        report_path=found.report_path,
        notes=list(found.notes),
        match=None if match is None else TraceMatch(match.matched, match.total, match.attention, list(match.unmatched)),
    )
