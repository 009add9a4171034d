"""The judge rule that weighs `memory-bound` and `tensor-pipe-underused` against the best implementation known at
the call's shape, not against the roofline (`judge_attainable`), and the per-call facts it reads (`Work`).

The reference (`Verdict.reference`, an `analysis.attainable.Reference`) is the fastest variant of the same run at
the same cell in compare and sweep, and the table attnprof ships (`analysis.attainable`) in analyze, model and a
run of one variant. A call's attainable time is its bytes at the reference's kernel GB/s (`memory-bound`) or its
FLOPs at its kernel TFLOP/s (`tensor-pipe-underused`); the impact is the time above it. A call at or above
`ATTAINABLE_BAND` of the reference is inside what the best known reaches: when every call named is, the finding
is `info` without impact. A finding with a call whose shape has no reference stays as the trace gave it, and its
evidence says why (`attainable_note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from attnprof.analysis.attainable import (
    ATTAINABLE_BAND,
    Attainable,
    AttainableLookup,
    NoReference,
    Reference,
    ShapeKey,
    canonical_mask,
)
from attnprof.analysis.findings.memory import slow_calls
from attnprof.analysis.findings.registry import Finding, numbers, us

if TYPE_CHECKING:
    from attnprof.analysis.instance.ledger import CallFacts
    from attnprof.analysis.instance.ledger_summary import AttentionLedger

MEMORY_BOUND = "memory-bound"
TENSOR_PIPE_UNDERUSED = "tensor-pipe-underused"
#: The findings judged against the attainable, and the rate each reads ("gbps": bytes; "tflops": FLOPs).
RATES = {MEMORY_BOUND: "gbps", TENSOR_PIPE_UNDERUSED: "tflops"}


@dataclass(frozen=True)
class Work:
    """One call (or the calls together) a finding names: its shape key (None: the row's own shape), bytes,
    FLOPs and time per instance (µs)."""

    finding: str
    key: ShapeKey | None
    bytes: float
    flops: float
    time_us: float

    def rate(self, which: str) -> float:
        """Its achieved GB/s ("gbps") or TFLOP/s ("tflops")."""
        work = self.bytes if which == "gbps" else self.flops / 1e3
        return work / self.time_us / 1e3 if self.time_us > 0 else 0.0


class Weighed(Protocol):
    """What `judge_attainable` reads of the judge's `Verdict`: the reference, the work named per call, the
    calls' common key, what an instance is called and its device time (the base of an impact's share)."""

    @property
    def reference(self) -> Reference | None: ...
    @property
    def work(self) -> Sequence[Work]: ...
    @property
    def shape_key(self) -> ShapeKey | None: ...
    @property
    def unit(self) -> str: ...
    @property
    def gpu_time_us(self) -> float | None: ...


def call_key(call: CallFacts, dtype: str | None) -> ShapeKey | None:
    """The key of a forward call with recorded shapes in `dtype` (None without either)."""
    traffic = call.traffic
    if traffic is None or not dtype or not traffic.head_dim or not traffic.queries:
        return None
    mask = "other" if call.mask_type is not None else canonical_mask(None, traffic.causal)
    return ShapeKey("fwd", traffic.queries, traffic.keys, traffic.head_dim, mask, dtype, traffic.batch_heads)


def memory_work(ledger: AttentionLedger | None, dtype: str | None) -> list[Work]:
    """Each call `memory-bound` names, with its key (see `call_key`)."""
    if ledger is None:
        return []
    return [
        Work(MEMORY_BOUND, call_key(call, dtype), traffic.bytes, traffic.flops, call.time_us)
        for call, traffic, _ in slow_calls(ledger)
    ]


def common_key(ledger: AttentionLedger | None, dtype: str | None) -> ShapeKey | None:
    """The key every forward call of `ledger` shares; None when they differ or one is unknown."""
    keys = {call_key(c, dtype) for c in ledger.forward_calls} if ledger is not None else set()
    return keys.pop() if len(keys) == 1 else None


def attainable_facts(
    gpu: str | None, ledger: AttentionLedger | None, dtype: str | None, lookup: AttainableLookup | None
) -> dict[str, Any]:
    """The `Verdict` fields that weigh a trace's findings against the best known at its calls' shapes on the GPU
    called `gpu`: `lookup`'s reference, the calls `memory-bound` names and the calls' common key; {} without a
    lookup or device work."""
    if lookup is None or ledger is None or ledger.time_base != "device":
        return {}
    return {
        "reference": lookup(gpu, ledger.peaks),
        "work": memory_work(ledger, dtype),
        "shape_key": common_key(ledger, dtype),
    }


def _evidence_work(finding: Finding, key: ShapeKey | None) -> list[Work]:
    """The work a finding's evidence holds together (`registry.work_numbers`), as one item; [] without it."""
    nbytes, flops, time_us = (finding.evidence.get(name) for name in ("work_bytes", "work_flops", "work_time_us"))
    if not isinstance(time_us, float | int) or time_us <= 0:
        return []
    return [Work(finding.id, key, float(nbytes or 0.0), float(flops or 0.0), float(time_us))]


