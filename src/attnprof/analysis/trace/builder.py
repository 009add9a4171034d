"""The one loop from decoded events to a trace's tables: `TableBuilder.add` reduces each batch of
`decoding.Record`s to a few numbers per event in the `array` columns of `trace`'s tables, interning
names, threads, input-type lists and kernel launch facts; `absorb` appends what a worker process read
(`parallel`); `finish` gives the `ParsedTrace`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from attnprof.analysis.base import DRIVER, KERNEL, MEMCPY, MEMSET, RUNTIME
from attnprof.analysis.trace import decoding
from attnprof.analysis.trace.decoding import ABSENT, EMPTY_ARGS, Args, KernelInfo
from attnprof.analysis.trace.tables import CpuTable, DeviceTable, GpuAnnotationTable, ParsedTrace, RuntimeTable


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


class TableBuilder:
    """Accumulates events into the compact tables; one pass, no per-event objects kept."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.threads: list[tuple[Any, Any]] = []
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.input_types: list[tuple[str, ...]] = []
        self.input_type_ids: dict[tuple[str, ...], int] = {}
        self.raw_input_type_ids: dict[bytes, int] = {}  # the JSON text of an `Input type` -> its index
        self.input_dims: list[bytes] = []  # the distinct `Input Dims`, as JSON text
        self.input_dims_ids: dict[bytes, int] = {}
        self.concrete_inputs: list[bytes] = []  # the distinct `Concrete Inputs`, as JSON text
        self.concrete_inputs_ids: dict[bytes, int] = {}
        self.concrete_inputs_at: dict[int, int] = {}  # cpu op row -> its index in concrete_inputs
        self.concrete_input_names: set[int] = set()  # the name ids of `decoding.CONCRETE_INPUT_OPS`
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
        index = _intern(self.names, self.name_ids, name)
        if name in decoding.CONCRETE_INPUT_OPS:
            self.concrete_input_names.add(index)
        return index

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
        of the event list were not objects (counted, not kept). Each kept event's name and thread are
        interned here; its row is written by the writer of its category (`_row_writers`)."""
        categories, overhead_names, absent = decoding.CATEGORIES, decoding.OVERHEAD_NAMES, ABSENT
        name_ids, thread_ids, new_name, new_thread = self.name_ids, self.thread_ids, self._name, self._thread
        write_row = _row_writers(self)
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
            if (code == decoding.CAT_RUNTIME or code == decoding.CAT_DRIVER) and name in overhead_names:
                self.overhead_count += 1  # (its name and thread interned all the same)
                continue
            args = ev.args
            if args is None:
                args = EMPTY_ARGS
            ext = args.ext
            write_row[code](nid, thread, ts, dur, ext if ext.__class__ is int else -1, args, pid, tid)

    def absorb(self, other: TableBuilder) -> None:
        """Append what `other` read from the events that follow this builder's (the reader's
        worker process): its interned lists are merged into these and its indices remapped."""
        remap = {
            "name": [self._name(n) for n in other.names],
            "thread": [self._thread(*t) for t in other.threads],
            "input_types": [self._input_types(t) for t in other.input_types],
            "input_dims": [_intern(self.input_dims, self.input_dims_ids, d) for d in other.input_dims],
            "info": [self.kernel_info_table.add(i) for i in other.kernel_infos],
        }
        for key, index in list(remap.items()):
            if index == list(range(len(index))):
                del remap[key]  # the same indices on both sides (threads, often): copied as they are
            else:
                index.append(-1)  # index -1 (none) stays -1
        concrete = [_intern(self.concrete_inputs, self.concrete_inputs_ids, c) for c in other.concrete_inputs]
        rows = len(self.cpu_ops)
        self.concrete_inputs_at.update({rows + op: concrete[i] for op, i in other.concrete_inputs_at.items()})
        for table in ("cpu_ops", "annotations", "runtime", "device", "gpu_annotations"):
            mine, theirs = getattr(self, table), getattr(other, table)
            for column in fields(mine):
                values = getattr(theirs, column.name)
                mapping = remap.get(column.name)
                getattr(mine, column.name).extend(values if mapping is None else [mapping[i] for i in values])
        for count in ("event_count", "non_objects", "overhead_count", "python_function_count"):
            setattr(self, count, getattr(self, count) + getattr(other, count))

    def finish(self, label: str, read_notes: tuple[str, ...] = ()) -> ParsedTrace:
        """The tables as a ParsedTrace named `label` (`read_notes`: see ParsedTrace)."""
        skipped = ("source", "read_notes")
        kept = {f.name: getattr(self, f.name) for f in fields(ParsedTrace) if f.name not in skipped}
        return ParsedTrace(**kept, source=label, read_notes=read_notes)


def _appenders(table: Any) -> tuple[Any, ...]:
    """The `append` of each column of a table, in field order."""
    return tuple(getattr(table, column.name).append for column in fields(table))


#: Writes one event's row: (name id, thread index, ts, dur, External id, args, pid, tid).
_RowWriter = Callable[[int, int, float, float, int, Args, Any, Any], None]


def _row_writers(builder: TableBuilder) -> tuple[_RowWriter, ...]:
    """The row writer of each table category, indexed by its code (`decoding.CAT_CPU_OP` ...
    `decoding.CAT_GPU_ANNOT`), appending to `builder`'s tables."""
    return (
        _cpu_writer(builder.cpu_ops, builder),
        _cpu_writer(builder.annotations, None),
        _runtime_writer(builder.runtime, RUNTIME),
        _runtime_writer(builder.runtime, DRIVER),
        _device_writer(builder.device, KERNEL, builder.kernel_info_table.index_of),
        _device_writer(builder.device, MEMCPY, None),
        _device_writer(builder.device, MEMSET, None),
        _device_writer(builder.gpu_annotations, None, None),
    )


