"""What a finding is, and the registry that holds them: the base every themed module imports.

A `Rule` is one finding: a stable id, a one-line summary, a paragraph (what it means, why it costs,
what to do), a severity (`problem`: something to act on; `info`: a fact worth knowing) and the
evidence function that, given a `FindingContext`, returns the sentence that states it with its
numbers (or that sentence and the numbers by name, `Said`), or None when the trace does not support
it. A problem has an impact function: the time per instance (forward or step) at stake, in µs, from
measured numbers only, or `NoImpact(reason)` where the trace cannot measure it, the reason one of
`NO_IMPACT_REASONS`; its docstring says what it counts (docs/findings.md shows it). A problem may also
have a `settle` function, which, given the impact, says why this instance's finding is only `info` (a
cost by design, too small to act on), or None. `Rule.match(ctx)` wraps the sentence in a `Finding` with the
rule's severity, the impact, the impact's share of the instance's time
(`FindingContext.instance_time_us`) and the numbers (`Finding.evidence`). A `FindingRegistry` keeps
rules in order; a duplicate id raises, an unknown one gets close matches. Each themed module fills its
own `RULES` registry with `@RULES.rule(...)`, and the package joins them, in the order the findings
are emitted, into `FINDINGS`. The registry's findings are a trace's; `judge` gives a row its final ones.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from attnprof.errors import DuplicateFindingError, UnknownFindingError
from attnprof.stats import median

if TYPE_CHECKING:
    from attnprof.analysis.counters.roofline import StepCounters
    from attnprof.analysis.instance.ledger import ForwardLedger
    from attnprof.analysis.instance.ledger_summary import AttentionLedger
    from attnprof.analysis.instance.metrics import ForwardMetrics, KernelStats

#: `problem`: something to act on, with what it costs; `info`: a fact worth knowing, nothing to fix.
SEVERITIES = ("problem", "info")
ID_PATTERN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")

#: A finding's evidence: the numbers (and the few words) behind its sentence, by name.
Numbers = dict[str, float | str | bool | None]

#: Why a problem finding carries no impact, each reason what would measure it.
NoImpactReason = Literal[
    "needs-record-shapes",
    "needs-peaks",
    "no-device-work",
    "needs-alternative",
    "compute-bound",
    "needs-quiet-timing",
    "needs-clock-reference",
]
NO_IMPACT_REASONS: dict[str, str] = {
    "needs-record-shapes": "the impact is computed from the calls' input shapes: profile with record_shapes=True",
    "needs-peaks": "the impact is measured against a ceiling this GPU has none of (no measured ceiling, no "
    "datasheet figure)",
    "no-device-work": "the impact is device time, and the trace has none for this finding (a CPU-only trace)",
    "needs-alternative": "the cost is the alternative's saving, which only a run measures (run and compare time "
    "the alternative at the same shape)",
    "compute-bound": "the kernels are compute-bound: their extra traffic overlaps their math, so it costs no "
    "time the counters can measure",
    "needs-quiet-timing": "the cost is what other processes added to the latency, which only a timing of the same "
    "step on a calm machine measures",
    "needs-clock-reference": "the cost is the time lost below the GPU's applications clock, which this GPU does not "
    "report (or the row has no latency)",
}


@dataclass(frozen=True)
class NoImpact:
    """What an impact function returns where the trace cannot measure the impact: why (`NO_IMPACT_REASONS`)."""

    reason: NoImpactReason


@dataclass(frozen=True)
class Finding:
    """One finding: a stable id, the sentence that states it, its rule's severity and, where the trace
    measures it, its impact: the time per instance at stake (`impact_us`) and its percentage of the
    instance's time (`impact_pct`); `evidence` holds the numbers behind the sentence by name (empty where
    its rule names none), so tables, diff and check read them instead of parsing words. A problem without
    an impact says why in `no_impact_reason` (one of `NO_IMPACT_REASONS`)."""

    id: str
    message: str
    severity: str = "problem"
    impact_us: float | None = None
    impact_pct: float | None = None
    evidence: Numbers = field(default_factory=dict, hash=False)
    no_impact_reason: str | None = None

    @property
    def share_base_us(self) -> float | None:
        """The time its impact's share is of (µs): impact over share; None without both."""
        return 100.0 * self.impact_us / self.impact_pct if self.impact_us and self.impact_pct else None


