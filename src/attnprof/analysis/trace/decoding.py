"""The msgspec schema of a trace event: the one place that says which fields attnprof reads.

Each event of `traceEvents` is decoded into a `Record` holding only the fields the trace tables
use; every other field (`Input Strides`, flow ids, ...) is
skipped by msgspec without building a Python object. Most bytes of a Kineto trace are such
fields. `Input type` is kept as raw JSON bytes (`msgspec.Raw`): the same few lists repeat on
every op, so they are interned by their bytes and decoded once each; `Input Dims` and `Concrete
Inputs` (the scalar inputs as text, e.g. SDPA's is_causal) likewise, kept as their bytes and decoded
only for the ops that need them (`instance.bandwidth`); `Concrete Inputs` are kept for the
`CONCRETE_INPUT_OPS` only.

What Kineto writes (checked against traces from torch 2.11 on an H200, and the Kineto source):
`cpu_op` and `user_annotation` ranges on CPU threads with `args["External id"]` (and
`args["Input type"]` with `record_shapes=True`; autograd ops add `Sequence number` and
`Fwd thread id`, which is > 0 on backward ops); `cuda_runtime`/`cuda_driver` calls with
`args.correlation`; `kernel`, `gpu_memcpy`, `gpu_memset` on the device (`pid` = device,
`tid` = stream) with the launching call's correlation and, for kernels, launch facts (`grid`,
`block`, `registers per thread`, `shared memory`, ...); `gpu_user_annotation` ranges; flows
(`ph: s`/`f`), metadata (`ph: M`). Older Kineto versions spell some categories `Kernel`,
`Memcpy`, `Memset`, `Runtime`. Timestamps and durations are microseconds.

`decode_records(payload)` decodes a JSON array of events; an event that does not fit the schema
(an `args` that is not an object, say) makes it raise `msgspec.ValidationError`, and the caller
then decodes the batch generically and passes each event through `record_from_object`, so an
odd trace is read more slowly, never misread.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec

#: The value of a field the event does not have.
ABSENT: Any = msgspec.UNSET
_NO_INPUT_TYPE = msgspec.Raw(b"null")
#: The value of a raw field (`Input type`, `Input Dims`, `Concrete Inputs`) the event does not have: this very object.
NO_RAW: msgspec.Raw = _NO_INPUT_TYPE
_f = msgspec.field
#: The ops whose `Concrete Inputs` the tables keep: SDPA and the backend ops it dispatches to, whose
#: is_causal `instance.bandwidth` reads. Interning every cpu op's instead cost 0.07 s (3%) of `attnprof
#: analyze` on the 1M-event scale trace (benchmarks/analysis_scale.py), where half the events are cpu ops.
CONCRETE_INPUT_OPS = frozenset(
    {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_attention_math",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    }
)
_Number = int | float | str | None  # pid and tid: numbers, or text in some exporters


# Category codes (the table builder dispatches on them once per event) and the spellings of each.
(
    CAT_CPU_OP,
    CAT_ANNOT,
    CAT_RUNTIME,
    CAT_DRIVER,
    CAT_KERNEL,
    CAT_MEMCPY,
    CAT_MEMSET,
    CAT_GPU_ANNOT,
    CAT_PYTHON,
    CAT_OVERHEAD,
) = range(10)
CATEGORIES: dict[str | None, int] = {
    "cpu_op": CAT_CPU_OP,
    "operator": CAT_CPU_OP,
    "Operator": CAT_CPU_OP,
    "user_annotation": CAT_ANNOT,
    "cuda_runtime": CAT_RUNTIME,
    "Runtime": CAT_RUNTIME,
    "runtime": CAT_RUNTIME,
    "cuda_driver": CAT_DRIVER,
    "driver": CAT_DRIVER,
    "kernel": CAT_KERNEL,
    "Kernel": CAT_KERNEL,
    "gpu_memcpy": CAT_MEMCPY,
    "Memcpy": CAT_MEMCPY,
    "gpu_memset": CAT_MEMSET,
    "Memset": CAT_MEMSET,
    "gpu_user_annotation": CAT_GPU_ANNOT,
    "python_function": CAT_PYTHON,
    "overhead": CAT_OVERHEAD,
}

#: Profiler bookkeeping rows that may appear among runtime calls; never device work.
OVERHEAD_NAMES = frozenset(
    {
        "Activity Buffer Request",
        "Buffer Flush",
        "Instrumentation",
        "Resource",
        "Driver Compiler",
        "Runtime Triggered Module Loading",
        "Lazy Function Loading",
        "Command Buffer Full",
        "UVM Activity Init",
    }
)


class CommonArgs(msgspec.Struct, gc=False):
    """The `args` fields read on several kinds of event; ABSENT where the event has no such key."""

    ext: Any = _f(name="External id", default=ABSENT)
    input_type: msgspec.Raw = _f(name="Input type", default=_NO_INPUT_TYPE)
    input_dims: msgspec.Raw = _f(name="Input Dims", default=_NO_INPUT_TYPE)  # interned by its bytes, decoded on use
    concrete_inputs: msgspec.Raw = _f(name="Concrete Inputs", default=_NO_INPUT_TYPE)  # likewise
    device: Any = ABSENT
    stream: Any = ABSENT
    corr: Any = _f(name="correlation", default=ABSENT)
    nbytes: Any = _f(name="bytes", default=ABSENT)
    seq: Any = _f(name="Sequence number", default=ABSENT)  # autograd: links a backward op to its forward op
    fwd_tid: Any = _f(name="Fwd thread id", default=ABSENT)  # > 0 on backward ops


class Args(CommonArgs, gc=False):
    """`CommonArgs` plus a kernel's launch facts, in every spelling Kineto versions and other
    exporters use (`kernel_info` says which spelling wins)."""

    grid: Any = ABSENT
    block: Any = ABSENT
    regs: Any = _f(name="registers per thread", default=ABSENT)
    regs_alt: Any = _f(name="registers_per_thread", default=ABSENT)
    smem: Any = _f(name="shared memory", default=ABSENT)
    smem_bytes: Any = _f(name="shared memory (bytes)", default=ABSENT)
    smem_cap: Any = _f(name="Shared Memory", default=ABSENT)
    smem_us: Any = _f(name="shared_memory", default=ABSENT)
    smem_static: Any = _f(name="static shared memory", default=ABSENT)
    smem_dynamic: Any = _f(name="dynamic shared memory", default=ABSENT)
    blocks_per_sm: Any = _f(name="blocks per SM", default=ABSENT)
    warps_per_sm: Any = _f(name="warps per SM", default=ABSENT)
    occupancy: Any = _f(name="est. achieved occupancy %", default=ABSENT)
    occupancy_alt: Any = _f(name="est. achieved occupancy", default=ABSENT)
    occupancy_pct: Any = _f(name="achieved occupancy %", default=ABSENT)


#: The launch-fact fields of `Args` (those `CommonArgs` lacks), in declaration order.
KERNEL_FACTS: tuple[str, ...] = Args.__struct_fields__[len(CommonArgs.__struct_fields__) :]
#: An event's launch facts as a tuple, in KERNEL_FACTS order (grid and block first).
kernel_facts = attrgetter(*KERNEL_FACTS)


class Record(msgspec.Struct, gc=False):
    """One trace event, reduced to what the tables read. A missing `ph` stays ABSENT (it counts
    as "X" for events of a known category); a missing `dur` is 0."""

    ph: str | msgspec.UnsetType = ABSENT
    cat: str | None = None
    name: str | None = None
    pid: _Number = None
    tid: _Number = None
    ts: Any = None
    dur: Any = 0.0
    args: Args | None = None


#: Empty args, for events without any.
EMPTY_ARGS = Args()

_decode_records = msgspec.json.Decoder(list[Record]).decode
_decode_any = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def decode_records(payload: bytes) -> list[Record]:
    """The events of a JSON array as `Record`s.

    Raises msgspec.ValidationError when an event does not fit the schema and
    msgspec.DecodeError (a ValueError) when the payload is not JSON.
    """
    return _decode_records(payload)


def decode_any(payload: bytes) -> Any:
    """Any JSON value, as dicts and lists. Raises msgspec.DecodeError (a ValueError) for non-JSON."""
    return _decode_any(payload)


def encode(value: Any) -> bytes:
    """`value` as compact JSON bytes (NaN and infinities become null). Raises TypeError for
    values JSON cannot hold."""
    return _encode(value)


def input_type_value(raw: bytes) -> Any:
    """The decoded value of an `Input type` field, from its JSON text."""
    return _decode_any(raw)


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
        """The product of the block's dimensions (None without a block)."""
        if not self.block:
            return None
        n = 1
        for d in self.block:
            n *= d
        return n


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):  # ABSENT included
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


