"""The judge: a row's final findings, from everything the row measured.

The registry's rules judge a trace alone. A row knows more: what its variant is on purpose, its
latency timed without the profiler, the alternatives to a dense mask measured beside it, the
hardware counters of its kernels. `judge(Verdict)` takes the trace's findings as the registry built
them and all of that, and returns the row's findings; no other package creates, drops, rewrites or
merges a finding. Each step is a judge rule, a function `(findings, verdict) -> findings` in
`JUDGE_RULES`, applied in that order:

- `flag_contention`: `cpu-contention` first when the latency was timed while other processes held the
  CPU (everything timed without the profiler rests on it);
- `settle_cpu_bound`: `cpu-bound` against the unprofiled latency (the profiler's own recording is
  host time too);
- `settle_gpu_idle`: `gpu-idle` at most the unprofiled latency less the GPU's busy time;
- `net_of_recording`: `cpu-bound` and `gpu-idle` net of the profiler's own recording, its cost per op
  calibrated on this machine (`analyze` of a trace timed by nothing else);
- `weigh_dense_mask`: `dense-mask` with the alternatives measured at the same shape and what the
  fastest would save;
- `apply_timed_fixes`: a finding whose proposed fix was timed at its shape (`TimedFix`, e.g. the fused
  call for `unfused-attention`) takes the measured saving as its impact, labelled "timed", in place
  of its estimate; one whose fix could not be timed (`FixNotTimed`) says why and how to time it;
- `join_counters`: `occupancy-unreported` judged again without the kernels Nsight Compute measured,
  then the counter findings;
- `judge_attainable` (`findings/attainable.py`): `memory-bound` and `tensor-pipe-underused` against the best
  implementation known at the call's shape (`Verdict.reference`), `info` inside its band;
- `join_gpu_health`: the findings on the GPU while the latency was timed (`throttled`), from its NVML
  samples;
- `drop_by_design`: the findings that only restate what the variant is on purpose.

After a run the alternatives found among its rows reach a row judged before through
`judge_alternatives`, which runs `weigh_dense_mask` alone on the row's findings; the fastest variant of the
run at a row's cell through `judge_best_known`, which runs `judge_attainable` alone; an fp8 row's fastest bf16
counterpart at its shape through `judge_fp8`, which runs the fp8 rules (`findings/fp8.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from attnprof.analysis.findings.attainable import Work, judge_attainable
from attnprof.analysis.findings.counters import RULES as COUNTER_RULES
from attnprof.analysis.findings.cpu import RULES as CPU_RULES
from attnprof.analysis.findings.fp8 import RULES as FP8_RULES
from attnprof.analysis.findings.gpu_health import RULES as GPU_HEALTH_RULES
from attnprof.analysis.findings.occupancy import RULES as OCCUPANCY_RULES
from attnprof.analysis.findings.recording import RecordingCost
from attnprof.analysis.findings.registry import (
    Finding,
    FindingContext,
    Fp8AgainstBf16,
    GpuHealthReading,
    HostDevice,
    Numbers,
    Timed,
    numbers,
    us,
)
from attnprof.analysis.findings.timed_fixes import FixNotTimed, TimedFix, apply_timed_fixes
from attnprof.analysis.instance.stalls import GPU_IDLE_SHARE

if TYPE_CHECKING:
    from attnprof.analysis.attainable import Reference, ShapeKey
    from attnprof.analysis.counters.cell import CellCounters
    from attnprof.analysis.instance.metrics import KernelStats

CPU_BOUND = "cpu-bound"
CPU_CONTENTION = "cpu-contention"
DENSE_MASK = "dense-mask"
GPU_IDLE = "gpu-idle"
OCCUPANCY_UNREPORTED = "occupancy-unreported"
#: cpu-bound stands only while the unprofiled latency is above the device time per instance by more than this.
CPU_BOUND_LATENCY_MARGIN = 1.10
#: The kinds of alternative to a dense mask, and how a sentence names each.
IS_CAUSAL = "is_causal"
BLOCK_MASK = "block-mask"
KIND_TEXT = {IS_CAUSAL: "SDPA with is_causal=True", BLOCK_MASK: "FlexAttention with a BlockMask"}
#: An alternative's `source` when it is a cell of the same run (else it was measured for comparison).
THIS_RUN = "this run"


class Alternative(Protocol):
    """An alternative to a dense mask as the judge reads it (`results.schema.MaskAlternative` is one): its
    kind (`IS_CAUSAL`, `BLOCK_MASK`), who ran it at which cell, where it comes from (`THIS_RUN` or measured
    for comparison), its latency (None: it did not run, `reason` says why)."""

    @property
    def kind(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def cell(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def latency_us(self) -> float | None: ...
    @property
    def reason(self) -> str | None: ...


@dataclass(frozen=True)
class Counted:
    """What the judge reads of a row's hardware counters (`Counted.of`): the counter findings of the step
    they judge, and the names of the trace's kernels whose achieved occupancy Nsight Compute measured."""

    findings: tuple[Finding, ...] = ()
    measured: frozenset[str] = frozenset()

    @classmethod
    def of(cls, counters: CellCounters, kernels: Sequence[KernelStats]) -> Counted:
        """What the judge reads of `counters` for a trace whose per-kernel statistics are `kernels`: the
        counter findings of the step the tables show (none when the report holds no whole step)."""
        found: list[Finding] = []
        if counters.steps:
            step = counters.shown
            context = FindingContext([], [], None, None, 0.0, step.time_us, unit=counters.unit, counters=step)
            found = COUNTER_RULES.build(context)
        return cls(tuple(found), counters.measured_names(kernels))


