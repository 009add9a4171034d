"""Parse a Kineto Chrome trace once into compact, typed, columnar tables.

`load_trace(source)` accepts a path (`.json` or `.json.gz`) or an already-loaded dict and
returns a `ParsedTrace`. Files are decoded as a stream of bytes: the `traceEvents` array is
read 4 MiB at a time, cut between two events and decoded in one call (with msgspec, into
`decoding.Record`s that skip every field the tables do not use; see `decoding`), each event is
reduced to a few numbers in `array`s and then dropped, so memory stays near the size of the
compact tables rather than the size of the JSON.

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
import zlib
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
_KERNEL_ARG_KEYS = decoding.KERNEL_ARG_KEYS  # every args key _make_kernel_info reads
_ABSENT = decoding.ABSENT
_EMPTY_ARGS = decoding.Args() if decoding.fast_decoder_available() else None

_CHUNK_CHARS = 1 << 22  # 4 MiB of JSON read at a time (the name predates reading bytes)


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
            with _open_binary(path) as fp:
                _stream_parse(fp, builder, label)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise TraceError(f"cannot read trace {path}: {exc}") from None
    trace = builder.finish(label)
    if trace.event_count == 0:
        raise TraceError("trace has no events")
    return trace


def _open_binary(path: Path) -> io.BufferedIOBase:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return path.open("rb")


# --------------------------------------------------------------------------- streaming JSON

_SKIP = re.compile(rb"[\s,]*").match
_WS = re.compile(rb"\s*").match
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_BOUNDARY_WINDOW = 65536  # bytes searched back from the buffer's end for a cut between events
_VALUE_WINDOW = 65536  # bytes decoded first when reading one top-level value

# The batch decoders; tests swap them (e.g. `_batch_records = None` forces the generic path).
_batch_records = decoding.decode_records if decoding.fast_decoder_available() else None
_batch_loads = decoding.decode_generic


class _Stream:
    """A refillable byte buffer over a file, decoding one JSON value or one batch of events at a time.

    Works on bytes: the events are ASCII JSON almost always, and decoding the whole file to text
    first would cost as much as parsing it.
    """

    __slots__ = ("fp", "buf", "pos", "eof", "decode", "label")

    def __init__(self, fp: io.BufferedIOBase, label: str) -> None:
        self.fp, self.buf, self.pos, self.eof, self.label = fp, b"", 0, False, label
        self.decode = json.JSONDecoder().raw_decode

    def refill(self) -> bool:
        if self.eof:
            return False
        chunk = self.fp.read(_CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-space character (skipping commas too), or '' at the end."""
        while True:
            self.pos = _SKIP(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return chr(self.buf[self.pos])
            if not self.refill():
                return ""

    def expect(self, char: str) -> None:
        while True:
            self.pos = _WS(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                break
            if not self.refill():
                raise TraceError(f"trace {self.label} is not valid JSON: ended early (truncated file?)")
        found = chr(self.buf[self.pos])
        if found != char:
            raise TraceError(f"trace {self.label} is not a Chrome trace: expected {char!r} "
                             f"at byte {self.pos}, found {found!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode the JSON value at the cursor, reading more bytes until it is complete."""
        window = _VALUE_WINDOW  # decode a window first: top-level values are small, the buffer is not
        while True:
            self.pos = _WS(self.buf, self.pos).end()
            if self.pos >= len(self.buf) and self.refill():
                continue
            whole = self.pos + window >= len(self.buf)
            # surrogateescape maps each undecodable byte to one character and back, so the
            # value's length in bytes is exact.
            text = self.buf[self.pos:self.pos + window].decode("utf-8", "surrogateescape")
            try:
                obj, end = self.decode(text)
            except json.JSONDecodeError as exc:
                if not whole:
                    window *= 16
                    continue
                if self.refill():
                    continue
                raise TraceError(f"trace {self.label} is not valid JSON: {exc.msg} "
                                 f"(truncated file?)") from None
            # A value that ends exactly at the text's end may be cut (a number): read on.
            if end >= len(text):
                if not whole:
                    window *= 16
                    continue
                if not self.eof and self.refill():
                    continue
            raw = text[:end].encode("utf-8", "surrogateescape")
            self.pos += len(raw)
            try:
                text[:end].encode("utf-8")
            except UnicodeEncodeError:  # bytes that are not UTF-8: replace them, as a text reader would
                obj = self.decode(raw.decode("utf-8", "replace"))[0]
            return obj

    def batches(self) -> Iterator[tuple[bool, list[Any]]]:
        """Yield the `traceEvents` array a buffer's worth at a time: (records?, events).

        Fast path: cut the buffer after the last `}, {` seen and decode everything before it in
        one call, as `Record`s when msgspec is there and the events fit its schema, else as dicts.
        JSON's strictness makes a wrong cut (say, inside a string) fail rather than mislead; then
        an earlier cut is tried, and at last one event is decoded on its own.
        """
        self.expect("[")
        while True:
            char = self.peek()
            if char == "]":
                self.pos += 1
                return
            if char == "":
                raise TraceError(f"trace {self.label} is not valid JSON: the event list is not closed "
                                 "(truncated file?)")
            buf, pos = self.buf, self.pos
            cuts = [m.start() + 1 for m in _BOUNDARY.finditer(buf, max(pos, len(buf) - _BOUNDARY_WINDOW))]
            if len(cuts) < 2:
                cuts = [m.start() + 1 for m in _BOUNDARY.finditer(buf, pos)]
            records, batch = False, None
            for cut in reversed(cuts[-3:]):
                if cut <= pos:
                    break
                payload = b"[" + buf[pos:cut] + b"]"
                try:
                    batch = _batch_records(payload) if _batch_records is not None else None
                    records = batch is not None
                    if batch is None:
                        batch = _batch_loads(payload)
                except ValueError:  # not JSON (a bad cut): msgspec's, orjson's and json's errors are ValueErrors
                    continue
                self.pos = cut
                break
            if batch is None:
                records, batch = False, [self.value()]
            yield records, batch


def _stream_parse(fp: io.BufferedIOBase, builder: _Builder, label: str) -> None:
    stream = _Stream(fp, label)
    first = stream.peek()
    if first == "":
        raise TraceError("trace has no events")
    if first == "[":  # the bare-array form of the Chrome trace format
        _add_batches(stream, builder)
        return
    stream.expect("{")
    while True:
        char = stream.peek()
        if char == "}":
            return
        if char == "":
            raise TraceError(f"trace {label} is not valid JSON: ended early (truncated file?)")
        key = stream.value()
        if not isinstance(key, str):
            raise TraceError(f"trace {label} is not a Chrome trace: a top-level key is not a string")
        stream.expect(":")
        if key == "traceEvents":
            stream.pos = _WS(stream.buf, stream.pos).end()
            if stream.peek() != "[":
                raise TraceError(f"trace {label}: 'traceEvents' is not a list")
            _add_batches(stream, builder)
        else:
            builder.top_level(key, stream.value())


def _add_batches(stream: _Stream, builder: _Builder) -> None:
    for records, batch in stream.batches():
        if records:
            builder.add_records(batch)
        else:
            builder.add_events(batch)

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


def _appenders(*columns: array) -> tuple[Any, ...]:
    return tuple(column.append for column in columns)


def _tuple_of(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


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

    def _kernel_info(self, values: tuple[Any, ...]) -> int:
        """The index of the KernelInfo for raw launch-fact values in KERNEL_ARG_KEYS order
        (ABSENT where the event lacks the key); the raw values are the cache key."""
        try:
            key = values if (values[0].__class__ is not list and values[1].__class__ is not list) else \
                (_tuple_of(values[0]), _tuple_of(values[1])) + values[2:]
            index = self.kernel_info_ids.get(key)
        except TypeError:  # an unhashable value: build the info, don't cache the raw key
            key, index = None, None
        if index is not None:
            return index
        info = _make_kernel_info({k: v for k, v in zip(_KERNEL_ARG_KEYS, values) if v is not _ABSENT})
        index = self.kernel_info_ids.get(info)
        if index is None:
            index = len(self.kernel_infos)
            self.kernel_info_ids[info] = index
            self.kernel_infos.append(info)
        if key is not None:
            self.kernel_info_ids[key] = index
        return index

    def add_events(self, events: Any) -> None:  # noqa: C901 - one flat loop is the fast path
        categories = _CATEGORIES
        name_ids, thread_ids = self.name_ids, self.thread_ids
        new_name, new_thread = self._name, self._thread
        cpu, ann, rt, dev, gann = self.cpu_ops, self.annotations, self.runtime, self.device, self.gpu_annotations
        count = self.event_count
        overhead_names = OVERHEAD_NAMES
        input_type_ids = self.input_type_ids
        kernel_keys, absent = _KERNEL_ARG_KEYS, _ABSENT
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
            args = ev.get("args")
            if args.__class__ is not dict:
                args = {} if not isinstance(args, dict) else args
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
                    dev.info.append(self._kernel_info(tuple([args.get(k, absent) for k in kernel_keys])))
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

    def add_records(self, records: Any) -> None:  # noqa: C901 - add_events for decoding.Record events
        """`add_events` for events decoded as `decoding.Record`s: the same tables, the same rules."""
        categories = _CATEGORIES
        name_ids, thread_ids = self.name_ids, self.thread_ids
        new_name, new_thread = self._name, self._thread
        cpu, ann, rt, dev, gann = self.cpu_ops, self.annotations, self.runtime, self.device, self.gpu_annotations
        overhead_names = OVERHEAD_NAMES
        input_type_ids = self.input_type_ids
        absent = _ABSENT
        cpu_name, cpu_thread, cpu_ts, cpu_dur, cpu_ext, cpu_types = _appenders(
            cpu.name, cpu.thread, cpu.ts, cpu.dur, cpu.ext, cpu.input_types)
        ann_name, ann_thread, ann_ts, ann_dur, ann_ext, ann_types = _appenders(
            ann.name, ann.thread, ann.ts, ann.dur, ann.ext, ann.input_types)
        rt_name, rt_thread, rt_ts, rt_dur, rt_corr, rt_ext, rt_domain = _appenders(
            rt.name, rt.thread, rt.ts, rt.dur, rt.corr, rt.ext, rt.domain)
        dev_kind, dev_name, dev_device, dev_stream, dev_ts, dev_dur, dev_corr, dev_ext, dev_info, dev_nbytes = \
            _appenders(dev.kind, dev.name, dev.device, dev.stream, dev.ts, dev.dur, dev.corr, dev.ext, dev.info,
                       dev.nbytes)
        gann_name, gann_device, gann_stream, gann_ts, gann_dur, gann_ext = _appenders(
            gann.name, gann.device, gann.stream, gann.ts, gann.dur, gann.ext)
        self.event_count += len(records)
        last_pid = last_tid = thread = absent
        for ev in records:
            code = categories.get(ev.cat)
            if code is None:
                if ev.ph == "X" and ev.name in overhead_names:
                    self.overhead_count += 1
                continue
            if ev.ph != "X" and ev.ph is not absent:  # a missing ph counts as "X", as in add_events
                continue
            ts, dur = ev.ts, ev.dur
            if ts.__class__ is not float or dur.__class__ is not float:
                ts, dur = _num(ts, None), _num(dur, 0.0)
                if ts is None:
                    continue
            name = ev.name
            nid = name_ids.get(name) if name.__class__ is str else None
            if nid is None:
                nid = new_name(name)
            pid, tid = ev.pid, ev.tid
            if pid != last_pid or tid != last_tid:  # most events share the previous one's (pid, tid)
                thread = thread_ids.get((pid, tid))
                if thread is None:
                    thread = new_thread(pid, tid)
                last_pid, last_tid = pid, tid
            args = ev.args
            if args is None:
                args = _EMPTY_ARGS
            if code == _C_CPU_OP:
                cpu_name(nid); cpu_thread(thread); cpu_ts(ts); cpu_dur(dur)
                ext = args.ext
                cpu_ext(ext if ext.__class__ is int else -1)
                types = args.input_type
                if types is absent or types is None:
                    cpu_types(-1)
                else:
                    try:
                        cpu_types(input_type_ids[tuple(types)])
                    except (KeyError, TypeError):
                        cpu_types(self._input_types(types))
            elif code == _C_RUNTIME or code == _C_DRIVER:
                if name in overhead_names:
                    self.overhead_count += 1
                    continue
                rt_name(nid); rt_thread(thread); rt_ts(ts); rt_dur(dur)
                corr = args.corr
                rt_corr(corr if corr.__class__ is int else -1)
                ext = args.ext
                rt_ext(ext if ext.__class__ is int else -1)
                rt_domain(DRIVER if code == _C_DRIVER else RUNTIME)
            elif code == _C_KERNEL or code == _C_MEMCPY or code == _C_MEMSET:
                kind = KERNEL if code == _C_KERNEL else (MEMCPY if code == _C_MEMCPY else MEMSET)
                dev_kind(kind); dev_name(nid); dev_ts(ts); dev_dur(dur)
                device = args.device
                if device is absent:
                    device = pid
                dev_device(device if device.__class__ is int else -1)
                stream = args.stream
                if stream is absent:
                    stream = tid
                dev_stream(stream if stream.__class__ is int else -1)
                corr = args.corr
                dev_corr(corr if corr.__class__ is int else -1)
                ext = args.ext
                dev_ext(ext if ext.__class__ is int else -1)
                if kind == KERNEL:
                    dev_info(self._kernel_info(args.kernel_values()))
                    dev_nbytes(-1)
                else:
                    dev_info(-1)
                    nbytes = args.nbytes
                    dev_nbytes(nbytes if nbytes.__class__ is int else -1)
            elif code == _C_ANNOT:
                ann_name(nid); ann_thread(thread); ann_ts(ts); ann_dur(dur)
                ext = args.ext
                ann_ext(ext if ext.__class__ is int else -1)
                ann_types(-1)
            elif code == _C_GPU_ANNOT:
                gann_name(nid); gann_ts(ts); gann_dur(dur)
                device = args.device
                if device is absent:
                    device = pid
                gann_device(device if device.__class__ is int else -1)
                stream = args.stream
                if stream is absent:
                    stream = tid
                gann_stream(stream if stream.__class__ is int else -1)
                ext = args.ext
                gann_ext(ext if ext.__class__ is int else -1)
            elif code == _C_PYTHON:
                self.python_function_count += 1
            else:
                self.overhead_count += 1

    def finish(self, label: str) -> ParsedTrace:
        return ParsedTrace(
            names=self.names, threads=self.threads, input_types=self.input_types,
            kernel_infos=self.kernel_infos, cpu_ops=self.cpu_ops, annotations=self.annotations,
            runtime=self.runtime, device=self.device, gpu_annotations=self.gpu_annotations,
            device_properties=self.device_properties, metadata=self.metadata,
            event_count=self.event_count, overhead_count=self.overhead_count,
            python_function_count=self.python_function_count, source=label)
