"""`torchrun -m attnprof sweep` on CPU with gloo (2 processes): the cells split across the ranks with each
variant's chain of growing sequence lengths on one rank (so the OOM rule holds there), rows gathered on rank 0,
a stream per rank; `--resume` after a rank died redoes only the missing cells, the OOM rule seeing kept rows."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import yaml
from test_distributed import torchrun

from attnprof.results.files import load_results
from attnprof.results.schema import Document, Row

WORKER = str(Path(__file__).with_name("oom_worker.py"))
VARIANTS = ["sdpa-math", "naive", "inplace"]
SEQS = [32, 64, 128]
HEAD_DIMS = [16, 32]
QUICK = ("--no-timing",)


def config(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "device": "cpu", "dtype": "fp32", "shapes": [{"batch": 1, "heads": 2}], "causal": True,
        "sweep": {"seq": SEQS, "head_dim": HEAD_DIMS}, "variants": VARIANTS, "baseline": "sdpa-math",
        "schedule": {"wait": 0, "warmup": 1, "active": 1}, "output_dir": str(tmp_path / "out"),
    }))
    return path


def cell(row: Row) -> tuple:
    return row.variant, row.seq, row.head_dim


def printed(text: str | bytes) -> Document:
    """The results document `--format json` printed (or results.json holds), typed."""
    return msgspec.json.decode(text, type=Document)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Document, str, Path]:
    """A 2-rank sweep in which naive runs out of memory from seq 64 on."""
    tmp_path = tmp_path_factory.mktemp("sharded-sweep")
    cfg = config(tmp_path)
    done = torchrun(2, WORKER, "64", "--no-plugins", "sweep", str(cfg), *QUICK, "-f", "json")
    assert done.returncode == 0, done.stderr[-3000:]  # out of memory fails no sweep
    (folder,) = (tmp_path / "out").iterdir()
    return folder, printed(done.stdout), done.stderr, cfg


@pytest.mark.slow
def test_each_cell_runs_once_and_each_chain_on_one_rank(sharded) -> None:
    folder, document, stderr, _ = sharded
    assert document == printed((folder / "results.json").read_bytes())  # only rank 0 prints
    rows = document.results
    assert sorted(cell(r) for r in rows) == sorted((v, s, d) for v in VARIANTS for s in SEQS for d in HEAD_DIMS)
    assert [(r.seq, r.variant == "sdpa-math") for r in rows][:2] == [(32, True), (32, False)]  # the plan's order
    chains = {(r.variant, r.head_dim): {x.rank for x in rows if (x.variant, x.head_dim) ==
                                              (r.variant, r.head_dim)} for r in rows}
    assert all(len(ranks) == 1 for ranks in chains.values()), chains
    assert {rank for ranks in chains.values() for rank in ranks} == {0, 1}
    assert all(r.world_size == 2 and r.hostname for r in rows)
    assert document.distributed is not None and document.measure is not None
    assert document.distributed["world_size"] == 2 and document.measure["timing"] is False
    assert "[rank 0] [1/" in stderr and "[rank 1] [1/" in stderr


@pytest.mark.slow
def test_the_oom_rule_holds_on_the_rank_of_the_chain(sharded) -> None:
    _, document, _, _ = sharded
    naive = {(r.seq, r.head_dim): r for r in document.results if r.variant == "naive"}
    for head_dim in HEAD_DIMS:
        assert naive[32, head_dim].status == "ok"
        assert naive[64, head_dim].status.startswith("failed: out of memory")
        assert naive[128, head_dim].status == "skipped: OOM at smaller size (seq 64)"
    ok = [r for r in document.results if r.status == "ok"]
    assert all(r.speedup_vs_baseline is not None for r in ok)  # baselines on the other rank count too


@pytest.mark.slow
def test_each_rank_streams_its_own_rows(sharded) -> None:
    folder, document, _, _ = sharded
    assert document.files is not None
    streams = document.files["rank_streams"]
    assert streams == [str(folder / "results.rank0.jsonl"), str(folder / "results.rank1.jsonl")]
    for rank, path in enumerate(streams):
        stream = load_results(path)
        assert stream.command == "sweep" and stream.header.placement is not None
        assert stream.header.placement["rank"] == rank
        assert sorted(map(cell, stream.rows)) == sorted(cell(r) for r in document.results if r.rank == rank)
    assert not (folder / "results.jsonl").exists()


@pytest.mark.slow
def test_resume_after_a_rank_died_redoes_only_its_cells(sharded, tmp_path: Path) -> None:
    folder, document, _, _ = sharded
    rows = document.results
    # The rank holding a naive chain survived, but died before that chain's seq 128 (its out-of-memory row at 64
    # is kept); the other rank's stream is lost.
    survivor = next(r.rank for r in rows if r.variant == "naive" and r.status.startswith("failed"))
    dead = tmp_path / "dead-run"
    dead.mkdir()
    name = f"results.rank{survivor}.jsonl"
    header, *lines = (folder / name).read_text().splitlines()
    lines = [line for line in lines if not ((r := json.loads(line))["variant"] == "naive" and r["seq"] == 128)]
    (dead / name).write_text("\n".join([header, *lines]) + "\n")
    kept = load_results(dead / name).rows
    done = torchrun(2, "-m", "attnprof", "--no-plugins", "sweep", "--resume", str(dead), "-o", str(tmp_path / "out"),
                    "-f", "json")  # no config, no --no-timing: both are the earlier sweep's
    assert done.returncode == 0, done.stderr[-3000:]
    lost = len(rows) - len(kept)
    assert f"{len(kept)} finished cell(s) kept, {lost} of {len(rows)} to run" in done.stderr
    again = printed(done.stdout)
    assert again.resumed_from == str(dead / name)
    assert sorted(map(cell, again.results)) == sorted(map(cell, rows))  # every cell, once
    assert all(r.timing_method is None for r in again.results)  # --no-timing was taken over
    (resumed,) = (tmp_path / "out").iterdir()
    new = [load_results(resumed / f"results.rank{rank}.jsonl").rows for rank in (0, 1)]
    assert new[0][: len(kept)] == kept  # rank 0's stream starts with the kept rows
    redone = sorted(map(cell, new[0][len(kept):] + new[1]))
    assert redone == sorted(cell(r) for r in rows if cell(r) not in set(map(cell, kept)))
    by_cell = {cell(r): r for r in again.results}
    for row in kept:  # kept as they were
        assert by_cell[cell(row)].trace == row.trace
    for head_dim in HEAD_DIMS:  # this run's naive does not run out of memory: only a kept OOM row skips seq 128
        expected = "skipped: OOM at smaller size (seq 64)" if ("naive", 64, head_dim) in map(cell, kept) else "ok"
        assert by_cell["naive", 128, head_dim].status == expected
    assert "skipped: OOM at smaller size (seq 64)" in [by_cell["naive", 128, d].status for d in HEAD_DIMS]


def test_compare_does_not_resume_a_sweep(cli, write_config, tmp_path: Path) -> None:
    cfg = write_config(sweep={"seq": [32]}, variants=["naive"])
    assert cli("--no-plugins", "sweep", str(cfg), *QUICK).exit_code == 0
    [folder] = (tmp_path / "out").glob("*-sweep")
    refused = cli("--no-plugins", "compare", "--resume", str(folder))
    assert refused.exit_code == 2 and "not the results of a compare" in refused.output
