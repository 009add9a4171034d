"""The one loop from decoded events to a trace's tables: `TableBuilder.add` reduces each batch of
`decoding.Record`s to a few numbers per event in the `array` columns of `trace`'s tables, interning
names, threads, input-type lists and kernel launch facts; `absorb` appends what a worker process read
(`parallel`); `finish` gives the `ParsedTrace`.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from dataclasses import fields
from operator import attrgetter
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

    def __init__(self, every_concrete_input: bool = False) -> None:
        #: Keep every cpu op's `Concrete Inputs`, not only those of `decoding.CONCRETE_INPUT_OPS` (what
        #: re-creating recorded ops needs: `analysis.recreate`, `analyze --time-fixes`).
        self.every_concrete_input = every_concrete_input
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.threads: list[tuple[Any, Any]] = []
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.input_types: list[tuple[str, ...]] = []
        self.input_type_ids: dict[tuple[str, ...], int] = {}
        self.raw_input_type_ids: dict[bytes, int] = {}  # the JSON text of an `Input type` -> its index
        self.input_dims: list[bytes] = []  # the distinct `Input Dims`, as JSON text
        self.input_dims_ids: dict[bytes | None, int] = {None: -1}  # None: an op without Input Dims
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
        if self.every_concrete_input or name in decoding.CONCRETE_INPUT_OPS:
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
        interned here and its row kept as a tuple; then each table's rows are written column by column
        (`_write_rows`, `_extend`). On the 1M-event scale trace (benchmarks/analysis_scale.py) that takes
        a sixth to a fifth less CPU time than appending each value of each row to its column did."""
        categories, overhead_names, absent = decoding.CATEGORIES, decoding.OVERHEAD_NAMES, ABSENT
        name_ids, thread_ids, new_name, new_thread = self.name_ids, self.thread_ids, self._name, self._thread
        first_counted, runtime, driver = decoding.CAT_PYTHON, decoding.CAT_RUNTIME, decoding.CAT_DRIVER
        tables: tuple[list[_Row], ...] = ([], [], [], [], [])  # cpu ops, annotations, runtime, device, GPU annotations
        keep = tuple(tables[table].append for table in _TABLE_OF)  # by category code
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
            if code >= first_counted:  # counted only: their names and threads are not interned
                if code == first_counted:
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
            if (code == runtime or code == driver) and name in overhead_names:
                self.overhead_count += 1  # (its name and thread interned all the same)
                continue
            args = ev.args
            if args is None:
                args = EMPTY_ARGS
            ext = args.ext
            keep[code]((code, nid, thread, ts, dur, ext if ext.__class__ is int else -1, args))
        _write_rows(self, tables)

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
                values, into = getattr(theirs, column.name), getattr(mine, column.name)
                mapping = remap.get(column.name)
                if mapping is None:
                    into.extend(values)
                else:
                    into.fromlist(list(map(mapping.__getitem__, values)))
        for count in ("event_count", "non_objects", "overhead_count", "python_function_count"):
            setattr(self, count, getattr(self, count) + getattr(other, count))

    def finish(self, label: str, read_notes: tuple[str, ...] = ()) -> ParsedTrace:
        """The tables as a ParsedTrace named `label` (`read_notes`: see ParsedTrace)."""
        skipped = ("source", "read_notes")
        kept = {f.name: getattr(self, f.name) for f in fields(ParsedTrace) if f.name not in skipped}
        return ParsedTrace(**kept, source=label, read_notes=read_notes)


#: A kept event: (category code, name id, thread index, ts, dur, External id or -1, args).
_Row = tuple[int, int, int, float, float, int, Args]
#: The table (its index in `TableBuilder.add`'s `tables`) of each category code, `decoding.CAT_CPU_OP` ...
#: `decoding.CAT_GPU_ANNOT`: runtime and driver calls share one, kernels, memcpys and memsets another.
_TABLE_OF = (0, 1, 2, 2, 3, 3, 3, 4)
_DOMAIN = {decoding.CAT_RUNTIME: RUNTIME, decoding.CAT_DRIVER: DRIVER}
_KIND = {decoding.CAT_KERNEL: KERNEL, decoding.CAT_MEMCPY: MEMCPY, decoding.CAT_MEMSET: MEMSET}
_NO_INPUTS = {"input_types": -1, "seq": -1, "fwd_tid": -1, "input_dims": -1}  # an annotation's
_input_type, _input_dims, _seq, _fwd_tid, _corr, _nbytes, _device, _stream = (
    attrgetter(f) for f in ("input_type", "input_dims", "seq", "fwd_tid", "corr", "nbytes", "device", "stream")
)


def _ints(values: Iterable[Any]) -> list[int]:
    """Each value that is an int (not a bool), else -1."""
    return [v if v.__class__ is int else -1 for v in values]