@dataclass(frozen=True)
class Verdict:
    """Everything a row's findings are judged on.

    `findings` are the trace's, as the registry built them, and `kernels` the trace's per-kernel
    statistics. `by_design`: the ids the variant shows on purpose. `latency_us`: the instance timed
    without the profiler (None: not timed); it is also the dense cell's latency the alternatives are
    weighed against. `gpu_time_us`: the device time per instance under the profiler. `unit`: what one
    instance is called ("forward", or "step" with backward work). `alternatives`: the dense mask's,
    measured. `counters`: the hardware counters (None without). `gpu_health`: the GPU over the timed calls
    (NVML; None: not sampled). `timed`: how the latency was timed, as far as the machine's load goes (None:
    not timed). `timed_fixes`: the fixes timed at the findings' shapes (see `TimedFix`), `untimed_fixes` those
    that could not be (`FixNotTimed`). `recording`: the
    profiler's own recording per instance (None: not calibrated), weighed against `host_device`, the trace's
    CPU against its GPU (None: no device work). `reference`: the best known rate by shape key (None: not judged
    against it), `work` the calls `memory-bound` names, each with its key, and `shape_key` the key all the
    calls share (None: unknown or several), for the work a finding's evidence holds together."""

    findings: Sequence[Finding] = ()
    kernels: Sequence[KernelStats] = ()
    by_design: frozenset[str] = frozenset()
    latency_us: float | None = None
    gpu_time_us: float | None = None
    unit: str = "forward"
    alternatives: Sequence[Alternative] = field(default_factory=tuple)
    counters: Counted | None = None
    gpu_health: GpuHealthReading | None = None
    timed: Timed | None = None
    timed_fixes: Sequence[TimedFix] = ()
    untimed_fixes: Sequence[FixNotTimed] = ()
    recording: RecordingCost | None = None
    host_device: HostDevice | None = None
    reference: Reference | None = None
    work: Sequence[Work] = ()
    shape_key: ShapeKey | None = None


JudgeRule = Callable[[list[Finding], Verdict], list[Finding]]


def _replaced(findings: list[Finding], finding_id: str, change: Callable[[Finding], Finding]) -> list[Finding]:
    """`findings` with the one called `finding_id` (if any) replaced by `change(it)`."""
    return [change(f) if f.id == finding_id else f for f in findings]


