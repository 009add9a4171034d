"""Per-kernel statistics across the forwards of an `Attribution`: one `KernelStats` per distinct
kernel, memcpy or memset name, with its count and time per forward (low median and median over the
forwards, zero where a forward did not run it), launch API, launch facts and occupancy.

Launch facts and APIs are counted with C-level `Counter`s over the device events of all forwards
at once; counts and times per forward with one `Counter` per forward. For FP32 CUDA-core GEMMs, the
op chain that launched them and, where the trace recorded shapes, their FLOPs per forward
(`bandwidth.gemm_flops`).
"""

from __future__ import annotations

from collections import Counter
from itertools import accumulate, chain, compress
from typing import Any

from attnprof.analysis.attribution.forward import Attribution, Forward
from attnprof.analysis.base import KERNEL, KIND_NAMES, MEMCPY
from attnprof.analysis.instance.bandwidth import gemm_flops
from attnprof.analysis.instance.metrics import KernelStats
from attnprof.analysis.names import explain_kernel
from attnprof.analysis.occupancy import SmLimits, kineto_estimate_pct, limits_for, theoretical_occupancy
from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.stats import median, median_count


def device_limits(trace: ParsedTrace, device: int) -> SmLimits | None:
    """The SM limits of `device` from the trace's deviceProperties, or None when it has none."""
    props = trace.device_properties_for(device)
    return limits_for(device_properties=props) if props else None


def kernel_stats(attribution: Attribution) -> list[KernelStats]:
    """Statistics per distinct device-event name, in order of first execution."""
    trace = attribution.trace
    if not attribution.device_traced:
        return []
    names, dev = trace.names, trace.device
    n_fwd = len(attribution.forwards)
    events = _Events(attribution.forwards, dev)
    seen = _PerForward(attribution.forwards, dev, events)
    infos, apis, chains, flops, launched_by = _launch_counts(trace, attribution.forwards, events)
    result = []
    limits_cache: dict[int, SmLimits | None] = {}
    for nid, counts_list in seen.counts.items():
        # forwards that did not run this name count as zero
        counts_list = [0] * (n_fwd - len(counts_list)) + counts_list
        times_list = [0.0] * (n_fwd - len(seen.times[nid])) + seen.times[nid]
        name = names[nid]
        expl = explain_kernel(name)
        e = seen.first[nid]
        stats = KernelStats(
            name=name,
            short_name=expl.short_name,
            kind=KIND_NAMES[dev.kind[e]],
            family=expl.family,
            library=expl.library,
            count_per_forward=median_count(counts_list),
            time_us=round(median(times_list), 3),
            tensor_cores=expl.tensor_cores,
            first_seen=seen.first_seen[nid],
            forwards_run=len(seen.counts[nid]),
            total_count=sum(seen.counts[nid]),
        )
        if nid in apis:
            stats.launch_api = apis[nid].most_common(1)[0][0]
        if nid in chains:
            stats.launch_ops = [c for c, _ in chains[nid].most_common()]
        if nid in launched_by:
            stats.launch_op_ids = launched_by[nid]
        if nid in flops:
            known = [float(f) for f in flops[nid] if f is not None]
            if len(known) == len(flops[nid]):  # shapes recorded for every launch of it
                stats.flops_per_forward = median(known + [0.0] * (n_fwd - len(known)))
        if nid in infos:
            device = dev.device[e]
            if device not in limits_cache:
                limits_cache[device] = device_limits(trace, device)
            _fill_launch_facts(stats, trace.kernel_infos[infos[nid].most_common(1)[0][0]], limits_cache[device])
        result.append(stats)
    result.sort(key=lambda s: s.first_seen)
    return result


_ZERO = 0.0  # a name's time in a forward is a sum that starts at zero