def _cpu_writer(table: CpuTable, builder: TableBuilder | None) -> _RowWriter:
    """Cpu ops (`builder` interns their input types) or user annotations (None: they have no input
    types, sequence number or forward thread)."""
    name, thread, ts, dur, ext, types, seq, fwd_tid, dims = _appenders(table)
    if builder is not None:
        raw_type_ids, raw_input_types = builder.raw_input_type_ids, builder._raw_input_types
        dims_list, dims_ids = builder.input_dims, builder.input_dims_ids
        concrete_list, concrete_ids = builder.concrete_inputs, builder.concrete_inputs_ids
        concrete_names, concrete_at, rows = builder.concrete_input_names, builder.concrete_inputs_at, table.ts
    no_raw = decoding.NO_RAW

    def write(nid: int, tid_index: int, t: float, d: float, x: int, args: Args, pid: Any, tid: Any) -> None:
        name(nid)
        thread(tid_index)
        ts(t)
        dur(d)
        ext(x)
        if builder is None:
            types(-1)
            seq(-1)
            fwd_tid(-1)
            dims(-1)
            return
        raw = bytes(args.input_type)
        index = raw_type_ids.get(raw)
        types(index if index is not None else raw_input_types(raw))
        sequence, forward_tid = args.seq, args.fwd_tid
        seq(sequence if sequence.__class__ is int else -1)
        fwd_tid(forward_tid if forward_tid.__class__ is int else -1)
        raw_dims = args.input_dims
        if raw_dims is no_raw:  # no record_shapes: no bytes made
            dims(-1)
        else:
            key = bytes(raw_dims)
            index = dims_ids.get(key)
            dims(index if index is not None else _intern(dims_list, dims_ids, key))
        if nid in concrete_names and args.concrete_inputs is not no_raw:  # SDPA ops only: a few a trace
            key = bytes(args.concrete_inputs)
            index = concrete_ids.get(key)
            concrete_at[len(rows) - 1] = index if index is not None else _intern(concrete_list, concrete_ids, key)

    return write


def _runtime_writer(table: RuntimeTable, domain_code: int) -> _RowWriter:
    name, thread, ts, dur, corr, ext, domain = _appenders(table)

    def write(nid: int, tid_index: int, t: float, d: float, x: int, args: Args, pid: Any, tid: Any) -> None:
        name(nid)
        thread(tid_index)
        ts(t)
        dur(d)
        ext(x)
        correlation = args.corr
        corr(correlation if correlation.__class__ is int else -1)
        domain(domain_code)

    return write


def _device_writer(
    table: DeviceTable | GpuAnnotationTable, kind_code: int | None, kernel_info_index: Callable[[Args], int] | None
) -> _RowWriter:
    """Kernels (`kind_code` KERNEL, with `kernel_info_index`), memcpys, memsets, or GPU annotations
    (`kind_code` None). Device and stream default to pid and tid; -1 when not an integer."""
    name, device, stream, ts, dur, ext = (
        getattr(table, c).append for c in ("name", "device", "stream", "ts", "dur", "ext")
    )
    if isinstance(table, DeviceTable):
        kind, corr, info, nbytes = table.kind.append, table.corr.append, table.info.append, table.nbytes.append

    def write(nid: int, tid_index: int, t: float, d: float, x: int, args: Args, pid: Any, tid: Any) -> None:
        name(nid)
        ts(t)
        dur(d)
        ext(x)
        on, at = args.device, args.stream
        if on is ABSENT:
            on = pid
        if at is ABSENT:
            at = tid
        device(on if on.__class__ is int else -1)
        stream(at if at.__class__ is int else -1)
        if kind_code is None:
            return
        kind(kind_code)
        correlation = args.corr
        corr(correlation if correlation.__class__ is int else -1)
        if kernel_info_index is not None:
            info(kernel_info_index(args))
            nbytes(-1)
        else:
            info(-1)
            size = args.nbytes
            nbytes(size if size.__class__ is int else -1)

    return write