def _sentence(pct: float, ref: Attainable) -> str:
    return f"at {pct:.0f}% of the best known at this shape ({ref.variant}, {ref.source})"


def judge_attainable(findings: list[Finding], verdict: Weighed) -> list[Finding]:
    """`memory-bound` and `tensor-pipe-underused` against `verdict.reference` (see the module docstring). A
    finding already judged so, or whose impact was timed, stands; so do all without a reference."""
    reference = verdict.reference
    if reference is None:
        return findings

    def weigh(finding: Finding) -> Finding:
        which = RATES.get(finding.id)
        if which is None or "attainable_source" in finding.evidence or "attainable_note" in finding.evidence:
            return finding
        if str(finding.evidence.get("impact_basis", "")).startswith("timed"):
            return finding
        work = [w for w in verdict.work if w.finding == finding.id] or _evidence_work(finding, verdict.shape_key)
        if not work:
            return finding
        judged: list[tuple[Work, Attainable, float, float]] = []  # (work, reference, % of it, time above it)
        for w in work:
            ref = reference(w.key)
            best = ref.gbps if not isinstance(ref, NoReference) and which == "gbps" else None
            best = ref.tflops if not isinstance(ref, NoReference) and which == "tflops" else best
            if isinstance(ref, NoReference) or not best:
                why = ref.reason if isinstance(ref, NoReference) else f"the best known at this shape has no {which}"
                note = numbers(attainable_note=f"no attainable reference: {why}")
                return replace(finding, evidence=finding.evidence | note)
            pct = 100.0 * w.rate(which) / best
            above = w.time_us - (w.bytes / best / 1e3 if which == "gbps" else w.flops / best / 1e6)
            judged.append((w, ref, pct, max(above, 0.0)))
        return _rejudged(finding, verdict, judged, which)

    return [weigh(f) for f in findings]


def _rejudged(
    finding: Finding, verdict: Weighed, judged: list[tuple[Work, Attainable, float, float]], which: str
) -> Finding:
    """`finding` with its impact the time above the attainable of the calls below the band, `info` when none is."""
    w, ref, pct, _ = min(judged, key=lambda item: item[2])
    rate = "GB/s" if which == "gbps" else "TFLOP/s"
    best = ref.gbps if which == "gbps" else ref.tflops
    evidence = finding.evidence | numbers(
        impact_basis="attainable",
        attainable_variant=ref.variant,
        attainable_source=ref.source,
        pct_of_attainable=pct,
        **{f"attainable_{which}": best},
    )
    below = [above for _, _, p, above in judged if p < 100 * ATTAINABLE_BAND]
    where = _sentence(pct, ref) + f": {best:,.0f} {rate}"
    if not below:
        note = (
            f" Against what is attainable, though, it is {where}, inside the {ATTAINABLE_BAND:.0%} band: no "
            "implementation known is faster here, so nothing is lost to the roofline a user could win."
        )
        message = finding.message + note
        return replace(finding, message=message, severity="info", impact_us=None, impact_pct=None, evidence=evidence)
    impact = sum(below)
    base = finding.share_base_us or verdict.gpu_time_us
    note = f" It is {where}; {us(impact)} per {verdict.unit} above the best known is what a faster kernel would win."
    return replace(
        finding,
        message=finding.message + note,
        impact_us=impact,
        impact_pct=100.0 * impact / base if base else None,
        evidence=evidence,
        no_impact_reason=None,
    )