class _Events:
    """The device events of all forwards, forward after forward, with their name ids; the events
    of forward `k` are at positions `starts[k]` to `starts[k + 1]`."""

    def __init__(self, forwards: list[Forward], dev: Any) -> None:
        self.all = list(chain.from_iterable(f.device for f in forwards))
        self.names = list(map(dev.name.__getitem__, self.all))
        self.starts = [0]
        self.starts.extend(accumulate(map(len, (f.device for f in forwards))))


class _PerForward:
    """Per device-event name id (in order of first execution): its count and its total time in
    each forward that ran it, in forward order (a total adds the durations in time order, from
    zero), its first event and where that event started in the order of the forwards."""

    def __init__(self, forwards: list[Forward], dev: Any, every: _Events) -> None:
        self.counts: dict[int, list[int]] = {}
        self.times: dict[int, list[float]] = {}
        self.first: dict[int, int] = {}
        self.first_seen: dict[int, float] = {}
        duration, all_names, starts = dev.dur, every.names, every.starts
        for k, fwd in enumerate(forwards):
            events = fwd.device
            if not events:
                continue
            nids = all_names[starts[k] : starts[k + 1]]
            if len(set(nids)) == len(nids):  # each name once (the common case): count 1, its one duration
                counts: dict[int, int] = dict.fromkeys(nids, 1)
                times = dict(zip(nids, [_ZERO + duration[e] for e in events], strict=True))
            else:
                counts, times = Counter(nids), {}
                for nid, e in zip(nids, events, strict=True):
                    times[nid] = times.get(nid, 0) + duration[e]
            for nid, count in counts.items():
                if nid in self.counts:
                    self.counts[nid].append(count)
                    self.times[nid].append(times[nid])
                else:
                    e = self.first[nid] = events[nids.index(nid)]
                    self.first_seen[nid] = k * 1e12 + (dev.ts[e] - dev.ts[events[0]])
                    self.counts[nid], self.times[nid] = [count], [times[nid]]


def _launch_counts(
    trace: ParsedTrace, forwards: list[Forward], every: _Events
) -> tuple[
    dict[int, Counter], dict[int, Counter], dict[int, Counter], dict[int, list[int | None]], dict[int, list[int]]
]:
    """Per device-event name id, over every event of every forward (in order): how often each
    kernel launch fact (index into `kernel_infos`) was seen, how often each launch API, for
    memcpys and FP32 CUDA-core GEMMs the op chain that launched them, and for those GEMMs their
    FLOPs in each forward that ran them (None in a forward where a launch's shapes are unknown)
    and the op that launched each run (-1: none).
    Counted with C-level `Counter`s over all of them."""
    names, dev, rt, ops = trace.names, trace.device, trace.runtime, trace.cpu_ops
    events, nids = every.all, every.names
    infos: dict[int, Counter] = {}
    for (nid, info), count in Counter(zip(nids, map(dev.info.__getitem__, events), strict=True)).items():
        if info >= 0:
            infos.setdefault(nid, Counter())[info] = count
    calls: list[Any] = list(chain.from_iterable(map(f.device_launch.get, f.device) for f in forwards))
    rt_name = rt.name.__getitem__
    if None in calls:  # an event without its launch call (none in traces read by find_forwards)
        launched = [c is not None for c in calls]
        api_pairs = zip(compress(nids, launched), map(rt_name, compress(calls, launched)), strict=True)
    else:
        api_pairs = zip(nids, map(rt_name, calls), strict=True)
    apis: dict[int, Counter] = {}
    for (nid, api), count in Counter(api_pairs).items():
        apis.setdefault(nid, Counter())[names[api]] = count
    chains: dict[int, Counter] = {}
    flops: dict[int, dict[int, int | None]] = {}  # GEMM name id -> forward -> its FLOPs there
    launched_by: dict[int, list[int]] = {}  # GEMM name id -> the op that launched each of its runs
    kind, dev_name = dev.kind, dev.name
    kernel_ids = set(compress(dev_name, map(KERNEL.__eq__, kind)))
    traced = set(compress(dev_name, map(MEMCPY.__eq__, kind))) if MEMCPY in kind else set()
    traced.update(n for n in kernel_ids if _chain_traced(names[n]))
    if traced:
        seen: Counter = Counter()  # (name id, the chain's op name ids) -> how often
        op_name = ops.name.__getitem__
        k = 0
        for p in compress(range(len(events)), map(traced.__contains__, nids)):  # in forward order
            while every.starts[k + 1] <= p:
                k += 1
            fwd, e = forwards[k], events[p]
            call = fwd.device_launch.get(e)
            op = fwd.launch_op.get(call, -1) if call is not None else -1
            if op >= 0:
                seen[nids[p], tuple(map(op_name, fwd.op_chain(op)))] += 1
            if nids[p] in kernel_ids:
                launched_by.setdefault(nids[p], []).append(op)
                found = flops.setdefault(nids[p], {})
                known, more = found.get(k, 0), gemm_flops(trace, op)
                found[k] = None if known is None or more is None else known + more
        for (nid, chain_ids), count in seen.items():
            chains.setdefault(nid, Counter())[" → ".join(map(names.__getitem__, chain_ids))] = count
    return infos, apis, chains, {nid: list(per.values()) for nid, per in flops.items()}, launched_by


