"""The profiler's own cost per recorded op on this machine, calibrated once and cached beside the ceilings.

Every op torch.profiler records costs host time of its own (the event, its input shapes with
record_shapes), so CPU time under the profiler overstates the CPU's work. `calibrate` times a loop of
`CALLS` calls of `torch.add` on a 1-element CPU tensor without the profiler and inside
`torch.profiler.profile` (CPU activity, plus CUDA when asked for and available; record_shapes on or
off), `ROUNDS` rounds each; the cost per op is the difference of the medians over the ops the profiler
recorded in a round. It takes well under a second on 2 cores and needs torch (imported inside).

The figure is kept in `profiler_cost.json` in the ceilings' cache directory (`ceiling.cache_dir()`),
keyed by host name, CPU model, torch version, record_shapes and the activities, so it is measured
again only for another machine, torch or profiler setting, or on request. `cached_cost` reads it
without importing torch (what `attnprof analyze` uses unless `--calibrate-profiler` asks to measure).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from attnprof.errors import ContendedCalibrationError, MissingExtraError
from attnprof.profiling.ceiling import cache_dir, read_cache, write_cache
from attnprof.profiling.contention import CpuShare, is_contended
from attnprof.profiling.environment import cpu_model, package_version
from attnprof.stats import median

CACHE_FILE = "profiler_cost.json"
CALLS = 2000  # torch.add calls per timed loop
ROUNDS = 7  # timed loops of each kind, interleaved; their medians are compared


@dataclass(frozen=True)
class ProfilerCost:
    """The profiler's recording cost per op (`per_op_us`), how it was calibrated (`record_shapes`, `cuda`:
    CUDA activity recorded too) and when (`measured_at`, ISO UTC); `ops` the ops recorded per round."""

    per_op_us: float
    record_shapes: bool
    cuda: bool
    ops: int
    measured_at: str

    @property
    def measured_on(self) -> str:
        """The date it was measured, YYYY-MM-DD."""
        return self.measured_at[:10]


#: Calibrates now, without the cache: `calibrate`, or a stand-in in tests.
Calibrator = Callable[[bool, bool], ProfilerCost]


def cache_path() -> Path:
    """`profiler_cost.json` in the ceilings' cache directory."""
    return cache_dir() / CACHE_FILE


def cost_key(record_shapes: bool, cuda: bool) -> str:
    """The cache key: this machine, its torch and the profiler's setting."""
    activities = "cpu+cuda" if cuda else "cpu"
    torch_version = package_version("torch") or "?"
    machine = f"{socket.gethostname()}|{cpu_model() or 'cpu'}"
    return f"{machine}|torch {torch_version}|record_shapes={record_shapes}|{activities}"


def calibrate(record_shapes: bool, cuda: bool = False) -> ProfilerCost:
    """Time `CALLS` trivial ops without and with the profiler (CUDA activity too when `cuda` and CUDA is
    available), `ROUNDS` rounds each, and return the cost per recorded op (never below 0)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        raise MissingExtraError(f"calibrating the profiler's cost needs torch ({e})") from e

    with_cuda = cuda and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if with_cuda else [])
    x = torch.zeros(1)

    def loop() -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            torch.add(x, x)
        return time.perf_counter() - start

    loop()  # warm-up: dispatch caches, allocator
    with profile(activities=activities, record_shapes=record_shapes):
        loop()  # the profiler's first start is slow, and the op's first recording too
    plain, profiled, ops = [], [], 0
    for _ in range(ROUNDS):  # interleaved, so a change in the machine's load falls on both alike
        plain.append(loop())
        with profile(activities=activities, record_shapes=record_shapes) as prof:
            profiled.append(loop())  # the loop alone: the profiler's start and stop are not per-op costs
        ops = sum(1 for e in prof.events() if e.device_type.name == "CPU")
    per_op = max(0.0, (median(profiled) - median(plain)) * 1e6 / max(ops, 1))
    measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return ProfilerCost(per_op, record_shapes, with_cuda, ops, measured_at)


def cached_cost(record_shapes: bool, cuda: bool = False, path: Path | None = None) -> ProfilerCost | None:
    """The cost cached for this machine and setting, else None (torch is not imported). With `cuda`, a figure
    calibrated with CUDA activity is preferred, else the CPU-only one (a lower bound: recording CUDA
    activity costs more)."""
    entries = read_cache(path or cache_path())
    for with_cuda in (True, False) if cuda else (False,):
        entry = entries.get(cost_key(record_shapes, with_cuda))
        if isinstance(entry, dict):
            try:
                return ProfilerCost(**entry)
            except TypeError:  # written by another attnprof: measured again on request
                continue
    return None


def profiler_cost(
    record_shapes: bool, cuda: bool = False, *, calibrator: Calibrator | None = None, path: Path | None = None
) -> ProfilerCost:
    """Calibrate now (`calibrator`, default `calibrate`) and cache the figure under its own setting; a cache
    that cannot be written is ignored. A calibration during which other processes took more than
    `CONTENTION_LIMIT` of the CPU measured them too: it is refused (`ContendedCalibrationError`), not cached."""
    share = CpuShare.start()
    cost = (calibrator or calibrate)(record_shapes, cuda)
    busy = share.others()
    if is_contended(busy):
        raise ContendedCalibrationError(
            f"the profiler's cost was calibrated while other processes took {busy:.0%} of the CPU: not cached, "
            "not used",
            hint="run `attnprof analyze --calibrate-profiler` again on a quieter machine",
        )
    path = path or cache_path()
    entries = read_cache(path)
    entries[cost_key(cost.record_shapes, cost.cuda)] = asdict(cost)
    write_cache(path, entries)
    return cost
