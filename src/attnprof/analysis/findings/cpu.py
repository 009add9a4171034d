"""Findings on the CPU side of an instance: a CPU that cannot keep the GPU fed, ops that launch nothing, and
a latency timed while other processes held the CPU (`cpu-contention`, the judge's: `FindingContext.timed`)."""

from __future__ import annotations

from collections import Counter

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, NoImpact, Said, numbers, us
from attnprof.stats import median_count

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()


def _launch_wait(ctx: FindingContext) -> float | NoImpact:
    """The CPU's work per instance (sync waits left out) less the GPU's busy time: how long the GPU
    waits for launches per instance, inside its work's span and between instances run back to back."""
    facts = ctx.host_device()
    return NoImpact("no-device-work") if facts is None else facts.cpu_work_us - facts.gpu_busy_us


@RULES.rule(
    "cpu-bound",
    severity="problem",
    summary="The CPU's work per forward (sync waits left out) exceeds the GPU's busy time: the GPU waits for launches.",
    paragraph="""
    The CPU spent longer issuing the forward (Python, op dispatch, kernel launches) than the GPU spent running it,
    so the GPU idles between kernels and a faster kernel would not make the forward faster. It is typical of small
    shapes and of many small ops in eager mode. Time the CPU spent waiting in a host sync (cudaStreamSynchronize,
    .item()) is not CPU work: while the CPU waits the GPU is busy, so the waits are left out (host-sync reports
    what they cost), and the GPU's busy time is the span of its work less the time it ran nothing. The message
    gives both times, their ratio, and the ops and launch calls per forward; on a training step the CPU time
    leaves out the region's wait inside the autograd engine and counts the backward ops' own CPU time. The CPU time
    is measured under the profiler, which adds its own recording to every op: in run, compare and model, where
    the latency timed without the profiler is within 10% of the GPU time, the finding is kept as info and says so;
    in analyze, with the profiler's cost per op calibrated on the machine (--calibrate-profiler, cached), the CPU
    time is judged net of the recording (ops per forward x cost per op) and the message says how much it was.
    Launch fewer, larger kernels: a fused attention kernel instead of separate matmul, mask and softmax ops,
    torch.compile, CUDA graphs (torch.compile(mode="reduce-overhead") or torch.cuda.CUDAGraph) to replay the
    launches, or more work per launch (a larger batch).
    """,
    impact=_launch_wait,
)
def _cpu_bound(ctx: FindingContext) -> Said | None:
    facts = ctx.host_device()
    if facts is None or not facts.host_bound:
        return None
    cpu, waits, busy, span = facts.cpu_work_us, facts.sync_wait_us, facts.gpu_busy_us, facts.gpu_span_us
    launches = median_count([sum(m.launch_apis.values()) for m in ctx.per_forward])
    ops = median_count([m.cpu_ops for m in ctx.per_forward])
    unit = ctx.unit
    work = ctx.cpu_work_us if ctx.cpu_work_us is not None else ctx.cpu_time_us
    parts = []
    if abs(work - ctx.cpu_time_us) > 1e-6:
        parts.append(
            f"the region's {us(ctx.cpu_time_us)} without its wait inside the autograd engine, "
            "plus the backward ops' CPU time"
        )
    if waits > 0:
        parts.append(f"less {us(waits)} waiting in host syncs")
    what = f"CPU time per {unit} ({us(cpu)}" + (": " + ", ".join(parts) if parts else "") + ")"
    sentence = (
        f"{what} exceeds the GPU's busy time per {unit} ({us(busy)} of the {us(span)} its work spanned, "
        f"{cpu / busy:.1f}x): "
        + (
            f"the GPU waits while the CPU runs {ops} ops and {launches} launch calls."
            if ops
            else f"the GPU waits while the CPU makes {launches} launch calls (its ops ran on other threads)."
        )
    )
    return sentence, numbers(cpu_us=cpu, gpu_us=busy, gpu_span_us=span, sync_wait_us=waits, ops=ops, launches=launches)


