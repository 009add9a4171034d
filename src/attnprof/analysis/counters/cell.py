"""What a row holds of Nsight Compute: `CellCounters`, made by `counters_for_cell` (run, compare, sweep,
model) or `counters_for_trace` (`analyze --ncu-report`).

`CellCounters` keeps every kernel of the report with its roofline placement, the steps they form, the
step the tables show and the findings judge (the median one by time), the time Nsight Compute took and the
report's path; its JSON is the schema's (`results.records.counters_record`, read back by `counters_of`).
It holds measurements only: the judge (`analysis.findings.judge.Counted.of`) reads its shown step and
`measured_names` (the trace's kernels whose achieved occupancy Nsight Compute measured) and makes the
counter findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnprof.analysis.counters.kernel import CounterReport, KernelCounters
from attnprof.analysis.counters.roofline import KernelPlacement, StepCounters, kernel_key, place_kernels, steps_of
from attnprof.analysis.hardware import Peaks, datasheet
from attnprof.analysis.roofline import bytes_moved, flops_convention, step_flops
from attnprof.registry import RunSpec

if TYPE_CHECKING:
    from attnprof.analysis.instance.ledger_summary import AttentionLedger
    from attnprof.analysis.instance.metrics import KernelStats
    from attnprof.analysis.trace.tables import ParsedTrace

UNREPORTED = "occupancy-unreported"


@dataclass(frozen=True)
class TraceMatch:
    """How a report's kernels met a trace's launches (`analyze --ncu-report`): `matched` of `total` report
    kernels found their launch (the i-th report kernel of a name is the i-th launch of that name in the
    trace), `attention` of them inside the trace's attention calls; `unmatched` the others' short names."""

    matched: int
    total: int
    attention: int
    unmatched: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """One line for the output."""
        text = (
            f"{self.matched} of {self.total} report kernel(s) matched the trace's launches by name and order, "
            f"{self.attention} of them in attention calls"
        )
        return text + (f"; unmatched: {', '.join(self.unmatched)}" if self.unmatched else "")


@dataclass
class CellCounters:
    """One row's hardware counters (see the module docstring). `placements` has one entry per kernel, in
    the same order; `counted` lists the indices of the kernels placed on the roofline (the attention
    kernels; all of them in a cell), in steps of `kernels_per_step`; `shown_step` is the step the tables
    show and the findings judge. `flops_per_step` and `compulsory_bytes` are the step's (None unknown),
    `peaks` the ceilings the placements use, `seconds` what Nsight Compute took (None when not timed)."""

    kernels: list[KernelCounters]
    placements: list[KernelPlacement]
    counted: list[int]
    kernels_per_step: int
    shown_step: int = 0
    flops_per_step: float | None = None
    flops_source: str | None = None
    compulsory_bytes: float | None = None
    peaks: Peaks | None = None
    unit: str = "forward"
    device: str | None = None
    seconds: float | None = None
    report_path: str | None = None
    notes: list[str] = field(default_factory=list)
    match: TraceMatch | None = None

    @property
    def steps(self) -> int:
        """How many steps the counted kernels form."""
        return len(self.counted) // self.kernels_per_step if self.kernels_per_step else 0

    def step(self, number: int) -> StepCounters:
        """The counted kernels of step `number` with their placements."""
        at = self.counted[number * self.kernels_per_step : (number + 1) * self.kernels_per_step]
        return StepCounters(
            [self.kernels[i] for i in at],
            [self.placements[i] for i in at],
            self.compulsory_bytes,
            self.peaks,
            self.unit,
        )

    @property
    def shown(self) -> StepCounters:
        """The step the tables show and the findings judge."""
        return self.step(self.shown_step)

    def measured_names(self, kernels: Sequence[KernelStats]) -> frozenset[str]:
        """The names of those of a trace's `kernels` whose achieved occupancy Nsight Compute measured."""
        measured = measured_occupancy(self)
        return frozenset(k.name for k in kernels if kernel_key(k.name) in measured)


def ceilings_text(peaks: Peaks | None) -> str:
    """`matmul 760 TFLOP/s and read 4,312 GB/s, measured on this machine (2026-12-02)` or `..., datasheet
    H200`; why there is none otherwise."""
    if peaks is None:
        return "no ceilings: none measured and no datasheet for this GPU"
    figures = (
        f"matmul {peaks.tensor_tflops:,.0f} TFLOP/s and read {peaks.read_gbps:,.0f} GB/s "
        f"(ridge {peaks.ridge:,.0f} FLOP/byte)"
    )
    if peaks.basis == "measured":
        when = peaks.source.rsplit("(", 1)[-1].rstrip(")") if "(" in peaks.source else "?"
        return f"{figures}, measured on this machine ({when})"
    return f"{figures}, {peaks.source.rsplit(' ', 2)[0]}"


