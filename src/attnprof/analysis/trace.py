"""Parse a Kineto Chrome trace once into compact, typed, columnar tables.

`load_trace(source)` accepts a path (`.json` or `.json.gz`) or an already-loaded dict and
returns a `ParsedTrace`. Files are decoded as a stream: the `traceEvents` array is read one
event at a time, each event is reduced to a few numbers in `array`s and then dropped, so
memory stays near the size of the compact tables rather than the size of the JSON.

What Kineto writes (checked against traces from torch 2.11 on an H200, and the Kineto source):

- `cat: cpu_op` (ATen ops) and `cat: user_annotation` (`record_function` ranges and
  `ProfilerStep#N`) on the CPU, with `pid`/`tid` of the thread and `args["External id"]`;
  cpu ops carry `args["Input type"]` when `record_shapes=True`.
- `cat: cuda_runtime` / `cat: cuda_driver` API calls on the CPU thread, with `args.correlation`
  and `args.cbid`.
- `cat: kernel`, `gpu_memcpy`, `gpu_memset` on the device (`pid` = device, `tid` = stream), with
  the launching call's `args.correlation`, and kernel launch facts (`grid`, `block`,
  `registers per thread`, `shared memory`, `blocks per SM`, `warps per SM`,
  `est. achieved occupancy %`).
- `cat: gpu_user_annotation`: the GPU-side extent of a `record_function` range, one per stream,
  linked to the CPU range by `args["External id"]`.
- `ph: s`/`f` flow events (`cat: ac2g`), metadata (`ph: M`), and a top-level
  `deviceProperties` list.

Older Kineto versions spell some categories `Kernel`, `Memcpy`, `Memset`, `Runtime`; they are
accepted too. Timestamps and durations are microseconds (floats).
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprof.analysis import decoding
from attnprof.errors import TraceError

# Device event kinds.
KERNEL, MEMCPY, MEMSET = 0, 1, 2
KIND_NAMES = ("kernel", "memcpy", "memset")
# Runtime event domains.
RUNTIME, DRIVER = 0, 1

# Internal category codes, dispatched on once per event.
_C_CPU_OP, _C_ANNOT, _C_RUNTIME, _C_DRIVER, _C_KERNEL, _C_MEMCPY, _C_MEMSET, _C_GPU_ANNOT, \
    _C_PYTHON, _C_OVERHEAD = range(10)
_CATEGORIES = {
    "cpu_op": _C_CPU_OP, "operator": _C_CPU_OP, "Operator": _C_CPU_OP,
    "user_annotation": _C_ANNOT,
    "cuda_runtime": _C_RUNTIME, "Runtime": _C_RUNTIME, "runtime": _C_RUNTIME,
    "cuda_driver": _C_DRIVER, "driver": _C_DRIVER,
    "kernel": _C_KERNEL, "Kernel": _C_KERNEL,
    "gpu_memcpy": _C_MEMCPY, "Memcpy": _C_MEMCPY,
    "gpu_memset": _C_MEMSET, "Memset": _C_MEMSET,
    "gpu_user_annotation": _C_GPU_ANNOT,
    "python_function": _C_PYTHON,
    "overhead": _C_OVERHEAD,
}

#: Profiler bookkeeping rows that may appear among runtime calls; never device work.
OVERHEAD_NAMES = frozenset({"Activity Buffer Request", "Buffer Flush", "Instrumentation", "Resource",
                            "Driver Compiler", "Runtime Triggered Module Loading", "Lazy Function Loading",
                            "Command Buffer Full", "UVM Activity Init"})

_SHARED_MEMORY_KEYS = ("shared memory", "shared memory (bytes)", "Shared Memory", "shared_memory",
                       "static shared memory", "dynamic shared memory")
_OCCUPANCY_KEYS = ("est. achieved occupancy %", "est. achieved occupancy", "achieved occupancy %")

_CHUNK_CHARS = 1 << 22  # 4 Mi characters of JSON read at a time


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """Launch facts of one kernel launch, as Kineto reports them (None where absent)."""

    grid: tuple[int, ...] | None
    block: tuple[int, ...] | None
    registers_per_thread: int | None
    shared_memory_bytes: int | None
    blocks_per_sm: float | None
    warps_per_sm: float | None
    achieved_occupancy_pct: float | None  # the raw reported value; 0 may mean "not computed"

    @property
    def threads_per_block(self) -> int | None:
        if not self.block:
            return None
        n = 1
        for d in self.block:
            n *= d
        return n


@dataclass(slots=True)
class CpuTable:
    """CPU-side ranges (cpu ops or user annotations), one column per field."""

    name: array = field(default_factory=lambda: array("i"))
    thread: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    ext: array = field(default_factory=lambda: array("q"))
    input_types: array = field(default_factory=lambda: array("i"))  # index into ParsedTrace.input_types; -1

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(slots=True)
class RuntimeTable:
    """CUDA runtime and driver API calls on the CPU."""

    name: array = field(default_factory=lambda: array("i"))
    thread: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    corr: array = field(default_factory=lambda: array("q"))
    ext: array = field(default_factory=lambda: array("q"))
    domain: array = field(default_factory=lambda: array("b"))  # RUNTIME or DRIVER

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(slots=True)
class DeviceTable:
    """Kernels, memcpys and memsets on the device."""

    kind: array = field(default_factory=lambda: array("b"))  # KERNEL, MEMCPY, MEMSET
    name: array = field(default_factory=lambda: array("i"))
    device: array = field(default_factory=lambda: array("i"))
    stream: array = field(default_factory=lambda: array("q"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    corr: array = field(default_factory=lambda: array("q"))
    ext: array = field(default_factory=lambda: array("q"))
    info: array = field(default_factory=lambda: array("i"))  # index into ParsedTrace.kernel_infos; -1
    nbytes: array = field(default_factory=lambda: array("q"))  # memcpy/memset bytes; -1

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(slots=True)
class GpuAnnotationTable:
    """GPU-side extents of record_function ranges (`gpu_user_annotation`)."""

    name: array = field(default_factory=lambda: array("i"))
    device: array = field(default_factory=lambda: array("i"))
    stream: array = field(default_factory=lambda: array("q"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    ext: array = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(slots=True)
class ParsedTrace:
    """A trace reduced to typed tables. Names, threads, input-type lists and kernel launch
    facts are interned: tables hold integer indices into `names`, `threads`, `input_types`
    and `kernel_infos`. `threads[i]` is the `(pid, tid)` of thread index `i`."""

    names: list[str]
    threads: list[tuple[Any, Any]]
    input_types: list[tuple[str, ...]]
    kernel_infos: list[KernelInfo]
    cpu_ops: CpuTable
    annotations: CpuTable
    runtime: RuntimeTable
    device: DeviceTable
    gpu_annotations: GpuAnnotationTable
    device_properties: list[dict[str, Any]]
    metadata: dict[str, Any]
    event_count: int
    overhead_count: int
    python_function_count: int
    source: str

    @property
    def has_device_events(self) -> bool:
        return len(self.device) > 0

    def name_of(self, index: int) -> str:
        return self.names[index]

    def device_properties_for(self, device: int) -> dict[str, Any] | None:
        """The `deviceProperties` entry of a device id, or the only entry, or None."""
        for props in self.device_properties:
            if props.get("id") == device:
                return props
        return self.device_properties[0] if len(self.device_properties) == 1 else None


def load_trace(source: str | Path | dict[str, Any] | ParsedTrace) -> ParsedTrace:
    """Parse a Chrome trace file (`.json`, `.json.gz`) or loaded dict into a `ParsedTrace`.

    Raises TraceError for a missing, unreadable or malformed file and for a trace with no events.
    """
    if isinstance(source, ParsedTrace):
        return source
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived dicts: the cyclic collector only slows them down
    try:
        return _load(source)
    finally:
        if gc_was_enabled:
            gc.enable()


def _load(source: str | Path | dict[str, Any]) -> ParsedTrace:
    builder = _Builder()
    if isinstance(source, dict):
        events = source.get("traceEvents")
        if events is None and not source:
            raise TraceError("trace has no events")
        if events is not None and not isinstance(events, list):
            raise TraceError("trace 'traceEvents' is not a list")
        for key, value in source.items():
            if key != "traceEvents":
                builder.top_level(key, value)
        builder.add_events(events or ())
        label = "<dict>"
    else:
        path = Path(source)
        label = str(path)
        if not path.exists():
            raise TraceError(f"trace file not found: {path}")
        if path.is_dir():
            raise TraceError(f"trace path is a directory, not a file: {path}")
        try:
            with _open_text(path) as stream:
                _stream_parse(stream, builder, label)
        except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
            raise TraceError(f"cannot read trace {path}: {exc}") from None
    trace = builder.finish(label)
    if trace.event_count == 0:
        raise TraceError("trace has no events")
    return trace


@@STREAM@@

# --------------------------------------------------------------------------- table builder

def _num(value: Any, default: float | None = -1.0) -> float | None:
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _dims(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (list, tuple)):
        try:
            return tuple(int(v) for v in value)
        except (TypeError, ValueError):
            return None
    return None


def _make_kernel_info(args: dict[str, Any]) -> KernelInfo:
    smem = None
    for key in _SHARED_MEMORY_KEYS[:4]:
        if key in args:
            smem = _int_or_none(args[key])
            break
    else:  # some exporters split static and dynamic shared memory
        parts = [_int_or_none(args.get(k)) for k in _SHARED_MEMORY_KEYS[4:]]
        if any(p is not None for p in parts):
            smem = sum(p or 0 for p in parts)
    occ = None
    for key in _OCCUPANCY_KEYS:
        if key in args:
            occ = _float_or_none(args[key])
            break
    regs = args.get("registers per thread", args.get("registers_per_thread"))
    return KernelInfo(_dims(args.get("grid")), _dims(args.get("block")), _int_or_none(regs), smem,
                      _float_or_none(args.get("blocks per SM")), _float_or_none(args.get("warps per SM")), occ)


class _Builder:
    """Accumulates events into the compact tables; one pass, no per-event objects kept."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.threads: list[tuple[Any, Any]] = []
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.input_types: list[tuple[str, ...]] = []
        self.input_type_ids: dict[tuple[str, ...], int] = {}
        self.kernel_infos: list[KernelInfo] = []
        self.kernel_info_ids: dict[tuple, int] = {}
        self.cpu_ops = CpuTable()
        self.annotations = CpuTable()
        self.runtime = RuntimeTable()
        self.device = DeviceTable()
        self.gpu_annotations = GpuAnnotationTable()
        self.device_properties: list[dict[str, Any]] = []
        self.metadata: dict[str, Any] = {}
        self.event_count = 0
        self.overhead_count = 0
        self.python_function_count = 0

    def top_level(self, key: str, value: Any) -> None:
        if key == "deviceProperties":
            if isinstance(value, list):
                self.device_properties = [p for p in value if isinstance(p, dict)]
        elif isinstance(value, (str, int, float, bool)) or value is None:
            self.metadata[key] = value
        elif key == "distributedInfo" and isinstance(value, dict):
            self.metadata[key] = value

    def _name(self, name: Any) -> int:
        if not isinstance(name, str):
            name = "" if name is None else str(name)
        ids = self.name_ids
        index = ids.get(name)
        if index is None:
            index = ids[name] = len(self.names)
            self.names.append(name)
        return index

    def _thread(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        index = self.thread_ids.get(key)
        if index is None:
            index = self.thread_ids[key] = len(self.threads)
            self.threads.append(key)
        return index

    def _input_types(self, types: Any) -> int:
        if not isinstance(types, list):
            return -1
        try:
            key = tuple(types)
            index = self.input_type_ids.get(key)
        except TypeError:  # an unhashable element: keep its text
            key = tuple(str(t) for t in types)
            index = self.input_type_ids.get(key)
        if index is None:
            index = self.input_type_ids[key] = len(self.input_types)
            self.input_types.append(key)
        return index

    def _kernel_info(self, args: dict[str, Any]) -> int:
        grid, block = args.get("grid"), args.get("block")
        try:  # fast path: the raw values, as Kineto writes them, are the cache key
            raw = (tuple(grid) if grid is not None else None, tuple(block) if block is not None else None,
                   args.get("registers per thread"), args.get("shared memory"), args.get("blocks per SM"),
                   args.get("warps per SM"), args.get("est. achieved occupancy %"))
            index = self.kernel_info_ids.get(raw)
        except TypeError:
            raw, index = None, None
        if index is not None:
            return index
        info = _make_kernel_info(args)
        index = self.kernel_info_ids.get(info)
        if index is None:
            index = len(self.kernel_infos)
            self.kernel_info_ids[info] = index
            self.kernel_infos.append(info)
        if raw is not None:
            self.kernel_info_ids[raw] = index
        return index

    def add_events(self, events: Any) -> None:  # noqa: C901 - one flat loop is the fast path
        categories = _CATEGORIES
        name_ids, thread_ids = self.name_ids, self.thread_ids
        new_name, new_thread = self._name, self._thread
        cpu, ann, rt, dev, gann = self.cpu_ops, self.annotations, self.runtime, self.device, self.gpu_annotations
        count = self.event_count
        overhead_names = OVERHEAD_NAMES
        input_type_ids = self.input_type_ids
        for ev in events:
            count += 1
            if not isinstance(ev, dict):
                continue
            code = categories.get(ev.get("cat"))
            if code is None:
                if ev.get("name") in overhead_names and ev.get("ph") == "X":
                    self.overhead_count += 1
                continue
            if ev.get("ph", "X") != "X":
                continue
            ts = ev.get("ts")
            dur = ev.get("dur", 0.0)
            if type(ts) is not float or type(dur) is not float:
                ts, dur = _num(ts, None), _num(dur, 0.0)
                if ts is None:
                    continue
            name = ev.get("name")
            nid = name_ids.get(name) if isinstance(name, str) else None
            if nid is None:
                nid = new_name(name)
            key = (ev.get("pid"), ev.get("tid"))
            thread = thread_ids.get(key)
            if thread is None:
                thread = new_thread(*key)
            args = ev.get("args") or {}
            if code == _C_CPU_OP:
                cpu.name.append(nid); cpu.thread.append(thread); cpu.ts.append(ts); cpu.dur.append(dur)
                ext = args.get("External id")
                cpu.ext.append(ext if type(ext) is int else -1)
                types = args.get("Input type")
                if types is None:
                    cpu.input_types.append(-1)
                else:
                    try:
                        cpu.input_types.append(input_type_ids[tuple(types)])
                    except (KeyError, TypeError):
                        cpu.input_types.append(self._input_types(types))
            elif code == _C_RUNTIME or code == _C_DRIVER:
                if name in overhead_names:
                    self.overhead_count += 1
                    continue
                rt.name.append(nid); rt.thread.append(thread); rt.ts.append(ts); rt.dur.append(dur)
                corr = args.get("correlation")
                rt.corr.append(corr if type(corr) is int else -1)
                ext = args.get("External id")
                rt.ext.append(ext if type(ext) is int else -1)
                rt.domain.append(DRIVER if code == _C_DRIVER else RUNTIME)
            elif code == _C_KERNEL or code == _C_MEMCPY or code == _C_MEMSET:
                kind = KERNEL if code == _C_KERNEL else (MEMCPY if code == _C_MEMCPY else MEMSET)
                dev.kind.append(kind); dev.name.append(nid); dev.ts.append(ts); dev.dur.append(dur)
                device = args.get("device", key[0])
                dev.device.append(device if type(device) is int else -1)
                stream = args.get("stream", key[1])
                dev.stream.append(stream if type(stream) is int else -1)
                corr = args.get("correlation")
                dev.corr.append(corr if type(corr) is int else -1)
                ext = args.get("External id")
                dev.ext.append(ext if type(ext) is int else -1)
                if kind == KERNEL:
                    dev.info.append(self._kernel_info(args))
                    dev.nbytes.append(-1)
                else:
                    dev.info.append(-1)
                    nbytes = args.get("bytes")
                    dev.nbytes.append(nbytes if type(nbytes) is int else -1)
            elif code == _C_ANNOT:
                ann.name.append(nid); ann.thread.append(thread); ann.ts.append(ts); ann.dur.append(dur)
                ext = args.get("External id")
                ann.ext.append(ext if type(ext) is int else -1)
                ann.input_types.append(-1)
            elif code == _C_GPU_ANNOT:
                gann.name.append(nid); gann.ts.append(ts); gann.dur.append(dur)
                device = args.get("device", key[0])
                gann.device.append(device if type(device) is int else -1)
                stream = args.get("stream", key[1])
                gann.stream.append(stream if type(stream) is int else -1)
                ext = args.get("External id")
                gann.ext.append(ext if type(ext) is int else -1)
            elif code == _C_PYTHON:
                self.python_function_count += 1
            else:
                self.overhead_count += 1
        self.event_count = count

    def finish(self, label: str) -> ParsedTrace:
        return ParsedTrace(
            names=self.names, threads=self.threads, input_types=self.input_types,
            kernel_infos=self.kernel_infos, cpu_ops=self.cpu_ops, annotations=self.annotations,
            runtime=self.runtime, device=self.device, gpu_annotations=self.gpu_annotations,
            device_properties=self.device_properties, metadata=self.metadata,
            event_count=self.event_count, overhead_count=self.overhead_count,
            python_function_count=self.python_function_count, source=label)
