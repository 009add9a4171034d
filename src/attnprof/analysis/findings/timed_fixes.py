"""Fixes timed at a finding's shape (`analyze --time-fixes`, `attnprof model`; `pipeline.fixes`), and the
judge rule that puts them into the findings (`apply_timed_fixes`, run by `judge.judge`): what a fix saved,
measured, in place of an estimate, or why it could not be timed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from attnprof.analysis.findings.registry import Finding, numbers, us


@dataclass(frozen=True)
class TimedFix:
    """A fix a finding proposes, timed at the finding's shape on this machine: the finding's id, what was
    timed (e.g. "sdpa-flash"), and the time per instance of the work the finding names, as traced
    (`before_us`) and with the fix (`after_us`), both re-created and timed here. `cpu_contention`: the largest
    share of the CPU other processes took while either was timed (None: not measured); `contended`: more than
    the limit the cells are judged by (such a saving measures that load too)."""

    finding: str
    alternative: str
    before_us: float
    after_us: float
    cpu_contention: float | None = None
    contended: bool = False

    @property
    def saved_us(self) -> float:
        """What the fix saves per instance (negative: it is slower)."""
        return self.before_us - self.after_us


@dataclass(frozen=True)
class FixNotTimed:
    """A fix a finding proposes that was not timed: the finding's id, the alternative ("" where nothing of
    the finding could be re-created) and why, in words that say how to get the timed figure."""

    finding: str
    alternative: str
    reason: str


class FixesVerdict(Protocol):
    """What `apply_timed_fixes` reads of the judge's `Verdict`."""

    @property
    def timed_fixes(self) -> Sequence[TimedFix]: ...
    @property
    def untimed_fixes(self) -> Sequence[FixNotTimed]: ...
    @property
    def gpu_time_us(self) -> float | None: ...
    @property
    def unit(self) -> str: ...


def apply_timed_fixes(findings: list[Finding], verdict: FixesVerdict) -> list[Finding]:
    """A finding whose fix was timed (`Verdict.timed_fixes`, the fastest where several were) takes what the
    fix saved as its impact, with evidence `impact_basis` "timed" replacing the estimate, and a sentence
    saying what was timed (the other alternatives, timed or not, named after it and in evidence
    `timed_alternatives`); its share keeps the base the finding's own impact had (else the device time
    per instance). A fix no faster than the traced work leaves an impact of 0. A finding whose fix was not
    timed at all (`Verdict.untimed_fixes`) keeps its impact and says why (evidence `timed_fix_reason`).
    Without either the findings stand."""
    fastest: dict[str, TimedFix] = {}
    for fix in verdict.timed_fixes:
        if fix.finding not in fastest or fix.saved_us > fastest[fix.finding].saved_us:
            fastest[fix.finding] = fix
    if not fastest and not verdict.untimed_fixes:
        return findings

    def others(finding_id: str, chosen: TimedFix) -> list[str]:
        fixes = verdict.timed_fixes
        timed_ = [f"{f.alternative} {us(f.after_us)}" for f in fixes if f.finding == finding_id and f != chosen]
        return timed_ + [f"{f.alternative}: {f.reason}" for f in verdict.untimed_fixes if f.finding == finding_id]

    def timed(finding: Finding) -> Finding:
        fix = fastest.get(finding.id)
        if fix is None:
            reasons = [f.reason.rstrip(".") for f in verdict.untimed_fixes if f.finding == finding.id]
            if not reasons:
                return finding
            note = f" Fix not timed: {reasons[0]}."
            return replace(
                finding, message=finding.message + note, evidence=finding.evidence | {"timed_fix_reason": reasons[0]}
            )
        saved = max(fix.saved_us, 0.0)
        base = finding.share_base_us or verdict.gpu_time_us
        rest = others(finding.id, fix)
        replacing, message = "", finding.message
        if finding.evidence.get("impact_basis") == "estimated":
            replacing = f" (in place of the estimate of {us(finding.impact_us)})" if finding.impact_us else ""
            estimate = finding.evidence.get("estimate_sentence")
            if isinstance(estimate, str) and message.endswith(estimate):
                message = message.removesuffix(estimate)  # the estimate and how to time it: timed now
        sentence = (
            f" Timed at this shape{replacing}: {fix.alternative} takes {us(fix.after_us)} against "
            f"{us(fix.before_us)} for the work as traced (both re-created here), saving {us(saved)} per "
            f"{verdict.unit}" + (f" (also: {'; '.join(rest)})." if rest else ".")
        )
        if fix.contended:
            sentence += (
                f" Other processes held {fix.cpu_contention or 0.0:.0%} of the CPU while it was timed: the saving "
                "measures that load too; time it again on a quiet machine."
            )
        evidence = finding.evidence | numbers(
            impact_basis="timed under contention" if fix.contended else "timed",
            timed_cpu_contention=fix.cpu_contention,
            timed_alternative=fix.alternative,
            timed_before_us=fix.before_us,
            timed_after_us=fix.after_us,
            saved_us=saved,
            timed_alternatives="; ".join([f"{fix.alternative} {us(fix.after_us)}", *rest]),
        )
        pct = 100.0 * saved / base if base else None
        return replace(
            finding,
            message=message + sentence,
            impact_us=saved,
            impact_pct=pct,
            evidence=evidence,
            no_impact_reason=None,
        )

    return [timed(f) for f in findings]
