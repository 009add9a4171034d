"""The one engine (`pipeline.engine.run_job`) on CPU: compare, sweep and a resume of a compare take one path, so
they end with the same rows on a tiny config; the engine prints nothing and tells its Watcher what happens;
a failing variant keeps the others' rows, and an out-of-memory row fails a compare, not a sweep."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.pipeline import plan_cells
from attnprof.pipeline.engine import Job, resume_rows, run_job
from attnprof.pipeline.resume import open_previous
from attnprof.pipeline.sweep import plan_sweep
from attnprof.plugins import load_variants
from attnprof.results.files import to_builtins

SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
FAST = MeasureOptions(min_time_s=0.02)
UNTIMED = MeasureOptions(timing=False)
SPEED = ("speedup_vs_baseline", "speedup_reliable")
#: Computed again over the old and new rows of a resumed run, as the speed-ups are (`pipeline.best_known`).
BEST_KNOWN = (
    *("best_known_variant", "best_known_latency_us", "pct_of_best_known", "best_known_basis", "best_known_source"),
)


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(device="cpu", dtype="fp32", shapes=[SHAPE], variants=["naive", "sdpa-math"], baseline="sdpa-math",
                  schedule=Schedule(wait=0, warmup=1, active=2), output_dir=tmp_path)


def variants():
    registry = load_variants(no_plugins=True).registry
    return [registry.get("naive"), registry.get("sdpa-math")]


class Seen:
    """A Watcher that keeps what it was told."""

    def __init__(self):
        self.events = []

    def ceiling(self, ceiling):
        self.events.append(("ceiling", ceiling.dtype))

    def ceiling_replaced(self, ceiling, beaten):
        self.events.append(("ceiling replaced", ceiling.dtype))

    @contextmanager
    def cells(self, total, time_left):
        self.events.append(("cells", total, time_left is not None))
        yield self

    def on_start(self, index, total, variant, spec):
        self.events.append(("start", index, total, variant.name))

    def on_done(self, result):
        self.events.append(("done", result.variant, result.status))


def by_cell(document):
    """Each row, less its measured numbers' noise: variant, cell, status and reason, by variant and cell."""
    return {(r.variant, r.seq, r.mode, r.dtype): (r.status, r.reason) for r in document.results}


def test_compare_and_sweep_run_the_same_cells_through_one_path(config, capsys) -> None:
    cells = plan_cells(config, variants(), "cpu")
    sweep_cells, _ = plan_sweep(config, variants(), "cpu")
    compared, swept = Seen(), Seen()
    compare, compare_code = run_job(Job("compare", config, "cpu", FAST, cells), compared)
    sweep, sweep_code = run_job(Job("sweep", config, "cpu", FAST, sweep_cells, sweep=True), swept)
    assert compare is not None and sweep is not None and compare_code == sweep_code == 0
    assert by_cell(compare.document) == by_cell(sweep.document) == {
        ("naive", 32, "fwd", "fp32"): ("ok", None),
        ("sdpa-math", 32, "fwd", "fp32"): ("ok", None),
    }
    for seen, outcome, planned in ((compared, compare, cells), (swept, sweep, sweep_cells)):
        assert seen.events[:2] == [("cells", 2, seen is swept), ("ceiling", "fp32")]  # only a sweep estimates
        starts = [("start", i, 2, variant.name) for i, (variant, _) in enumerate(planned)]
        assert [e for e in seen.events if e[0] == "start"] == starts
        assert [e[1:] for e in seen.events if e[0] == "done"] == [(r.variant, "ok") for r in outcome.results]
        assert all(r.speedup_vs_baseline is not None for r in outcome.document.results)
    stream = (sweep.folder.dir / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["variant"] for line in stream[1:]] == ["sdpa-math", "naive"]  # baseline first
    assert compare.document.files is not None and "results_jsonl" not in compare.document.files
    assert not (compare.folder.dir / "results.jsonl").exists()
    assert capsys.readouterr() == ("", "")  # the engine prints nothing: the CLI's Watcher shows what it says


def test_a_resumed_compare_ends_as_a_straight_one(config) -> None:
    cells = plan_cells(config, variants(), "cpu")
    straight, _ = run_job(Job("compare", config, "cpu", FAST, cells))

    def interrupt(*args):
        raise KeyboardInterrupt

    cut_short = [cells[0], (replace(cells[1][0], forward=interrupt), cells[1][1])]
    first, code = run_job(Job("compare", config, "cpu", FAST, cut_short))
    assert first is not None and code == 130 and first.interrupted
    assert [r.variant for r in first.document.results] == ["naive"]

    previous = open_previous(first.folder.dir, "compare")
    resumed = resume_rows(previous, config, FAST, "cpu", cells)
    assert (len(resumed.rows), resumed.to_run, resumed.planned, resumed.announce) == (1, 1, 2, True)
    seen = Seen()
    final, code = run_job(Job("compare", config, "cpu", FAST, cells, previous, resumed.rows), seen)
    assert final is not None and code == 0 and not final.interrupted
    assert by_cell(final.document) == by_cell(straight.document)
    assert [e for e in seen.events if e[0] == "start"] == [("start", 0, 1, "sdpa-math")]  # only the missing cell
    kept, again = to_builtins(final.document.results[0]), to_builtins(first.document.results[0])
    redone = SPEED + BEST_KNOWN
    assert {k: v for k, v in kept.items() if k not in redone} == {k: v for k, v in again.items() if k not in redone}
    assert kept["speedup_vs_baseline"] is not None  # computed again over old and new rows
    assert again["best_known_variant"] is None and kept["best_known_variant"] is not None  # two variants now
    assert final.document.resumed_from == str(previous.path)


@pytest.mark.parametrize(("error", "compare_code", "sweep_code"), [
    (RuntimeError("boom"), 1, 1),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64 GiB"), 1, 0),  # a sweep's OOM is a result
])
def test_a_failing_variant_keeps_the_others(config, error, compare_code, sweep_code) -> None:
    def fail(*args):
        raise error

    naive, sdpa = variants()
    broken = [replace(naive, forward=fail), sdpa]
    codes = []
    plans = (("compare", plan_cells(config, broken, "cpu")), ("sweep", plan_sweep(config, broken, "cpu")[0]))
    for command, cells in plans:
        outcome, code = run_job(Job(command, config, "cpu", UNTIMED, cells, sweep=command == "sweep"))
        assert outcome is not None
        rows = by_cell(outcome.document)
        assert rows[("sdpa-math", 32, "fwd", "fp32")] == ("ok", None)
        status, reason = rows[("naive", 32, "fwd", "fp32")]
        assert status.startswith("failed") and "\n" not in status + reason
        codes.append(code)
    assert codes == [compare_code, sweep_code]
