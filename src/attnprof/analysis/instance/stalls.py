"""Where a region instance stalled: host syncs inside it, and the device sitting idle.

- A host sync is a runtime call that blocks the CPU until the device catches up (`SYNC_APIS`):
  `tensor.item()`, a data-dependent branch (`aten::is_nonzero`), a copy from pageable memory. Each
  is kept with the op chain around it, innermost first, the memcpy its op launched, if any, and the
  bubble it leaves: the time the device ran nothing (no event of any instance on that device, from
  the `DeviceTimeline`) from the sync's start until the first device work that starts after it
  returned (from the end of the previous sync's bubble where they overlap). While the device is
  busy, the CPU's wait costs nothing; the bubble is what the device loses while the CPU catches up.
- Idle time is measured within each phase: from the phase's first device event to its last, the
  time no kernel, memcpy or memset of the instance ran, on any stream. The hand-off between the
  forward and the backward phase (the autograd engine starting, or `.backward()` called after the
  region) is not counted. In an instance idle more than `GPU_IDLE_SHARE` of that span, the
  largest gaps are kept with the CPU ops that ran during them (the `gpu-idle` finding's evidence).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, islice

from attnprof.analysis.attribution.forward import Forward
from attnprof.analysis.base import MEMCPY, SYNC_APIS
from attnprof.analysis.short_names import short_kernel_name
from attnprof.analysis.trace.tables import ParsedTrace

LARGEST_GAPS = 3
_RawGap = tuple[float, str, float, float, int]  # (duration, phase, start, phase start, the event before)
GPU_IDLE_SHARE = 0.5  # idle more than busy: the gpu-idle finding's threshold


@dataclass(frozen=True)
class Sync:
    """One host sync: its API, how long the CPU waited in it, the ops around it (innermost first),
    the memcpy its op launched ("" when none) and the device idle time it caused (`bubble_us`, see
    the module docstring)."""

    api: str
    wait_us: float
    chain: tuple[str, ...]
    memcpy: str = ""
    bubble_us: float = 0.0


class DeviceTimeline:
    """When each device was busy: the device events of the whole trace (every instance, and work
    outside them), merged into busy intervals per device. Built once per analysis, and only for a
    trace with host syncs (`TraceIndex.timeline`)."""

    def __init__(self, trace: ParsedTrace, device_end: Sequence[float]) -> None:
        dev = trace.device
        per_device: dict[int, list[tuple[float, float]]] = {}
        for e in range(len(dev.ts)):
            per_device.setdefault(dev.device[e], []).append((dev.ts[e], device_end[e]))
        self._starts: dict[int, list[float]] = {}  # every event's start, sorted
        self._busy: dict[int, tuple[list[float], list[float], list[float]]] = {}  # merged: starts, ends, busy before
        for device, spans in per_device.items():
            spans.sort()
            self._starts[device] = [start for start, _ in spans]
            starts, ends, before = [spans[0][0]], [spans[0][1]], [0.0]
            for start, end in spans[1:]:
                if start <= ends[-1]:
                    ends[-1] = max(ends[-1], end)
                else:
                    before.append(before[-1] + ends[-1] - starts[-1])
                    starts.append(start)
                    ends.append(end)
            self._busy[device] = (starts, ends, before)

    def next_start(self, device: int, after: float) -> float | None:
        """The start of the first event on `device` that starts at or after `after`; None when none does."""
        starts = self._starts.get(device, [])
        i = bisect_left(starts, after)
        return starts[i] if i < len(starts) else None

    def busy(self, device: int, start: float, end: float) -> float:
        """How long `device` ran something between `start` and `end`."""
        return self._busy_until(device, end) - self._busy_until(device, start)

    def _busy_until(self, device: int, t: float) -> float:
        starts, ends, before = self._busy.get(device, ([], [], []))
        i = bisect_right(starts, t) - 1
        if i < 0:
            return 0.0
        return before[i] + min(t, ends[i]) - starts[i]


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
    """The host syncs and idle time of one instance (`idle_us` within `span_us`, the phases' spans
    together). The largest gaps are described (`gaps`) only when read: the findings read those of
    one instance."""

    __slots__ = ("syncs", "idle_us", "span_us", "_gaps", "_pending")

    def __init__(self, syncs: list[Sync] | None = None, idle_us: float = 0.0, span_us: float = 0.0) -> None:
        self.syncs = syncs if syncs is not None else []
        self.idle_us = idle_us
        self.span_us = span_us  # the phases' spans together
        self._gaps: list[Gap] | None = None
        self._pending: tuple[ParsedTrace, list[list[int]], list[tuple[str, list[int]]]] | None = None

    @property
    def busy_us(self) -> float:
        """The time the device ran the instance's work: the span less the idle time."""
        return self.span_us - self.idle_us

    @property
    def sync_wait_us(self) -> float:
        """The time the CPU waited in host syncs."""
        return sum(s.wait_us for s in self.syncs)

    @property
    def sync_bubble_us(self) -> float:
        """The device idle time the host syncs caused (their bubbles together)."""
        return sum(s.bubble_us for s in self.syncs)

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
    timeline: Callable[[], DeviceTimeline] | None = None,
) -> Stalls:
    """The host syncs and idle time of one instance whose device work was traced; `roots` are its
    top-level forward ops (see `OpTree.roots`), `device_end` the end of each device event (ts + dur)
    and `sync_ids` the trace's `sync_name_ids` (both found once per trace). `timeline` gives the
    trace's `DeviceTimeline` (built on first call) for the syncs' bubbles; without it they are 0."""
    stalls = Stalls(syncs=_syncs(trace, fwd, sync_ids, timeline))
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


def _syncs(
    trace: ParsedTrace, fwd: Forward, sync_ids: frozenset[int], timeline: Callable[[], DeviceTimeline] | None
) -> list[Sync]:
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
    busy = timeline() if timeline is not None and fwd.device else None
    device = dev.device[fwd.device[0]] if fwd.device else -1
    result, bubble_end = [], float("-inf")
    for call in sorted(syncs, key=rt.ts.__getitem__):
        op = fwd.launch_op.get(call, -1)
        chain = tuple(names[ops.name[o]] for o in reversed(fwd.op_chain(op)))
        bubble = 0.0
        if busy is not None:
            start = max(rt.ts[call], bubble_end)
            resumed = busy.next_start(device, rt.ts[call] + rt.dur[call])
            if resumed is not None and resumed > start:
                bubble = resumed - start - busy.busy(device, start, resumed)
                bubble_end = resumed
        result.append(Sync(names[rt.name[call]], rt.dur[call], chain, copies.get(op, "") if op >= 0 else "", bubble))
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
