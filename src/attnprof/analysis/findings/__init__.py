"""Stage 4, judgement: findings over the per-instance metrics, never over the raw trace tables.

Each finding is one registered `Rule` (see `registry`): a stable id, a severity, a summary, a
paragraph and the evidence function that states it with its numbers. The themed modules each fill
their own `RULES`; `FINDINGS` joins them in the order the findings are emitted, and everything that
lists findings (`FINDING_IDS`, `attnprof findings`, docs/findings.md, the ids `check` accepts) reads
it. Adding a finding is adding one `@RULES.rule(...)` in the module of its theme.

The registry judges a trace alone; `judge` (see `judge.py`) gives a row its final findings from the
trace's and what else the row measured, and is the only place a finding is dropped, rewritten or joined.
"""

from __future__ import annotations

from attnprof.analysis.findings import (
    backward,
    comm,
    counters,
    cpu,
    forward,
    fp8,
    fusion,
    gpu_health,
    ledger,
    masks,
    memory,
    occupancy,
)
from attnprof.analysis.findings.judge import (
    Counted,
    FixNotTimed,
    RecordingCost,
    TimedFix,
    Verdict,
    judge,
    judge_alternatives,
    judge_best_known,
    judge_fp8,
)
from attnprof.analysis.findings.registry import (
    SEVERITIES,
    Finding,
    FindingContext,
    FindingRegistry,
    Rule,
    read_finding,
)

#: Every finding, in the order they are emitted: the forward's work, unfused attention, the masks and the SDPA backend,
#: occupancy, the CPU side, communication, the backward, the attention ledger and the stalls, then the
#: attention calls' memory traffic, then what hardware counters (Nsight Compute) show inside the kernels, then
#: the GPU while the latency was timed (NVML), then an fp8 cell against bf16 in its run.
FINDINGS = FindingRegistry(
    [
        *forward.RULES,
        *fusion.RULES,
        *masks.RULES,
        *occupancy.RULES,
        *cpu.RULES,
        *comm.RULES,
        *backward.RULES,
        *ledger.RULES,
        *memory.RULES,
        *counters.RULES,
        *gpu_health.RULES,
        *fp8.RULES,
    ]
)
#: The ids, a stable JSON contract, in the order the findings are emitted.
FINDING_IDS = FINDINGS.ids()


def build_findings(ctx: FindingContext) -> list[Finding]:
    """All findings the evidence supports, in `FINDINGS` order."""
    return FINDINGS.build(ctx)


def counter_findings(ctx: FindingContext) -> list[Finding]:
    """The findings from hardware counters (`ctx.counters`), in their registry order."""
    return counters.RULES.build(ctx)


__all__ = [
    "read_finding",
    "FINDINGS",
    "FINDING_IDS",
    "SEVERITIES",
    "Counted",
    "Finding",
    "FindingContext",
    "FindingRegistry",
    "FixNotTimed",
    "RecordingCost",
    "Rule",
    "TimedFix",
    "Verdict",
    "build_findings",
    "counter_findings",
    "judge",
    "judge_alternatives",
    "judge_best_known",
    "judge_fp8",
]