def flag_contention(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """`cpu-contention` (the cpu module's rule, over `verdict.timed`) before the other findings when the kept
    timing was contended; the findings stand otherwise."""
    if verdict.timed is None:
        return findings
    found = CPU_RULES.get(CPU_CONTENTION).match(FindingContext([], [], None, None, 0.0, None, timed=verdict.timed))
    return findings if found is None else [found, *(f for f in findings if f.id != CPU_CONTENTION)]


def settle_cpu_bound(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """`cpu-bound` rests on the CPU time under the profiler, which also pays for the profiler's own
    recording (every op, their input shapes). The latency timed without it settles the question: when it
    is within 10% (`CPU_BOUND_LATENCY_MARGIN`) of the device time per instance, the GPU sets the pace,
    and the finding becomes `info`, without impact, saying so. Without a latency or a device time the
    finding stands as the trace gave it."""
    latency, gpu = verdict.latency_us, verdict.gpu_time_us
    if not latency or not gpu or latency > CPU_BOUND_LATENCY_MARGIN * gpu:
        return findings
    note = (
        f" Timed without the profiler, though, a {verdict.unit} takes {latency:,.1f} us, within "
        f"{CPU_BOUND_LATENCY_MARGIN - 1:.0%} of its {gpu:,.1f} us on the GPU: the host time above includes the "
        "profiler's own recording, and the GPU sets the pace."
    )
    settled = numbers(latency_us=latency, gpu_time_us=gpu, margin=CPU_BOUND_LATENCY_MARGIN, settled=True)

    def settle(finding: Finding) -> Finding:
        evidence = finding.evidence | settled
        return replace(
            finding, message=finding.message + note, severity="info", impact_us=None, impact_pct=None, evidence=evidence
        )

    return _replaced(findings, CPU_BOUND, settle)


def settle_gpu_idle(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """`gpu-idle` measures the idle time inside the span of the GPU's work under the profiler, whose own
    recording stretches the host's share of it. Timed without the profiler, an instance leaves the GPU idle
    at most its latency less the GPU's busy time (`verdict.host_device`): where the profiled idle time is
    longer, that bound is the finding's impact, or it becomes `info` without impact when the bound is not
    more than `GPU_IDLE_SHARE` of the latency. Without a latency or device work it stands."""
    latency, facts = verdict.latency_us, verdict.host_device
    if not latency or facts is None:
        return findings
    idle = max(latency - facts.gpu_busy_us, 0.0)
    share = idle / latency

    def settle(finding: Finding) -> Finding:
        if finding.impact_us is None or finding.impact_us <= idle:
            return finding
        message = (
            f"{finding.message} Timed without the profiler, though, a {verdict.unit} takes {us(latency)}: beside "
            f"the GPU's {us(facts.gpu_busy_us)} of work it sits idle at most {us(idle)}, {share:.0%}"
        )
        evidence = finding.evidence | numbers(
            latency_us=latency, gpu_busy_us=facts.gpu_busy_us, unprofiled_idle_us=idle, settled=True
        )
        if share <= GPU_IDLE_SHARE:
            message += f", not more than {GPU_IDLE_SHARE:.0%}: the idle time above is the profiled run's."
            return replace(
                finding, message=message, severity="info", impact_us=None, impact_pct=None, evidence=evidence
            )
        return replace(finding, message=message + ".", impact_us=idle, impact_pct=100.0 * share, evidence=evidence)

    return _replaced(findings, GPU_IDLE, settle)


def _netted(finding: Finding, note: str, evidence: Numbers, impact_us: float | None) -> Finding:
    """`finding` with `note` after its message and `evidence`: `info` without impact when `impact_us` is None,
    else a problem of that impact (its percentage scaled alike)."""
    message = finding.message + note
    if impact_us is None:
        return replace(finding, message=message, severity="info", impact_us=None, impact_pct=None, evidence=evidence)
    pct = finding.impact_pct * impact_us / finding.impact_us if finding.impact_pct and finding.impact_us else None
    return replace(finding, message=message, impact_us=impact_us, impact_pct=pct, evidence=evidence)


def net_of_recording(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """`cpu-bound` and `gpu-idle` net of the profiler's own recording (`verdict.recording`), for a trace with
    no unprofiled latency to settle them. `cpu-bound`: the CPU's work less the recording; when that no longer
    exceeds the GPU's busy time the finding becomes `info` without impact, else its impact is the net excess.
    `gpu-idle`: at most the recording's time of the idle time was the recording's (the CPU it held was not
    launching); when the rest is no more than `GPU_IDLE_SHARE` of the span left, it becomes `info`, else its
    impact is the idle time left. Each says how much of the host time the recording was. A finding settled
    or netted before stands."""
    recording, unit = verdict.recording, verdict.unit
    if recording is None or recording.cost_us <= 0:
        return findings

    def cpu_bound(finding: Finding) -> Finding:
        cpu, busy = finding.evidence.get("cpu_us"), finding.evidence.get("gpu_us")
        if finding.evidence.get("settled") or finding.evidence.get("net_cpu_us") is not None:
            return finding
        if not isinstance(cpu, float | int) or not isinstance(busy, float | int):
            return finding
        net = cpu - recording.part_us(cpu)
        note = " " + recording.sentence(cpu, unit)
        evidence = finding.evidence | recording.evidence(cpu) | numbers(net_cpu_us=net)
        if net <= busy:
            note += f": net of it, {us(net)} is within the GPU's {us(busy)}, and the GPU sets the pace."
            return _netted(finding, note, evidence, None)
        note += f"; net of it, the CPU still exceeds the GPU's busy time by {us(net - busy)}."
        return _netted(finding, note, evidence, net - busy)

    def gpu_idle(finding: Finding) -> Finding:
        facts, idle = verdict.host_device, finding.impact_us
        if facts is None or idle is None or finding.evidence.get("settled") or "net_idle_us" in finding.evidence:
            return finding
        host = facts.cpu_work_us
        part = min(recording.part_us(host), idle)  # the GPU waited on the recording at most all its idle time
        net_idle, net_span = idle - part, facts.gpu_span_us - part
        share = net_idle / net_span if net_span > 0 else 0.0
        note = " " + recording.sentence(host, unit)
        evidence = finding.evidence | recording.evidence(host) | numbers(net_idle_us=net_idle, net_idle_share=share)
        if share <= GPU_IDLE_SHARE:
            note += (
                f": net of it, the GPU would sit idle about {us(net_idle)} of {us(net_span)}, {share:.0%}, "
                f"not more than {GPU_IDLE_SHARE:.0%}."
            )
            return _netted(finding, note, evidence, None)
        note += f"; net of it, the GPU would still sit idle about {us(net_idle)} of {us(net_span)}, {share:.0%}."
        return _netted(finding, note, evidence, net_idle)

    return _replaced(_replaced(findings, CPU_BOUND, cpu_bound), GPU_IDLE, gpu_idle)


def alternative_sentence(alt: Alternative, dense_us: float) -> str:
    """What the alternative took, against the dense cell's `dense_us`, in one sentence."""
    what = f"{KIND_TEXT[alt.kind]} ({alt.variant} at {alt.cell})"
    if alt.latency_us is None or alt.latency_us <= 0:
        if alt.source == THIS_RUN:
            return f"{what} did not run in this run: {alt.reason}."
        return f"{what} could not be measured for comparison here: {alt.reason}."
    how = "a cell of this run" if alt.source == THIS_RUN else "measured for comparison, outside the profiled region"
    ratio = dense_us / alt.latency_us
    relative = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return f"{what} takes {us(alt.latency_us)} ({how}) against this cell's {us(dense_us)}: {relative}."


def saved_by(alternatives: Sequence[Alternative], dense_us: float) -> tuple[float, float] | None:
    """What the fastest measured alternative would save per call: (µs, % of the dense cell's latency);
    None when none ran, or none is faster."""
    times = [a.latency_us for a in alternatives if a.latency_us is not None]
    if not times or min(times) >= dense_us:
        return None
    saved = dense_us - min(times)
    return saved, 100.0 * saved / dense_us


def weigh_dense_mask(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """`dense-mask` names what the way that skips the masked blocks took at the same shape (a sentence per
    alternative after the trace's), and, where one is faster, what the fastest would save is its impact:
    the mask's conversion kernels are only part of what a dense mask costs, and a timed alternative is what
    a user could win. Without alternatives or a latency the finding stands as the trace gave it."""
    alternatives, dense = verdict.alternatives, verdict.latency_us
    if not alternatives or not dense:
        return findings

    def weigh(finding: Finding) -> Finding:
        message = " ".join([finding.message, *(alternative_sentence(a, dense) for a in alternatives)])
        saved = saved_by(alternatives, dense)
        if saved is None:
            return replace(finding, message=message, evidence=finding.evidence | numbers(dense_latency_us=dense))
        fastest = min((a for a in alternatives if a.latency_us is not None), key=lambda a: a.latency_us or 0.0)
        evidence = numbers(
            dense_latency_us=dense,
            alternative_kind=fastest.kind,
            alternative_variant=fastest.variant,
            alternative_cell=fastest.cell,
            alternative_source=fastest.source,
            alternative_latency_us=fastest.latency_us,
            saved_us=saved[0],
        )
        evidence = finding.evidence | evidence
        return replace(
            finding, message=message, impact_us=saved[0], impact_pct=saved[1], evidence=evidence, no_impact_reason=None
        )

    return _replaced(findings, DENSE_MASK, weigh)


def join_counters(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """With hardware counters, a kernel whose achieved occupancy Nsight Compute measured is no longer
    `occupancy-unreported`: the finding is judged again over the other kernels (and goes when none is
    left); then the counter findings whose ids are not already among the findings follow, in their
    registry's order. Without counters the findings stand."""
    counted = verdict.counters
    if counted is None:
        return findings
    found: list[Finding] = []
    for finding in findings:
        if finding.id == OCCUPANCY_UNREPORTED and counted.measured:
            left = [k for k in verdict.kernels if k.name not in counted.measured]
            again = OCCUPANCY_RULES.get(OCCUPANCY_UNREPORTED).match(FindingContext([], left, None, None, 0.0, None))
            if again is not None:
                found.append(again)
            continue
        found.append(finding)
    ids = {f.id for f in found}
    return found + [f for f in counted.findings if f.id not in ids]


def join_gpu_health(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """With NVML samples of the GPU over the timed calls, the gpu-health findings (`throttled`) follow the
    others, in their registry's order, judged against the latency timed over those calls (the instance's
    time their impact is a share of); without samples the findings stand."""
    if verdict.gpu_health is None:
        return findings
    latency, unit = verdict.latency_us, verdict.unit
    context = FindingContext([], [], None, None, 0.0, latency, unit=unit, gpu_health=verdict.gpu_health)
    ids = {f.id for f in findings}
    return findings + [f for f in GPU_HEALTH_RULES.build(context) if f.id not in ids]


def drop_by_design(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    """A variant's `by_design` findings only restate what it is on purpose (sdpa-math pins the math
    backend, so `backend-fallback` tells its user nothing): its rows leave them out. `analyze` on the same
    trace, which knows no variant, keeps them."""
    if not verdict.by_design:
        return findings
    return [f for f in findings if f.id not in verdict.by_design]


#: The judge's rules, in the order they run.
JUDGE_RULES: tuple[JudgeRule, ...] = (
    flag_contention,
    settle_cpu_bound,
    settle_gpu_idle,
    net_of_recording,
    weigh_dense_mask,
    apply_timed_fixes,
    join_counters,
    judge_attainable,
    join_gpu_health,
    drop_by_design,
)


def judge(verdict: Verdict) -> list[Finding]:
    """A row's final findings: the trace's, through every rule of `JUDGE_RULES` in order."""
    findings = list(verdict.findings)
    for rule in JUDGE_RULES:
        findings = rule(findings, verdict)
    return findings


def judge_alternatives(
    findings: Sequence[Finding], alternatives: Sequence[Alternative], dense_us: float
) -> list[Finding]:
    """The findings of a row judged before, with the alternatives found after its run among the run's rows
    (a dense cell's cells of the same run): `weigh_dense_mask` alone runs again, on `dense-mask` as the row
    holds it (with the sentences of any alternative measured for comparison already in it)."""
    return weigh_dense_mask(list(findings), Verdict(alternatives=alternatives, latency_us=dense_us))


def judge_best_known(findings: Sequence[Finding], reference: Reference, unit: str) -> list[Finding]:
    """The findings of a row judged before, against the best known at its shape found after its run (the
    fastest variant of the run at its cell): `judge_attainable` alone, on the work the findings' evidence holds."""
    return judge_attainable(list(findings), Verdict(reference=reference, unit=unit))


def judge_fp8(findings: Sequence[Finding], against: Fp8AgainstBf16, unit: str) -> list[Finding]:
    """The findings of an fp8 row judged before, with the fastest bf16 row of its shape and mode found after its
    run: the fp8 rules (`fp8-not-faster`) judged again against it, their findings in place of any the row held,
    the others kept; the context's instance time is the fp8 row's latency."""
    context = FindingContext([], [], None, None, 0.0, against.fp8_latency_us, unit=unit, fp8_vs_bf16=against)
    fp8_ids = set(FP8_RULES.ids())
    return [f for f in findings if f.id not in fp8_ids] + FP8_RULES.build(context)
