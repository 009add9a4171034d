"""How much of the machine's CPU other processes took while a cell was timed.

Other work on the machine slows a forward's host side, and on a small CPU it slows everything: with
torch's threads on every core, an op whose parallel region waits for a thread that another process holds
waits a whole scheduler slice. On the 2-core development VM, with other jobs using three quarters of its
CPU, back-to-back default compares measured sdpa-math at 787 µs in one run and 370 ms in another. A latency
timed like that is not comparable with another, and `diff` needs to know.

`CpuShare` reads the machine's busy CPU time (every CPU, steal included: a hypervisor's other guests take
the CPU too) from /proc/stat and this process's own CPU time (every thread) from `os.times` at the start
and end of a window; what the machine was busy with beyond this process, over the window's wall time on
every CPU, is the share other processes took (0 on an idle machine, towards 1 when they held every core).
Linux only; None elsewhere or for a window too short for the counters' tick (`MIN_WINDOW_S`).

Two more signs of it, for a cell's timing (`pipeline.stages`, which re-times a contended cell):

- `wait_for_calm` polls the share while this process sleeps, until other processes take no more than
  `CONTENTION_LIMIT` or `CALM_WAIT_S` has passed (bounded: at most `CALM_WAIT_S` plus one window).
- `scheduler_tick_ms`: latencies that sit on whole multiples of a scheduler tick (1/HZ, 4 ms at HZ=250)
  were set by the scheduler, not by the forward: on the 2-core VM beside busy loops, samples snapped to
  multiples of ~4 ms with IQRs that looked stable while the machine was saturated.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

STAT = "/proc/stat"
MIN_WINDOW_S = 0.05  # /proc/stat counts in ticks of 1/CLK_TCK s (10 ms at the usual 100)
#: Other processes' share of the CPU above which a CPU figure is not trusted: `diff` does not judge a latency
#: timed under it, and a CPU ceiling measured under it is used for its run but not cached.
CONTENTION_LIMIT = 0.25
#: How long a contended cell waits for the CPU to calm before it is timed again, and the window of each poll.
CALM_WAIT_S = 2.0
CALM_WINDOW_S = 0.2
#: A sample set is quantized when this share of it lies within `TICK_TOLERANCE` of a tick (of at least
#: `MIN_TICK_MS`) from whole multiples of it, on at least two different multiples.
TICK_SHARE = 0.9
TICK_TOLERANCE = 0.03
MIN_TICK_MS = 1.0
MIN_TICK_SAMPLES = 8
TICK_CLUSTERS = 8


def machine_busy_s(path: str = STAT) -> float | None:
    """Seconds every CPU of the machine spent busy since boot (user, nice, system, irq, softirq and steal;
    not idle or iowait), or None where /proc/stat cannot be read."""
    try:
        with open(path) as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """This process's CPU seconds so far, every thread, user and system."""
    times = os.times()
    return times.user + times.system


def usable_cpus() -> int:
    """The CPUs of the machine that /proc/stat counts (all online ones)."""
    return os.cpu_count() or 1


@dataclass
class CpuShare:
    """One window's readings; `others()` at its end gives the share other processes took."""

    busy_s: float | None
    own_s: float
    wall_s: float

    @classmethod
    def start(cls) -> CpuShare:
        """The readings at the start of a window."""
        return cls(machine_busy_s(), own_cpu_s(), time.perf_counter())

    def others(self) -> float | None:
        """The share (0 to 1) of the machine's CPU time that other processes took since `start`; None
        without /proc/stat or for a window shorter than `MIN_WINDOW_S`."""
        busy, own, wall = machine_busy_s(), own_cpu_s(), time.perf_counter() - self.wall_s
        if busy is None or self.busy_s is None or wall < MIN_WINDOW_S:
            return None
        foreign = (busy - self.busy_s) - (own - self.own_s)
        return min(1.0, max(0.0, foreign / (wall * usable_cpus())))


