"""`attnprof sweep`: every variant at every point of a config's sweep axes, each finished cell streamed
to disk, and the out-of-memory rule.

The points are the cross product of the axes over each configured shape (`sweep_specs`); a point
whose kv_heads does not divide its heads is left out and named. The plan (`plan_sweep`) runs one
dtype after another (each against its own matmul ceiling), sequence lengths in ascending order
within each, and the baseline first at each point, so that each finished cell's row is complete
when it is streamed: its speed-up is known, and once a variant runs out of memory at one sequence
length, its larger ones at the same other axes are skipped (`OomRule`) instead of run.

Under torchrun each rank runs a share of the plan (`pipeline.sharded`): a variant's chain of growing
sequence lengths at one point of the other axes (`chain_key`) stays on one rank, so the OOM rule still
sees the whole chain; a streamed row whose baseline cell ran on another rank gets its speed-up when rank 0
gathers the rows.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import msgspec
from pydantic import ValidationError

from attnprof.config import Config, Shape
from attnprof.errors import ConfigError
from attnprof.pipeline.cell import ran_out_of_memory
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.run import Cell
from attnprof.registry import RunSpec, Variant
from attnprof.results.keys import cell_key as row_cell_key
from attnprof.results.schema import Row

OOM_SKIP = "OOM at smaller size"  # the reason of a cell skipped by the OOM rule

Key = tuple[Any, ...]


def sweep_specs(config: Config, device: str) -> tuple[list[RunSpec], list[str]]:
    """The sweep's points on the resolved `device`: each configured shape with every combination of
    the shape axes (q_len, kv_len, mask, score_mod and kv_cache among them), crossed with the dtype, causal and
    mode axes (or the config's own values).
    Returns them, without repeats, and why combinations that make no valid shape were left out."""
    axes = config.sweep.axes() if config.sweep else {}
    shape_axes = {name: values for name, values in axes.items() if name in Shape.model_fields}
    specs: list[RunSpec] = []
    left_out: list[str] = []
    for base in config.shapes:
        for combination in itertools.product(*shape_axes.values()):
            try:
                shape = Shape(**(base.model_dump() | dict(zip(shape_axes, combination, strict=True))))
            except ValidationError as exc:
                left_out.append(exc.errors()[0]["msg"].removeprefix("Value error, "))
                continue
            if problem := config.default_problem(shape):
                left_out.append(problem)
                continue
            specs += [
                shape.spec(device, dtype, causal, mode, config.mask, config.score_mod, config.kv_cache)
                for dtype, causal, mode in itertools.product(
                    axes.get("dtype", [config.dtype]),
                    axes.get("causal", [config.causal]),
                    axes.get("mode", config.modes),
                )
            ]
    return list(dict.fromkeys(specs)), list(dict.fromkeys(left_out))


def plan_sweep(config: Config, variants: list[Variant], device: str) -> tuple[list[Cell], list[str]]:
    """Every point × variant: dtype after dtype, sequence lengths ascending within each, the points
    in config order at one length, the baseline first at each point. Also returns the left-out
    combinations (`sweep_specs`); ConfigError when no point is left."""
    specs, left_out = sweep_specs(config, device)
    if not specs:
        raise ConfigError(f"the sweep has no valid point: {'; '.join(left_out)}")
    dtypes = list(dict.fromkeys(spec.dtype for spec in specs))
    specs.sort(key=lambda spec: (dtypes.index(spec.dtype), spec.seq))
    ordered = sorted(variants, key=lambda variant: variant.name != config.baseline)
    return [(variant, spec) for spec in specs for variant in ordered], left_out


def without_axes(config: Config, names: list[str]) -> Config:
    """`config` with the named sweep axes removed (a command-line option fixed them)."""
    if config.sweep is None or not any(getattr(config.sweep, name) is not None for name in names):
        return config
    return config.model_copy(update={"sweep": config.sweep.model_copy(update=dict.fromkeys(names))})


def cell_key(variant: str, spec: RunSpec) -> Key:
    """What identifies a cell in a results row: its variant and `RunSpec.cell_key` (the device by its type,
    so a cell is the same on every rank's GPU); `row_key` gives it for the cell's row."""
    return (variant, *spec.cell_key)


def row_key(row: Row) -> Key:
    """The key of a results row (`cell_key`)."""
    return (row.variant, *row_cell_key(row))


def chain_key(variant: str, spec: RunSpec) -> Key:
    """`cell_key` without the sequence length: one variant's cells at growing sequence lengths, every other
    axis equal (what the OOM rule follows, and what a sharded sweep keeps on one rank). A packed batch
    (`seq_lens`) is a chain of its own: its total is its lengths'."""
    return cell_key(variant, spec if spec.seq_lens is not None else replace(spec, seq=0))


class OomRule:
    """Once a variant runs out of memory at one sequence length, its larger sequence lengths at the same
    other axes (batch, heads, kv_heads, head_dim, dtype, causal, mode, device type) are skipped."""

    def __init__(self) -> None:
        self._smallest: dict[Key, int] = {}

    def _note(self, chain: Key, seq: int, status: str, reason: str | None) -> None:
        if ran_out_of_memory(status, reason):
            self._smallest[chain] = min(seq, self._smallest.get(chain, seq))

    def note_result(self, result: CellResult) -> None:
        """Take a finished cell into account."""
        self._note(chain_key(result.variant, result.spec), result.spec.seq, result.status, result.reason)

    def note_row(self, row: Row) -> None:
        """Take a row of an earlier run (`--resume`) into account."""
        square = {name: None for name in ("q_len", "kv_len") if getattr(row, name) == row.seq}
        chain = (
            row.variant,
            *row_cell_key(msgspec.structs.replace(row, **square, seq=row.seq if row.seq_lens else 0)),
        )  # as chain_key: lengths = seq drop (not a packed batch's)
        self._note(chain, row.seq or 0, row.status, row.reason)

    def skip_reason(self, variant: Variant, spec: RunSpec) -> str | None:
        """`OOM at smaller size (seq S)` when `variant` ran out of memory at a smaller S; else None."""
        seq = self._smallest.get(chain_key(variant.name, spec))
        return f"{OOM_SKIP} (seq {seq})" if seq is not None and spec.seq > seq else None