def _first_present(*values: Any) -> Any:
    for value in values:
        if value is not ABSENT:
            return value
    return ABSENT


def kernel_info(args: Args) -> KernelInfo:
    """The launch facts of a kernel event's args; where several spellings of a fact are present,
    the first in `Args` order wins."""
    smem = _first_present(args.smem, args.smem_bytes, args.smem_cap, args.smem_us)
    if smem is not ABSENT:
        smem = _int_or_none(smem)
    else:  # some exporters split static and dynamic shared memory
        parts = [_int_or_none(args.smem_static), _int_or_none(args.smem_dynamic)]
        smem = sum(p or 0 for p in parts) if any(p is not None for p in parts) else None
    return KernelInfo(
        _dims(args.grid),
        _dims(args.block),
        _int_or_none(_first_present(args.regs, args.regs_alt)),
        smem,
        _float_or_none(args.blocks_per_sm),
        _float_or_none(args.warps_per_sm),
        _float_or_none(_first_present(args.occupancy, args.occupancy_alt, args.occupancy_pct)),
    )


def _tuple_of(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class KernelInfos:
    """A trace's distinct KernelInfos in order of first use, looked up by an event's raw launch facts."""

    def __init__(self) -> None:
        self.items: list[KernelInfo] = []
        self._ids: dict[KernelInfo, int] = {}
        self._by_facts: dict[tuple[Any, ...], int] = {}

    def add(self, info: KernelInfo) -> int:
        """The index of `info`, appended first when it is new."""
        index = self._ids.get(info)
        if index is None:
            index = self._ids[info] = len(self.items)
            self.items.append(info)
        return index

    def index_of(self, args: Args) -> int:
        """The index of the KernelInfo of a kernel event's args, cached by the raw launch facts."""
        facts = kernel_facts(args)
        try:
            if facts[0].__class__ is list or facts[1].__class__ is list:  # grid and block
                facts = (_tuple_of(facts[0]), _tuple_of(facts[1]), *facts[2:])
            index = self._by_facts.get(facts)
        except TypeError:  # an unhashable value: build the info, don't cache the raw facts
            return self.add(kernel_info(args))
        if index is None:
            index = self._by_facts[facts] = self.add(kernel_info(args))
        return index


def _scalar_or_text(value: Any) -> Any:
    return value if value is None or type(value) in (int, float, str) else str(value)


def _raw_json(value: Any) -> msgspec.Raw:
    try:
        return msgspec.Raw(_encode(value))
    except TypeError:  # not JSON data: the field is read as absent
        return _NO_INPUT_TYPE


def record_from_object(event: Any) -> Record | None:
    """The `Record` of an event already decoded to dicts and lists; None when it is not an object.

    For events that do not fit the schema: a non-object `args` is dropped, a non-text `ph` or
    `cat` makes the event one that no table keeps, and a `name`, `pid` or `tid` that is neither
    a number nor text is kept as text.
    """
    if not isinstance(event, dict):
        return None
    fields: dict[str, Any] = {}
    for name, key in zip(Record.__struct_fields__, Record.__struct_encode_fields__, strict=True):
        if key in event:
            fields[name] = event[key]
    if "ph" in fields and not isinstance(fields["ph"], str):
        fields["ph"] = ""
    if "cat" in fields and not isinstance(fields["cat"], str):
        fields["cat"] = None
    for name in ("name", "pid", "tid"):
        if name in fields:
            fields[name] = _scalar_or_text(fields[name])
    args = fields.pop("args", None)
    if isinstance(args, dict):
        values = {
            name: args[key]
            for name, key in zip(Args.__struct_fields__, Args.__struct_encode_fields__, strict=True)
            if key in args
        }
        for raw in ("input_type", "input_dims", "concrete_inputs"):
            if raw in values:
                values[raw] = _raw_json(values[raw])
        fields["args"] = Args(**values)
    return Record(**fields)
