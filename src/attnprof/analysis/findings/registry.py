"""What a finding is, and the registry that holds them: the base every themed module imports.

A `Rule` is one finding: a stable id, a one-line summary, a paragraph (what it means, why it costs,
what to do), a severity (`problem`: something to act on; `info`: a fact worth knowing) and the
evidence function that, given a `FindingContext`, returns the sentence that states it with its
numbers, or None when the trace does not support it. `Rule.match(ctx)` wraps that sentence in a
`Finding`. A `FindingRegistry` keeps rules in order; a duplicate id raises, an unknown one gets
close matches. Each themed module fills its own `RULES` registry with `@RULES.rule(...)`, and the
package joins them, in the order the findings are emitted, into `FINDINGS`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from attnprof.errors import DuplicateFindingError, UnknownFindingError

if TYPE_CHECKING:
    from attnprof.analysis.instance.ledger import AttentionLedger
    from attnprof.analysis.instance.metrics import ForwardMetrics, KernelStats

#: `problem`: something to act on, with what it costs; `info`: a fact worth knowing, nothing to fix.
SEVERITIES = ("problem", "info")
ID_PATTERN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Finding:
    """One finding: a stable id and the sentence that states it."""

    id: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """{"id", "message"}."""
        return asdict(self)


@dataclass
class FindingContext:
    """What the findings read: per-forward metrics, per-kernel statistics and the analysis' totals."""

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

    def every(self, k: int, n: int | None = None) -> str:
        """ "every step" when `k` is all `n` instances (default: all of them), else "k of n steps"."""
        n = len(self.per_forward) if n is None else n
        return f"every {self.unit}" if k == n else f"{k} of {n} {self.unit}s"


Evidence = Callable[[FindingContext], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One finding: what it is called, says and weighs, and the evidence function that finds it."""

    id: str
    severity: str
    summary: str
    paragraph: str
    evidence: Evidence

    def __post_init__(self) -> None:
        if not ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"finding id {self.id!r}: use lower-case words joined by '-'")
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding {self.id}: severity must be one of {', '.join(SEVERITIES)}")
        if not self.summary.strip() or "\n" in self.summary:
            raise ValueError(f"finding {self.id}: the summary is one non-empty line")
        if not self.paragraph.strip():
            raise ValueError(f"finding {self.id}: the paragraph is empty")

    def match(self, ctx: FindingContext) -> Finding | None:
        """The finding with its sentence when the evidence supports it, else None."""
        message = self.evidence(ctx)
        return None if message is None else Finding(self.id, message)

    def to_dict(self) -> dict[str, str]:
        """{"id", "severity", "summary", "paragraph"}."""
        return {"id": self.id, "severity": self.severity, "summary": self.summary, "paragraph": self.paragraph}


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

    def rule(self, finding_id: str, *, severity: str, summary: str, paragraph: str) -> Callable[[Evidence], Rule]:
        """Decorator: register the evidence function below as the rule `finding_id`; the name it is
        defined under then holds the `Rule`."""

        def register(evidence: Evidence) -> Rule:
            return self.register(Rule(finding_id, severity, summary, " ".join(paragraph.split()), evidence))

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


def listed(items: list[str], limit: int = 4) -> str:
    """The first `limit` items joined by commas, then "and N more"."""
    shown = items[:limit]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(shown) + more
