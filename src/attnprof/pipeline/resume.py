"""`--resume FOLDER`: the rows a run folder already holds, the planned cells that still miss one, and
the merge of old and new rows into one results list.

A folder's rows are those of every results stream (`results*.jsonl`: one per rank of a torchrun run,
written as each cell finished) and every results document (`results*.json`) in it. A planned cell is
done when a row of its variant and cell (`RunSpec.cell_key`, the device by its type) exists; a
collective cell (run by every rank together) only when rows of all the ranks of the run that wrote
them are there: otherwise its partial rows are dropped and the cell runs again. Rows of cells that
the plan does not hold are left out (and counted). A failed or skipped row is a row: it is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprof.errors import ConfigError
from attnprof.registry import RunSpec, Variant
from attnprof.report.results_file import load_results
from attnprof.report.serialize import row_cell_key
from attnprof.results import SPEED_KEYS, SpeedCell, speedups

Cell = tuple[Variant, RunSpec]


@dataclass
class ResumePlan:
    """What a resumed run keeps and redoes: rows kept (in plan order), the indices of the cells to run,
    and how many rows of the folder belong to no planned cell (or to an incomplete collective cell)."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    ignored: int = 0
    dropped: int = 0


def folder_rows(folder: Path) -> list[dict[str, Any]]:
    """Every row of the results streams and documents in `folder`, file by file in name order.
    ConfigError when `folder` is no directory or holds no results file."""
    if not folder.is_dir():
        raise ConfigError(f"--resume {folder}: no such folder")
    files = sorted([*folder.glob("results*.jsonl"), *folder.glob("results*.json")])
    if not files:
        raise ConfigError(
            f"--resume {folder}: no results file in it (results.json or results.rank*.jsonl)",
            hint="give the folder of an earlier run, e.g. attnprof-out/20260101-120000-compare",
        )
    return [row for path in files for row in load_results(path).rows]


def _identity(row: dict[str, Any]) -> tuple[str, tuple[Any, ...]] | None:
    try:
        return row["variant"], row_cell_key(row)
    except KeyError:
        return None


def resume_plan(cells: Sequence[Cell], rows: list[dict[str, Any]]) -> ResumePlan:
    """Match the folder's `rows` with the planned `cells` (see the module docstring)."""
    index = {(v.name, s.cell_key): i for i, (v, s) in enumerate(cells)}
    found: dict[int, list[dict[str, Any]]] = {}
    plan = ResumePlan()
    for row in rows:
        i = index.get(_identity(row))  # type: ignore[arg-type]
        if i is None:
            plan.ignored += 1
            continue
        found.setdefault(i, []).append(row)
    for i, (variant, _) in enumerate(cells):
        have = found.get(i, [])
        kept = _complete(have) if variant.collective else have[:1]
        if kept:
            plan.kept += kept
        else:
            plan.missing.append(i)
            plan.dropped += len(have)
    return plan


def _complete(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rank, in rank order, when the rows cover every rank of their run; else none."""
    if len(rows) == 1 and rows[0].get("rank") is None:
        return rows  # a single-process row (the variant was skipped there)
    by_rank = {row.get("rank"): row for row in rows if isinstance(row.get("rank"), int)}
    worlds = {row.get("world_size") for row in by_rank.values()}
    if len(worlds) != 1:
        return []
    world = worlds.pop()
    if not isinstance(world, int) or set(by_rank) != set(range(world)):
        return []
    return [by_rank[r] for r in range(world)]


def ordered_rows(cells: Sequence[Cell], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` in the plan's cell order (a cell's rows by rank), rows of no planned cell last."""
    index = {(v.name, s.cell_key): i for i, (v, s) in enumerate(cells)}

    def position(row: dict[str, Any]) -> tuple[int, int]:
        rank = row.get("rank")
        return index.get(_identity(row), len(cells)), rank if isinstance(rank, int) else -1  # type: ignore[arg-type]

    return sorted(rows, key=position)


def attach_row_speedups(rows: list[dict[str, Any]], baseline: str | None) -> None:
    """Set `speedup_vs_baseline` and `speedup_reliable` on serialized rows, as `attach_speedups` does on
    results (rows from several ranks and runs compare by their cell)."""

    def positive(value: Any) -> float | None:
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    cells = [
        SpeedCell(
            row["variant"],
            row_cell_key(row),
            row.get("status") == "ok",
            {key: positive(row.get(key)) for key in SPEED_KEYS},
            bool(row.get("unstable")),
        )
        for row in rows
    ]
    for row, found in zip(rows, speedups(cells, baseline), strict=True):
        row["speedup_vs_baseline"], row["speedup_reliable"] = found if found is not None else (None, None)