def _or_datasheet(peaks: Peaks | None, device: str | None) -> Peaks | None:
    """`peaks` (measured on this machine), else the datasheet of the GPU the report names (None: unknown)."""
    if peaks is not None:
        return peaks
    sheet = datasheet(device)
    return sheet.peaks if sheet else None


def counters_for_cell(
    report: CounterReport,
    spec: RunSpec | None,
    peaks: Peaks | None,
    *,
    seconds: float | None,
    report_path: str | None,
) -> CellCounters:
    """A cell's counters from its report: every kernel placed on the roofline with the step's useful FLOPs
    (`step_flops(spec)`; none without a spec) against `peaks` (measured on this machine: `attnprof.peaks`;
    else the datasheet of the report's GPU), the counter findings of its median step, `seconds` Nsight
    Compute took and the report's path."""
    flops = step_flops(spec) if spec is not None else None
    source = flops_convention(spec) if spec is not None else None
    compulsory = bytes_moved(spec) if spec is not None else None
    unit = "forward" if spec is None or spec.mode == "fwd" else "step"
    indices = list(range(len(report.kernels)))
    return _assemble(
        report, indices, flops, source, compulsory, _or_datasheet(peaks, report.device), unit, seconds, report_path
    )


def _assemble(
    report: CounterReport,
    counted: list[int],
    flops: float | None,
    flops_source: str | None,
    compulsory: float | None,
    peaks: Peaks | None,
    unit: str,
    seconds: float | None,
    report_path: str | None,
    match: TraceMatch | None = None,
    notes: list[str] | None = None,
) -> CellCounters:
    kernels = report.kernels
    per_step = steps_of([kernels[i] for i in counted]) if counted else 0
    cut = counted[len(counted) - len(counted) % per_step :] if per_step else []
    counted = counted[: len(counted) - len(cut)]
    chosen = [kernels[i] for i in counted]
    placed, place_notes = place_kernels(chosen, per_step, flops, peaks) if chosen else ([], [])
    by_index = {p.index: p for p in placed}
    why = {i: "not placed: the report ends inside a step" for i in cut}
    placements = [
        by_index.get(k.index)
        or KernelPlacement(
            k.index, -1, None, None, None, None, None, None, why.get(k.index, "not placed: not in an attention call")
        )
        for k in kernels
    ]
    if cut:
        place_notes.append(f"the report ends {len(cut)} kernel(s) into a step: they are not placed")
    result = CellCounters(
        kernels=list(kernels),
        placements=placements,
        counted=counted,
        kernels_per_step=per_step,
        flops_per_step=flops,
        flops_source=flops_source,
        compulsory_bytes=compulsory,
        peaks=peaks,
        unit=unit,
        device=report.device,
        seconds=seconds,
        report_path=report_path,
        notes=[*report.notes, *(notes or []), *place_notes],
        match=match,
    )
    if result.steps:
        result.shown_step = _median_step(result)
        if result.steps > 1:
            result.notes.append(
                f"the report holds {result.steps} {unit}s of {per_step} kernel(s); the tables show and the findings "
                f"judge {unit} {result.shown_step + 1}, the median by time"
            )
    return result