def _extend(table: Any, n: int, columns: dict[str, Any]) -> None:
    """Append `n` rows to `table`: each column's values (a list or tuple), or the one value of all of them.
    The values are packed by `struct` (in the `array`'s own typecode and layout), which converts them
    two and a half times as fast as `array` does."""
    for column in fields(table):
        values, into = columns[column.name], getattr(table, column.name)
        if not isinstance(values, (list, tuple)):
            into.extend(array(into.typecode, [values]) * n)
            continue
        try:
            into.frombytes(struct.pack(f"{n}{into.typecode}", *values))
        except struct.error:  # a value out of the column's range: the error `array` gives
            into.extend(array(into.typecode, values))


def _write_rows(builder: TableBuilder, tables: tuple[list[_Row], ...]) -> None:
    """Append a batch's kept rows to `builder`'s tables (`tables` as in `TableBuilder.add`), column by column."""
    cpu, annotations, runtime, device, gpu = tables
    if cpu:
        _write_cpu_ops(builder, cpu)
    if annotations:
        _, name, thread, ts, dur, ext, _ = zip(*annotations, strict=True)
        _extend(
            builder.annotations,
            len(name),
            {"name": name, "thread": thread, "ts": ts, "dur": dur, "ext": ext} | _NO_INPUTS,
        )
    if runtime:
        code, name, thread, ts, dur, ext, args = zip(*runtime, strict=True)
        columns = {"name": name, "thread": thread, "ts": ts, "dur": dur, "corr": _ints(map(_corr, args)), "ext": ext}
        _extend(builder.runtime, len(name), columns | {"domain": list(map(_DOMAIN.__getitem__, code))})
    if device:
        _write_device(builder, builder.device, device)
    if gpu:
        _write_device(builder, builder.gpu_annotations, gpu)


def _write_cpu_ops(builder: TableBuilder, rows: list[_Row]) -> None:
    """Cpu ops, with their interned input types and `Input Dims`, and the `Concrete Inputs` of the
    `decoding.CONCRETE_INPUT_OPS`."""
    _, name, thread, ts, dur, ext, args = zip(*rows, strict=True)
    raw_types = list(map(bytes, map(_input_type, args)))
    types = list(map(builder.raw_input_type_ids.get, raw_types))
    if None in types:  # input types not seen before
        types = [t if t is not None else builder._raw_input_types(r) for t, r in zip(types, raw_types, strict=True)]
    no_raw, dims_ids = decoding.NO_RAW, builder.input_dims_ids
    raw_dims = [None if raw is no_raw else bytes(raw) for raw in map(_input_dims, args)]  # None: not recorded
    dims = list(map(dims_ids.get, raw_dims))  # (None -> -1 is in the map)
    if None in dims:  # Input Dims not seen before
        dims = [
            d if d is not None else _intern(builder.input_dims, dims_ids, r)
            for d, r in zip(dims, raw_dims, strict=True)
        ]
    if not builder.concrete_input_names.isdisjoint(name):  # SDPA ops: a few a trace
        concrete_names, concrete_ids = builder.concrete_input_names, builder.concrete_inputs_ids
        for row, (nid, arg) in enumerate(zip(name, args, strict=True), len(builder.cpu_ops)):
            if nid in concrete_names and arg.concrete_inputs is not no_raw:
                key = bytes(arg.concrete_inputs)
                builder.concrete_inputs_at[row] = _intern(builder.concrete_inputs, concrete_ids, key)
    columns = {"name": name, "thread": thread, "ts": ts, "dur": dur, "ext": ext, "input_types": types}
    columns |= {"seq": _ints(map(_seq, args)), "fwd_tid": _ints(map(_fwd_tid, args)), "input_dims": dims}
    _extend(builder.cpu_ops, len(name), columns)


def _write_device(builder: TableBuilder, table: DeviceTable | GpuAnnotationTable, rows: list[_Row]) -> None:
    """Kernels, memcpys and memsets (a DeviceTable), or GPU annotations. Device and stream default to
    the event's pid and tid; -1 when not an integer."""
    code, name, thread, ts, dur, ext, args = zip(*rows, strict=True)
    device, stream = list(map(_device, args)), list(map(_stream, args))
    if ABSENT in device or ABSENT in stream:
        pid_tid = list(map(builder.threads.__getitem__, thread))
        device = [pt[0] if on is ABSENT else on for on, pt in zip(device, pid_tid, strict=True)]
        stream = [pt[1] if at is ABSENT else at for at, pt in zip(stream, pid_tid, strict=True)]
    columns = {"name": name, "device": _ints(device), "stream": _ints(stream), "ts": ts, "dur": dur, "ext": ext}
    if isinstance(table, DeviceTable):
        kernel, index_of = decoding.CAT_KERNEL, builder.kernel_info_table.index_of
        columns["kind"] = list(map(_KIND.__getitem__, code))
        columns["corr"] = _ints(map(_corr, args))
        columns["info"] = [index_of(a) if c == kernel else -1 for c, a in zip(code, args, strict=True)]
        columns["nbytes"] = [-1 if c == kernel else n for c, n in zip(code, _ints(map(_nbytes, args)), strict=True)]
    _extend(table, len(name), columns)