def read_finding(written: Any) -> Finding:
    """A finding read back from its record (anything with a finding's fields: `results.parts.FindingRecord`),
    to judge a row made before; evidence written before findings had any is empty."""
    evidence = dict(written.evidence or {})
    reason = getattr(written, "no_impact_reason", None)
    return Finding(
        written.id, written.message, written.severity, written.impact_us, written.impact_pct, evidence, reason
    )


@dataclass(frozen=True)
class HostDevice:
    """The CPU against the GPU, medians over the instances with device work: the CPU's own work
    (`ForwardMetrics.cpu_work_us` less the waits in host syncs, which are not work: the GPU is busy
    meanwhile), those waits, the GPU's busy time (the span of its work less the time it ran nothing)
    and that span."""

    cpu_work_us: float
    sync_wait_us: float
    gpu_busy_us: float
    gpu_span_us: float

    @property
    def host_bound(self) -> bool:
        """True when the CPU's work exceeds the GPU's busy time: the GPU waits for launches."""
        return self.cpu_work_us > self.gpu_busy_us


def host_device_of(per_forward: Sequence[ForwardMetrics]) -> HostDevice | None:
    """The CPU against the GPU over these instances (see `HostDevice`); None without device work."""
    pairs = [(m, m.stalls) for m in per_forward if m.stalls is not None and m.stalls.span_us > 0]
    if not pairs:
        return None
    return HostDevice(
        median([m.cpu_work_us - s.sync_wait_us for m, s in pairs]),
        median([s.sync_wait_us for _, s in pairs]),
        median([s.busy_us for _, s in pairs]),
        median([s.span_us for _, s in pairs]),
    )


