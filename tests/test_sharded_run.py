"""`torchrun -m attnprof compare` on CPU with gloo (2 processes): cells split across the ranks and each run
once, rows gathered on rank 0 into one results file, a stream per rank, cp-ring on every rank; `--resume`
after a rank died redoes only the missing cells (in a new folder); a single process resumes from its results.json."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_distributed import torchrun

from attnprof.results.files import load_results
from attnprof.results.schema import Row

SHAPE = {"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}
SPREAD = ["sdpa-math", "naive", "inplace"]  # split across the ranks
FAST = ("--min-time", "0.02", "--contention-retimes", "0")  # the ranks share the box with the suite: no calm waits


def config(tmp_path: Path, variants: list[str]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "device": "cpu", "dtype": "fp32", "shapes": [SHAPE], "causal": True, "variants": variants,
        "baseline": "sdpa-math", "schedule": {"wait": 0, "warmup": 1, "active": 2},
        "output_dir": str(tmp_path / "out"),
    }))
    return path


def run_folder(tmp_path: Path) -> Path:
    (folder,) = (tmp_path / "out").iterdir()
    return folder


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, Path]:
    tmp_path = tmp_path_factory.mktemp("sharded")
    cfg = config(tmp_path, [*SPREAD, "cp-ring"])
    done = torchrun(2, "-m", "attnprof", "--no-plugins", "compare", str(cfg), *FAST, "-f", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_folder(tmp_path), done, cfg


def rows_of(path: Path) -> list[Row]:
    return load_results(path).rows


@pytest.mark.slow
def test_every_cell_runs_once_and_rank_0_writes_one_results_file(sharded) -> None:
    folder, done, _ = sharded
    document = json.loads(done.stdout)  # only rank 0 prints, and only the document
    assert document == json.loads((folder / "results.json").read_text())
    rows = rows_of(folder / "results.json")
    spread = [r for r in rows if r.variant in SPREAD]
    assert sorted(r.variant for r in spread) == sorted(SPREAD)  # each exactly once
    assert {r.rank for r in spread} == {0, 1}  # both ranks got a share
    assert all(r.status == "ok" and r.world_size == 2 and r.hostname for r in rows)
    ring = [r for r in rows if r.variant == "cp-ring"]
    assert [r.rank for r in ring] == [0, 1] and all(r.passed for r in ring)
    assert all(r.correctness_scope == "this process's 32 of 64 query rows" for r in ring)
    assert all(r.comm.source == "cpu ops" and r.comm.ops_per_forward == 2 for r in ring)
    assert [r.variant for r in rows][:2] == ["sdpa-math", "naive"]  # the plan's order, not the ranks'
    assert next(r for r in rows if r.variant == "sdpa-math").speedup_vs_baseline == 1.0
    assert all(r.speedup_vs_baseline is not None for r in rows)  # across ranks: cells compare by their key
    ranks = document["distributed"]["ranks"]
    assert document["distributed"]["world_size"] == 2 and [r["rank"] for r in ranks] == [0, 1]
    assert sum(r["cells"] for r in ranks) == len(SPREAD) + 2 and all(r["collective_cells"] == 1 for r in ranks)
    with (folder / "results.csv").open() as handle:
        assert [row["rank"] for row in csv.DictReader(handle)] == [str(r.rank) for r in rows]


@pytest.mark.slow
def test_each_rank_streams_its_rows_and_keeps_its_traces(sharded) -> None:
    folder, done, _ = sharded
    assert json.loads(done.stdout) == json.loads((folder / "results.json").read_text())
    rows = rows_of(folder / "results.json")
    for rank in (0, 1):
        stream = load_results(folder / f"results.rank{rank}.jsonl")
        assert stream.header.format == "attnprof-results-jsonl" and stream.header.placement is not None
        assert stream.header.placement["rank"] == rank
        mine = [(r.variant, r.rank) for r in rows if r.rank == rank]
        assert sorted((r.variant, r.rank) for r in stream.rows) == sorted(mine)
        traces = {p.name for p in (folder / "traces" / f"rank{rank}").iterdir()}
        assert {Path(r.trace).name for r in rows if r.rank == rank} == traces
    assert "[rank 0] [1/" in done.stderr and "[rank 1] [1/" in done.stderr


@pytest.mark.slow
def test_resume_after_a_rank_died_redoes_only_the_missing_cells(sharded, tmp_path: Path) -> None:
    folder, _, cfg = sharded
    # Rank 1 died: only rank 0's stream is left, and rank 0 never wrote results.json.
    dead = tmp_path / "dead-run"
    dead.mkdir()
    shutil.copy(folder / "results.rank0.jsonl", dead)
    survived = rows_of(dead / "results.rank0.jsonl")
    done = torchrun(2, "-m", "attnprof", "--no-plugins", "compare", str(cfg), *FAST, "--resume", str(dead),
                    "-o", str(tmp_path / "again"), "-f", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    (resumed,) = (tmp_path / "again").iterdir()
    document = json.loads((resumed / "results.json").read_text())
    rows = rows_of(resumed / "results.json")
    assert sorted(r.variant for r in rows) == sorted([*SPREAD, "cp-ring", "cp-ring"])
    kept = [r for r in survived if r.variant in SPREAD]
    for old in kept:  # rank 0's finished cells are kept as they were
        new = next(r for r in rows if r.variant == old.variant)
        assert new.latency_us == old.latency_us and new.trace == old.trace
    new_rows = rows_of(resumed / "results.rank0.jsonl")[len(kept):] + rows_of(resumed / "results.rank1.jsonl")
    redone = sorted(r.variant for r in new_rows)
    # cp-ring had only rank 0's row: incomplete, so both ranks ran it again; of the rest only what rank 1 held.
    assert redone == sorted(["cp-ring", "cp-ring", *(v for v in SPREAD if v not in {r.variant for r in kept})])
    assert document["resumed_from"] == str(dead / "results.rank0.jsonl")
    assert f"{len(kept)} finished cell(s) kept, {len(redone) - 1} of {len(SPREAD) + 1} to run" in done.stderr


def test_a_single_process_resumes_from_its_results_json(cli, write_config, tmp_path: Path) -> None:
    cfg = write_config(variants=["sdpa-math", "naive"])
    first = cli("--no-plugins", "compare", str(cfg), "--no-timing", "-f", "json")
    assert first.exit_code == 0, first.output
    folder = run_folder(tmp_path)
    assert json.loads((folder / "results.json").read_text())["measure"]["timing"] is False
    # An interrupted run: only the first row made it into results.json.
    partial = tmp_path / "partial"
    partial.mkdir()
    document = json.loads((folder / "results.json").read_text())
    document["results"] = document["results"][:1]
    document["interrupted"] = True
    (partial / "results.json").write_text(json.dumps(document))
    again = cli("--no-plugins", "compare", "--resume", str(partial), "-o", str(tmp_path / "again"), "-f", "json")
    assert again.exit_code == 0, again.output  # no config and no --no-timing: both are the earlier run's
    assert "1 finished cell(s) kept, 1 of 2 to run" in again.stderr
    merged = json.loads(again.stdout)
    assert [r["variant"] for r in merged["results"]] == ["sdpa-math", "naive"]
    assert merged["results"][0]["trace"] == document["results"][0]["trace"]  # kept, not run again
    assert merged["results"][1]["timing_method"] is None  # --no-timing was taken over
    resumed = Path(merged["files"]["dir"])
    assert [p.name for p in (resumed / "traces").iterdir()] == [Path(merged["results"][1]["trace"]).name]
    assert merged["resumed_from"] == str(partial / "results.json")
    assert merged["distributed"] is None and merged["results"][1]["rank"] is None  # a single process: no ranks
    assert not list(resumed.glob("*.jsonl"))  # a compare of one process streams nothing
    other = cli("--no-plugins", "compare", "--resume", str(partial), "--seed", "3")
    assert other.exit_code == 2 and "seed 0 (now 3)" in other.output


def test_resume_needs_results(cli, write_config, tmp_path: Path) -> None:
    cfg = write_config(variants=["naive"])
    missing = cli("--no-plugins", "compare", str(cfg), "--resume", str(tmp_path / "nowhere"))
    assert missing.exit_code == 2 and "no such results file" in missing.output
    (tmp_path / "empty").mkdir()
    empty = cli("--no-plugins", "compare", str(cfg), "--resume", str(tmp_path / "empty"))
    assert empty.exit_code == 2 and "no results in it" in empty.output