def _median_step(counters: CellCounters) -> int:
    """The step whose kernels' time is the (low) median of the steps'."""
    times = sorted((counters.step(n).time_us, n) for n in range(counters.steps))
    return times[(len(times) - 1) // 2][1]


# --------------------------------------------------------------------------- what the judge reads


def measured_occupancy(counters: CellCounters) -> dict[str, float]:
    """Achieved occupancy (percent) Nsight Compute measured, by `kernel_key` (the first launch of a name)."""
    found: dict[str, float] = {}
    for k in counters.kernels:
        if k.achieved_occupancy_pct is not None:
            found.setdefault(kernel_key(k.name), k.achieved_occupancy_pct)
    return found


def occupancy_notes(kernels: list[KernelStats], counters: CellCounters) -> list[str]:
    """For each kernel the trace reported no achieved occupancy for, the figure Nsight Compute measured."""
    measured = measured_occupancy(counters)
    return [
        f"{k.short_name}: achieved occupancy {measured[key]:.1f}% measured by Nsight Compute (the trace reported none)"
        for k in kernels
        if k.kind == "kernel" and k.achieved_occupancy_pct is None and (key := kernel_key(k.name)) in measured
    ]


# --------------------------------------------------------------------------- analyze --ncu-report


def match_report(report: CounterReport, trace: ParsedTrace) -> list[str | None]:
    """The trace's name of each report kernel's launch, None where there is none: the i-th report kernel of
    a name is the i-th launch of that name in the trace (launches in time order). Names are compared by
    `kernel_key`, else by their short name when only one trace name has it."""
    from attnprof.analysis.base import KERNEL
    from attnprof.analysis.short_names import short_kernel_name

    dev, names = trace.device, trace.names
    launches: dict[str, list[str]] = {}
    for e in sorted((e for e in range(len(dev)) if dev.kind[e] == KERNEL), key=dev.ts.__getitem__):
        name = names[dev.name[e]]
        launches.setdefault(kernel_key(name), []).append(name)
    by_short: dict[str, list[str]] = {}
    for key, found in launches.items():
        by_short.setdefault(short_kernel_name(found[0]), []).append(key)
    seen: dict[str, int] = {}
    result: list[str | None] = []
    for k in report.kernels:
        key = kernel_key(k.name)
        if key not in launches:
            keys = by_short.get(k.short_name, [])
            key = keys[0] if len(keys) == 1 else key
        n = seen.get(key, 0)
        seen[key] = n + 1
        found = launches.get(key, [])
        result.append(found[n] if n < len(found) else None)
    return result


def counters_for_trace(
    report: CounterReport,
    trace: ParsedTrace,
    ledger: AttentionLedger | None,
    unit: str,
    peaks: Peaks | None,
    report_path: str,
) -> CellCounters:
    """`analyze --ncu-report`: the report's kernels met with the trace's launches (`match_report`), the
    attention kernels among them (those of the attention ledger's calls, `ledger`: None without device work)
    placed on the roofline with the FLOPs of the trace's attention calls (from their recorded shapes) against
    `peaks` (else the datasheet of the report's GPU), and the counter findings of a step (`unit`: what an
    instance is called)."""
    from attnprof.analysis.short_names import short_kernel_name

    matched = match_report(report, trace)
    in_calls = {name for call in (ledger.calls if ledger else []) for name in call.kernels}
    attention = [i for i, name in enumerate(matched) if name is not None and short_kernel_name(name) in in_calls]
    unmatched = [k.short_name for k, name in zip(report.kernels, matched, strict=True) if name is None]
    match = TraceMatch(
        sum(name is not None for name in matched), len(matched), len(attention), list(dict.fromkeys(unmatched))
    )
    notes: list[str] = []
    counted = attention
    if not attention:
        counted = list(range(len(report.kernels)))
        notes.append(
            "no report kernel ran inside an attention call of the trace: the report's kernels are taken as the steps"
        )
    per_step = steps_of([report.kernels[i] for i in counted])
    flops, how, compulsory = _trace_flops(ledger, per_step)
    if flops is None:
        notes.append(f"no kernel is placed on the roofline: the trace's attention FLOPs per {unit} are unknown, {how}")
    return _assemble(
        report,
        counted,
        flops,
        how if flops is not None else None,
        compulsory,
        _or_datasheet(peaks, report.device),
        unit,
        None,
        report_path,
        match,
        notes,
    )


def _trace_flops(ledger: AttentionLedger | None, per_step: int) -> tuple[float | None, str, float | None]:
    """The FLOPs of one report step of `per_step` kernels, how they were counted (or why they are unknown),
    and its compulsory bytes: those of the trace's attention calls per instance (a forward call's from its
    recorded shapes, a backward call's 2.5 times its forward call's), times the share of the instance's
    attention kernel launches a report step holds (one layer's call of a model with several)."""
    from attnprof.analysis.roofline import MODE_FLOPS_FACTOR

    if ledger is None or ledger.time_base != "device" or not ledger.calls:
        return None, "it has no attention call on the GPU", None
    flops, unknown_mask = 0.0, 0
    for call in ledger.calls:
        origin = call if call.phase == "forward" else None
        if call.phase != "forward" and call.forward_call is not None:
            origin = ledger.calls[call.forward_call]
        if origin is None:
            return None, "a backward call's forward call is not in the instance", None
        if origin.traffic is None:
            return None, "an attention call's shapes were not recorded (profile with record_shapes=True)", None
        flops += origin.traffic.flops * (1.0 if call.phase == "forward" else MODE_FLOPS_FACTOR["bwd"])
        unknown_mask += call.phase == "forward" and origin.traffic.causal is None
    launches = sum(1 for call in ledger.calls for k in call.kernels if not k.startswith(("Memcpy", "Memset")))
    share = min(1.0, per_step / launches) if per_step and launches else 1.0
    every_forward = all(call.phase == "forward" for call in ledger.calls)
    compulsory = ledger.bytes_per_forward if every_forward else None
    text = "the trace's attention calls, from their recorded shapes (forward 4·B·H·D per kept pair, backward 2.5x)"
    if unknown_mask:
        text += f"; every pair of {unknown_mask} forward call(s): is_causal not recorded"
    if share < 1.0:
        text += f", times {per_step} of the {launches} attention kernels an instance launches"
    return flops * share, text, None if compulsory is None else compulsory * share
