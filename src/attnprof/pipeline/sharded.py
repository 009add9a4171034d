"""A run over the ranks of a torchrun group, and a run that resumes an earlier one's folder.

Under torchrun every rank runs `run_sharded` with the same plan:

1. the ranks check that they planned the same cells (their configs, plugins or devices may differ);
2. rank 0 opens the run folder (or, with `resume`, reads the rows already in it: `pipeline.resume`)
   and sends the folder and the cells still to run to every rank;
3. collective cells (`Variant.collective`: one forward across all ranks) run first, on every rank
   together; the other cells are split by estimated cost (`pipeline.sharding`), each rank running
   its share on its own GPU, its traces in `traces/rank{R}/`;
4. each rank appends every finished row to its own stream, `results.rank{R}.jsonl` in the run
   folder, so a rank that dies loses only the cell it was running (`--resume` redoes the rest);
5. rank 0 gathers every rank's rows and writes the one `results.json` and `results.csv`; every row
   names its rank, host and GPU, and the document's `distributed` section each rank's share.

Without a group (a single process), `run_sharded` is the `--resume` of a single-process run: the
cells that miss a row run, and the results files (`results-2.json`, ...) hold the old rows and the
new ones. A single process without `--resume` never comes here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from attnprof.config import Config, MeasureOptions
from attnprof.errors import AttnprofError, DistributedError
from attnprof.pipeline.distributed import MULTICAST_OFF
from attnprof.pipeline.resume import ResumePlan, folder_rows, ordered_rows, resume_plan
from attnprof.pipeline.run import Cell, RunFolder, RunOutcome, finish_rows, open_run_folder, resume_folder, run_cells
from attnprof.pipeline.sharding import Split, cell_cost, cell_name, split_cells
from attnprof.registry import RunSpec, Variant
from attnprof.results import CellResult, Placement

if TYPE_CHECKING:
    from attnprof.pipeline.distributed import Group
    from attnprof.profiling.ceiling import RunCeiling

T = TypeVar("T")


def _on_main(group: Group | None, make: Callable[[], T]) -> T:
    return make() if group is None else group.broadcast(make)


def _check_same_plan(cells: list[Cell], group: Group) -> list[str]:
    names = [cell_name(v.name, s) for v, s in cells]
    differs = group.broadcast(lambda: names) != names
    if group.agree_max(int(differs)):
        raise DistributedError(
            "the ranks planned different cells (their configs, plugins or devices differ)",
            hint="run every rank with the same config and the same attnprof plugins installed",
        )
    return names


def share_of(
    cells: list[Cell],
    todo: list[int],
    world_size: int,
    keep_together: Callable[[Variant, RunSpec], Hashable] | None = None,
) -> tuple[list[int], Split]:
    """The collective cells among `todo` (every rank runs them), and the split of the others (cells with
    one `keep_together` key on one rank)."""
    collective = [i for i in todo if cells[i][0].collective]
    spread = [i for i in todo if not cells[i][0].collective]
    group = None if keep_together is None else (lambda j: keep_together(*cells[spread[j]]))
    split = split_cells(
        [cell_name(cells[i][0].name, cells[i][1]) for i in spread],
        [cell_cost(cells[i][1]) for i in spread],
        world_size,
        group,
    )
    return collective, Split([[spread[j] for j in shard] for shard in split.shards], split.costs)


def run_sharded(
    command: str,
    config: Config,
    cells: list[Cell],
    device: str,
    measure: MeasureOptions,
    group: Group | None,
    *,
    resume: Path | None = None,
    ceiling: RunCeiling | None = None,
    where: Placement | None = None,
    on_start: Callable[[int, int, Variant, RunSpec], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
    keep_together: Callable[[Variant, RunSpec], Hashable] | None = None,
) -> tuple[RunOutcome | None, int]:
    """Run `cells` as the module docstring says; (the outcome on rank 0, None elsewhere; the exit code,
    the same on every rank). `where` is this rank's placement, set on each of its rows; cells with one
    `keep_together(variant, spec)` key run on one rank (a sweep's chain of growing sequences)."""
    from attnprof.report.serialize import json_entry

    rank = 0 if group is None else group.ctx.rank
    world = 1 if group is None else group.ctx.world_size
    if group is not None:
        _check_same_plan(cells, group)
    kept: dict[str, Any] = {}

    def prepare() -> tuple[RunFolder, list[int]]:
        folder = resume_folder(resume) if resume else open_run_folder(Path(config.output_dir), command)
        plan = resume_plan(cells, folder_rows(resume)) if resume else ResumePlan(missing=list(range(len(cells))))
        kept["plan"] = plan
        return folder, plan.missing

    folder, todo = _on_main(group, prepare)
    collective, split = share_of(cells, todo, world, keep_together)
    mine = collective + split.shards[rank]
    trace_dir = folder.traces if group is None else folder.traces / f"rank{rank}"
    stream = None
    if group is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        stream = _open_stream(command, config, device, ceiling, folder, rank, where)

    def done(result: CellResult) -> None:
        result.placement = where
        if stream is not None:
            stream.append(json_entry(result))
        if on_done:
            on_done(result)

    failure: AttnprofError | None = None
    results: list[CellResult] = []
    interrupted = False
    try:
        results, interrupted = run_cells(
            [cells[i] for i in mine], config, measure, ceiling, on_start, done, trace_dir, group
        )
    except AttnprofError as exc:  # the others must not wait for this rank: its error goes to rank 0
        failure = exc
    finally:
        if stream is not None:
            stream.close()
    share: dict[str, Any] = {
        "rank": rank,
        "rows": [json_entry(r) for r in results],
        "interrupted": interrupted,
        "error": failure,
        "placement": None if where is None else asdict(where),
        "cells": len(mine),
        "collective_cells": len(collective),
        "estimated_s": round(split.costs[rank] + sum(cell_cost(cells[i][1]) for i in collective), 1),
    }
    shares: list[dict[str, Any]] | None = [share] if group is None else group.gather(share)

    def finish() -> int:
        assert shares is not None
        plan = kept["plan"]
        rows = ordered_rows(cells, plan.kept + [row for s in shares for row in s["rows"]])
        outcome = finish_rows(
            command,
            config,
            device,
            rows,
            ceiling.current if ceiling is not None else None,
            any(s["interrupted"] for s in shares),
            folder,
            _summary(group, shares, plan, resume),
            results,
        )
        kept["outcome"] = outcome
        failed = next((s for s in shares if s["error"] is not None), None)
        if failed is not None and group is not None:
            error = failed["error"]
            raise type(error)(f"rank {failed['rank']}: {error.message}", error.hint)
        if failed is not None:
            raise failed["error"]
        return outcome.exit_code

    code = _on_main(group, finish)  # only the exit code travels; rank 0 keeps the outcome
    return kept.get("outcome"), code


def _open_stream(
    command: str,
    config: Config,
    device: str,
    ceiling: RunCeiling | None,
    folder: RunFolder,
    rank: int,
    where: Placement | None,
) -> Any:
    """This rank's results stream in the run folder, its header written."""
    from attnprof.profiling.environment import collect_environment
    from attnprof.report.export import ResultsStream
    from attnprof.report.results_file import stream_header
    from attnprof.report.serialize import results_document

    current = ceiling.current if ceiling is not None else None
    document = results_document(
        command, config, collect_environment(device), current, [], False, files=folder.to_dict()
    )
    header = stream_header(document) | {"placement": None if where is None else asdict(where)}
    return ResultsStream(folder.dir / f"results.rank{rank}.jsonl", header)


def _summary(
    group: Group | None, shares: list[dict[str, Any]], plan: ResumePlan, resume: Path | None
) -> dict[str, Any]:
    """The document's `resumed` section (with `resume`) and `distributed` section (under torchrun):
    what was kept and run again, the group and each rank's share."""
    extra: dict[str, Any] = {}
    if resume is not None:
        extra["resumed"] = {
            "from": str(resume),
            "kept_rows": len(plan.kept),
            "cells_run": len(plan.missing),
            "rows_of_other_cells": plan.ignored,
            "partial_rows_dropped": plan.dropped,
        }
    if group is None:
        return extra
    ranks = [
        {key: s[key] for key in ("rank", "cells", "collective_cells", "estimated_s", "interrupted")}
        | (s["placement"] or {})
        for s in shares
    ]
    extra["distributed"] = {
        "world_size": group.ctx.world_size,
        "backend": group.backend,
        "environment": {name: os.environ.get(name) for name in MULTICAST_OFF},
        "split": "longest estimated cost first, each cell to the least loaded rank (pipeline.sharding)",
        "ranks": ranks,
    }
    return extra
