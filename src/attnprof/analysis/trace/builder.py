"""The one loop from decoded events to a trace's tables: `TableBuilder.add` reduces each batch of
`decoding.Record`s to a few numbers per event in the `array` columns of `trace`'s tables, interning
names, threads, input-type lists and kernel launch facts; `absorb` appends what a worker process read
(`parallel`); `finish` gives the `ParsedTrace`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from attnprof.analysis.base import DRIVER, KERNEL, MEMCPY, MEMSET, RUNTIME
from attnprof.analysis.trace import decoding
from attnprof.analysis.trace.decoding import ABSENT, EMPTY_ARGS, KernelInfo
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
                if device.__class__ is not int:
                    device = -1
                if stream.__class__ is not int:
                    stream = -1
                if code == decoding.CAT_GPU_ANNOT:
                    gann_name(nid)
                    gann_ts(ts)
                    gann_dur(dur)
                    gann_ext(ext)
                    gann_device(device)
                    gann_stream(stream)
                    continue
                kind = KERNEL if code == decoding.CAT_KERNEL else (MEMCPY if code == decoding.CAT_MEMCPY else MEMSET)
                dev_kind(kind)
                dev_name(nid)
                dev_ts(ts)
                dev_dur(dur)
                dev_ext(ext)
                dev_device(device)
                dev_stream(stream)
                corr = args.corr
                dev_corr(corr if corr.__class__ is int else -1)
                if kind == KERNEL:
                    dev_info(kernel_info_index(args))
                    dev_nbytes(-1)
                else:
                    dev_info(-1)
                    nbytes = args.nbytes
                    dev_nbytes(nbytes if nbytes.__class__ is int else -1)

    def absorb(self, other: TableBuilder) -> None:
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

    def finish(self, label: str, read_notes: tuple[str, ...] = ()) -> ParsedTrace:
        """The tables as a ParsedTrace named `label` (`read_notes`: see ParsedTrace)."""
        kept = {f.name: getattr(self, f.name) for f in fields(ParsedTrace) if f.name not in ("source", "read_notes")}
        return ParsedTrace(**kept, source=label, read_notes=read_notes)


def _appenders(table: Any) -> tuple[Any, ...]:
    """The `append` of each column of a table, in field order."""
    return tuple(getattr(table, column.name).append for column in fields(table))
