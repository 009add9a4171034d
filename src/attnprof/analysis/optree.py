"""One region instance's forward ops as a tree: subtrees as ranges, children in order, and the
device work each op launched.

`Forward.ops` is in start order, so the ops are in pre-order: the subtree of the op at position `i`
is `ops[i:end[i]]`. Built once per instance in O(ops + device events) with list and dict lookups
only; every later question (what did this op launch, in all, and how long did it run) reads these
lists, never the whole trace. Backward-phase work is kept apart (`backward`), by the outermost
backward op that launched it.
"""

from __future__ import annotations

from itertools import repeat

from attnprof.analysis.forwards import Forward
from attnprof.analysis.trace import ParsedTrace


class OpTree:
    """The forward ops of `fwd` with their device work (see the module docstring)."""

    def __init__(self, trace: ParsedTrace, fwd: Forward) -> None:
        self.trace, self.fwd = trace, fwd
        order = self.order = fwd.ops
        n = len(order)
        pos = self.pos = dict(zip(order, range(n), strict=True))
        get_parent = fwd.op_parent.get
        parents = map(get_parent, order, repeat(-1))
        up = self._up = list(map(pos.get, parents, repeat(-1)))  # the parent's position; -1: the region
        self.roots = [op for op, p in zip(order, up, strict=True) if p < 0]
        self.direct: dict[int, list[int]] = {}  # op (-1: none) -> the forward work it launched itself
        self.backward: dict[int, list[int]] = {}  # outermost backward op (-1: none) -> its work
        busy, count = [0.0] * n, [0] * n
        dur, launch_of, op_of = trace.device.dur, fwd.device_launch.get, fwd.launch_op.get
        backward = fwd.backward_device
        for e in fwd.device:
            call = launch_of(e)
            op = op_of(call, -1) if call is not None else -1
            if backward and e in backward:
                while op >= 0 and get_parent(op, -1) >= 0:
                    op = get_parent(op, -1)
                self.backward.setdefault(op, []).append(e)
                continue
            found = self.direct.get(op)
            if found is None:
                self.direct[op] = [e]
            else:
                found.append(e)
            i = pos.get(op, -1)
            if i >= 0:
                busy[i] += dur[e]
                count[i] += 1
        end = list(range(1, n + 1))
        for i in range(n - 1, -1, -1):  # children come after their parent: fold them in from the end
            p = up[i]
            if p >= 0:
                if end[i] > end[p]:
                    end[p] = end[i]
                if count[i]:  # a subtree that launched nothing adds zeros: skipped
                    busy[p] += busy[i]
                    count[p] += count[i]
        self.end, self._busy, self._count = end, busy, count
        self._names, self._name_ids = trace.names, trace.cpu_ops.name
        self._kids: dict[int, list[int]] = {}

    def kids(self, parent: int) -> list[int]:
        """The ops directly inside `parent` (-1: the region), in start order."""
        if parent < 0:
            return self.roots
        found = self._kids.get(parent)
        if found is None:
            p = self.pos[parent]
            up = self._up
            found = self._kids[parent] = [self.order[i] for i in range(p + 1, self.end[p]) if up[i] == p]
        return found

    def name(self, op: int) -> str:
        """The op's name."""
        return self._names[self._name_ids[op]]

    def parent(self, op: int) -> int:
        """The enclosing op (-1: the region itself)."""
        p = self._up[self.pos[op]]
        return self.order[p] if p >= 0 else -1

    def subtree(self, op: int) -> list[int]:
        """`op` and every op nested in it, in start order."""
        i = self.pos[op]
        return self.order[i : self.end[i]]

    def events(self, op: int) -> list[int]:
        """The forward device work launched inside `op` (its own and its descendants'), in launch order."""
        return [e for o in self.subtree(op) for e in self.direct.get(o, ())]

    def launched(self, op: int) -> bool:
        """True when `op` or an op inside it launched device work."""
        return self._count[self.pos[op]] > 0

    def device_us(self, op: int) -> float:
        """The summed duration of the device work launched inside `op`."""
        return self._busy[self.pos[op]]

    def chain(self, root: int, op: int) -> str:
        """The op names from `root` down to `op`, joined by " → "."""
        names = []
        while op >= 0:
            names.append(self.name(op))
            if op == root:
                break
            op = self.parent(op)
        return " → ".join(reversed(names))