class GpuHealthReading(Protocol):
    """The GPU over a cell's timed calls, as the gpu-health findings read it (`profiling.gpu_health.GpuHealth`
    is one): NVML samples taken, those in which the GPU was idle, the SM clock's median and lowest (MHz, over
    the samples not idle), the applications clock (the reference; None where the GPU has none), the power
    draw in percent of its limit (median, highest), the highest temperature (°C) and each reason the driver
    gave for holding the clock down (other than idle) with the percentage of samples that showed it."""

    @property
    def samples(self) -> int: ...
    @property
    def idle_samples(self) -> int: ...
    @property
    def sm_clock_mhz(self) -> int: ...
    @property
    def sm_clock_min_mhz(self) -> int: ...
    @property
    def application_clock_mhz(self) -> int | None: ...
    @property
    def power_pct(self) -> float | None: ...
    @property
    def power_max_pct(self) -> float | None: ...
    @property
    def temperature_max_c(self) -> int | None: ...
    @property
    def reason_pcts(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class Timed:
    """How a row's latency was timed without the profiler, as far as the machine's load goes (what
    `cpu-contention` reads): the share of the CPU other processes took (None: unknown), the limit above which
    that share makes a timing contended, the scheduler tick its samples sit on (None: they do not), whether
    the kept timing is contended (either sign), the samples thrown away for contention, and the seconds
    spent waiting for a calm CPU that did not come (then it was not timed again)."""

    cpu_contention: float | None
    limit: float
    quantized_tick_ms: float | None
    contended: bool
    retimes: int
    uncalm_wait_s: float = 0.0


@dataclass(frozen=True)
class Fp8AgainstBf16:
    """An fp8 row beside the fastest bf16 row of the same shape and mode in the same run, as `fp8-not-faster`
    reads it: the fp8 dtype and latency, the bf16 variant and its latency (µs, timed without the profiler)."""

    fp8_dtype: str
    fp8_latency_us: float
    bf16_variant: str
    bf16_latency_us: float


@dataclass
class FindingContext:
    """What the findings read: per-forward metrics, per-kernel statistics and the analysis' totals; or, for
    the counter findings, one step's hardware counters (`counters`); for the gpu-health findings, the GPU
    over the timed calls (`gpu_health`); or, for `cpu-contention`, how the row's latency was timed (`timed`)."""

    per_forward: list[ForwardMetrics]
    kernels: list[KernelStats]
    dtype: str | None
    dtype_source: str | None
    cpu_time_us: float
    gpu_time_us: float | None
    cpu_work_us: float | None = None  # cpu_time_us without the wait inside the autograd engine
    comm: Any = None  # analysis.comm.CommStats, or None without communication
    attention: AttentionLedger | None = None  # the ledger over the instances (None: CPU-only trace)

    unit: str = "forward"  # what one instance is called: "step" with backward work (see phases.instance_unit)
    ceiling_tflops: float | None = None  # the measured matmul ceiling of the inputs' dtype (None: not measured)
    counters: StepCounters | None = None  # one step's hardware counters (Nsight Compute); None without them
    gpu_health: GpuHealthReading | None = None  # the GPU while the latency was timed (NVML); None without it
    timed: Timed | None = None  # how the row's latency was timed (the judge's); None for a trace alone
    fp8_vs_bf16: Fp8AgainstBf16 | None = None  # an fp8 row's bf16 counterpart in its run; None for a trace alone

    @property
    def instance_time_us(self) -> float:
        """An instance's time, the base of `Finding.impact_pct`: the larger of its CPU time and its GPU
        time (first device event to last), medians over the instances."""
        return max(self.cpu_time_us, self.gpu_time_us or 0.0)

    def ledgers(self) -> list[ForwardLedger | None]:
        """Each instance's attention ledger: its device work's, or in a CPU-only trace the one timed on
        the CPU (`ForwardMetrics.cpu_attention`); None for an instance without one. For the findings that
        judge CPU and GPU traces alike; the others read `ForwardMetrics.attention` alone."""
        return [m.attention if m.attention is not None else m.cpu_attention for m in self.per_forward]

    def host_device(self) -> HostDevice | None:
        """The CPU against the GPU (see `HostDevice`); None without device work. Worked out once: several
        rules read it, and its medians run over every instance."""
        return self._host_device

    @functools.cached_property
    def _host_device(self) -> HostDevice | None:
        return host_device_of(self.per_forward)

    def host_bound(self) -> bool | None:
        """True when the CPU bounds an instance (the cpu-bound test), False when the GPU does, None
        without device work."""
        facts = self.host_device()
        return None if facts is None else facts.host_bound

    def every(self, k: int, n: int | None = None) -> str:
        """ "every step" when `k` is all `n` instances (default: all of them), else "k of n steps"."""
        n = len(self.per_forward) if n is None else n
        return f"every {self.unit}" if k == n else f"{k} of {n} {self.unit}s"


#: What an evidence function may return beside a bare sentence: the sentence and its numbers by name.
Said = tuple[str, Numbers]
Evidence = Callable[[FindingContext], "str | Said | None"]
Impact = Callable[[FindingContext], "float | NoImpact"]
#: Given the impact, why this instance's finding is only `info` (a sentence), or None: it stays a problem.
Settle = Callable[[FindingContext, float], "Said | None"]


@dataclass(frozen=True)
class Rule:
    """One finding: what it is called, says and weighs, and the evidence function that finds it."""

    id: str
    severity: str
    summary: str
    paragraph: str
    evidence: Evidence
    impact: Impact | None = None
    settle: Settle | None = None

    def __post_init__(self) -> None:
        if not ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"finding id {self.id!r}: use lower-case words joined by '-'")
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding {self.id}: severity must be one of {', '.join(SEVERITIES)}")
        if not self.summary.strip() or "\n" in self.summary:
            raise ValueError(f"finding {self.id}: the summary is one non-empty line")
        if not self.paragraph.strip():
            raise ValueError(f"finding {self.id}: the paragraph is empty")
        if self.impact is not None and (self.severity != "problem" or not inspect.getdoc(self.impact)):
            raise ValueError(f"finding {self.id}: only a problem has an impact, and its docstring says what it counts")
        if self.settle is not None and self.impact is None:
            raise ValueError(f"finding {self.id}: only a finding with an impact can be settled by it")

    @property
    def impact_text(self) -> str | None:
        """What the impact counts (the impact function's docstring, one line), None without one."""
        doc = inspect.getdoc(self.impact) if self.impact is not None else None
        return " ".join(doc.split()) if doc else None

    def match(self, ctx: FindingContext) -> Finding | None:
        """The finding with its sentence, severity and impact when the evidence supports it, else None."""
        said = self.evidence(ctx)
        if said is None:
            return None
        message, values = said if isinstance(said, tuple) else (said, {})
        if self.impact is None:
            return Finding(self.id, message, self.severity, evidence=values)
        impact = self.impact(ctx)
        if isinstance(impact, NoImpact):
            return Finding(self.id, message, self.severity, evidence=values, no_impact_reason=impact.reason)
        impact = max(impact, 0.0)
        settled = self.settle(ctx, impact) if self.settle is not None else None
        if settled is not None:  # a cost by design, too small to act on: a fact, without impact
            sentence, numbers_ = settled
            return Finding(self.id, f"{message} {sentence}", "info", evidence=values | numbers_)
        base = ctx.instance_time_us
        pct = 100.0 * impact / base if base > 0 else None
        return Finding(self.id, message, self.severity, impact, pct, values)

    def to_dict(self) -> dict[str, str | None]:
        """{"id", "severity", "summary", "paragraph", "impact"} (impact: what it counts, null without one)."""
        return {
            "id": self.id,
            "severity": self.severity,
            "summary": self.summary,
            "paragraph": self.paragraph,
            "impact": self.impact_text,
        }