def is_contended(share: float | None) -> bool:
    """True when other processes took more than `CONTENTION_LIMIT` of the CPU (False when unknown)."""
    return share is not None and share > CONTENTION_LIMIT


class Window(Protocol):
    """A window of CPU readings: `others()` is the share other processes took since it started."""

    def others(self) -> float | None: ...


@dataclass(frozen=True)
class Calm:
    """What `wait_for_calm` found: whether the CPU calmed down, the last share it read (None: unknown) and
    the seconds it waited."""

    calm: bool
    share: float | None
    waited_s: float


def wait_for_calm(
    max_wait_s: float = CALM_WAIT_S,
    window_s: float = CALM_WINDOW_S,
    *,
    start: Callable[[], Window] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> Calm:
    """Sleep in windows of `window_s`, reading the share other processes took in each, until one is at most
    `CONTENTION_LIMIT` (calm) or `max_wait_s` has passed (not calm). A share that cannot be read ends the
    wait at once, calm unknown (`share` None, `calm` False). `start`, `sleep` and `clock` are for tests."""
    begin = clock()
    share: float | None = None
    while True:
        window = (start or CpuShare.start)()
        sleep(window_s)
        share = window.others()
        waited = clock() - begin
        if share is None or not is_contended(share):
            return Calm(share is not None, share, waited)
        if waited >= max_wait_s:
            return Calm(False, share, waited)


def scheduler_tick_ms(samples_us: Sequence[float]) -> float | None:
    """The scheduler tick (ms) the samples are quantized to, or None: the largest tick of at least
    `MIN_TICK_MS` such that `TICK_SHARE` of the samples lie within `TICK_TOLERANCE` of a tick from a whole
    multiple of it, and at least two of them on another multiple than the commonest (one multiple is a
    stable timing, not a quantized one). The candidate ticks come from the samples: the distances between
    the `TICK_CLUSTERS` largest clusters they form, and each one's value, over 1 to 4. Needs
    `MIN_TICK_SAMPLES` samples."""
    if len(samples_us) < MIN_TICK_SAMPLES:
        return None
    ms = [s / 1e3 for s in samples_us]
    clusters = _clusters(sorted(ms))
    if len(clusters) < 2:
        return None
    centres = [c[len(c) // 2] for c in sorted(clusters, key=len, reverse=True)[:TICK_CLUSTERS]]
    candidates = {abs(b - a) / k for a in centres for b in centres if b > a for k in range(1, 5)}
    candidates |= {c / k for c in centres for k in range(1, 5)}
    for tick in sorted((t for t in candidates if t >= MIN_TICK_MS), reverse=True):
        if _on_ticks(ms, tick):
            return round(tick, 3)
    return None


def _on_ticks(ms: list[float], tick: float) -> bool:
    """True when `TICK_SHARE` of `ms` lie near whole multiples (1 and up) of `tick`, two or more of them
    off the commonest multiple."""
    allowed = (1 - TICK_SHARE) * len(ms)
    counts: dict[int, int] = {}
    misses = 0
    for x in ms:
        k = round(x / tick)
        if k >= 1 and abs(x - k * tick) <= TICK_TOLERANCE * tick:
            counts[k] = counts.get(k, 0) + 1
        else:
            misses += 1
            if misses > allowed:
                return False
    return len(ms) - misses - max(counts.values(), default=0) >= 2


def _clusters(sorted_ms: list[float]) -> list[list[float]]:
    """Runs of sorted samples whose neighbours lie within `TICK_TOLERANCE` × `MIN_TICK_MS` of each other."""
    clusters: list[list[float]] = [[sorted_ms[0]]]
    for x in sorted_ms[1:]:
        if x - clusters[-1][-1] <= TICK_TOLERANCE * MIN_TICK_MS:
            clusters[-1].append(x)
        else:
            clusters.append([x])
    return clusters
