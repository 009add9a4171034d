"""The read-bandwidth probe: how fast this device can read memory, measured with read-only kernels.

A copy is no read ceiling: on an H200 cuDNN's decode read about 4.4 TB/s in a profiled run, above the
4.2 TB/s of a 1 GiB copy or of a plain `torch.sum`. So several read-only candidates are timed and the
fastest is the ceiling; `method` names it, with every candidate's figure.

CUDA: a buffer of `GPU_READ_BYTES` (2 GiB, a quarter of the free memory when less is free; many times
any L2, so the L2 cannot serve it) of fp32 ones, read by
- with triton (not under TRITON_INTERPRET): `read_kernel.grid_stride_sum` in each of `TRITON_CONFIGS`
  (tile size, warps, tiles per loop step, programs per SM, load cache hint), a persistent grid of
  programs per SM summing 16-byte loads into one float per program. Its output is checked: the sum of
  the ones must equal the number of elements it was counted as reading, else the candidate is dropped;
- `torch.sum` and `torch.amax` over the buffer (the candidates without triton).
Each candidate: `WARMUP` calls (a triton kernel compiles in the first), then the median of `REPS`
CUDA-event timings; GB/s is bytes read / time (10^9 B/s). With triton's compile cache warm the whole
probe takes a few tens of milliseconds of GPU time; the first run compiles each configuration.

CPU: `torch.sum` over `CPU_READ_BYTES` (64 MiB) of fp32 (more than most last-level caches hold), timed
with perf_counter: about 0.2 s on 2 busy cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from attnprof.errors import one_line
from attnprof.stats import median

WARMUP = 3
REPS = 10
GPU_READ_BYTES = 2 << 30
CPU_READ_BYTES = 64 << 20
#: Triton candidates: (elements per tile, warps, tiles per loop step, programs per SM, load cache hint).
TRITON_CONFIGS: tuple[tuple[int, int, int, int, str], ...] = (
    (4096, 8, 2, 4, ""),
    (4096, 8, 2, 4, ".cg"),
    (8192, 8, 2, 2, ""),
    (2048, 4, 4, 8, ""),
)
_FLOAT_BYTES = 4
#: What follows the winner's name in a method ("torch.sum over 64 MiB of fp32; median of ...").
OVER = " over "


@dataclass(frozen=True)
class ReadCandidate:
    """One candidate's figure: its name, the bytes one call reads, and GB/s (None: dropped, `problem` says why)."""

    name: str
    nbytes: int
    gbps: float | None
    problem: str | None = None


@dataclass(frozen=True)
class ReadBandwidth:
    """The probe's result: the best candidate's GB/s, the method in words, and every candidate."""

    gbps: float
    method: str
    candidates: tuple[ReadCandidate, ...]


def median_seconds(fn: Callable[[], Any], dev: Any) -> float:
    """Median seconds of one call of `fn` on `dev`, over `REPS` calls after `WARMUP`.

    CUDA: a pair of events around each call, the calls issued back to back behind one untimed call and
    synchronized once at the end, so the GPU never waits between an event and the launch of its call
    (a launch gap would count as time). CPU: perf_counter around each call.
    """
    import torch

    for _ in range(WARMUP):
        fn()
    if dev.type != "cuda":
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return median(times)
    torch.cuda.synchronize(dev)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
    fn()  # keeps the GPU busy while the first timed call is launched
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(dev)
    return median([start.elapsed_time(end) / 1e3 for start, end in events])


