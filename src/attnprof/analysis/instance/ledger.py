"""The attention ledger: the attention calls of each region instance and the overhead around them,
summarised over the instances.

Per instance (`forward_ledger`): the calls that `attention` finds, with their kernels and time, the
overhead that `attention_overhead` finds, and the masks it builds outside its calls (`masks`; like an
SDPA call's input types, read by the findings and not in the JSON). Over the instances (`summarize`):
counts are low medians, times medians; the calls listed are those of the first instance that has the
median number of calls, each with the median time of its position over the instances that ran the
same calls.

`AttentionLedger.to_dict()` is the JSON contract of `TraceAnalysis.to_dict()["attention"]`:

    calls_per_forward      forward attention calls per instance
    backends               the listed forward calls by backend, e.g. {"cudnn": 2}
    kernel_time_us         device time of the calls' work (kernels, and memcpys/memsets launched
                           inside them), forward and backward phase together
    backward_kernel_time_us  the backward phase's part of it (null without backward work)
    gpu_time_pct           kernel_time_us over the instance's GPU time (first device event to last)
    overhead_us            the overhead items' time together
    calls                  [{op, backend, phase, kernels, time_us, forward_call}]: phase "forward" or
                           "backward"; forward_call is a backward call's forward call (its index in
                           calls), null when no forward call links to it
    overhead               [{kind, ops, count_per_forward, time_us}]: ops are the op chains that
                           launched its work, commonest first
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from attnprof.analysis.instance.calls import SDPA_OP, Call, LedgerNames, backward_calls, find_calls
from attnprof.analysis.instance.index import TraceIndex
from attnprof.analysis.instance.masks import MaskBuild, mask_builds
from attnprof.analysis.instance.optree import OpTree
from attnprof.analysis.instance.overhead import OVERHEAD_KINDS, Overhead, overhead_ledger, overhead_units
from attnprof.analysis.names import short_kernel_name
from attnprof.stats import median, median_count

_time_us = attrgetter("time_us")


@dataclass(slots=True)
class CallFacts:
    """One attention call: what ran, on which backend, in which phase, and its device time.
    `kernel_ids` are its device events' name ids in `names` (the trace's); `kernels` reads them."""

    op: str
    backend: str
    phase: str
    kernel_ids: tuple[int, ...]
    time_us: float
    forward_call: int | None = None
    names: Sequence[str] = field(default=(), compare=False, repr=False)
    #: An SDPA call's `Input type` (record_shapes; () without), and the name ids and device time of
    #: its work outside the backend it dispatched to (a mask converted to the backend's form). Not
    #: in the JSON; the findings read them (see `sdpa_facts`).
    input_types: tuple[str, ...] = ()
    prep_ids: tuple[int, ...] = ()
    prep_time_us: float = 0.0

    @property
    def mask_type(self) -> str | None:
        """The type of the mask an `aten::scaled_dot_product_attention` call was given (its 4th input:
        "bool", "c10::BFloat16", ...), None without one or where the types were not recorded."""
        if self.op != SDPA_OP or len(self.input_types) < 4:
            return None
        return self.input_types[3] if self.input_types[3] not in ("", "Scalar") else None

    @property
    def kernels(self) -> tuple[str, ...]:
        """The short names of its kernels, memcpys and memsets, in launch order."""
        names = self.names
        return tuple(short_kernel_name(names[n]) for n in self.kernel_ids)

    @property
    def signature(self) -> tuple[str, str, str, int | None]:
        """What must match for two instances' calls to be the same call."""
        return (self.op, self.backend, self.phase, self.forward_call)


@dataclass
class ForwardLedger:
    """The attention calls (forward ones first, then backward ones) and overhead of one instance."""

    calls: list[CallFacts]
    overhead: dict[str, Overhead]
    gpu_time_us: float | None
    forward_count: int = 0  # how many of the calls are forward calls
    masks: list[MaskBuild] = field(default_factory=list)  # the masks built outside the calls (see masks)

    @property
    def forward_calls(self) -> list[CallFacts]:
        """The forward-phase calls."""
        return self.calls[: self.forward_count]

    @property
    def kernel_time_us(self) -> float:
        """The device time of every call's work, both phases."""
        return sum(map(_time_us, self.calls))

    @property
    def backward_time_us(self) -> float:
        """The device time of the backward calls' work."""
        return sum(c.time_us for c in self.calls if c.phase == "backward")

    @property
    def overhead_us(self) -> float:
        """The overhead items' time together."""
        return sum(map(_time_us, self.overhead.values()))

    @property
    def gpu_time_pct(self) -> float | None:
        """kernel_time_us over the instance's GPU time, in percent; None without GPU time."""
        return _share_pct(self.kernel_time_us, self.gpu_time_us)


def _share_pct(kernel_time_us: float, gpu_time_us: float | None) -> float | None:
    return 100.0 * kernel_time_us / gpu_time_us if gpu_time_us else None


def _facts(tree: OpTree, names: LedgerNames, call: Call) -> CallFacts:
    trace = tree.trace
    dev = trace.device
    events = call.events
    facts = CallFacts(
        op=call.op,
        backend=call.backend,
        phase=call.phase,
        kernel_ids=tuple(map(dev.name.__getitem__, events)),
        time_us=sum(map(dev.dur.__getitem__, events)),
        forward_call=call.forward_call,
        names=trace.names,
    )
    if call.first >= 0 and names.role.get(trace.cpu_ops.name[call.first]) == "sdpa":
        sdpa_facts(tree, names, call, facts)
    return facts