class FindingRegistry:
    """Rules by id, in the order they were registered (the order their findings are emitted in)."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules: dict[str, Rule] = {}
        for rule in rules:
            self.register(rule)

    def register(self, rule: Rule) -> Rule:
        """Add `rule`; DuplicateFindingError if its id is taken."""
        if rule.id in self._rules:
            raise DuplicateFindingError(f"finding {rule.id!r} is already registered")
        self._rules[rule.id] = rule
        return rule

    def rule(
        self,
        finding_id: str,
        *,
        severity: str,
        summary: str,
        paragraph: str,
        impact: Impact | None = None,
        settle: Settle | None = None,
    ) -> Callable[[Evidence], Rule]:
        """Decorator: register the evidence function below as the rule `finding_id` (with its `impact`
        function, and its `settle`, if any); the name it is defined under then holds the `Rule`."""

        def register(evidence: Evidence) -> Rule:
            text = " ".join(paragraph.split())
            return self.register(Rule(finding_id, severity, summary, text, evidence, impact, settle))

        return register

    def get(self, finding_id: str) -> Rule:
        """The rule called `finding_id`; UnknownFindingError with the closest ids otherwise."""
        try:
            return self._rules[finding_id]
        except KeyError:
            close = difflib.get_close_matches(finding_id, list(self._rules), n=3, cutoff=0.5)
            guess = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownFindingError(
                f"unknown finding {finding_id!r}{guess}", hint="`attnprof findings` lists them all"
            ) from None

    def ids(self) -> tuple[str, ...]:
        """Every id, in order."""
        return tuple(self._rules)

    def build(self, ctx: FindingContext) -> list[Finding]:
        """Every finding the evidence supports, in order."""
        found = (rule.match(ctx) for rule in self._rules.values())
        return [finding for finding in found if finding is not None]

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._rules.values())

    def __len__(self) -> int:
        return len(self._rules)

    def __contains__(self, finding_id: object) -> bool:
        return finding_id in self._rules


# ------------------------------------------------------------------ the words the sentences share


def us(value: float) -> str:
    """`1,234.5 us`."""
    return f"{value:,.1f} us"


def numbers(**values: float | str | bool | None) -> Numbers:
    """Evidence by name, floats rounded to 3 decimals (what a JSON row keeps of a µs or a GB/s)."""
    return {name: round(v, 3) if isinstance(v, float) else v for name, v in values.items()}


def work_numbers(nbytes: float, flops: float, time_us: float) -> Numbers:
    """The work a finding names, together over its calls or kernels (what the judge weighs against the best
    known at the shape once the live ledger is gone): bytes, FLOPs and time per instance."""
    return numbers(work_bytes=float(nbytes), work_flops=float(flops), work_time_us=time_us)


def listed(items: list[str], limit: int = 4) -> str:
    """The first `limit` items joined by commas, then "and N more"."""
    shown = items[:limit]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(shown) + more
