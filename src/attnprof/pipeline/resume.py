"""`--resume` of `sweep` and `compare`: read an earlier run's rows, keep its finished cells, refuse to
continue it with settings that would change what a cell measures, and merge old and new rows.

An earlier run's rows are those of its folder: a sweep's stream (`results.jsonl`), every rank's stream
of a torchrun run (`results.rank{R}.jsonl`, read as one), or (compare) its `results.json`.

Kept: rows that are ok, skipped (this machine cannot run the cell, or the OOM rule), or failed
because the cell ran out of memory (it would again). Any other failure is transient as far as a
resume knows (a crash, a driver hiccup), so that cell runs again. A cell cut short by the
interrupt has no row and runs again, as does one whose line a crash left incomplete. A cell is kept
once (its first row); a collective variant's cell (every rank ran it together) only when the rows of
all the ranks of its run are there, else it runs again.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from attnprof.config import Config, MeasureOptions, parse_config
from attnprof.errors import ConfigError, ResultsFileError
from attnprof.pipeline.cell import ran_out_of_memory
from attnprof.pipeline.measured import SPEED_KEYS, SpeedCell, speedups
from attnprof.pipeline.run import Cell
from attnprof.pipeline.sweep import cell_key, row_key
from attnprof.results.files import ResultsFile, load_results
from attnprof.results.keys import cell_key as row_cell_key
from attnprof.results.schema import Row

STREAM_NAME = "results.jsonl"
RANK_STREAM = re.compile(r"results\.rank(\d+)\.jsonl")
#: Config fields that change what a cell measures without being part of its key.
CONFIG_MEANING = ("schedule", "seed", "region")
#: Measurement options that change what a cell measures (the others do not: clocks, refresh_ceiling).
#: (`flush_l2` is `cold_l2` flush, so `cold_l2` speaks for both.)
MEASURE_MEANING = ("timing", "min_time_s", "cuda_graph", "cold_l2", "check_masking")


def rank_stream_name(rank: int) -> str:
    """The file name of rank `rank`'s results stream in a torchrun run's folder."""
    return f"results.rank{rank}.jsonl"


def read_folder(folder: Path) -> ResultsFile:
    """A run folder's rows as one results file: its stream, else every rank's stream (rows in rank order,
    the header of the lowest rank's), else its results.json. ResultsFileError when it holds none."""
    ranks = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := RANK_STREAM.fullmatch(p.name)))
    files = [folder / STREAM_NAME] if (folder / STREAM_NAME).is_file() else [path for _, path in ranks]
    if not files and (folder / "results.json").is_file():
        files = [folder / "results.json"]
    if not files:
        raise ResultsFileError(
            f"{folder}: no results in it (results.jsonl, results.rank*.jsonl or results.json)",
            hint="give the folder of an earlier run, e.g. attnprof-out/20260101-120000-sweep",
        )
    loaded = [load_results(path) for path in files]
    if len(loaded) == 1:
        return loaded[0]
    rows = [row for part in loaded for row in part.rows]
    return ResultsFile(folder, loaded[0].header, rows, any(part.truncated for part in loaded))


def open_previous(path: Path, command: str = "sweep") -> ResultsFile:
    """The results of the `command` run to resume: the file `path`, or what the folder `path` holds
    (`read_folder`). ResultsFileError (exit 2) for anything else; a sweep resumes from its stream(s) only."""
    previous = read_folder(path) if path.is_dir() else load_results(path)
    stream = previous.is_stream
    if previous.command != command or (command == "sweep" and not stream):
        what = "the results stream" if command == "sweep" else "the results"
        raise ResultsFileError(
            f"{previous.path}: not {what} of a {command}",
            hint=f"--resume takes a {command}'s folder" + (" or its results.jsonl" if command == "sweep" else ""),
        )
    return previous


def recorded_config(previous: ResultsFile) -> Config:
    """The config the earlier run ran with, as recorded in its results."""
    return parse_config(previous.header.config, f"{previous.path} (its recorded config)")


def recorded_measure(previous: ResultsFile) -> dict[str, Any]:
    """The earlier run's measurement options as this attnprof reads them: `cuda_graph` true/false (files of
    before "auto") as "on"/"off", `cold_l2` from `flush_l2` where it predates `cold_l2`. Options it did not
    record are left out; a record this attnprof cannot read is taken as written."""
    from pydantic import ValidationError

    recorded = previous.header.measure or {}
    known = {name: value for name, value in recorded.items() if name in MeasureOptions.model_fields}
    try:
        read = MeasureOptions(**known).model_dump()
    except ValidationError:
        return known
    return {name: read[name] for name in read if name in known or (name == "cold_l2" and "flush_l2" in known)}


