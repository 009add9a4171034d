"""A forward (or training step): one instance of the region, with the CPU ops, runtime calls
and device work attributed to it (`attribution.attribute`), and the launch APIs that tie them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from attnprof.analysis.attribution.timeline import rows_at
from attnprof.analysis.base import launch_kind
from attnprof.analysis.trace.tables import ParsedTrace


@dataclass(slots=True)
class Forward:
    """One forward: its CPU range and everything attributed to it (indices into the trace's
    tables). `op_parent[i]` is the enclosing op of op `i` (-1: directly under the region);
    `launch_op[r]` is the innermost op around runtime call `r` (-1: none). `op_tree`, when known:
    the position in `ops` of each op's enclosing op (-1: the region) and the end of its subtree
    (see `timeline.subtrees`); `op_parent` is built from it on first use."""

    thread: int
    start: float
    end: float
    ext: int
    ops: Sequence[int] = field(default_factory=list)  # a range where they are consecutive table rows
    op_tree: tuple[list[int], list[int]] | None = None
    parents_found: dict[int, int] | None = field(default=None, repr=False)  # op_parent, once built
    calls: list[int] = field(default_factory=list)  # all runtime/driver calls inside
    launch_op: dict[int, int] = field(default_factory=dict)
    launches: list[int] = field(default_factory=list)  # calls that put work on the device
    device: list[int] = field(default_factory=list)  # kernels, memcpys, memsets (sorted by start)
    device_launch: dict[int, int] = field(default_factory=dict)  # device event -> its launch call
    gpu_annotations: list[int] = field(default_factory=list)
    # Backward work (see attribution.backward); shared empty defaults, replaced when there is some.
    backward_tops: Sequence[int] = ()  # outermost backward ops
    backward_calls: AbstractSet[int] = frozenset()  # runtime calls made inside them
    backward_device: AbstractSet[int] = frozenset()  # device events of those calls
    unmatched_launches: int = 0
    annotation_mismatches: int | None = None

    @property
    def op_parent(self) -> dict[int, int]:
        """The enclosing op of each op (-1: the region), built from `op_tree` on first use."""
        found = self.parents_found
        if found is None:
            found = self.parents_found = {}
            if self.op_tree is not None:
                found.update(zip(self.ops, rows_at(self.ops, self.op_tree[0]), strict=True))
        return found

    def add_parents(self, parents: Iterable[tuple[int, int]]) -> None:
        """Set the enclosing op of more ops (op, parent); `op_tree` no longer holds then."""
        self.op_parent.update(parents)
        self.op_tree = None

    @property
    def cpu_time_us(self) -> float:
        """Wall time of the CPU range."""
        return self.end - self.start

    def op_chain(self, op: int) -> list[int]:
        """The ops from the top level under the region down to `op`."""
        chain = []
        ops = self.ops
        if self.parents_found is None and self.op_tree is not None and ops:  # by position, no dict yet
            i = op - ops[0]  # its position where the ops are consecutive rows (the common case)
            if 0 <= i < len(ops) and ops[i] == op:
                up = self.op_tree[0]
                while i >= 0:
                    chain.append(ops[i])
                    i = up[i]
                return chain[::-1]
        while op >= 0:
            chain.append(op)
            op = self.op_parent.get(op, -1)
        return chain[::-1]


@dataclass
class Attribution:
    """The forwards of one region, with the trace they index into."""

    trace: ParsedTrace
    forwards: list[Forward]
    device_traced: bool  # the trace holds device events at all
    has_gpu_annotations: bool
    notes: list[str]

    @property
    def annotation_mismatches(self) -> int | None:
        """Device events that GPU annotations and correlation disagree on; None without annotations."""
        if not self.has_gpu_annotations:
            return None
        return sum(f.annotation_mismatches or 0 for f in self.forwards)


def launch_name_ids(trace: ParsedTrace) -> dict[int, str]:
    """The launch kind (see `launch_kind`) of each name id that a runtime call carries and that
    puts work on the device."""
    names = trace.names
    kinds = ((n, launch_kind(names[n])) for n in set(trace.runtime.name))
    return {n: kind for n, kind in kinds if kind is not None}
