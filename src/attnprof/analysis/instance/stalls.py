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
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, islice

from attnprof.analysis.attribution.forward import Forward
from attnprof.analysis.base import MEMCPY, SYNC_APIS
from attnprof.analysis.names import short_kernel_name
from attnprof.analysis.trace.tables import ParsedTrace

LARGEST_GAPS = 3
_RawGap = tuple[float, str, float, float, int]  # (duration, phase, start, phase start, the event before)
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


class Stalls:
    """The host syncs and idle time of one instance. The largest gaps are described (`gaps`) only
    when read: the findings read those of one instance."""

    __slots__ = ("syncs", "idle_us", "span_us", "_gaps", "_pending")

    def __init__(self, syncs: list[Sync] | None = None, idle_us: float = 0.0, span_us: float = 0.0) -> None:
        self.syncs = syncs if syncs is not None else []
        self.idle_us = idle_us
        self.span_us = span_us  # the phases' spans together
        self._gaps: list[Gap] | None = None
        self._pending: tuple[ParsedTrace, list[list[int]], list[tuple[str, list[int]]]] | None = None

    @property
    def idle_share(self) -> float | None:
        """idle_us over span_us; None without device work."""
        return self.idle_us / self.span_us if self.span_us > 0 else None

    @property
    def gaps(self) -> list[Gap]:
        """The largest gaps, longest first (none unless the instance idled more than `GPU_IDLE_SHARE`)."""
        if self._gaps is None:
            self._gaps = []
            if self._pending is not None:
                trace, threads, phases = self._pending
                raw = [gap for phase, events in phases for gap in _raw_gaps(trace, events, phase)]
                raw.sort(key=lambda g: -g[0])
                self._gaps = [_gap(trace, threads, *g) for g in raw[:LARGEST_GAPS]]
                self._pending = None
        return self._gaps


def sync_name_ids(trace: ParsedTrace) -> frozenset[int]:
    """The name ids of the trace's runtime calls that are host syncs (`SYNC_APIS`)."""
    names = trace.names
    return frozenset(n for n in set(trace.runtime.name) if names[n] in SYNC_APIS)


def forward_stalls(
    trace: ParsedTrace,
    fwd: Forward,
    roots: list[int],
    device_end: Sequence[float],
    sync_ids: frozenset[int],
) -> Stalls:
    """The host syncs and idle time of one instance whose device work was traced; `roots` are its
    top-level forward ops (see `OpTree.roots`), `device_end` the end of each device event (ts + dur)
    and `sync_ids` the trace's `sync_name_ids` (both found once per trace)."""
    stalls = Stalls(syncs=_syncs(trace, fwd, sync_ids))
    if fwd.backward_device:
        backward = [e for e in fwd.device if e in fwd.backward_device]
        forward = [e for e in fwd.device if e not in fwd.backward_device] if backward else fwd.device
        phases = [(phase, events) for phase, events in (("forward", forward), ("backward", backward)) if events]
    else:
        phases = [("forward", fwd.device)] if fwd.device else []
    for _, events in phases:
        idle, span = _idle(trace.device.ts, device_end, events)
        stalls.idle_us += idle
        stalls.span_us += span
    if (stalls.idle_share or 0.0) > GPU_IDLE_SHARE:
        threads = [roots, list(fwd.backward_tops)]  # each sorted by start, its ops one after another
        stalls._pending = (trace, threads, phases)
    return stalls


def _syncs(trace: ParsedTrace, fwd: Forward, sync_ids: frozenset[int]) -> list[Sync]:
    rt, names, ops, dev = trace.runtime, trace.names, trace.cpu_ops, trace.device
    call_names = list(map(rt.name.__getitem__, fwd.calls))
    if sync_ids.isdisjoint(call_names):  # the common case
        return []
    syncs = list(compress(fwd.calls, map(sync_ids.__contains__, call_names)))
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


def _idle(ts: Sequence[float], ends: Sequence[float], events: list[int]) -> tuple[float, float]:
    """Idle time and span of device events sorted by start (`ts`, `ends`: of every device event)."""
    first = events[0]
    running_end = ends[first]  # the latest end so far
    gaps = []
    for e in islice(events, 1, None):
        gap = ts[e] - running_end
        if gap > 0.0:
            gaps.append(gap)
        if ends[e] > running_end:
            running_end = ends[e]
    return sum(gaps), running_end - ts[first]


def _raw_gaps(trace: ParsedTrace, events: list[int], phase: str) -> list[_RawGap]:
    """The gaps (duration, phase, start, phase start, the event before) of device events sorted by start."""
    dev = trace.device
    first = events[0]
    end, last = dev.ts[first] + dev.dur[first], first
    span_start = dev.ts[first]
    gaps = []
    for e in events[1:]:
        ts, te = dev.ts[e], dev.ts[e] + dev.dur[e]
        if ts > end:
            gaps.append((ts - end, phase, end, span_start, last))
        if te > end:
            end, last = te, e
    return gaps


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
