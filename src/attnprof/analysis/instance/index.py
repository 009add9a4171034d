"""`TraceIndex`: what the per-instance measures of one analysis look up, found once, and the caches
that instances of one kind share. `analyze` creates one per analysis, after attribution, and passes
it down; it lives and dies with that run.

Name facts, found once per trace so that no instance tests a name as text: the name ids of the ops
that per-forward metrics count (`transpose`, `to_copy`, `safe_softmax`, `mask_nesting`), of the
device-to-device memcpys (`dtod`), of the runtime calls that are host syncs (`sync_calls`), each
device event's end (`device_end`) and what the attention ledger tests (`ledger`: op roles, SDPA and
fused-attention backends by name id).

Caches, each filled by the first instance that needs an entry and read by the later ones (a training
loop or a model repeats one instance: the 1M-event scale trace has 16,959 instances of 7 op
sequences and 7 shapes). What each saves, measured as `forward_metrics`' CPU time over those
instances (the whole `attnprof analyze` takes about 3.3 CPU s):

- `op_facts`: per op-name sequence, what `forward_metrics` reads of the names alone (`OpFacts`: op
  counts, ledger roles, positions of the ops it looks at). Saves 0.14 s.
- `launch_counts`: per launch-call name sequence, the launch calls by API name. Saves 0.05 s.
- `shape_facts`: per `OpTree.shape()`, the attention calls the recognisers found (`calls.ShapeCalls`;
  saves 0.32 s) and the ops that convert something, with their kinds (`mask_convert.convert_kinds`:
  3.1% of `attnprof analyze`'s instructions on the 100k-event scale trace, callgrind).
- `input_dims`: per distinct `Input Dims` and input, the dims `mask_converts` compares (1.2% more).
- `timeline`: the device's busy intervals over the whole trace (`stalls.DeviceTimeline`), built the
  first time an instance has a host sync (for the bubble it leaves), never in a trace without one.
- `traffic`: per forward call's recorded inputs (the op's name, `Input Dims`, `Input type` and
  `Concrete Inputs` ids, interned by the reader; for an eager call those of its first and last
  matmul), the bytes and FLOPs of `bandwidth.call_traffic` / `eager_traffic`, which decode the dims'
  JSON. Saves about 0.2 s.

Each instance's attention ledger is timed from its own calls (`ledger.forward_ledger`): a per-shape
cache of the ledger saved about 0.17 s of 2.6 s at 1M (4-7% of `attnprof analyze`), and was left out
(docs/performance.md).

An entry is shared by the instances that read it and never changed once made. `op_facts` and
`launch_counts` count the instances that read each entry (`forwards`): the medians over instances
take each entry with that multiplicity (`op_counts`, `launch_apis`).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import add
from types import MappingProxyType
from typing import Any

from attnprof.analysis.instance.bandwidth import Traffic, call_traffic, eager_traffic
from attnprof.analysis.instance.call_names import LedgerNames, ledger_names
from attnprof.analysis.instance.calls import Call, ShapeCalls, shape_calls
from attnprof.analysis.instance.mask_convert import CONVERT_OPS, convert_kinds, input_dims
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.stalls import DeviceTimeline, sync_name_ids
from attnprof.analysis.trace.tables import ParsedTrace

#: Ops that build a causal mask; MASK_OPS nested in one another (or in the softmax) count once.
MASK_OPS = ("aten::ones", "aten::tril", "aten::triu", "aten::scalar_tensor", "aten::where")
SAFE_SOFTMAX = "aten::_safe_softmax"
_MASK_SET = frozenset(MASK_OPS)
_MASK_NESTING = _MASK_SET | {SAFE_SOFTMAX}


def is_dtod(name: str) -> bool:
    """True for the name of a device-to-device memcpy."""
    return "DtoD" in name or "Device -> Device" in name


@dataclass(slots=True)
class OpFacts:
    """What `forward_metrics` reads of an instance's op names alone: the op counts by name, each
    op's ledger role, and the positions of the named ops it looks at (empty where the name does not
    occur). Shared by the instances that ran the same op names: read it, never change it;
    `forwards` is how many did (the index counts them). `counts` is a read-only view."""

    counts: Mapping[str, int]
    roles: tuple[str | None, ...]
    transposes: tuple[int, ...]
    to_copy: tuple[int, ...]
    safe_softmax: tuple[int, ...]
    mask_ops: tuple[int, ...]  # MASK_OPS (one may nest in another, or in the softmax)
    forwards: int = 0


@dataclass(frozen=True, slots=True)
class ShapeFacts:
    """What the instances of one `OpTree.shape()` share: their forward attention calls by position
    (`calls.shape_calls`) and the positions of their converting ops with their kinds
    (`mask_convert.convert_kinds`). Read it, never change it."""

    calls: ShapeCalls
    converts: tuple[tuple[int, str], ...]


@dataclass(slots=True)
class LaunchCounts:
    """The launch calls of the instances that made the same calls, by API name (a read-only view);
    `forwards` is how many instances did."""

    counts: Mapping[str, int]
    forwards: int = 0


class TraceIndex:
    """The name facts and caches of one analysis of `trace` (see the module docstring)."""

    def __init__(self, trace: ParsedTrace) -> None:
        self.trace = trace
        names, dev = trace.names, trace.device
        ids = {names[n]: n for n in set(trace.cpu_ops.name)}
        self.transpose: int = ids.get("aten::transpose", -1)  # -1: no such op in the trace
        self.to_copy: int = ids.get("aten::_to_copy", -1)
        self.safe_softmax: int = ids.get(SAFE_SOFTMAX, -1)
        self.mask_nesting: frozenset[int] = frozenset(ids[n] for n in _MASK_NESTING if n in ids)
        self.mask_ops: frozenset[int] = self.mask_nesting - {self.safe_softmax}  # MASK_OPS
        self.dtod: frozenset[int] = frozenset(n for n in set(dev.name) if is_dtod(names[n]))
        self.device_end: Sequence[float] = array("d", map(add, dev.ts, dev.dur))  # ts + dur of each device event
        self.sync_calls: frozenset[int] = sync_name_ids(trace)
        self.ledger: LedgerNames = ledger_names(trace, CONVERT_OPS)
        # the caches (see the module docstring), by op-name ids, launch-name ids, OpTree.shape()
        self._op_facts: dict[tuple[int, ...], OpFacts] = {}
        self._launch_counts: dict[tuple[int, ...], LaunchCounts] = {}
        self._shapes: dict[Any, ShapeFacts] = {}
        self._traffic: dict[tuple[Any, ...], Traffic | None] = {}
        self._dims: dict[tuple[int, int], tuple[int, ...] | None] = {}
        self._timeline: DeviceTimeline | None = None

    def timeline(self) -> DeviceTimeline:
        """The trace's `DeviceTimeline`, built on the first call."""
        if self._timeline is None:
            self._timeline = DeviceTimeline(self.trace, self.device_end)
        return self._timeline

    def op_facts(self, op_names: tuple[int, ...]) -> OpFacts:
        """The `OpFacts` of an instance whose ops have these name ids; counts it as one more instance
        (call it once per instance)."""
        facts = self._op_facts.get(op_names)
        if facts is None:
            facts = self._op_facts[op_names] = self._new_op_facts(op_names)
        facts.forwards += 1
        return facts

    def _new_op_facts(self, op_names: tuple[int, ...]) -> OpFacts:
        counts = Counter(map(self.trace.names.__getitem__, op_names))
        positions = range(len(op_names))

        def named(name: str, name_id: int) -> tuple[int, ...]:  # the positions of the ops with this name
            return tuple(compress(positions, map(name_id.__eq__, op_names))) if name in counts else ()

        mask_ops = self.mask_ops
        masks = () if _MASK_SET.isdisjoint(counts) else tuple(compress(positions, map(mask_ops.__contains__, op_names)))
        return OpFacts(
            MappingProxyType(counts),
            tuple(map(self.ledger.role.get, op_names)),
            named("aten::transpose", self.transpose),
            named("aten::_to_copy", self.to_copy),
            named(SAFE_SOFTMAX, self.safe_softmax),
            masks,
        )

    def launch_counts(self, call_names: tuple[int, ...]) -> Mapping[str, int]:
        """The launch calls by API name of an instance whose launch calls have these name ids (shared:
        read it, never change it); counts it as one more instance (call it once per instance)."""
        found = self._launch_counts.get(call_names)
        if found is None:
            counts = Counter(map(self.trace.names.__getitem__, call_names))
            found = self._launch_counts[call_names] = LaunchCounts(MappingProxyType(counts))
        found.forwards += 1
        return found.counts

    def shape_facts(self, tree: OpTree) -> ShapeFacts:
        """The `ShapeFacts` of `tree`'s shape (found on the first instance of each shape)."""
        shape = tree.shape()
        found = self._shapes.get(shape)
        if found is None:
            found = self._shapes[shape] = ShapeFacts(shape_calls(tree, self.ledger), convert_kinds(tree, self.ledger))
        return found

    def traffic(self, call: Call) -> Traffic | None:
        """What a forward call moves and computes, from its recorded shapes (`bandwidth`); None for a
        backward call or where the shapes were not recorded."""
        if call.phase != "forward" or call.first < 0:
            return None
        ops = self.trace.cpu_ops
        names, dims, types = ops.name, ops.input_dims, ops.input_types
        first, last = call.first, call.last
        eager = call.backend == "eager"
        concrete = self.trace.concrete_inputs_at.get(first, -1)
        key: tuple[Any, ...] = (names[first], dims[first], types[first], concrete)
        if eager:
            key += (names[last], dims[last], types[last]) if last >= 0 else (-1,)
        found = self._traffic.get(key, self)
        if found is not self:
            return found  # type: ignore[return-value]
        found = eager_traffic(self.trace, call.first, call.last) if eager else call_traffic(self.trace, call.first)
        self._traffic[key] = found
        return found

    def input_dims(self, op: int, at: int) -> tuple[int, ...] | None:
        """`mask_convert.input_dims` of op `op`'s input `at`, decoded once per distinct `Input Dims`."""
        key = (self.trace.cpu_ops.input_dims[op], at)
        found = self._dims.get(key, self)
        if found is self:
            found = self._dims[key] = input_dims(self.trace, op, at)
        return found  # type: ignore[return-value]

    def op_counts(self) -> list[tuple[Mapping[str, int], int]]:
        """The op counts by name of the instances seen, each distinct one with how many instances had it."""
        return [(facts.counts, facts.forwards) for facts in self._op_facts.values()]

    def launch_apis(self) -> list[tuple[Mapping[str, int], int]]:
        """The launch calls by API name of the instances seen, each distinct one with how many had it."""
        return [(found.counts, found.forwards) for found in self._launch_counts.values()]