def read_candidates(device: str) -> list[ReadCandidate]:
    """Time every read-only candidate on `device` (see the module docstring); the buffer is freed on return."""
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    nbytes = _gpu_read_bytes(dev) if cuda else CPU_READ_BYTES
    src = torch.ones(nbytes // _FLOAT_BYTES, dtype=torch.float32, device=dev)
    found = []
    if cuda and _triton_usable():
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        found += [_triton_candidate(src, sms, config) for config in TRITON_CONFIGS]
    reductions: list[tuple[str, Callable[[Any], Any]]] = [("torch.sum", torch.sum), ("torch.amax", torch.amax)]
    for name, reduce in reductions[: 2 if cuda else 1]:
        seconds = median_seconds(partial(reduce, src), dev)
        found.append(ReadCandidate(name, src.numel() * _FLOAT_BYTES, src.numel() * _FLOAT_BYTES / seconds / 1e9))
    return found


def gbps_text(gbps: float) -> str:
    """ "4,512" above 100 GB/s, three significant digits below ("12.3")."""
    return f"{gbps:,.0f}" if gbps >= 100 else f"{gbps:.3g}"


def winner(method: str) -> str:
    """The winning candidate's name at the head of a `probe_read` method."""
    return method.split(OVER)[0]


def probe_read(device: str) -> ReadBandwidth:
    """The read bandwidth of `device`: the fastest of `read_candidates`, and a method naming it and the others."""
    import torch

    candidates = read_candidates(device)
    timed = sorted((c for c in candidates if c.gbps is not None), key=lambda c: -(c.gbps or 0.0))
    best = timed[0]  # the torch reductions always time
    others = ", ".join(f"{c.name} {gbps_text(c.gbps or 0.0)}" for c in timed[1:])
    dropped = "".join(f"; dropped {c.name}: {c.problem}" for c in candidates if c.gbps is None)
    where = "CUDA events" if torch.device(device).type == "cuda" else "perf_counter"
    rank = f", the fastest of {len(candidates)} read-only candidates" if len(candidates) > 1 else ""
    method = (
        f"{best.name}{OVER}{best.nbytes / 2**20:,.0f} MiB of fp32{rank}"
        f"{f' (others, GB/s: {others})' if others else ''}{dropped}; median of {REPS} after {WARMUP} warm-ups, {where}"
    )
    return ReadBandwidth(best.gbps or 0.0, method, tuple(candidates))


def triton_name(block: int, warps: int, unroll: int, per_sm: int, cache: str) -> str:
    """ "triton grid-stride sum (tile 4096, 8 warps, unroll 2, 4 programs/SM, .cg)"."""
    hint = f", {cache}" if cache else ""
    return f"triton grid-stride sum (tile {block}, {warps} warps, unroll {unroll}, {per_sm} programs/SM{hint})"


def _triton_candidate(src: Any, sms: int, config: tuple[int, int, int, int, str]) -> ReadCandidate:
    """Time one triton configuration (`TRITON_CONFIGS`) over `src` (fp32 ones) and check its sums; a failure
    drops it, with why."""
    import torch

    block, warps, unroll, per_sm, cache = config
    name = triton_name(*config)
    out = torch.empty(sms * per_sm, dtype=torch.float32, device=src.device)
    try:
        from attnprof.profiling.read_kernel import read_sum

        elements = read_sum(src, out, block, unroll, warps, cache)
        seconds = median_seconds(lambda: read_sum(src, out, block, unroll, warps, cache), src.device)
        total = float(out.double().sum().item())
    except Exception as exc:  # a triton that cannot compile or launch it: the other candidates remain
        return ReadCandidate(name, 0, None, one_line(exc))
    if abs(total - elements) > 1e-6 * elements:
        return ReadCandidate(name, 0, None, f"its sums came to {total:.0f}, not the {elements} elements counted")
    return ReadCandidate(name, elements * _FLOAT_BYTES, elements * _FLOAT_BYTES / seconds / 1e9)


def _gpu_read_bytes(dev: Any) -> int:
    """`GPU_READ_BYTES`, or a quarter of the free memory (whole MiB) when that is less."""
    import torch

    free, _ = torch.cuda.mem_get_info(dev)
    return min(GPU_READ_BYTES, (free // 4) >> 20 << 20)


def _triton_usable() -> bool:
    """Triton is installed and not in interpreter mode (which would read 2 GiB through numpy)."""
    from attnprof.devices import triton_installed

    return triton_installed() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