def inherit_measure(measure: MeasureOptions, previous: ResultsFile) -> MeasureOptions:
    """`measure` with each option left at its default taken from the earlier run instead (`flush_l2` through
    `cold_l2`, which says the same)."""
    recorded = recorded_measure(previous)
    defaults = MeasureOptions()
    given = measure.model_dump()
    inherited = {
        name: recorded[name]
        for name, value in given.items()
        if value == getattr(defaults, name) and name in recorded and name != "flush_l2"
    }
    return MeasureOptions(**(given | inherited)) if inherited else measure


def check_resumable(previous: ResultsFile, config: Config, measure: MeasureOptions, device: str) -> None:
    """ConfigError (exit 2) naming each setting that differs from the earlier run's and changes what
    a cell measures: the device, the profiler schedule, the seed, the region, the timing options (when
    it recorded them). (Variants, shapes, axes and the baseline may differ: they choose cells, they do
    not change one.) Under torchrun, rank 0 checks its device against the earlier rank 0's."""
    recorded = previous.header.config or {}
    now = config.model_dump(mode="json")
    differences = []
    was_device = previous.environment.get("device")
    if was_device != device:
        differences.append(f"device {was_device} (now {device})")
    differences += [
        f"{name} {recorded.get(name)} (now {now[name]})" for name in CONFIG_MEANING if recorded.get(name) != now[name]
    ]
    if previous.header.measure is not None:
        was_measure = recorded_measure(previous)
        differences += [
            f"{name} {was_measure.get(name)} (now {getattr(measure, name)})"
            for name in MEASURE_MEANING
            if was_measure.get(name) != getattr(measure, name)
        ]
    if differences:
        raise ConfigError(
            f"cannot resume {previous.path}: it ran with {'; '.join(differences)}",
            hint="resume with the settings it ran with, or start a new run",
        )


def _finished(row: Row) -> bool:
    return row.ok or row.status.startswith("skipped") or ran_out_of_memory(row.status, row.reason)


def kept_rows(previous: ResultsFile, collective: Collection[str] = ()) -> list[Row]:
    """The rows of finished cells that a resume keeps (see the module's docstring); `collective` names
    the variants whose cells every rank ran together."""
    cells: dict[tuple[Any, ...], list[Row]] = {}
    for row in previous.rows:
        if _finished(row):
            cells.setdefault(row_key(row), []).append(row)
    kept: list[Row] = []
    for rows in cells.values():
        kept += _complete(rows) if rows[0].variant in collective else rows[:1]
    return kept


def _complete(rows: list[Row]) -> list[Row]:
    """One row per rank, in rank order, when the rows cover every rank of their run; else none."""
    if len(rows) == 1 and rows[0].rank is None:
        return rows  # a single process's row (the variant was skipped there)
    by_rank = {row.rank: row for row in rows if row.rank is not None}
    worlds = {row.world_size for row in by_rank.values()}
    world = worlds.pop() if len(worlds) == 1 else None
    if not isinstance(world, int) or set(by_rank) != set(range(world)):
        return []
    return [by_rank[r] for r in range(world)]


def still_to_run(cells: Sequence[Cell], kept: list[Row]) -> list[int]:
    """The indices of the planned cells that have no kept row."""
    done = {row_key(row) for row in kept}
    return [i for i, (variant, spec) in enumerate(cells) if cell_key(variant.name, spec) not in done]


def ordered_rows(cells: Sequence[Cell], rows: list[Row]) -> list[Row]:
    """`rows` in the plan's cell order (a cell's rows by rank), rows of no planned cell last."""
    index = {cell_key(variant.name, spec): i for i, (variant, spec) in enumerate(cells)}

    def position(row: Row) -> tuple[int, int]:
        return index.get(row_key(row), len(cells)), row.rank if row.rank is not None else -1

    return sorted(rows, key=position)


def attach_row_speedups(rows: list[Row], baseline: str | None) -> None:
    """Set `speedup_vs_baseline` and `speedup_reliable` on rows, as `attach_speedups` does on results (rows
    from several ranks and runs compare by their cell)."""

    def positive(value: float | None) -> float | None:
        return float(value) if value is not None and value > 0 else None

    cells = [
        SpeedCell(
            row.variant,
            row_cell_key(row),
            row.ok,
            {key: positive(getattr(row, key)) for key in SPEED_KEYS},
            bool(row.unstable) or bool(row.contended),
            row.dtype if row.subject == "cell" else None,
        )
        for row in rows
    ]
    for row, found in zip(rows, speedups(cells, baseline), strict=True):
        row.speedup_vs_baseline, row.speedup_reliable, row.speedup_vs_dtype = found or (None, None, None)
