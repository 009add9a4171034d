"""Which rank runs which cell: a deterministic split balanced by estimated cost, not by count.

A cell's estimated cost is seconds: a fixed start-up per cell (inputs, warm-up, profiler, analysis,
whatever the shape) plus the calls it makes, each at the roofline of nominal rates:

    cost = CELL_OVERHEAD_S + CALLS_PER_CELL · call_seconds
    call_seconds = max(FLOPs / NOMINAL_FLOP_RATE, bytes / NOMINAL_BANDWIDTH)

with FLOPs and bytes what the cell's step really does (`analysis.roofline`): `step_flops` counts the
(query, key) pairs its mask keeps (causal, sliding window, documents, prefix, decode's one query against
the cache), 4·B·H·D each, × the mode's factor (fwd 1, bwd 2.5, fwd+bwd 3.5); `bytes_moved` is q, k, v
and the output (and their gradients in the backward) once each, k and v with their own (GQA) heads (a
dense mask a variant may build is left out: the cost knows the cell, not the variant). So a prefill cell
is costed by its FLOPs (twice the sequence, four times the work) and a decode cell (one query against a
long cache, memory-bound) by the cache it reads, not as the square of its length; and a thousand tiny
cells still cost their start-up. `pipeline.eta` fits a sweep's time left on the same `call_seconds`.

The split is the longest-processing-time rule: cells by cost, most expensive first (ties
by their key, so every rank computes the same split), each to the rank with the least estimated
work so far (ties: the lower rank). Each rank runs its cells in the plan's order.

`group` keeps cells together: every cell with the same group key goes to one rank as one unit (a
sweep can keep the growing sequences of one variant and shape on one rank, so a rule such as "skip
longer sequences after an out-of-memory" still sees the whole chain). `compare` splits single cells.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from attnprof.analysis.roofline import bytes_moved, step_flops
from attnprof.registry import RunSpec

CELL_OVERHEAD_S = 2.0
CALLS_PER_CELL = 40  # cold call, warm-up, the timed repetitions' floor, profiled steps, memory
#: Nominal attention FLOP/s and memory bandwidth (bytes/s): only ratios matter, not the absolute rates.
#: FLOP rate over bandwidth puts the ridge between memory- and compute-bound cells (CUDA: 120 FLOP/byte,
#: near what an H200 reaches, ~560 TFLOP/s fused attention against ~4.5 TB/s read in docs/validation.md;
#: an H100's is alike), and both against CELL_OVERHEAD_S weigh the work beside the start-up.
NOMINAL_FLOP_RATE = {
    ("cuda", "bf16"): 300e12,
    ("cuda", "fp16"): 300e12,
    ("cuda", "fp32"): 40e12,
    ("cuda", "fp8"): 600e12,
    ("cuda", "fp8_e5m2"): 600e12,
    ("cpu", "bf16"): 50e9,
    ("cpu", "fp16"): 20e9,
    ("cpu", "fp32"): 100e9,
}
NOMINAL_BANDWIDTH = {"cuda": 2.5e12, "cpu": 20e9}


def call_seconds(spec: RunSpec) -> float:
    """Nominal seconds of one call of the cell's step: the roofline bound of its FLOPs and bytes
    (`analysis.roofline.step_flops`, `bytes_moved`) at `NOMINAL_FLOP_RATE` and `NOMINAL_BANDWIDTH`.
    A relative work measure: compute-bound cells go by FLOPs, memory-bound ones (decode) by bytes."""
    flop_rate = NOMINAL_FLOP_RATE.get((spec.device_type, spec.dtype), NOMINAL_FLOP_RATE[("cpu", "fp32")])
    bandwidth = NOMINAL_BANDWIDTH.get(spec.device_type, NOMINAL_BANDWIDTH["cpu"])
    return max(step_flops(spec) / flop_rate, bytes_moved(spec) / bandwidth)


def cell_cost(spec: RunSpec) -> float:
    """Estimated seconds for one cell (see the module docstring)."""
    return CELL_OVERHEAD_S + CALLS_PER_CELL * call_seconds(spec)


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
