"""`attnprof sweep`: every variant at every point of a config's sweep axes, each finished cell streamed
to disk, and the out-of-memory rule.

The points are the cross product of the axes over each configured shape (`sweep_specs`); a point
whose kv_heads does not divide its heads is left out and named. The plan (`plan_sweep`) runs one
dtype after another (each against its own matmul ceiling), sequence lengths in ascending order
within each, and the baseline first at each point, so that each finished cell's row is complete
when it is streamed: its speed-up is known, and once a variant runs out of memory at one sequence
length, its larger ones at the same other axes are skipped (`OomRule`) instead of run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from itertools import groupby
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from attnprof.config import Config, MeasureOptions, Shape
from attnprof.errors import ConfigError
from attnprof.interrupts import raise_if_interrupted
from attnprof.pipeline.run import Cell, RunFolder, run_cells
from attnprof.registry import RunSpec, Variant
from attnprof.results import CellResult, attach_speedups

if TYPE_CHECKING:
    from pathlib import Path

    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.report.export import ResultsStream

OOM_REASON = "out of memory"  # how `run_cell` begins the reason of a cell that ran out of memory
OOM_SKIP = "OOM at smaller size"  # the reason of a cell skipped by the OOM rule

#: What identifies a cell in a results row: a finished row with the same key is the same cell.
KEY_FIELDS = ("variant", "batch", "heads", "kv_heads", "seq", "head_dim", "dtype", "causal", "mode", "device")

Key = tuple[Any, ...]


def sweep_specs(config: Config, device: str) -> tuple[list[RunSpec], list[str]]:
    """The sweep's points on the resolved `device`: each configured shape with every combination of
    the shape axes, crossed with the dtype, causal and mode axes (or the config's own values).
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
            specs += [
                shape.spec(device, dtype, causal, mode)
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
    """The key of a cell (`KEY_FIELDS`), as `row_key` gives it for the cell's row."""
    fields = {"variant": variant, "kv_heads": spec.n_kv_heads}
    return tuple(fields[name] if name in fields else getattr(spec, name) for name in KEY_FIELDS)


def row_key(row: dict[str, Any]) -> Key:
    """The key of a results row (`KEY_FIELDS`)."""
    return tuple(row.get(name) for name in KEY_FIELDS)


def ran_out_of_memory(status: str, reason: str | None) -> bool:
    """True for a cell that failed because it ran out of memory."""
    return status.startswith("failed") and (reason or "").startswith(OOM_REASON)


class OomRule:
    """Once a variant runs out of memory at one sequence length, its larger sequence lengths at the same
    other axes (batch, heads, kv_heads, head_dim, dtype, causal, mode, device) are skipped."""

    SEQ = KEY_FIELDS.index("seq")

    def __init__(self) -> None:
        self._smallest: dict[Key, int] = {}

    def _note(self, key: Key, status: str, reason: str | None) -> None:
        if ran_out_of_memory(status, reason):
            group = key[: self.SEQ] + key[self.SEQ + 1 :]
            seq = key[self.SEQ]
            self._smallest[group] = min(seq, self._smallest.get(group, seq))

    def note_result(self, result: CellResult) -> None:
        """Take a finished cell into account."""
        self._note(cell_key(result.variant, result.spec), result.status, result.reason)

    def note_row(self, row: dict[str, Any]) -> None:
        """Take a row of an earlier run (`--resume`) into account."""
        self._note(row_key(row), str(row.get("status", "")), row.get("reason"))

    def skip_reason(self, variant: Variant, spec: RunSpec) -> str | None:
        """`OOM at smaller size (seq S)` when `variant` ran out of memory at a smaller S; else None."""
        key = cell_key(variant.name, spec)
        seq = self._smallest.get(key[: self.SEQ] + key[self.SEQ + 1 :])
        return f"{OOM_SKIP} (seq {seq})" if seq is not None and spec.seq > seq else None


class _Recorder:
    """What `run_sweep` does around each cell: global progress indices, speed-up against the point's
    baseline cell, the OOM rule, and the streamed row."""

    def __init__(self, total: int, baseline: str | None, stream: ResultsStream, oom: OomRule) -> None:
        self.total, self.baseline, self.stream, self.oom = total, baseline, stream, oom
        self.offset = 0  # cells of the dtypes before the current one
        self.baselines: dict[RunSpec, CellResult] = {}
        self.on_start: Callable[[int, int, Variant, RunSpec], None] | None = None
        self.on_done: Callable[[CellResult], None] | None = None

    def started(self, index: int, total: int, variant: Variant, spec: RunSpec) -> None:
        """Pass the start on with the index among all cells."""
        if self.on_start:
            self.on_start(self.offset + index, self.total, variant, spec)

    def done(self, result: CellResult) -> None:
        """Speed-up, OOM rule, then the row on disk before anyone else hears of the cell."""
        from attnprof.report.serialize import json_entry

        if result.variant == self.baseline:
            self.baselines[result.spec] = result
        base = self.baselines.get(result.spec)
        attach_speedups([result] if base is None or base is result else [base, result], self.baseline)
        self.oom.note_result(result)
        self.stream.append(json_entry(result))
        if self.on_done:
            self.on_done(result)


def run_sweep(
    cells: list[Cell],
    config: Config,
    measure: MeasureOptions,
    ceiling_for: Callable[[str], RunCeiling | None],
    stream: ResultsStream,
    oom: OomRule,
    on_start: Callable[[int, int, Variant, RunSpec], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
    trace_dir: Path | None = None,
) -> tuple[list[CellResult], bool]:
    """Run the planned cells dtype by dtype (`ceiling_for(dtype)` gives each its ceiling), skipping by
    the OOM rule and appending each finished cell's row to `stream` with its speed-up against the
    baseline's cell (which runs first at each point). Returns the results and whether Ctrl-C cut the
    sweep short. `on_start` gets the index among all `cells`."""
    recorder = _Recorder(len(cells), config.baseline, stream, oom)
    recorder.on_start, recorder.on_done = on_start, on_done
    results: list[CellResult] = []
    for dtype, group in groupby(cells, key=lambda cell: cell[1].dtype):
        recorder.offset = len(results)
        try:
            raise_if_interrupted()
            ceiling = ceiling_for(dtype)
        except KeyboardInterrupt:
            return results, True
        done, interrupted = run_cells(
            list(group), config, measure, ceiling, recorder.started, recorder.done, trace_dir, skip=oom.skip_reason
        )
        results += done
        if interrupted:
            return results, True
    return results, False


def sweep_document(
    config: Config,
    environment: dict[str, Any],
    ceilings: dict[str, RunCeiling],
    results: list[CellResult],
    kept: list[dict[str, Any]],
    interrupted: bool,
    folder: RunFolder,
    measure: MeasureOptions,
    resumed_from: str | None,
) -> dict[str, Any]:
    """The sweep's results document: the rows `kept` from the sweep it resumes, then this run's; the
    measurement options and what it resumed (so a later `--resume` can check it continues alike); the
    ceiling (one dtype) or `ceilings` by dtype."""
    from attnprof.report.serialize import results_document

    files = folder.to_dict() | {"results_jsonl": str(folder.dir / "results.jsonl")}
    single = next(iter(ceilings.values())).current if len(ceilings) == 1 else None
    document = results_document("sweep", config, environment, single, results, interrupted, files=files)
    document["results"] = kept + document["results"]
    document["measure"] = measure.model_dump(mode="json")
    document["resumed_from"] = resumed_from
    if len(ceilings) > 1:
        document["ceilings"] = {dtype: ceiling.current.to_dict() for dtype, ceiling in ceilings.items()}
    return document


def write_sweep_results(folder: RunFolder, document: dict[str, Any]) -> None:
    """`results.json` and `results.csv` of every row of the document, next to the stream."""
    from attnprof.report.export import write_csv, write_json
    from attnprof.report.serialize import CSV_FIELDS, entry_csv_row

    write_json(folder.results_json, document)
    write_csv(folder.results_csv, [entry_csv_row(entry) for entry in document["results"]], CSV_FIELDS)


def sweep_exit_code(results: list[CellResult], interrupted: bool) -> int:
    """130 after Ctrl-C; 1 when a cell failed for another reason than running out of memory; else 0."""
    if interrupted:
        return 130
    return 1 if any(r.status == "failed" and not ran_out_of_memory(r.status, r.reason) for r in results) else 0
