"""Parse a Kineto Chrome trace once into compact, typed, columnar tables.

`load_trace(source)` accepts a path (`.json` or `.json.gz`), an already-loaded dict or a
`ParsedTrace` and returns a `ParsedTrace`. A file is read as a stream of bytes (`reader`; two
processes for a large one: `parallel`) and decoded by msgspec into `decoding.Record`s, holding
the fields attnprof reads and nothing else; a dict is encoded to JSON and read the same way.
`_Builder.add`, the one loop from events to tables, reduces each to a few numbers in `array`s.
"""

from __future__ import annotations

import gc
import gzip
import zlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from attnprof.analysis import decoding, parallel, reader
from attnprof.analysis.decoding import ABSENT, EMPTY_ARGS, KernelInfo
from attnprof.errors import TraceError

KERNEL, MEMCPY, MEMSET = 0, 1, 2  # device event kinds
KIND_NAMES = ("kernel", "memcpy", "memset")
RUNTIME, DRIVER = 0, 1  # runtime event domains


class _Table:
    """A table's length is its number of rows."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.ts)  # type: ignore[attr-defined]


@dataclass(slots=True)
class CpuTable(_Table):
    """CPU-side ranges (cpu ops or user annotations), one column per field."""

    name: array = field(default_factory=lambda: array("i"))
    thread: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    ext: array = field(default_factory=lambda: array("q"))
    input_types: array = field(default_factory=lambda: array("i"))  # index into ParsedTrace.input_types; -1
    seq: array = field(default_factory=lambda: array("q"))  # autograd `Sequence number`; -1
    fwd_tid: array = field(default_factory=lambda: array("q"))  # `Fwd thread id` (> 0: a backward op); -1


@dataclass(slots=True)
class RuntimeTable(_Table):
    """CUDA runtime and driver API calls on the CPU."""

    name: array = field(default_factory=lambda: array("i"))
    thread: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    corr: array = field(default_factory=lambda: array("q"))
    ext: array = field(default_factory=lambda: array("q"))
    domain: array = field(default_factory=lambda: array("b"))  # RUNTIME or DRIVER


@dataclass(slots=True)
class DeviceTable(_Table):
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


@dataclass(slots=True)
class GpuAnnotationTable(_Table):
    """GPU-side extents of record_function ranges (`gpu_user_annotation`)."""

    name: array = field(default_factory=lambda: array("i"))
    device: array = field(default_factory=lambda: array("i"))
    stream: array = field(default_factory=lambda: array("q"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    ext: array = field(default_factory=lambda: array("q"))


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

    Raises TraceError (one line, naming the file) for a missing or unreadable file, for one that
    is not a torch.profiler Chrome trace, and for a trace with no events.
    """
    if isinstance(source, ParsedTrace):
        return source
    with gc_paused():  # millions of short-lived objects: the cyclic collector only slows them down
        return _load(source)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block (as it was after it). Reading and analysing
    a trace builds many containers and keeps them: each collection would only walk them again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(source: str | Path | dict[str, Any]) -> ParsedTrace:
    builder = _Builder()
    if isinstance(source, dict):
        label = "<dict>"
        try:
            data = decoding.encode(source)
        except TypeError as exc:
            raise reader.not_a_trace(label, f"it cannot be written as JSON ({exc})") from None
        saw_events = reader.read_bytes(data, builder, label)
    else:
        path = Path(source)
        label = str(path)
        if not path.exists():
            raise TraceError(f"trace file not found: {path}")
        if path.is_dir():
            raise TraceError(f"trace path is a directory, not a file: {path}")
        try:
            saw_events = parallel.read_path(path, builder, _Builder, label)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise reader.not_a_trace(label, f"its gzip data is cut short or corrupt ({exc})") from None
        except OSError as exc:
            raise TraceError(f"cannot read trace {path}: {exc}") from None
    if not saw_events:
        raise reader.not_a_trace(label, "it has no 'traceEvents' list")
    if builder.event_count == builder.non_objects:
        if builder.event_count:
            raise reader.not_a_trace(label, "its events are not JSON objects")
        raise TraceError(f"trace {label} has no events")
    return builder.finish(label)


def _num(value: Any, default: float | None) -> float | None:
    try:
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def _intern(items: list[Any], ids: dict[Any, int], key: Any) -> int:
    """The index of `key` in `items`, appending it first when it is new."""
    index = ids.get(key)
    if index is None:
        index = ids[key] = len(items)
        items.append(key)
    return index


