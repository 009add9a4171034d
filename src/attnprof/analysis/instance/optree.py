"""One region instance's forward ops as a tree: subtrees as ranges, children in order, and the
device work each op launched.

`Forward.ops` is in start order, so the ops are in pre-order: the subtree of the op at position `i`
is `ops[i:end[i]]`. Built once per instance in O(ops + device events) with list and dict lookups
only; every later question (what did this op launch, in all, and how long did it run) reads these
lists, never the whole trace. Backward-phase work is kept apart (`backward`), by the outermost
backward op that launched it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain, compress, repeat
from typing import Any, cast

from attnprof.analysis.attribution.forward import Forward
from attnprof.analysis.trace.tables import ParsedTrace


class OpTree:
    """The forward ops of `fwd` with their device work (see the module docstring). `op_names` is the
    name id of each op of `fwd.ops` and `roles` its role (see `call_names.op_role`; None: none); both
    may be shared with other instances (see `index.OpFacts`), and are only read."""

    def __init__(self, trace: ParsedTrace, fwd: Forward, roles: Sequence[str | None], op_names: Sequence[int]) -> None:
        self.trace, self.fwd = trace, fwd
        self.cpu_only = len(trace.device) == 0
        order = self.order = fwd.ops
        n = len(order)
        rows = order if isinstance(order, range) else None  # consecutive table rows
        self._pos: Mapping[int, int] | None = _Consecutive(rows.start, n) if rows is not None else None
        if fwd.op_tree is not None and len(fwd.op_tree[0]) == n:  # from the sweep that found the ops
            up, end = fwd.op_tree
            roots = self.roots = []
            i = 0
            while i < n:  # each top-level op, then past its subtree
                roots.append(order[i])
                i = end[i]
        else:
            up = list(map(self.pos.get, map(fwd.op_parent.get, order, repeat(-1)), repeat(-1)))  # -1: the region
            end = _subtree_ends(up)
            self.roots = list(compress(order, map((-1).__eq__, up)))
        self._up, self.end = up, end
        self._name_ids, self._names = trace.cpu_ops.name, trace.names
        self.op_names = op_names
        self.roles = roles
        self.direct: dict[int, list[int]] = {}  # op (-1: none) -> the forward work it launched itself
        self.backward: dict[int, list[int]] = {}  # outermost backward op (-1: none) -> its work
        launched = self._launched = [False] * n
        device, backward, direct = fwd.device, fwd.backward_device, self.direct
        # the op that launched each event (-1: none; a call that is not in launch_op has no key None)
        op_of = cast("Callable[[int | None, int], int]", fwd.launch_op.get)
        launched_by = list(map(op_of, map(fwd.device_launch.get, device), repeat(-1)))
        if rows is not None:  # its position: by arithmetic on consecutive rows
            lo, hi = rows.start, rows.stop
            where = self._where = [op - lo if lo <= op < hi else -1 for op in launched_by]
        else:
            where = self._where = list(map(self.pos.get, launched_by, repeat(-1)))
        for e, op, i in zip(device, launched_by, where, strict=True):
            if backward and e in backward:
                get_parent = fwd.op_parent.get
                while op >= 0 and get_parent(op, -1) >= 0:
                    op = get_parent(op, -1)
                self.backward.setdefault(op, []).append(e)
                continue
            found = direct.get(op)
            if found is None:
                direct[op] = [e]
                while i >= 0 and not launched[i]:  # it and the ops around it launched work
                    launched[i] = True
                    i = up[i]
            else:
                found.append(e)
        self._kids: dict[int, list[int]] = {}

    def shape(self) -> tuple[tuple[int, ...], ...]:
        """Everything about the instance that its attention calls depend on, by position and name id:
        its op names and nesting, and per device event its launching op's position (-1: none, -2: a
        backward event), name and kind. Instances of one shape have the same calls, at the same
        positions (`index.TraceIndex.shape_facts` finds them once per shape)."""
        fwd, dev = self.fwd, self.trace.device
        backward = fwd.backward_device
        where = self._where
        if backward:
            where = [-2 if e in backward else i for e, i in zip(fwd.device, where, strict=True)]
        return (
            tuple(self.op_names),
            tuple(self._up),
            tuple(where),
            tuple(map(dev.name.__getitem__, fwd.device)),
            tuple(map(dev.kind.__getitem__, fwd.device)),
        )

    @property
    def pos(self) -> Mapping[int, int]:
        """The position of each op in `order` (read-only; a dict built on first use where the ops are
        not consecutive table rows)."""
        found = self._pos
        if found is None:
            found = self._pos = dict(zip(self.order, range(len(self.order)), strict=True))
        return found

    def kids(self, parent: int) -> list[int]:
        """The ops directly inside `parent` (-1: the region), in start order."""
        if parent < 0:
            return self.roots
        found = self._kids.get(parent)
        if found is None:
            p = self.pos[parent]
            found = self._kids[parent] = list(
                compress(self.order[p + 1 : self.end[p]], map(p.__eq__, self._up[p + 1 : self.end[p]]))
            )
        return found

    def name(self, op: int) -> str:
        """The op's name."""
        return self._names[self._name_ids[op]]

    def role(self, op: int) -> str | None:
        """The op's role (see the class docstring)."""
        return self.roles[self.pos[op]]

    def parent(self, op: int) -> int:
        """The enclosing op (-1: the region itself)."""
        p = self._up[self.pos[op]]
        return self.order[p] if p >= 0 else -1

    def subtree(self, op: int) -> list[int]:
        """`op` and every op nested in it, in start order."""
        i = self.pos[op]
        return self.ops_at(i, self.end[i])

    def ops_at(self, start: int, stop: int) -> list[int]:
        """The ops at positions `start` to `stop` (exclusive), as a new list."""
        return list(self.order[start:stop])

    def events(self, op: int) -> list[int]:
        """The forward device work launched inside `op` (its own and its descendants'), in launch order."""
        i = self.pos[op]
        if not self._launched[i]:
            return []
        if self.end[i] == i + 1:
            return list(self.direct[op])
        return self.span_events(i, self.end[i])

    def span_events(self, start: int, stop: int) -> list[int]:
        """The forward device work launched by the ops at positions `start` to `stop` (exclusive): op
        by op, each op's in launch order."""
        direct = self.direct
        return list(chain.from_iterable(map(direct.__getitem__, filter(direct.__contains__, self.order[start:stop]))))

    def launched(self, op: int) -> bool:
        """True when `op` or an op inside it launched device work."""
        return self._launched[self.pos[op]]

    def worked(self, op: int) -> bool:
        """True when `op` did work: launched device work (`launched`), or in a CPU-only trace, always
        (every op runs on the CPU)."""
        return self.cpu_only or self._launched[self.pos[op]]

    def chain(self, root: int, op: int) -> str:
        """The op names from `root` down to `op`, joined by " → "."""
        names = []
        while op >= 0:
            names.append(self.name(op))
            if op == root:
                break
            op = self.parent(op)
        return " → ".join(reversed(names))


class _Consecutive(Mapping[int, int]):
    """The positions of the consecutive rows `start` to `start + n - 1`: read as a dict, never built."""

    __slots__ = ("start", "n")

    def __init__(self, start: int, n: int) -> None:
        self.start, self.n = start, n

    def __getitem__(self, row: int) -> int:
        i = row - self.start
        if 0 <= i < self.n:
            return i
        raise KeyError(row)

    def get(self, row: int, default: Any = None) -> Any:
        """The position of `row`, else `default`."""
        i = row - self.start
        return i if 0 <= i < self.n else default

    def __contains__(self, row: object) -> bool:
        return isinstance(row, int) and 0 <= row - self.start < self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.start + self.n))

    def __len__(self) -> int:
        return self.n


def _subtree_ends(up: list[int]) -> list[int]:
    """The end of each op's subtree (the position after its last descendant), from the position of
    each op's parent (-1: none), ops in pre-order."""
    end = list(range(1, len(up) + 1))
    for i in range(len(up) - 1, 0, -1):  # children come after their parent: fold them in from the end
        p = up[i]
        if p >= 0 and end[i] > end[p]:
            end[p] = end[i]
    return end
