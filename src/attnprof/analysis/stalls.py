"""Where a region instance stalled: host syncs inside it, and the device sitting idle.

- A host sync is a runtime call that blocks the CPU until the device catches up (`SYNC_APIS`):
  `tensor.item()`, a data-dependent branch (`aten::is_nonzero`), a copy from pageable memory. Each
  is kept with the op chain around it, innermost first, and the memcpy its op launched, if any.
- Idle time is measured within each phase: from the phase's first device event to its last, the
  time no kernel, memcpy or memset of the instance ran, on any stream. The hand-off between the
  forward and the backward phase (the autograd engine starting, or `.backward()` called after the
  region) is not counted. In an instance idle more than `GPU_IDLE_SHARE` of that span, the
  largest gaps are kept with the CPU ops that ran during them (the `gpu-idle` finding's evidence).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import compress

from attnprof.analysis.forwards import Forward
from attnprof.analysis.names import short_kernel_name
from attnprof.analysis.trace import MEMCPY, ParsedTrace

SYNC_APIS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
    }
)
LARGEST_GAPS = 3
GPU_IDLE_SHARE = 0.5  # idle more than busy: the gpu-idle finding's threshold


@dataclass(frozen=True)
class Sync:
    """One host sync: its API, how long the CPU waited in it, the ops around it (innermost first)
    and the memcpy its op launched ("" when none)."""

    api: str
    wait_us: float
    chain: tuple[str, ...]
    memcpy: str = ""


@dataclass(frozen=True)
class Gap:
    """One idle stretch of the device: where (after which device event, how far into its phase),
    how long, and the CPU ops that ran meanwhile with how much of the gap each covered."""

    phase: str
    after: str
    offset_us: float
    duration_us: float
    cpu_ops: tuple[tuple[str, float], ...]


@dataclass
class Stalls:
    """The host syncs and idle time of one instance."""

    syncs: list[Sync] = field(default_factory=list)
    idle_us: float = 0.0
    span_us: float = 0.0  # the phases' spans together
    gaps: list[Gap] = field(default_factory=list)  # the largest, longest first

    @property
    def idle_share(self) -> float | None:
        """idle_us over span_us; None without device work."""
        return self.idle_us / self.span_us if self.span_us > 0 else None


def forward_stalls(trace: ParsedTrace, fwd: Forward, roots: list[int]) -> Stalls:
    """The host syncs and idle time of one instance whose device work was traced; `roots` are its
    top-level forward ops (see `OpTree.roots`)."""
    stalls = Stalls(syncs=_syncs(trace, fwd))
    backward = [e for e in fwd.device if e in fwd.backward_device] if fwd.backward_device else []
    forward = [e for e in fwd.device if e not in fwd.backward_device] if backward else fwd.device
    gaps: list[tuple[float, str, float, float, int]] = []  # (duration, phase, start, phase start, the event before)
    for phase, events in (("forward", forward), ("backward", backward)):
        if not events:
            continue
        idle, span, found = _idle(trace, events, phase)
        stalls.idle_us += idle
        stalls.span_us += span
        gaps += found
    if gaps and (stalls.idle_share or 0.0) > GPU_IDLE_SHARE:
        gaps.sort(key=lambda g: -g[0])
        threads = [roots, list(fwd.backward_tops)]  # each sorted by start, its ops one after another
        stalls.gaps = [_gap(trace, threads, *g) for g in gaps[:LARGEST_GAPS]]
    return stalls


def _syncs(trace: ParsedTrace, fwd: Forward) -> list[Sync]:
    rt, names, ops, dev = trace.runtime, trace.names, trace.cpu_ops, trace.device
    syncs = list(
        compress(fwd.calls, map(SYNC_APIS.__contains__, map(names.__getitem__, map(rt.name.__getitem__, fwd.calls))))
    )
    if not syncs:
        return []
    copies: dict[int, str] = {}  # op -> the memcpy it launched
    for e in fwd.device:
        if dev.kind[e] == MEMCPY:
            call = fwd.device_launch.get(e)
            if call is not None:
                copies.setdefault(fwd.launch_op.get(call, -1), short_kernel_name(names[dev.name[e]]))
    result = []
    for call in syncs:
        op = fwd.launch_op.get(call, -1)
        chain = tuple(names[ops.name[o]] for o in reversed(fwd.op_chain(op)))
        result.append(Sync(names[rt.name[call]], rt.dur[call], chain, copies.get(op, "") if op >= 0 else ""))
    return result


def _idle(
    trace: ParsedTrace, events: list[int], phase: str
) -> tuple[float, float, list[tuple[float, str, float, float, int]]]:
    """Idle time, span and gaps (duration, phase, start, phase start, the event before) of events sorted by start."""
    dev = trace.device
    first = events[0]
    start, end, last = dev.ts[first], dev.ts[first] + dev.dur[first], first
    span_start, idle = start, 0.0
    gaps = []
    for e in events[1:]:
        ts, te = dev.ts[e], dev.ts[e] + dev.dur[e]
        if ts > end:
            idle += ts - end
            gaps.append((ts - end, phase, end, span_start, last))
        if te > end:
            end, last = te, e
    return idle, end - span_start, gaps


def _gap(
    trace: ParsedTrace, threads: list[list[int]], duration: float, phase: str, start: float, origin: float, after: int
) -> Gap:
    """A gap with the CPU ops that overlapped it, of `threads` (lists of ops, each sorted by start,
    none overlapping another of its list)."""
    ops, names = trace.cpu_ops, trace.names
    ts, dur = ops.ts, ops.dur
    end = start + duration
    overlaps: dict[str, float] = {}
    for tops in threads:
        i = bisect_left(tops, end, key=ts.__getitem__) - 1
        while i >= 0 and ts[tops[i]] + dur[tops[i]] > start:  # earlier ops end earlier: stop at the first before
            o = tops[i]
            name = names[ops.name[o]]
            overlaps[name] = overlaps.get(name, 0.0) + min(end, ts[o] + dur[o]) - max(start, ts[o])
            i -= 1
    ranked = tuple(sorted(overlaps.items(), key=lambda kv: -kv[1]))
    return Gap(phase, short_kernel_name(names[trace.device.name[after]]), start - origin, duration, ranked)
