"""The typed, columnar tables a trace is reduced to: one column per field, in `array`s, with
names, threads, input types and kernel launch facts interned."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from attnprof.analysis.trace.decoding import KernelInfo, input_type_value


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
    input_dims: array = field(default_factory=lambda: array("i"))  # index into ParsedTrace.input_dims; -1


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
    #: How the file was read, where that went otherwise than planned: why the two-process read
    #: fell back to one process, with the worker's traceback if it failed (`parallel`). Not part
    #: of the trace's contents: `attnprof --debug analyze` shows them.
    read_notes: tuple[str, ...] = ()
    #: The distinct `Input Dims` (record_shapes) as their JSON text; `input_dims_of` decodes one.
    input_dims: list[bytes] = field(default_factory=list)
    #: The distinct `Concrete Inputs` (record_shapes) as their JSON text; `concrete_inputs_of` decodes one.
    concrete_inputs: list[bytes] = field(default_factory=list)
    #: The cpu ops that recorded them, by row: the index of theirs in `concrete_inputs`. Only the ops of
    #: `decoding.CONCRETE_INPUT_OPS` are kept, a few in a trace: a map, not a column.
    concrete_inputs_at: dict[int, int] = field(default_factory=dict)

    def input_dims_of(self, op: int) -> list[Any] | None:
        """The `Input Dims` of cpu op `op` (a list with one entry per input), or None when not recorded."""
        index = self.cpu_ops.input_dims[op]
        if index < 0:
            return None
        value = input_type_value(self.input_dims[index])
        return value if isinstance(value, list) else None

    def concrete_inputs_of(self, op: int) -> list[Any] | None:
        """The `Concrete Inputs` of cpu op `op` (one text per input: a scalar's value, "" for a tensor
        or none, e.g. "True" for SDPA's is_causal), or None when not recorded or not kept (an op
        outside `decoding.CONCRETE_INPUT_OPS`)."""
        index = self.concrete_inputs_at.get(op)
        if index is None:
            return None
        value = input_type_value(self.concrete_inputs[index])
        return value if isinstance(value, list) else None

    def device_properties_for(self, device: int) -> dict[str, Any] | None:
        """The `deviceProperties` entry of a device id, or the only entry, or None."""
        for props in self.device_properties:
            if props.get("id") == device:
                return props
        return self.device_properties[0] if len(self.device_properties) == 1 else None
