"""Parse a Kineto Chrome trace once into compact, typed, columnar tables.

`load_trace(source)` accepts a path (`.json` or `.json.gz`), an already-loaded dict or a
`ParsedTrace` and returns a `ParsedTrace`. A file is read as a stream of bytes (`reader`; two
processes for a large one: `parallel`) and decoded by msgspec into `decoding.Record`s, holding
the fields attnprof reads and nothing else; a dict is encoded to JSON and read the same way.
`builder.TableBuilder.add`, the one loop from events to tables, reduces each to a few numbers in `array`s.
"""

from __future__ import annotations

import gc
import gzip
import zlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprof.analysis import decoding, parallel, reader
from attnprof.analysis.decoding import KernelInfo
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
    from attnprof.analysis.builder import TableBuilder  # (it imports this module's tables)

    builder = TableBuilder()
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
            saw_events = parallel.read_path(path, builder, TableBuilder, label)
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