@RULES.rule(
    "metadata-transposes",
    severity="info",
    summary="aten::transpose ops that launch no kernel: they only rewrite strides.",
    paragraph="""
    The forward calls aten::transpose (k.transpose(-2, -1), a head split or merge), and those ops launched no
    kernel: a transpose returns a view with its strides swapped and moves no data. They cost a few microseconds
    of CPU dispatch each and no GPU time; the finding is there because they show in the op list and look like
    data movement. The message gives their number per forward and the op they mostly ran under. If a later op
    needs the data contiguous, that copy shows there (as a copy kernel or a hidden-memcpy), not here. Nothing to
    fix, unless the forward is cpu-bound, where every op counts.
    """,
)
def _metadata_transposes(ctx: FindingContext) -> str | None:
    if any(m.metadata_transposes is None for m in ctx.per_forward):
        return None  # no CUDA trace: launching or not is unknown
    n = median_count([m.metadata_transposes or 0 for m in ctx.per_forward])
    if not n:
        return None
    parents: Counter = Counter()
    for m in ctx.per_forward:
        if m.metadata_transpose_parents:
            parents.update(m.metadata_transpose_parents)
    where = parents.most_common(1)[0][0] if parents else "the region"
    return (
        f"{n} aten::transpose op{'s' if n != 1 else ''} per {ctx.unit} launch no kernel (they only "
        f"rewrite strides, mostly under {where})."
    )


def _contention_cost(ctx: FindingContext) -> float | NoImpact:
    """Not measured: what the other processes added is unknown without a quiet timing of the same step."""
    return NoImpact("needs-quiet-timing")


@RULES.rule(
    "cpu-contention",
    severity="problem",
    summary="Other processes held the CPU while the latency was timed, even after re-timing: it measures them too.",
    paragraph="""
    While the step was timed without the profiler, other processes took more than a quarter of the machine's CPU
    (busy time of every CPU, steal included, less this process's own), or the samples sat on whole multiples of a
    scheduler tick (1 ms or more: 4 ms at HZ=250), which is the scheduler's doing, not the step's. Either way the
    latency measures the other work too: on a 2-core machine beside busy processes the same backward read
    55,991 us against 1,380 us when quiet, with spreads small enough to look stable. attnprof waited for the CPU
    to calm and timed the step again (--contention-retimes, 2 by default); this finding says the kept sample was
    still contended. Its latency, TFLOP/s and speed-ups are marked in every table and are not judged by diff or
    check (exit 3). Time again on a quiet machine: stop the other jobs, or pin them and attnprof to separate cores.
    """,
    impact=_contention_cost,
)
def _cpu_contention(ctx: FindingContext) -> Said | None:
    timed = ctx.timed
    if timed is None or not timed.contended:
        return None
    signs = []
    if timed.cpu_contention is not None and timed.cpu_contention > timed.limit:
        signs.append(f"other processes took {timed.cpu_contention:.0%} of the CPU (limit {timed.limit:.0%})")
    if timed.quantized_tick_ms is not None:
        signs.append(f"the samples sat on multiples of a {timed.quantized_tick_ms:.3g} ms scheduler tick")
    again = f"after {timed.retimes} re-time(s)" if timed.retimes else "not re-timed"
    if timed.uncalm_wait_s > 0:
        again += f"; the CPU did not calm in {timed.uncalm_wait_s:.1f} s of waiting"
    sentence = (
        f"While the latency was timed, {' and '.join(signs)} ({again}): it measures the other processes too, "
        "so its latency, TFLOP/s and speed-ups are not the variant's."
    )
    evidence = numbers(
        cpu_contention=timed.cpu_contention,
        contention_limit=timed.limit,
        quantized_tick_ms=timed.quantized_tick_ms,
        retimed_for_contention=timed.retimes,
    )
    if timed.uncalm_wait_s > 0:
        evidence |= numbers(uncalm_wait_s=timed.uncalm_wait_s)
    return sentence, evidence
