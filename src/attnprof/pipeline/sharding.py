"""Which rank runs which cell: a deterministic split balanced by estimated cost, not by count.

A cell's estimated cost is seconds: a fixed start-up per cell (inputs, warm-up, profiler, analysis,
whatever the shape) plus the forwards it runs at an assumed rate:

    cost = CELL_OVERHEAD_S + CALLS_PER_CELL · FLOPs / rate(device type, dtype)
    FLOPs = 4 · B · H · S² · D  × (0.5 causal)  × mode factor (fwd 1, bwd 2.5, fwd+bwd 3.5)

so a sequence twice as long costs four times the work, and a thousand tiny cells still cost their
start-up. The split is the longest-processing-time rule: cells by cost, most expensive first (ties
by their key, so every rank computes the same split), each to the rank with the least estimated
work so far (ties: the lower rank). Each rank runs its cells in the plan's order.

`group` keeps cells together: every cell with the same group key goes to one rank as one unit (a
sweep can keep the growing sequences of one variant and shape on one rank, so a rule such as "skip
longer sequences after an out-of-memory" still sees the whole chain). `compare` splits single cells.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from attnprof.registry import RunSpec

CELL_OVERHEAD_S = 2.0
CALLS_PER_CELL = 40  # cold call, warm-up, the timed repetitions' floor, profiled steps, memory
MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
#: Assumed attention FLOP/s, by device type and dtype: only the ratio to CELL_OVERHEAD_S matters.
RATE = {
    ("cuda", "bf16"): 300e12,
    ("cuda", "fp16"): 300e12,
    ("cuda", "fp32"): 40e12,
    ("cpu", "bf16"): 50e9,
    ("cpu", "fp16"): 20e9,
    ("cpu", "fp32"): 100e9,
}


def cell_flops(spec: RunSpec) -> float:
    """Attention FLOPs of one call of the cell's step (forward 4·B·H·S²·D, halved when causal, × mode factor)."""
    flops = 4.0 * spec.batch * spec.heads * spec.seq * spec.seq * spec.head_dim
    return flops * (0.5 if spec.causal else 1.0) * MODE_FACTOR[spec.mode]


def cell_cost(spec: RunSpec) -> float:
    """Estimated seconds for one cell (see the module docstring)."""
    rate = RATE.get((spec.device_type, spec.dtype), RATE[("cpu", "fp32")])
    return CELL_OVERHEAD_S + CALLS_PER_CELL * cell_flops(spec) / rate


@dataclass(frozen=True)
class Split:
    """Each rank's cells (indices into the plan, in plan order) and its estimated seconds."""

    shards: list[list[int]]
    costs: list[float]

    def rank_of(self) -> dict[int, int]:
        """The rank of each planned cell index."""
        return {index: rank for rank, shard in enumerate(self.shards) for index in shard}


def split_cells(
    keys: Sequence[str],
    costs: Sequence[float],
    world_size: int,
    group: Callable[[int], Hashable] | None = None,
) -> Split:
    """Split cells `0..len(keys)-1` over `world_size` ranks by the longest-processing-time rule.

    `keys` name the cells (unique; they break ties, so the split never depends on anything but the
    plan), `costs` are their estimates, `group(i)` (optional) puts cells with one group key on one
    rank together. Deterministic: the same arguments give the same split on every rank.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (got {world_size})")
    if len(keys) != len(costs):
        raise ValueError("one cost per key")
    units: dict[Hashable, list[int]] = {}
    for i in range(len(keys)):
        units.setdefault(group(i) if group else i, []).append(i)
    ordered = sorted(units.values(), key=lambda cells: (-sum(costs[i] for i in cells), min(keys[i] for i in cells)))
    loads = [0.0] * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for cells in ordered:
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += sum(costs[i] for i in cells)
        shards[rank].extend(cells)
    return Split([sorted(shard) for shard in shards], loads)


def cell_name(variant: str, spec: RunSpec) -> str:
    """A cell's stable name across ranks and runs: the variant and `RunSpec.cell_key`."""
    return "|".join([variant, *(str(part) for part in spec.cell_key)])
