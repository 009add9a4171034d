"""JSON decoders for batches of trace events, fastest first.

- msgspec (the `fast` extra): decodes each event into a `Record` holding only the fields the
  trace tables use; every other field (`Input Dims`, `Input Strides`, `Concrete Inputs`, flow
  ids, ...) is skipped without building a Python object. Most bytes of a Kineto trace are such
  fields: on the benchmark traces this decodes about 2x faster than msgspec's own generic
  decoding and 4-5x faster than orjson (docs/performance.md).
- generic decoding into dicts: msgspec's when installed, else orjson's, else the standard
  library's.

`decode_records(payload)` returns a list of `Record`s, or None when msgspec is missing or the
batch does not fit the schema (say, an `args` that is not an object); the caller then uses
`decode_generic(payload)`, so an odd trace is read the slow way, never misread. Both raise
ValueError for text that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any, Callable

#: The kernel `args` keys that KernelInfo is built from, in the order of `Record` fields below.
KERNEL_ARG_KEYS = ("grid", "block", "registers per thread", "registers_per_thread", "shared memory",
                   "shared memory (bytes)", "Shared Memory", "shared_memory", "static shared memory",
                   "dynamic shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %",
                   "est. achieved occupancy", "achieved occupancy %")

try:
    import msgspec
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None

if msgspec is not None:  # generic decoders, fastest first (msgspec builds dicts about twice as fast as orjson)
    _generic_loads: Callable[[Any], Any] = msgspec.json.decode
else:  # pragma: no cover - depends on the environment
    try:
        from orjson import loads as _generic_loads
    except ImportError:
        _generic_loads = json.loads

if msgspec is not None:
    ABSENT: Any = msgspec.UNSET
    _f = msgspec.field

    class Args(msgspec.Struct):
        """The `args` fields the tables read; ABSENT where the event has no such key."""

        ext: Any = _f(name="External id", default=ABSENT)
        corr: Any = _f(name="correlation", default=ABSENT)
        input_type: Any = _f(name="Input type", default=ABSENT)
        device: Any = ABSENT
        stream: Any = ABSENT
        nbytes: Any = _f(name="bytes", default=ABSENT)
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

        def kernel_values(self) -> tuple[Any, ...]:
            """The kernel launch facts, in KERNEL_ARG_KEYS order."""
            return (self.grid, self.block, self.regs, self.regs_alt, self.smem, self.smem_bytes, self.smem_cap,
                    self.smem_us, self.smem_static, self.smem_dynamic, self.blocks_per_sm, self.warps_per_sm,
                    self.occupancy, self.occupancy_alt, self.occupancy_pct)

    class Record(msgspec.Struct):
        """One trace event, reduced to what the tables read. Defaults match `dict.get` on a raw event."""

        ph: Any = ABSENT
        cat: Any = None
        name: Any = None
        pid: Any = None
        tid: Any = None
        ts: Any = None
        dur: Any = 0.0
        args: Args | None = None

    _record_decoder: Callable[[bytes], list[Record]] | None = msgspec.json.Decoder(list[Record]).decode
    _validation_error: type[Exception] = msgspec.ValidationError
else:  # pragma: no cover - depends on the environment
    ABSENT = object()
    _record_decoder = None
    _validation_error = ValueError


def fast_decoder_available() -> bool:
    """True when msgspec is installed and `decode_records` can work."""
    return _record_decoder is not None


def decode_records(payload: bytes) -> list[Any] | None:
    """The events of a JSON array as `Record`s; None without msgspec or when an event does not fit."""
    if _record_decoder is None:
        return None
    try:
        return _record_decoder(payload)
    except _validation_error:
        return None


def decode_generic(payload: bytes | str) -> Any:
    """Any JSON value, as dicts and lists (msgspec, else orjson, else the standard library)."""
    return _generic_loads(payload)