def sdpa_facts(tree: OpTree, names: LedgerNames, call: Call, facts: CallFacts) -> None:
    """Fill an SDPA call's input types and the work it ran outside the backend op it dispatched to
    (for a dense mask: the kernels that turn it into the backend's additive bias)."""
    trace = tree.trace
    ops = trace.cpu_ops
    types = ops.input_types[call.first]
    facts.input_types = trace.input_types[types] if types >= 0 else ()
    dispatch = next((o for o in call.ops if ops.name[o] in names.sdpa_backend), -1)
    if dispatch < 0 or dispatch == call.first:
        return
    inside = set(tree.events(dispatch))
    prep = [e for e in call.events if e not in inside]
    dev = trace.device
    facts.prep_ids = tuple(map(dev.name.__getitem__, prep))
    facts.prep_time_us = sum(map(dev.dur.__getitem__, prep))


def forward_ledger(tree: OpTree, index: TraceIndex, gpu_time_us: float | None) -> ForwardLedger:
    """The attention calls and overhead of one instance whose device work was traced (`tree`: its
    ops, with the roles of `index.ledger`): its forward calls, placed from those of its shape
    (`index.shape_calls`), their backward work, and the overhead around them."""
    found = index.shape_calls(tree)
    calls = find_calls(tree, found)
    names = index.ledger
    backward, unclaimed = backward_calls(tree, names, calls)
    units = overhead_units(tree, calls, found.in_call)
    overhead = overhead_ledger(tree, units, unclaimed)
    facts = [_facts(tree, names, c) for c in calls + backward]
    masks = mask_builds(tree, names, calls, units, found.in_call)
    return ForwardLedger(facts, overhead, gpu_time_us, len(calls), masks)


@dataclass
class AttentionLedger:
    """The ledger over all instances (see the module docstring)."""

    calls_per_forward: int
    backends: dict[str, int]
    kernel_time_us: float
    backward_kernel_time_us: float | None
    gpu_time_pct: float | None
    overhead_us: float
    calls: list[CallFacts] = field(default_factory=list)
    overhead: list[dict[str, Any]] = field(default_factory=list)

    @property
    def backends_text(self) -> str:
        """The backends as "cudnn:2" ("eager:1 flex:1" for several); "" without calls."""
        return " ".join(f"{backend}:{n}" for backend, n in self.backends.items())

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract (see the module docstring)."""

        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {
            "calls_per_forward": self.calls_per_forward,
            "backends": dict(self.backends),
            "kernel_time_us": r(self.kernel_time_us),
            "backward_kernel_time_us": r(self.backward_kernel_time_us),
            "gpu_time_pct": None if self.gpu_time_pct is None else round(self.gpu_time_pct, 2),
            "overhead_us": r(self.overhead_us),
            "calls": [
                {
                    "op": c.op,
                    "backend": c.backend,
                    "phase": c.phase,
                    "kernels": list(c.kernels),
                    "time_us": r(c.time_us),
                    "forward_call": c.forward_call,
                }
                for c in self.calls
            ],
            "overhead": [dict(item) for item in self.overhead],
        }


def summarize(ledgers: list[ForwardLedger]) -> AttentionLedger:
    """The ledger over the instances (at least one)."""
    per_call = median_count([ledger.forward_count for ledger in ledgers])
    calls = _typical_calls(ledgers, per_call)
    kernel_times = [ledger.kernel_time_us for ledger in ledgers]
    shares = map(_share_pct, kernel_times, [ledger.gpu_time_us for ledger in ledgers])
    pcts = [p for p in shares if p is not None]
    has_backward = any(len(ledger.calls) > ledger.forward_count for ledger in ledgers)
    return AttentionLedger(
        calls_per_forward=per_call,
        backends=dict(sorted(Counter(c.backend for c in calls if c.phase == "forward").items())),
        kernel_time_us=median(kernel_times),
        backward_kernel_time_us=median([ledger.backward_time_us for ledger in ledgers]) if has_backward else None,
        gpu_time_pct=median(pcts) if pcts else None,
        overhead_us=median([ledger.overhead_us for ledger in ledgers]),
        calls=calls,
        overhead=_overhead_items(ledgers),
    )


def _typical_calls(ledgers: list[ForwardLedger], per_call: int) -> list[CallFacts]:
    """The calls of the first instance with the median number of forward calls, each timed by the
    median over the instances that ran the same calls."""
    first = next(ledger for ledger in ledgers if len(ledger.forward_calls) == per_call)
    shape = [c.signature for c in first.calls]
    same = [ledger for ledger in ledgers if [c.signature for c in ledger.calls] == shape]
    return [
        CallFacts(
            c.op,
            c.backend,
            c.phase,
            c.kernel_ids,
            median([s.calls[i].time_us for s in same]),
            c.forward_call,
            c.names,
            c.input_types,
            c.prep_ids,
            median([s.calls[i].prep_time_us for s in same]),
        )
        for i, c in enumerate(first.calls)
    ]


def _overhead_items(ledgers: list[ForwardLedger]) -> list[dict[str, Any]]:
    items = []
    for kind in OVERHEAD_KINDS:
        found = [ledger.overhead.get(kind) for ledger in ledgers]
        if not any(found):
            continue
        chains: Counter = Counter()
        for item in found:
            if item is not None:
                chains.update(item.chains)
        items.append(
            {
                "kind": kind,
                "ops": [chain for chain, _ in chains.most_common()],
                "count_per_forward": median_count([item.count if item else 0 for item in found]),
                "time_us": round(median([item.time_us if item else 0.0 for item in found]), 3),
            }
        )
    return items
