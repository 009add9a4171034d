"""Where a run's cells run and its rows go: the ranks of a torchrun group, an earlier run it resumes, or
this one process alone; every job of the engine (`pipeline.engine.run_job`) comes through here.

Every rank runs `run_sharded` with the same `Job`:

1. the ranks check that they planned the same cells and kept the same rows of the run they resume
   (their configs, plugins, devices or resumed folders may differ);
2. rank 0 opens the run folder and sends it to every rank;
3. the cells without a kept row are shared out: collective cells (`Variant.collective`: one forward
   across all ranks) run first, on every rank together; the others are split by estimated cost
   (`pipeline.sharding`), cells with one `keep_together` key on one rank (a sweep's chain of growing
   sequence lengths), and each rank runs its share (`RunShare`: the engine's `run_share`) on its own GPU,
   its traces in
   `traces/rank{R}/`;
4. each rank appends every finished row to its own stream, `results.rank{R}.jsonl` (rank 0's starts
   with the kept rows), so a rank that dies loses only the cell it was running (`--resume` redoes
   the rest);
5. rank 0 gathers every rank's rows and writes the one `results.json` and `results.csv`, the rows in
   the plan's order with their speed-ups and percentages' references computed over all of them
   (`pipeline.references`; and each dense-mask row joined with
   its alternative's cell, `pipeline.mask_alternatives`); every row names its rank, host
   and GPU, and the document's `distributed` section each rank's share.

A single process (no group) runs every cell itself, in `traces/`, streaming to `results.jsonl` in a
sweep; it writes the same `results.json` and `results.csv` (with `resumed_from` null when it resumes
nothing). Ctrl-C before any row finished writes nothing: the folder is removed again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from msgspec.structs import replace

from attnprof.config import Config, MeasureOptions
from attnprof.errors import AttnprofError, DistributedError
from attnprof.pipeline.best_known import attach_best_known
from attnprof.pipeline.distributed import MULTICAST_OFF
from attnprof.pipeline.fp8_compare import attach_fp8_comparisons
from attnprof.pipeline.mask_alternatives import attach_row_alternatives
from attnprof.pipeline.measured import CellResult, Placement
from attnprof.pipeline.references import attach_references
from attnprof.pipeline.resume import (
    STREAM_NAME,
    attach_row_speedups,
    ordered_rows,
    rank_stream_name,
    still_to_run,
)
from attnprof.pipeline.run import Cell, RunFolder, RunOutcome, open_run_folder, rows_exit_code
from attnprof.pipeline.sharding import Split, cell_cost, cell_name, split_cells
from attnprof.pipeline.sweep import chain_key
from attnprof.registry import RunSpec, Variant
from attnprof.results.schema import Document, Row

if TYPE_CHECKING:
    from attnprof.pipeline.distributed import Group
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.results.files import ResultsFile

T = TypeVar("T")


@dataclass
class Job:
    """What every rank runs: the whole plan (`cells`), the rows kept from the run it resumes
    (`previous`), and whether it is a sweep (`pipeline.engine` runs each dtype's cells under the OOM rule;
    a single process streams its rows; a chain of growing sequence lengths stays on one rank; a row that
    ran out of memory does not fail the run)."""

    command: str
    config: Config
    device: str
    measure: MeasureOptions
    cells: list[Cell]
    previous: ResultsFile | None = None
    kept: list[Row] = field(default_factory=list)
    sweep: bool = False

    @property
    def keep_together(self) -> Callable[[Variant, RunSpec], Hashable] | None:
        """The split's key of cells that stay on one rank: a sweep's chain (the OOM rule follows it)."""
        return (lambda variant, spec: chain_key(variant.name, spec)) if self.sweep else None

    @property
    def out_of_memory_fails(self) -> bool:
        """Whether a row that ran out of memory fails the run (not in a sweep)."""
        return not self.sweep


@dataclass
class Share:
    """What one rank's share produced: its results, whether Ctrl-C cut it short, the matmul ceiling
    of each dtype it measured, and (--ncu) what its Nsight Compute passes did."""

    results: list[CellResult]
    interrupted: bool
    ceilings: dict[str, RunCeiling] = field(default_factory=dict)
    counters: dict[str, Any] | None = None  # --ncu: what its Nsight Compute passes did (`CounterCollector.summary`)


#: Takes each finished result of this rank: sets its placement and streams its row.
Recorder = Callable[[CellResult], None]
#: Runs this rank's cells: (its cells, the kept rows, its traces folder, the Recorder) -> its Share.
RunShare = Callable[[list[Cell], list[Row], Path, Recorder], Share]


def _on_main(group: Group | None, make: Callable[[], T]) -> T:
    return make() if group is None else group.broadcast(make)


def _check_same_plan(names: list[str], group: Group) -> None:
    differs = group.broadcast(lambda: names) != names
    if group.agree_max(int(differs)):
        raise DistributedError(
            "the ranks planned different cells (their configs, plugins, devices or resumed folders differ)",
            hint="run every rank with the same config and attnprof plugins; --resume needs the folder on every node",
        )


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
    job: Job, group: Group | None, run_share: RunShare, where: Placement | None = None
) -> tuple[RunOutcome | None, int]:
    """Run `job` as the module docstring says; (the outcome on rank 0, None elsewhere; the exit code,
    the same on every rank). `where` is this rank's placement, set on each of its rows. Ctrl-C before any
    row finished (none kept from a resumed run either) removes the run's folder again and raises
    NothingFinishedError: no 0-row results file is left behind."""
    todo = still_to_run(job.cells, job.kept)
    if group is not None:
        _check_same_plan([cell_name(v.name, s) for v, s in job.cells] + [str(i) for i in todo], group)
    folder = _on_main(group, lambda: open_run_folder(Path(job.config.output_dir), job.command))
    recorded: list[CellResult] = []
    try:
        return _run_in_folder(job, group, run_share, where, folder, todo, recorded)
    except KeyboardInterrupt:  # outside the cells' loop: the environment, the stream's header, the gather
        if (group is None or group.ctx.is_main) and not job.kept and not recorded:
            raise folder.discard() from None
        raise


def _run_in_folder(
    job: Job,
    group: Group | None,
    run_share: RunShare,
    where: Placement | None,
    folder: RunFolder,
    todo: list[int],
    recorded: list[CellResult],
) -> tuple[RunOutcome | None, int]:
    """`run_sharded` once the folder is open: this rank's share run and streamed (each finished result
    also put in `recorded`), then the rows gathered and written by rank 0."""
    from attnprof.pipeline.rows import cell_row
    from attnprof.profiling.environment import collect_environment
    from attnprof.results.files import ResultsStream, stream_header

    rank = 0 if group is None else group.ctx.rank
    world = 1 if group is None else group.ctx.world_size
    collective, split = share_of(job.cells, todo, world, job.keep_together)
    mine = collective + split.shards[rank]
    trace_dir = folder.traces if group is None else folder.traces / f"rank{rank}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    streams = _stream_paths(folder, group, job.sweep)
    environment = collect_environment(job.device)
    stream = None
    if streams:
        header = stream_header(_document(job, folder, environment, [], False, {}, streams, group is not None))
        stream = ResultsStream(Path(streams[rank]), replace(header, placement=None if where is None else asdict(where)))
        for row in job.kept if rank == 0 else []:
            stream.append(row)

    def record(result: CellResult) -> None:
        result.placement = where
        recorded.append(result)
        if stream is not None:
            stream.append(cell_row(result))

    failure: AttnprofError | None = None
    share = Share([], False)
    try:
        share = run_share([job.cells[i] for i in mine], job.kept, trace_dir, record)
    except AttnprofError as exc:  # the others must not wait for this rank: its error goes to rank 0
        failure = exc
    finally:
        if stream is not None:
            stream.close()
    estimated_s = split.costs[rank] + sum(cell_cost(job.cells[i][1]) for i in collective)
    sent: dict[str, Any] = {
        "rank": rank,
        "rows": [cell_row(r) for r in share.results],
        "interrupted": share.interrupted,
        "error": failure,
        "placement": None if where is None else asdict(where),
        "cells": len(mine),
        "collective_cells": len(collective),
        "estimated_s": round(estimated_s, 1),
        "ceilings": {dtype: ceiling.current.to_dict() for dtype, ceiling in share.ceilings.items()},
        "counters": share.counters,
    }
    shares = [sent] if group is None else group.gather(sent)
    made: dict[str, RunOutcome] = {}

    def finish() -> int:
        assert shares is not None
        rows = ordered_rows(job.cells, job.kept + [row for s in shares for row in s["rows"]])
        interrupted = any(s["interrupted"] for s in shares)
        if interrupted and not rows:
            raise folder.discard()
        attach_row_speedups(rows, job.config.baseline)
        attach_references(rows)  # one reference per device for every percentage of the run
        attach_best_known(rows)  # the run's fastest variant at each cell, its findings judged against it
        attach_fp8_comparisons(rows)  # an fp8 row against the fastest bf16 row of its shape: fp8-not-faster
        attach_row_alternatives(rows)
        ceilings: dict[str, Any] = {}
        for s in shares:
            ceilings = s["ceilings"] | ceilings  # rank 0's first, then the lowest rank that measured one
        document = _document(job, folder, environment, rows, interrupted, ceilings, streams, group is not None)
        if group is not None:
            document.distributed = _distributed(group, shares)
        if job.measure.ncu:
            document.ncu = share.counters
        _write(folder, document)
        made["outcome"] = RunOutcome(job.command, share.results, document, folder, interrupted)
        failed = next((s for s in shares if s["error"] is not None), None)
        if failed is not None:
            error = failed["error"]
            raise error if group is None else type(error)(f"rank {failed['rank']}: {error.message}", error.hint)
        return rows_exit_code(rows, interrupted, job.out_of_memory_fails)

    code = _on_main(group, finish)  # only the exit code travels; rank 0 keeps the outcome
    return made.get("outcome"), code


def _stream_paths(folder: RunFolder, group: Group | None, alone: bool) -> list[str]:
    """The results streams of the run, by rank: one per rank in a group, `results.jsonl` alone when the
    job streams, else none."""
    if group is not None:
        return [str(folder.dir / rank_stream_name(r)) for r in range(group.ctx.world_size)]
    return [str(folder.dir / STREAM_NAME)] if alone else []


def _document(
    job: Job,
    folder: RunFolder,
    environment: dict[str, Any],
    rows: list[Row],
    interrupted: bool,
    ceilings: dict[str, Any],
    streams: list[str],
    grouped: bool,
) -> Document:
    """The results document: the rows, the measurement options and what the run resumed (so a later
    `--resume` can check it continues alike), the ceiling (one dtype) or `ceilings` by dtype, and the
    streams among its files (`results_jsonl` of a single process, `rank_streams` of a group)."""
    from attnprof.pipeline.rows import results_document

    files: dict[str, Any] = folder.to_dict()
    if grouped:
        files["rank_streams"] = streams
    elif streams:
        files["results_jsonl"] = streams[0]
    document = results_document(job.command, job.config, environment, None, rows, interrupted, files=files)
    document.ceiling = next(iter(ceilings.values())) if len(ceilings) == 1 else None
    document.measure = job.measure.model_dump(mode="json")
    document.resumed_from = str(job.previous.path) if job.previous is not None else None
    if len(ceilings) > 1:
        document.ceilings = ceilings
    return document


def _write(folder: RunFolder, document: Document) -> None:
    """`results.json` and `results.csv` of every row of the document."""
    from attnprof.results.files import write_csv, write_json

    write_json(folder.results_json, document)
    write_csv(folder.results_csv, document.results)


def _distributed(group: Group, shares: list[dict[str, Any]]) -> dict[str, Any]:
    """The document's `distributed` section: the group, its environment and each rank's share."""
    ranks = [
        {key: s[key] for key in ("rank", "cells", "collective_cells", "estimated_s", "interrupted")}
        | (s["placement"] or {})
        | {"ceilings": {dtype: c["tflops"] for dtype, c in s["ceilings"].items()}}
        for s in shares
    ]
    return {
        "world_size": group.ctx.world_size,
        "backend": group.backend,
        "environment": {name: os.environ.get(name) for name in MULTICAST_OFF},
        "split": "longest estimated cost first, each cell to the least loaded rank (pipeline.sharding)",
        "ranks": ranks,
    }
