"""The process warmed once per device before its first cell, so that no cell's figures depend on running first.

Without it the first cell of a process measures state that later cells find ready:

* CPU, the allocator: glibc's malloc hands a large freed block back to the kernel (an mmap'd block, or
  the top of the heap beyond its trim threshold) until a block of that size has once been freed, which
  raises its dynamic mmap threshold (up to 32 MiB on 64-bit). Until then every call of a variant whose
  intermediates are MiB-sized faults its pages in again: sdpa-math at 1x4x256x64 fp32 made about 500
  minor page faults a call and ran at 1,400 µs first in a process against 700 µs after another cell (on
  the 2-core development VM, where a fault costs more than on bare metal). One 31 MiB block allocated and
  freed raises the threshold as a long-running process has it raised.
* CPU, the thread pool: the first parallel op starts the OpenMP and MKL threads.
* The profiler: its first session in a process initialises kineto (0.8 s on that VM) and, on CUDA, CUPTI;
  the first cell's profiled forwards then ran several times slower than its timed ones (naive: 6,372 µs of
  CPU time against 453 µs of latency). A one-op session pays that here.
* CUDA: the context, cuBLAS's handle and workspace, and the SM clock, which rises from idle under load:
  matmuls run until their time settles (`CLOCK_SETTLE`) or `CLOCK_BUDGET_S` runs out.

`warm_process(device)` does this once per device per process and returns what it did, or None when the
device was warmed already.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

ALLOCATOR_BLOCK_BYTES = 31 * 1024 * 1024  # just under glibc's 32 MiB cap on the dynamic mmap threshold
CLOCK_SETTLE = 0.02  # the last three matmul batches within 2% of their median
CLOCK_MIN_S = 0.05
CLOCK_BUDGET_S = 0.5

_warmed: set[str] = set()


@dataclass(frozen=True)
class ProcessWarmup:
    """What warming the process for `device` did, and how long it took."""

    device: str
    seconds: float
    steps: tuple[str, ...]

    @property
    def note(self) -> str:
        """One line: what was warmed, and in how long."""
        return f"process warmed for {self.device} in {self.seconds:.2f} s ({', '.join(self.steps)})"


def warm_process(device: str) -> ProcessWarmup | None:
    """Warm the process for `device` (the module docstring) the first time it is asked for that device;
    None afterwards."""
    import torch

    key = str(torch.device(device))
    if key in _warmed:
        return None
    started = time.perf_counter()
    steps: list[str] = []
    if torch.device(device).type == "cuda":
        with torch.cuda.device(torch.device(device)):
            steps.append(_warm_cuda(torch.device(device)))
    else:
        _raise_mmap_threshold()
        steps.append(f"allocator: a {ALLOCATOR_BLOCK_BYTES >> 20} MiB block freed")
        _parallel_op()
        steps.append(f"thread pool: {torch.get_num_threads()} threads")
    _profile_once(device)
    steps.append("profiler initialised")
    _warmed.add(key)
    return ProcessWarmup(key, time.perf_counter() - started, tuple(steps))


def forget_warmed() -> None:
    """Let the next `warm_process` warm every device again (tests)."""
    _warmed.clear()


def _raise_mmap_threshold() -> None:
    import torch

    block = torch.empty(ALLOCATOR_BLOCK_BYTES, dtype=torch.uint8)
    del block


def _parallel_op() -> None:
    import torch

    x = torch.ones(256, 256)
    for _ in range(4):
        (x @ x).softmax(-1).sum()


def _profile_once(device: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from attnprof.profiling.profiler import NativeStderr

    activities = [ProfilerActivity.CPU]
    cuda = torch.device(device).type == "cuda"
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    native = NativeStderr()  # kineto's own lines stay off the terminal, as in every profiled cell
    with native.capture(), torch.no_grad(), profile(activities=activities):
        with record_function("attnprof-warmup"):
            torch.ones(64, 64, device=device).sum()
        if cuda:
            torch.cuda.synchronize(device)
    native.lines()


def _warm_cuda(dev: Any) -> str:
    """Batches of matmuls until their event times settle; what happened, in words."""
    import torch

    from attnprof.profiling.timing import has_settled

    a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    times: list[float] = []
    started = time.perf_counter()
    while True:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(10):
            a @ a
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
        elapsed = time.perf_counter() - started
        if elapsed >= CLOCK_MIN_S and has_settled(times, 3, CLOCK_SETTLE):
            return f"context, cuBLAS and SM clock: {len(times)} matmul batches settled in {elapsed:.2f} s"
        if elapsed >= CLOCK_BUDGET_S:
            return f"context, cuBLAS and SM clock: {len(times)} matmul batches, unsettled after {elapsed:.2f} s"