class _Builder:
    """Accumulates events into the compact tables; one pass, no per-event objects kept."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.threads: list[tuple[Any, Any]] = []
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.input_types: list[tuple[str, ...]] = []
        self.input_type_ids: dict[tuple[str, ...], int] = {}
        self.raw_input_type_ids: dict[bytes, int] = {}  # the JSON text of an `Input type` -> its index
        self.kernel_info_table = decoding.KernelInfos()
        self.kernel_infos: list[KernelInfo] = self.kernel_info_table.items
        self.cpu_ops = CpuTable()
        self.annotations = CpuTable()
        self.runtime = RuntimeTable()
        self.device = DeviceTable()
        self.gpu_annotations = GpuAnnotationTable()
        self.device_properties: list[dict[str, Any]] = []
        self.metadata: dict[str, Any] = {}
        self.event_count = 0
        self.non_objects = 0
        self.overhead_count = 0
        self.python_function_count = 0

    def top_level(self, key: str, value: Any) -> None:
        """Keep `deviceProperties` and the scalar top-level keys (and `distributedInfo`)."""
        if key == "deviceProperties":
            if isinstance(value, list):
                self.device_properties = [p for p in value if isinstance(p, dict)]
        elif (
            isinstance(value, (str, int, float, bool))
            or value is None
            or (key == "distributedInfo" and isinstance(value, dict))
        ):
            self.metadata[key] = value

    def _name(self, name: Any) -> int:
        if not isinstance(name, str):
            name = "" if name is None else str(name)
        return _intern(self.names, self.name_ids, name)

    def _thread(self, pid: Any, tid: Any) -> int:
        return _intern(self.threads, self.thread_ids, (pid, tid))

    def _input_types(self, types: tuple[Any, ...]) -> int:
        try:
            return _intern(self.input_types, self.input_type_ids, types)
        except TypeError:  # an unhashable element: keep its text
            return _intern(self.input_types, self.input_type_ids, tuple(str(t) for t in types))

    def _raw_input_types(self, raw: bytes) -> int:
        value = decoding.input_type_value(raw)
        index = self.raw_input_type_ids[raw] = self._input_types(tuple(value)) if isinstance(value, list) else -1
        return index

    def add(self, records: list[decoding.Record], non_objects: int = 0) -> None:
        """Reduce a batch of events, in file order, into the tables; `non_objects` more entries
        of the event list were not objects (counted, not kept)."""
        categories, kernel_info_index = decoding.CATEGORIES, self.kernel_info_table.index_of
        name_ids, thread_ids, raw_type_ids = self.name_ids, self.thread_ids, self.raw_input_type_ids
        new_name, new_thread = self._name, self._thread
        cpu, ann, rt, dev, gann = self.cpu_ops, self.annotations, self.runtime, self.device, self.gpu_annotations
        overhead_names = decoding.OVERHEAD_NAMES
        absent = ABSENT
        cpu_name, cpu_thread, cpu_ts, cpu_dur, cpu_ext, cpu_types, cpu_seq, cpu_fwd_tid = _appenders(cpu)
        ann_name, ann_thread, ann_ts, ann_dur, ann_ext, ann_types, ann_seq, ann_fwd_tid = _appenders(ann)
        rt_name, rt_thread, rt_ts, rt_dur, rt_corr, rt_ext, rt_domain = _appenders(rt)
        dev_kind, dev_name, dev_device, dev_stream, dev_ts, dev_dur, dev_corr, dev_ext, dev_info, dev_nbytes = (
            _appenders(dev)
        )
        gann_name, gann_device, gann_stream, gann_ts, gann_dur, gann_ext = _appenders(gann)
        self.event_count += len(records) + non_objects
        self.non_objects += non_objects
        last_pid = last_tid = thread = absent
        for ev in records:
            code = categories.get(ev.cat)
            if code is None:
                if ev.ph == "X" and ev.name in overhead_names:
                    self.overhead_count += 1
                continue
            if ev.ph != "X" and ev.ph is not absent:  # a missing ph counts as "X"
                continue
            ts, dur = ev.ts, ev.dur
            if ts.__class__ is not float or dur.__class__ is not float:
                ts, dur = _num(ts, None), _num(dur, 0.0)
                if ts is None:
                    continue
            if code >= decoding.CAT_PYTHON:  # counted only: their names and threads are not interned
                if code == decoding.CAT_PYTHON:
                    self.python_function_count += 1
                else:
                    self.overhead_count += 1
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
                args = EMPTY_ARGS
            ext = args.ext
            if ext.__class__ is not int:
                ext = -1
            if code == decoding.CAT_CPU_OP:
                cpu_name(nid)
                cpu_thread(thread)
                cpu_ts(ts)
                cpu_dur(dur)
                cpu_ext(ext)
                raw = bytes(args.input_type)
                types = raw_type_ids.get(raw)
                cpu_types(types if types is not None else self._raw_input_types(raw))
                seq, fwd_tid = args.seq, args.fwd_tid
                cpu_seq(seq if seq.__class__ is int else -1)
                cpu_fwd_tid(fwd_tid if fwd_tid.__class__ is int else -1)
            elif code == decoding.CAT_RUNTIME or code == decoding.CAT_DRIVER:
                if name in overhead_names:
                    self.overhead_count += 1
                    continue
                rt_name(nid)
                rt_thread(thread)
                rt_ts(ts)
                rt_dur(dur)
                rt_ext(ext)
                corr = args.corr
                rt_corr(corr if corr.__class__ is int else -1)
                rt_domain(DRIVER if code == decoding.CAT_DRIVER else RUNTIME)
            elif code == decoding.CAT_ANNOT:
                ann_name(nid)
                ann_thread(thread)
                ann_ts(ts)
                ann_dur(dur)
                ann_ext(ext)
                ann_types(-1)
                ann_seq(-1)
                ann_fwd_tid(-1)
            else:  # device work and GPU annotations: device and stream default to pid and tid
                device, stream = args.device, args.stream
                if device is absent:
                    device = pid
                if stream is absent:
                    stream = tid
                if code == decoding.CAT_GPU_ANNOT:
                    gann_name(nid)
                    gann_ts(ts)
                    gann_dur(dur)
                    gann_ext(ext)
                    gann_device(device if device.__class__ is int else -1)
                    gann_stream(stream if stream.__class__ is int else -1)
                    continue
                kind = KERNEL if code == decoding.CAT_KERNEL else (MEMCPY if code == decoding.CAT_MEMCPY else MEMSET)
                dev_kind(kind)
                dev_name(nid)
                dev_ts(ts)
                dev_dur(dur)
                dev_ext(ext)
                dev_device(device if device.__class__ is int else -1)
                dev_stream(stream if stream.__class__ is int else -1)
                corr = args.corr
                dev_corr(corr if corr.__class__ is int else -1)
                if kind == KERNEL:
                    dev_info(kernel_info_index(args))
                    dev_nbytes(-1)
                else:
                    dev_info(-1)
                    nbytes = args.nbytes
                    dev_nbytes(nbytes if nbytes.__class__ is int else -1)

    def absorb(self, other: _Builder) -> None:
        """Append what `other` read from the events that follow this builder's (the reader's
        worker process): its interned lists are merged into these and its indices remapped."""
        remap = {
            "name": [self._name(n) for n in other.names],
            "thread": [self._thread(*t) for t in other.threads],
            "input_types": [self._input_types(t) for t in other.input_types],
            "info": [self.kernel_info_table.add(i) for i in other.kernel_infos],
        }
        for key, index in list(remap.items()):
            if index == list(range(len(index))):
                del remap[key]  # the same indices on both sides (threads, often): copied as they are
            else:
                index.append(-1)  # index -1 (none) stays -1
        for table in ("cpu_ops", "annotations", "runtime", "device", "gpu_annotations"):
            mine, theirs = getattr(self, table), getattr(other, table)
            for column in fields(mine):
                values = getattr(theirs, column.name)
                mapping = remap.get(column.name)
                getattr(mine, column.name).extend(values if mapping is None else [mapping[i] for i in values])
        for count in ("event_count", "non_objects", "overhead_count", "python_function_count"):
            setattr(self, count, getattr(self, count) + getattr(other, count))

    def finish(self, label: str) -> ParsedTrace:
        """The tables as a ParsedTrace named `label`."""
        kept = {f.name: getattr(self, f.name) for f in fields(ParsedTrace) if f.name != "source"}
        return ParsedTrace(**kept, source=label)


def new_builder() -> reader.Sink:
    """An empty table builder: the sink that `parallel.start_early` hands its worker."""
    return _Builder()


def _appenders(table: Any) -> tuple[Any, ...]:
    """The `append` of each column of a table, in field order."""
    return tuple(getattr(table, column.name).append for column in fields(table))
