"""Measured ceilings: dense matmul throughput, read bandwidth and copy bandwidth, cached on disk.

Nothing here is a datasheet number: the ceilings are measured on this machine, once per
device name and dtype (and CPU thread count on CPU), and kept in `ceilings.json` in the
cache directory: `$ATTNPROF_CACHE_DIR` if set, else `$XDG_CACHE_HOME/attnprof` (an absolute
XDG_CACHE_HOME), else `~/.cache/attnprof`. A cache that cannot be read or written is ignored;
the measurement is then simply not kept.

A cached entry is used only while it is trustworthy: it is measured again when it is older
than `MAX_AGE_DAYS`, when it was measured under another torch version or NVIDIA driver
version, or when `refresh` asks for it. A CPU figure measured while other processes held more than
`CONTENTION_LIMIT` of the machine's CPU measured them too (0.0017 TFLOP/s against 0.167 quiet on the
2-core VM): it is neither cached nor used. The run uses the figure cached before instead, whatever its age or
versions (`source` "cached", `reason` and `set_aside` say why), else none at all (a CPU has no datasheet
figure): % of peak is then n/a, saying why. A run measures it again, at most once, when a cell's achieved
TFLOP/s exceeds it (`RunCeiling.measure_again`).

FP8 (`fp8`, `fp8_e5m2`): the matmul is `torch._scaled_mm` at the same 8192³ size, per-tensor float32 scales of
1 and a bf16 output, counted 2·n³ FLOPs like every other dtype; `fp8` multiplies e4m3 by e4m3, `fp8_e5m2` e5m2
by e4m3 (cuBLASLt has no e5m2 × e5m2 product; the tensor cores run both at one rate). A CPU has no fp8 ceiling.

CPU in bf16 or fp16 has no ceiling (`source` "none"): a half-precision matmul on a CPU is no
peak for attention kernels that compute in fp32 inside (against a freshly measured bf16 matmul,
sdpa-flash on CPU reached 4,832%). Nothing is measured then, and % of peak is n/a.

CUDA: an 8192³ matmul in the dtype (current torch matmul settings, so fp32 is true fp32
unless TF32 was allowed), 3 warm-ups then the median of 10 CUDA-event timings; a 1 GiB
device-to-device copy, bandwidth counted as bytes read plus bytes written; and the read bandwidth,
the fastest of several read-only kernels over 2 GiB (`profiling.read_probe`: a Triton grid-stride
sum in a few configurations when triton is installed, `torch.sum`, `torch.amax`), `read_method`
naming the winner. CPU (fp32): the same with a 64 MiB copy, `torch.sum`/`torch.amax` over 64 MiB,
and a square matmul whose size doubles from 256 until one product takes 5 ms (at most 2048), so the
whole measurement stays well under a second on 2 cores.

The ridge point, where a call's arithmetic intensity turns it from memory- to compute-bound, is the
matmul ceiling over the read bandwidth (`Ceiling.ridge`, FLOPs per byte): attention's traffic is
nearly all reads. The copy bandwidth is kept beside it, a different quantity (read + write).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

from attnprof.profiling.contention import CpuShare, is_contended
from attnprof.profiling.fp8 import SCALED_MM_OPERANDS, TORCH_FP8, scaled_matmul_seconds
from attnprof.profiling.read_probe import REPS, WARMUP, median_seconds, probe_read

CACHE_ENV = "ATTNPROF_CACHE_DIR"
XDG_ENV = "XDG_CACHE_HOME"
CACHE_FILE = "ceilings.json"
CACHE_VERSION = 3  # 2: torch and driver version in the entry, not the key; 3: the read bandwidth
MAX_AGE_DAYS = 30  # a cached ceiling older than this is measured again

GPU_MATMUL_N = 8192
GPU_COPY_BYTES = 1 << 30
CPU_MATMUL_MIN_N, CPU_MATMUL_MAX_N = 256, 2048
CPU_MATMUL_TARGET_S = 0.005
CPU_COPY_BYTES = 64 << 20
CPU_NO_CEILING_DTYPES = ("bf16", "fp16")

#: Where a Ceiling's figures come from: measured in this call, read from the cache, or none at all.
CeilingSource = Literal["measured", "cached", "none"]

_memo: dict[tuple[str, str], Ceiling] = {}


@dataclass(frozen=True)
class Ceiling:
    """Measured peaks: matmul TFLOP/s, copy bandwidth and read bandwidth in GB/s (1e9 B/s), and where
    they came from.

    `source` is "measured" (just now), "cached" (read from the cache file) or "none" (no
    meaningful ceiling: every figure None). `reason` says why: why it was measured now (no
    cached figure, too old, another torch ...), or why there is none; None for "cached".
    `method` says how the matmul and the copy were measured, `read_method` how the read bandwidth
    was (the winning candidate, and the others' figures); `measured_at` is an ISO timestamp (UTC).
    `set_aside`: the figure measured now under contention and why it is not used (None: none was set aside),
    for the rows' `pct_of_peak_note`.
    """

    tflops: float | None
    bandwidth_gbps: float | None
    source: CeilingSource
    method: str | None = None
    measured_at: str | None = None
    torch_version: str | None = None
    driver_version: str | None = None
    reason: str | None = None
    read_gbps: float | None = None
    read_method: str | None = None
    set_aside: str | None = None

    @property
    def ridge(self) -> float | None:
        """The ridge point in FLOPs per byte: the matmul ceiling over the read bandwidth; None without both."""
        return self.tflops * 1e3 / self.read_gbps if self.tflops and self.read_gbps else None

    @property
    def measured_on(self) -> str:
        """The date it was measured, YYYY-MM-DD, or "?" when unknown."""
        return self.measured_at[:10] if self.measured_at else "?"

    def to_dict(self) -> dict:
        """A JSON-ready dict of the fields."""
        return asdict(self)


#: Measures one device and dtype now, without the cache: `probe_ceiling`, or a stand-in in tests.
CeilingProbe = Callable[[str, str], Ceiling]


def cache_dir() -> Path:
    """`$ATTNPROF_CACHE_DIR`, else `$XDG_CACHE_HOME/attnprof` (when absolute), else `~/.cache/attnprof`."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get(XDG_ENV)
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "attnprof"
    return Path.home() / ".cache" / "attnprof"


def cache_path() -> Path:
    """The JSON file ceilings are kept in: `ceilings.json` in `cache_dir()`."""
    return cache_dir() / CACHE_FILE


def device_key(device: str, dtype: str) -> str:
    """The cache key: device name and dtype (plus threads on CPU); versions live in the entry."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    else:
        from attnprof.profiling.environment import cpu_model

        name = f"{cpu_model() or 'cpu'} ({torch.get_num_threads()} threads)"
    return f"{name}|{dtype}"


def software_versions(device: str) -> tuple[str, str | None]:
    """The torch version and the NVIDIA driver version (None on CPU or without nvidia-smi)."""
    import torch

    if torch.device(device).type != "cuda":
        return torch.__version__, None
    from attnprof.profiling.environment import nvidia_driver_version

    return torch.__version__, nvidia_driver_version()


def no_ceiling_reason(device: str, dtype: str) -> str | None:
    """Why `device` has no meaningful matmul ceiling in `dtype` (CPU in bf16 or fp16), or None."""
    import torch

    if torch.device(device).type == "cpu" and dtype in CPU_NO_CEILING_DTYPES:
        return f"no meaningful {dtype} matmul ceiling on CPU (attention there computes in fp32)"
    if torch.device(device).type == "cpu" and dtype in TORCH_FP8:
        return f"no {dtype} matmul ceiling on CPU (fp8 cells need a GPU)"
    return None


def read_cache(path: Path) -> dict[str, Any]:
    """The cached entries, or {} when the file is missing, unreadable or of another version."""
    return _read_file(path)[1]


def _read_file(path: Path) -> tuple[Any, dict[str, Any]]:
    """The file's version (None when unreadable) and its entries ({} unless of `CACHE_VERSION`)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, {}
    if not isinstance(data, dict):
        return None, {}
    version = data.get("version")
    if version != CACHE_VERSION or not isinstance(data.get("entries"), dict):
        return version, {}
    return version, data["entries"]


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


def device_ceiling(
    device: str, dtype: str, refresh: bool = False, *, probe: CeilingProbe | None = None, path: Path | None = None
) -> Ceiling:
    """The matmul, copy and read ceilings for `device` and `dtype`, from memory, cache, or a fresh measurement.

    A cached entry that is too old or from another torch or driver version is measured again
    (see the module docstring); CPU in bf16/fp16 gives a Ceiling with source "none".
    `refresh` measures again and overwrites the cache; `probe(device, dtype)` replaces the
    real measurement (tests); `path` overrides the cache file.
    """
    none = no_ceiling_reason(device, dtype)
    if none:
        return Ceiling(None, None, "none", reason=none)
    path = path or cache_path()
    key = device_key(device, dtype)
    memo_key = (str(path), key)
    if not refresh and memo_key in _memo:
        return _memo[memo_key]
    version, entries = _read_file(path)
    torch_version, driver_version = software_versions(device)
    if refresh:
        why: str | None = "a fresh measurement was asked for"
    elif version is not None and version != CACHE_VERSION:
        why = f"the cache was written by an older attnprof (cache version {version}, now {CACHE_VERSION})"
    else:
        why = _why_measure(entries.get(key), torch_version, driver_version)
    if why is None:
        ceiling = _from_entry(entries[key])
    else:
        share = CpuShare.start()
        measured = (probe or probe_ceiling)(device, dtype)
        busy = share.others() if device.split(":")[0] == "cpu" else None
        ceiling = replace(
            measured,
            source="measured",
            torch_version=torch_version,
            driver_version=driver_version,
            measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            reason=why,
        )
        if is_contended(busy):  # it measured the other processes too: neither cached nor used
            return _instead_of_contended(ceiling, entries.get(key), busy or 0.0, dtype)
        entries[key] = {k: v for k, v in ceiling.to_dict().items() if k not in ("source", "reason", "set_aside")}
        if not write_cache(path, entries):
            ceiling = replace(ceiling, reason=f"{why}; not kept: cannot write {path}")
    _memo[memo_key] = replace(ceiling, source="cached", reason=None)  # later calls in this process reuse it
    return ceiling


def _instead_of_contended(measured: Ceiling, entry: Any, busy: float, dtype: str) -> Ceiling:
    """What a run uses instead of `measured`, a CPU ceiling measured while other processes took `busy` of the
    CPU: the cached `entry` when it is readable (whatever its age or versions), else no ceiling (a CPU has no
    datasheet figure). `reason` and `set_aside` say which and why."""
    taken = f"measured now at {measured.tflops or 0:.3g} TFLOP/s while other processes took {busy:.0%} of the CPU"
    try:
        cached = _from_entry(entry)
    except (KeyError, TypeError, ValueError):
        cached = None
    if cached is None or not cached.tflops or cached.tflops <= 0:
        why = f"the {dtype} matmul ceiling was {taken}, and no calm figure is cached (a CPU has no datasheet)"
        return Ceiling(None, None, "none", reason=why, set_aside=taken)
    used = f"the {dtype} matmul ceiling cached on {cached.measured_on} ({cached.tflops:.3g} TFLOP/s)"
    return replace(cached, reason=f"{measured.reason}; {taken}: not used, {used} is", set_aside=f"{used}: {taken}")


def cached_ceiling(gpu: str, dtype: str, path: Path | None = None) -> Ceiling | None:
    """The cached ceiling of the CUDA GPU called `gpu` (its device name, as a trace's deviceProperties give
    it) in `dtype`, or None when the cache holds no readable entry for it no older than `MAX_AGE_DAYS`.

    For `analyze` and `model`, which measure nothing: torch is not imported, so the torch and driver
    versions are not compared, and nothing is measured. `path` overrides the cache file.
    """
    entry = read_cache(path or cache_path()).get(f"{gpu}|{dtype}")
    if not isinstance(entry, dict) or _why_measure(entry, None, None, check_versions=False) is not None:
        return None
    return _from_entry(entry)


def forget() -> None:
    """Drop the in-process memo, so the next call reads the cache file (or measures) again."""
    _memo.clear()


@dataclass
class RunCeiling:
    """The ceiling one run compares against: `current`, measured again at most once per run (`measure_again`).

    `replaced` is the ceiling `current` replaced, or None while it has not been measured again.
    """

    device: str
    dtype: str
    current: Ceiling
    probe: CeilingProbe | None = None
    path: Path | None = None
    replaced: Ceiling | None = None

    @classmethod
    def start(
        cls,
        device: str,
        dtype: str,
        refresh: bool = False,
        *,
        probe: CeilingProbe | None = None,
        path: Path | None = None,
    ) -> RunCeiling:
        """The run's ceiling from `device_ceiling` (same arguments)."""
        return cls(device, dtype, device_ceiling(device, dtype, refresh, probe=probe, path=path), probe, path)

    def measure_again(self, why: str) -> bool:
        """Measure `current` again (and re-cache it) because `why`; True the first time in a run, then False.

        A run without a ceiling (source "none") never measures.
        """
        if self.replaced is not None or self.current.source == "none":
            return False
        self.replaced = self.current
        fresh = device_ceiling(self.device, self.dtype, refresh=True, probe=self.probe, path=self.path)
        self.current = replace(fresh, reason=why)
        return True


def _from_entry(entry: dict[str, Any]) -> Ceiling:
    return Ceiling(
        float(entry["tflops"]),
        float(entry["bandwidth_gbps"]),
        "cached",
        method=entry["method"],
        measured_at=entry["measured_at"],
        torch_version=entry["torch_version"],
        driver_version=entry.get("driver_version"),
        read_gbps=float(entry["read_gbps"]),
        read_method=entry["read_method"],
    )


def _why_measure(
    entry: Any, torch_version: str | None, driver_version: str | None, *, check_versions: bool = True
) -> str | None:
    """Why a cached entry cannot be used (no entry, unreadable, too old, other versions), or None when it can."""
    if not isinstance(entry, dict):
        return "no cached figure"
    try:
        valid = (
            float(entry["tflops"]) > 0
            and float(entry["bandwidth_gbps"]) > 0
            and float(entry["read_gbps"]) > 0
            and isinstance(entry["method"], str)
            and isinstance(entry["read_method"], str)
        )
        age = datetime.now(timezone.utc) - datetime.fromisoformat(entry["measured_at"])
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        return "the cached figure was unreadable"
    if age > timedelta(days=MAX_AGE_DAYS):
        return f"the cached figure was {age.days} days old (limit {MAX_AGE_DAYS})"
    if not check_versions:
        return None
    if entry.get("torch_version") != torch_version:
        return f"the cached figure was measured with torch {entry.get('torch_version')}"
    if entry.get("driver_version") != driver_version:
        return f"the cached figure was measured with driver {entry.get('driver_version') or 'none'}"
    return None


def probe_ceiling(device: str, dtype: str) -> Ceiling:
    """Measure matmul TFLOP/s, copy GB/s and read GB/s on `device` now, bypassing the cache (see the module
    docstring)."""
    import torch

    from attnprof.profiling.inputs import torch_dtype

    dev = torch.device(device)
    tdtype = torch_dtype(dtype)
    cuda = dev.type == "cuda"
    n = GPU_MATMUL_N if cuda else _cpu_matmul_size(tdtype)
    nbytes = GPU_COPY_BYTES if cuda else CPU_COPY_BYTES
    if dtype in TORCH_FP8:
        mm_s = scaled_matmul_seconds(n, dtype, dev)
        product = f"{dtype} torch._scaled_mm ({SCALED_MM_OPERANDS[dtype]}, bf16 out)"
    else:
        mm_s = _matmul_seconds(n, tdtype, dev)
        product = f"{dtype} matmul"
    copy_s = _copy_seconds(nbytes, dev)
    read = probe_read(device)
    tflops = 2.0 * n**3 / mm_s / 1e12
    gbps = 2.0 * nbytes / copy_s / 1e9
    where = "CUDA events" if cuda else "perf_counter"
    method = (
        f"{n}x{n}x{n} {product} and {nbytes >> 20} MiB copy (read+write), "
        f"median of {REPS} after {WARMUP} warm-ups, {where}"
    )
    return Ceiling(tflops, gbps, "measured", method=method, read_gbps=read.gbps, read_method=read.method)


def _matmul_seconds(n: int, tdtype: Any, dev: Any) -> float:
    """Median seconds of one n x n x n matmul; the operands are freed on return."""
    import torch

    a, b, c = _operands(n, tdtype, dev)
    return median_seconds(lambda: torch.matmul(a, b, out=c), dev)


def _copy_seconds(nbytes: int, dev: Any) -> float:
    """Median seconds of one device copy of `nbytes`; the buffers are freed on return."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    src.fill_(1)
    return median_seconds(lambda: dst.copy_(src), dev)


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