def _chain_traced(name: str) -> bool:
    """True for a GEMM kernel without tensor cores: the fp32-cuda-cores finding names its ops."""
    explained = explain_kernel(name)
    return explained.family == "gemm" and explained.tensor_cores is False


def _fill_launch_facts(stats: KernelStats, info, limits: SmLimits | None) -> None:
    stats.grid = list(info.grid) if info.grid else None
    stats.block = list(info.block) if info.block else None
    stats.registers_per_thread = info.registers_per_thread
    stats.shared_memory_bytes = info.shared_memory_bytes
    stats.blocks_per_sm = info.blocks_per_sm
    stats.warps_per_sm = info.warps_per_sm
    reported = info.achieved_occupancy_pct
    stats.achieved_occupancy_pct = reported if reported is not None and reported > 0 else None
    threads = info.threads_per_block
    occ = None
    if limits is not None and threads:
        occ = theoretical_occupancy(info.registers_per_thread, threads, info.shared_memory_bytes, limits)
        if occ is not None:
            stats.theoretical_occupancy_pct = occ.pct
            stats.occupancy_limiter = occ.limiter
            stats.occupancy_arithmetic = occ.arithmetic
    if stats.achieved_occupancy_pct is None:
        stats.occupancy_note = unreported_cause(stats, info, limits, occ)


def unreported_cause(stats: KernelStats, info, limits: SmLimits | None, occ) -> str:
    """The likeliest reason the profiler's achieved-occupancy figure is 0 or missing."""
    if info.achieved_occupancy_pct is None:
        return "the trace has no occupancy field for this kernel"
    smem = info.shared_memory_bytes or 0
    default_limit = limits.default_smem_per_block if limits else 48 * 1024
    if smem > default_limit:
        return (
            f"its {smem:,} B of shared memory per block exceed the {default_limit // 1024} KB default "
            "per-block limit that Kineto's estimate assumes, so the estimate finds no resident block"
        )
    if limits is not None and occ is not None and info.grid and info.threads_per_block:
        grid_blocks = 1
        for d in info.grid:
            grid_blocks *= d
        estimate = kineto_estimate_pct(grid_blocks, info.threads_per_block, occ.active_blocks, limits)
        if estimate is not None and estimate < 0.5:
            return (
                f"its grid of {grid_blocks} block(s) over {limits.num_sms} SMs keeps the estimate "
                f"under 0.5%, which rounds to 0"
            )
    if stats.launch_api and stats.launch_api.startswith("cu") and not stats.launch_api.startswith("cuda"):
        return f"it was launched through the driver API ({stats.launch_api}), which the estimate may not cover"
    return "none visible in the trace"
