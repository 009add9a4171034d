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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

STAT = "/proc/stat"
MIN_WINDOW_S = 0.05  # /proc/stat counts in ticks of 1/CLK_TCK s (10 ms at the usual 100)
#: Other processes' share of the CPU above which a CPU figure is not trusted: `diff` does not judge a latency
#: timed under it, and a CPU ceiling measured under it is used for its run but not cached.
CONTENTION_LIMIT = 0.25


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
