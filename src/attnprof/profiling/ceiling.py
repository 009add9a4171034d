"""Measured ceilings: dense matmul throughput and device copy bandwidth, cached on disk.

Nothing here is a datasheet number: both ceilings are measured on this machine, once per
device name, dtype and torch version (and CPU thread count on CPU), and kept in
`$ATTNPROF_CACHE_DIR/ceilings.json` (default `~/.cache/attnprof/ceilings.json`). A cache
that cannot be read or written is ignored; the measurement is then simply not kept.

CUDA: an 8192³ matmul in the dtype (current torch matmul settings, so fp32 is true fp32
unless TF32 was allowed), 3 warm-ups then the median of 10 CUDA-event timings; and a 1 GiB
device-to-device copy, bandwidth counted as bytes read plus bytes written. CPU: the same
with a 64 MiB copy and a square matmul whose size doubles from 256 until one product takes
5 ms (at most 2048), so the whole measurement stays well under a second on 2 cores.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from attnprof.stats import median

CACHE_ENV = "ATTNPROF_CACHE_DIR"
CACHE_FILE = "ceilings.json"
CACHE_VERSION = 1

GPU_MATMUL_N = 8192
GPU_COPY_BYTES = 1 << 30
CPU_MATMUL_MIN_N, CPU_MATMUL_MAX_N = 256, 2048
CPU_MATMUL_TARGET_S = 0.005
CPU_COPY_BYTES = 64 << 20
WARMUP = 3
REPS = 10

_memo: dict[tuple[str, str], Ceiling] = {}


@dataclass(frozen=True)
class Ceiling:
    """Measured peaks: matmul TFLOP/s and copy bandwidth in GB/s (1e9 B/s), and where they came from."""

    tflops: float
    bandwidth_gbps: float
    source: str

    def to_dict(self) -> dict:
        """A JSON-ready dict of the fields."""
        return asdict(self)


#: Measures one device and dtype now, without the cache: `probe_ceiling`, or a stand-in in tests.
CeilingProbe = Callable[[str, str], Ceiling]


def cache_path() -> Path:
    """The JSON file ceilings are kept in: `$ATTNPROF_CACHE_DIR/ceilings.json` or `~/.cache/attnprof/ceilings.json`."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "attnprof"
    return base / CACHE_FILE


def device_key(device: str, dtype: str) -> str:
    """The cache key: device name, dtype and torch version (plus threads on CPU)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    else:
        from attnprof.profiling.environment import cpu_model

        name = f"{cpu_model() or 'cpu'} ({torch.get_num_threads()} threads)"
    return f"{name}|{dtype}|torch {torch.__version__}"


def read_cache(path: Path) -> dict[str, Any]:
    """The cached entries, or {} when the file is missing, unreadable or of another version."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def write_cache(path: Path, entries: dict[str, Any]) -> bool:
    """Write the entries atomically; False (and nothing raised) when the cache is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ceilings-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump({"version": CACHE_VERSION, "entries": entries}, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def device_ceiling(device: str, dtype: str, refresh: bool = False, *, probe: CeilingProbe | None = None,
                   path: Path | None = None) -> Ceiling:
    """The measured matmul and copy ceilings for `device` and `dtype`, from memory, cache, or a fresh measurement.

    `refresh` measures again and overwrites the cache; `probe(device, dtype)` replaces the
    real measurement (tests); `path` overrides the cache file.
    """
    path = path or cache_path()
    key = device_key(device, dtype)
    memo_key = (str(path), key)
    if not refresh and memo_key in _memo:
        return _memo[memo_key]
    entries = read_cache(path)
    entry = entries.get(key)
    if not refresh and _valid_entry(entry):
        ceiling = Ceiling(float(entry["tflops"]), float(entry["bandwidth_gbps"]),
                          f"cached {entry.get('measured_at', '?')}: {entry['source']} ({path})")
    else:
        ceiling = (probe or probe_ceiling)(device, dtype)
        entries[key] = {**ceiling.to_dict(), "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_cache(path, entries)
    _memo[memo_key] = ceiling
    return ceiling


def forget() -> None:
    """Drop the in-process memo, so the next call reads the cache file (or measures) again."""
    _memo.clear()


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    try:
        return float(entry["tflops"]) > 0 and float(entry["bandwidth_gbps"]) > 0 and isinstance(entry["source"], str)
    except (KeyError, TypeError, ValueError):
        return False


def probe_ceiling(device: str, dtype: str) -> Ceiling:
    """Measure matmul TFLOP/s and copy GB/s on `device` now, bypassing the cache (see the module docstring)."""
    import torch

    from attnprof.profiling.inputs import torch_dtype

    dev = torch.device(device)
    tdtype = torch_dtype(dtype)
    cuda = dev.type == "cuda"
    n = GPU_MATMUL_N if cuda else _cpu_matmul_size(tdtype)
    nbytes = GPU_COPY_BYTES if cuda else CPU_COPY_BYTES
    mm_s = _matmul_seconds(n, tdtype, dev)
    copy_s = _copy_seconds(nbytes, dev)
    tflops = 2.0 * n ** 3 / mm_s / 1e12
    gbps = 2.0 * nbytes / copy_s / 1e9
    where = "CUDA events" if cuda else "perf_counter"
    source = (f"measured: {n}x{n}x{n} {dtype} matmul and {nbytes >> 20} MiB copy (read+write), "
              f"median of {REPS} after {WARMUP} warm-ups, {where}")
    return Ceiling(tflops, gbps, source)


def _matmul_seconds(n: int, tdtype: Any, dev: Any) -> float:
    """Median seconds of one n x n x n matmul; the operands are freed on return."""
    import torch

    a, b, c = _operands(n, tdtype, dev)
    return _median_seconds(lambda: torch.matmul(a, b, out=c), dev)


def _copy_seconds(nbytes: int, dev: Any) -> float:
    """Median seconds of one device copy of `nbytes`; the buffers are freed on return."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    src.fill_(1)
    return _median_seconds(lambda: dst.copy_(src), dev)


def _operands(n: int, tdtype: Any, dev: Any) -> tuple[Any, Any, Any]:
    import torch

    a = torch.randn(n, n, device=dev, dtype=torch.float32).to(tdtype)
    b = torch.randn(n, n, device=dev, dtype=torch.float32).to(tdtype)
    return a, b, torch.empty(n, n, device=dev, dtype=tdtype)


def _cpu_matmul_size(tdtype: Any) -> int:
    """The smallest power-of-two size from 256 whose single product takes at least 5 ms (at most 2048)."""
    import torch

    n = CPU_MATMUL_MIN_N
    while n < CPU_MATMUL_MAX_N:
        a, b, c = _operands(n, tdtype, torch.device("cpu"))
        torch.matmul(a, b, out=c)
        t0 = time.perf_counter()
        torch.matmul(a, b, out=c)
        if time.perf_counter() - t0 >= CPU_MATMUL_TARGET_S:
            break
        n *= 2
    return n


def _median_seconds(fn: Callable[[], Any], dev: Any) -> float:
    import torch

    for _ in range(WARMUP):
        fn()
    times = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        for _ in range(REPS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(REPS):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return median(times)
