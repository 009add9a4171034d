"""Findings on the memory traffic of the attention calls: how close a memory-bound call comes to the
read bandwidth.

Read from the summarised ledger only (`FindingContext.attention`): each forward call's bytes, FLOPs
and shape (`instance.bandwidth.Traffic`), its achieved GB/s, and the peaks the ledger compares against
(`analysis.hardware.Peaks`: the GPU's datasheet in `analyze`, the read bandwidth and matmul ceiling
measured on this machine in `run`/`compare`/`sweep`) for the ridge point and the read bandwidth.

Two rules, because a rule's severity is fixed (the docs and `attnprof findings` list it): below
`MEMORY_BOUND_SHARE` of the read bandwidth a memory-bound call is a problem with a likely cause
and what it costs; at or above it, the same numbers are an info (the call is as fast as its bytes
allow; only moving fewer bytes makes it faster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import (
    FindingContext,
    FindingRegistry,
    NoImpact,
    Numbers,
    Said,
    listed,
    numbers,
    us,
    work_numbers,
)

if TYPE_CHECKING:
    from attnprof.analysis.instance.bandwidth import Traffic
    from attnprof.analysis.instance.ledger import CallFacts
    from attnprof.analysis.instance.ledger_summary import AttentionLedger

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: A memory-bound call below this share of the read bandwidth is a problem (`memory-bound`).
MEMORY_BOUND_SHARE = 0.60
#: Query rows per call below which a call is decode-like (a prefill template's query block is mostly padding).
DECODE_QUERIES = 16


def _memory_bound(ledger: AttentionLedger) -> list[tuple[CallFacts, Traffic, float]]:
    """The forward calls below the ridge point with an achieved figure, each with its traffic and its %
    of the read bandwidth."""
    ridge = ledger.ridge
    if ridge is None:
        return []
    found = []
    for call in ledger.forward_calls:
        traffic, pct = call.traffic, ledger.pct_of_read_bandwidth(call.achieved_gbps)
        if traffic is not None and pct is not None and traffic.flops < ridge * traffic.bytes:
            found.append((call, traffic, pct))
    return found


def _numbers(ledger: AttentionLedger, call: CallFacts, traffic: Traffic, pct: float, unit: str) -> str:
    ridge = ledger.ridge or 0.0
    return (
        f"{call.op} ({call.backend}) moves {traffic.bytes / 1e6:,.1f} MB per {unit} in {us(call.time_us)}: "
        f"{call.achieved_gbps or 0.0:,.0f} GB/s, {pct:.{1 if pct < 10 else 0}f}% of the {ledger.read_bandwidth_source} "
        f"(arithmetic intensity {call.intensity or 0.0:.1f} FLOP/byte, below the ridge point of "
        f"{ridge:.0f}: its bytes bound it, not the tensor cores)"
    )


def _evidence(ledger: AttentionLedger, found: list[tuple[CallFacts, Traffic, float]]) -> Numbers:
    """The numbers of the call with the lowest share of the read bandwidth among `found` (the calls the
    sentence names), and how many calls it names."""
    call, traffic, pct = min(found, key=lambda item: item[2])
    return work_numbers(
        sum(t.bytes for _, t, _ in found), sum(t.flops for _, t, _ in found), sum(c.time_us for c, _, _ in found)
    ) | numbers(
        calls=len(found),
        op=call.op,
        backend=call.backend,
        bytes=traffic.bytes,
        time_us=call.time_us,
        achieved_gbps=call.achieved_gbps,
        pct_of_read_bandwidth=pct,
        read_bandwidth_gbps=ledger.read_bandwidth_gbps,
    )


def _cause(ledger: AttentionLedger, call: CallFacts, traffic: Traffic) -> str:
    """The likely reason a memory-bound call reads slowly, from its backend, kernels and shape."""
    kernels = call.kernels
    if call.backend in ("math", "eager"):
        return (
            f"the math path materialises the {traffic.queries}x{traffic.keys} scores per head and writes and reads "
            f"them again through {len(kernels)} kernels ({listed(list(dict.fromkeys(kernels)), 3)}); "
            "use a fused backend (flash, cuDNN, efficient) or compiled flex"
        )
    merge = [k for k in kernels[1:] if "combine" in k or k.startswith(("triton_per_", "triton_red_"))]
    if merge:
        pairs = traffic.batch * traffic.kv_heads
        return (
            f"the keys are split into chunks and {listed(merge, 2)} merge their partial outputs; with "
            f"{traffic.batch} x {traffic.kv_heads} = {pairs} (sequence, KV head) pair(s) the chunks alone must fill "
            "the GPU, and too few or too small chunks, or a slow merge, leave the bandwidth unused"
        )
    if traffic.kv_heads == traffic.q_heads > 1:
        repeated = any(item["kind"] == "kv-repeat" for item in ledger.overhead)
        why = (
            "K/V were repeated to the query heads before the call (kv-repeat in the ledger)"
            if repeated
            else f"K/V come with as many heads as Q ({traffic.q_heads}): if the model groups its KV heads, they "
            "were repeated before the call"
        )
        return (
            f"{why}, so {kernels[0] if kernels else 'the kernel'} reads every KV head once per query head; pass the "
            "grouped K/V with enable_gqa=True to a backend that packs the heads of a group (flash, cuDNN)"
        )
    if call.backend == "flex" and traffic.queries < DECODE_QUERIES and any("flex_attention" in k for k in kernels):
        return (
            f"the FlexAttention prefill template ran on {traffic.queries} query row(s): its query block is mostly "
            f"padding, each program walks all {traffic.keys:,} keys alone, and the {traffic.q_heads} query heads "
            f"read their {traffic.kv_heads} KV heads again each (the heads of a GQA group are not packed)"
        )
    return (
        f"{kernels[0] if kernels else 'the kernel'} keeps too few bytes in flight: too few blocks for the SMs "
        "(batch x heads small without a split over the keys) or reads that are not coalesced"
    )


def slow_calls(ledger: AttentionLedger) -> list[tuple[CallFacts, Traffic, float]]:
    """The memory-bound calls below `MEMORY_BOUND_SHARE` of the read bandwidth."""
    return [found for found in _memory_bound(ledger) if found[2] < 100 * MEMORY_BOUND_SHARE]


def _bandwidth_lost(ctx: FindingContext) -> float | NoImpact:
    """The slow memory-bound calls' device time per instance less the time their bytes take at the read
    bandwidth."""
    ledger = ctx.attention
    if ledger is None:
        return NoImpact("no-device-work")
    if not ledger.read_bandwidth_gbps:
        return NoImpact("needs-peaks")
    ref = ledger.read_bandwidth_gbps
    return sum(call.time_us - traffic.bytes / ref / 1e3 for call, traffic, _ in slow_calls(ledger))


@RULES.rule(
    "memory-bound",
    severity="problem",
    summary=f"A memory-bound (decode-like) attention call reads below {MEMORY_BOUND_SHARE:.0%} of the read "
    "bandwidth: its GB/s and likely cause.",
    paragraph=f"""
    An attention call whose arithmetic intensity (FLOPs per byte of Q, K, V, O and mask, from the recorded
    shapes) lies below the ridge point of the GPU (its compute peak over its read bandwidth) is bound by its
    bytes: decoding, one query row against a long KV cache, is the usual case. Such a call is as fast as it
    can be when it reads at the read bandwidth; this one reached less than {MEMORY_BOUND_SHARE:.0%} of it. In
    run, compare and sweep the peaks are those measured on the machine (the matmul ceiling and the read
    bandwidth of a read-only probe); in analyze they are the datasheet's of the GPU the trace names, or
    those measured on this machine when its cache holds them for that GPU. The message gives the bytes,
    the time, the achieved GB/s and its share of the read bandwidth (the figure it names, or the achieved
    figure where a call beat it), the time lost against
    reading at that bandwidth, and the likely cause: the math path materialising the scores, K/V repeated to
    the query heads (grouped-query heads not packed), a split-KV reduction kernel, a prefill template run on a
    decode shape, or too few blocks in flight. Profile with record_shapes=True: without shapes there are no
    bytes. The judge then weighs the call against the best implementation known at its shape (the fastest
    variant of the same compare or sweep, else attnprof's attainable table; docs/attainable.md): its impact
    becomes the time above that, and at 90% of it or more the finding is info.
    """,
    impact=_bandwidth_lost,
)
def _memory_bound_slow(ctx: FindingContext) -> Said | None:
    ledger = ctx.attention
    if ledger is None:
        return None
    slow = slow_calls(ledger)
    if not slow:
        return None
    ref = ledger.read_bandwidth_gbps or 0.0
    parts = []
    for call, traffic, pct in slow:
        lost = call.time_us - traffic.bytes / ref / 1e3
        parts.append(
            f"{_numbers(ledger, call, traffic, pct, ctx.unit)}; {us(lost)} per {ctx.unit} over reading its bytes "
            f"at {ref:,.0f} GB/s. Likely cause: {_cause(ledger, call, traffic)}"
        )
    return "; ".join(parts) + ".", _evidence(ledger, slow)


@RULES.rule(
    "bandwidth-bound",
    severity="info",
    summary=f"A memory-bound (decode-like) attention call reads at {MEMORY_BOUND_SHARE:.0%} or more of the read "
    "bandwidth: only fewer bytes make it faster.",
    paragraph=f"""
    An attention call below the ridge point of the GPU (see memory-bound) reached {MEMORY_BOUND_SHARE:.0%} or
    more of the read bandwidth: its kernel is doing what it can, and its time follows its bytes. The message
    gives the bytes, the time, the achieved GB/s and its share. What is left is to move fewer bytes: a KV
    cache in fp8, fewer KV heads (grouped-query or multi-query attention), or batching more queries per
    read of the cache (speculative decoding, several sequences sharing a prefix).
    """,
)
def _bandwidth_bound(ctx: FindingContext) -> Said | None:
    ledger = ctx.attention
    if ledger is None:
        return None
    fast = [found for found in _memory_bound(ledger) if found[2] >= 100 * MEMORY_BOUND_SHARE]
    if not fast:
        return None
    return "; ".join(_numbers(ledger, *found, ctx.unit) for found in fast) + ".", _evidence(ledger, fast)
