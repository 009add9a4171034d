"""The best known at each cell of a run, and the row's findings judged against it (`attach_best_known`).

After a run (compare, sweep, run), its rows are grouped by cell (`results.keys.cell_key`: the cell without the
variant). Where two or more variants ran ok at a cell, the reference is the fastest of them ("this run"): by the
attention kernels' device time when every row of the cell has it (`kernel_tflops`; the same FLOPs at one cell,
so the ratio of rates is that of times), else by latency (a CPU run); when the shipped table of this GPU holds
the very same shape at a kernel TFLOP/s over 1% higher (the run compared only slow variants), that entry is the best
known instead. A cell only one variant ran on a GPU
takes the shipped table's entry for its shape (`analysis.attainable`), scaled to this GPU's measured ceilings
when the table is another GPU's. Each row gets `best_known_variant`, `best_known_latency_us` (this run's
only), `pct_of_best_known` (its rate in % of the best's), `best_known_basis` and `best_known_source`, and the
judge weighs its `memory-bound` and `tensor-pipe-underused` against the best's kernel GB/s and TFLOP/s
(`findings.judge.judge_best_known`). A row judged before (a resumed one) keeps its judgement.
"""

from __future__ import annotations

from typing import Any

from attnprof.analysis.attainable import (
    Attainable,
    NoReference,
    ShapeKey,
    canonical_mask,
    measured_at,
    reference_for,
)
from attnprof.analysis.findings.judge import THIS_RUN
from attnprof.analysis.hardware import Peaks
from attnprof.pipeline.rows import join_best_known
from attnprof.results.keys import cell_key
from attnprof.results.schema import Row

KERNEL_TIME, LATENCY = "kernel time", "latency"
#: The table's entry replaces a run's fastest only when faster by more than this (not the same run, rounded).
TABLE_MARGIN = 1.01
#: The modes a table key has a phase for (fwd+bwd has none: the table keeps each phase alone).
_PHASES = {"fwd": "fwd", "bwd": "bwd"}


def row_key(row: Row) -> ShapeKey | None:
    """The table key of a cell's row; None for a mode the table does not keep or a row missing a field."""
    phase = _PHASES.get(row.mode or "fwd")
    q_len, kv_len = row.q_len or row.seq, row.kv_len or row.seq
    if phase is None or not (q_len and kv_len and row.head_dim and row.batch and row.heads and row.dtype):
        return None
    mask = canonical_mask(row.mask, row.causal)
    return ShapeKey(phase, q_len, kv_len, row.head_dim, mask, row.dtype, row.batch * row.heads)


def _timed(row: Row) -> bool:
    return row.subject == "cell" and row.ok and row.latency_us is not None and row.latency_us > 0


def attach_best_known(rows: list[Row]) -> None:
    """Set each timed cell row's best-known fields and judge its findings against them (module docstring)."""
    cells: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        if _timed(row):
            cells.setdefault(cell_key(row), []).append(row)
    for members in cells.values():
        if len(members) > 1:
            _this_run(members)
        elif members[0].device and str(members[0].device).startswith("cuda"):
            _from_table(members[0])


def _this_run(members: list[Row]) -> None:
    """The fastest of a cell's rows as every one's reference."""
    by_kernel = all(r.kernel_tflops for r in members)
    if by_kernel:
        best = max(members, key=lambda r: r.kernel_tflops or 0.0)
    else:
        best = min(members, key=lambda r: r.latency_us or 0.0)
    reference = Attainable(best.kernel_gbps, best.kernel_tflops, best.variant, THIS_RUN)
    best_latency = best.latency_us
    if by_kernel:
        known = measured_at(row_key(best), _gpu(best))
        if known is not None and known.tflops and known.tflops > TABLE_MARGIN * (best.kernel_tflops or 0.0):
            reference, best_latency = known, None
    for row in members:
        if by_kernel:
            pct = 100.0 * (row.kernel_tflops or 0.0) / (reference.tflops or 1.0)
        else:
            pct = 100.0 * (best.latency_us or 0.0) / (row.latency_us or 1.0)
        _attach(row, reference, pct, KERNEL_TIME if by_kernel else LATENCY, best_latency)


def _gpu(row: Row) -> str | None:
    return row.gpu or (row.trace_device.name if row.trace_device is not None else None)


def _from_table(row: Row) -> None:
    """The shipped table's entry for a lone row's shape, when there is one and the row has the kernel rate."""
    gpu = _gpu(row)
    peaks = None
    if row.peak_read_gbps and row.peak_tflops:
        peaks = Peaks.measured(row.peak_read_gbps, row.peak_tflops, THIS_RUN)
    reference = reference_for(row_key(row), gpu, peaks)
    if isinstance(reference, NoReference):
        join_best_known(row, reference)  # its findings stand, saying why
        return
    memory = row.bound == "memory"
    mine, best = (row.kernel_gbps, reference.gbps) if memory else (row.kernel_tflops, reference.tflops)
    if mine is None or not best:
        return
    _attach(row, reference, 100.0 * mine / best, KERNEL_TIME, None)


def _attach(row: Row, reference: Attainable, pct: float, basis: str, latency_us: float | None) -> None:
    row.best_known_variant, row.best_known_latency_us = reference.variant, latency_us
    row.pct_of_best_known, row.best_known_basis = round(pct, 3), basis
    row.best_known_source = reference.source
    join_best_known(row, reference)
