"""On one CUDA GPU under torchrun (world size 1, NCCL): the sharded compare, and the context-parallel variants
with their communication kernels in the trace.

Run on the device with `python -m pytest -m gpu tests/test_gpu_distributed.py`. Skipped without CUDA.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
import yaml
from test_distributed import torchrun

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LONG = ("--batch", "1", "--heads", "16", "--seq", "16384", "--head-dim", "128")


def compare(tmp_path: Path, *args: str) -> tuple[dict, str]:
    done = torchrun(1, "-m", "attnprof", "--no-plugins", "compare", "--device", "cuda", "--dtype", "bf16",
                    "-o", str(tmp_path), "-f", "json", *args, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a row failed, and says why
    return json.loads(done.stdout), done.stderr


@pytest.fixture(scope="module")
def context_parallel(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("cp")
    document, _ = compare(out, *LONG, "--causal", "--variants", "cp-ring", "--variants", "cp-torch",
                          "--variants", "sdpa-flash", "--baseline", "sdpa-flash")
    return document


def row(document: dict, variant: str) -> dict:
    (found,) = [r for r in document["results"] if r["variant"] == variant]
    return found


def test_the_run_is_one_rank_on_nccl_with_multicast_off(context_parallel: dict) -> None:
    group = context_parallel["distributed"]
    assert group["world_size"] == 1 and group["backend"] == "nccl"
    assert group["environment"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                    "NVSHMEM_DISABLE_NVLS": "1"}
    assert all(r["rank"] == 0 and r["gpu"] and r["device"] == "cuda:0" for r in context_parallel["results"])


def test_the_ring_sends_to_itself_through_nccl_and_is_correct(context_parallel: dict) -> None:
    ring = row(context_parallel, "cp-ring")
    assert ring["status"] == "ok", ring["reason"]
    assert ring["passed"] is True and ring["rel_error"] < 1.5e-2
    comm = ring["comm"]
    assert comm["source"] == "device" and comm["kernels_per_forward"] >= 1, comm
    assert any(name.startswith("nccl") for name in comm["kernels"]), comm
    assert comm["comm_time_us"] > 0 and comm["overlap_pct"] is not None
    with gzip.open(ring["trace"], "rt") as handle:
        assert re.search(r'"name":\s*"(?:void )?nccl\w*Kernel', handle.read())  # in the trace itself
    assert ring["latency_us"] > 0 and ring["speedup_vs_baseline"] is not None


def test_pytorchs_context_parallelism_runs_and_is_correct(context_parallel: dict) -> None:
    cp = row(context_parallel, "cp-torch")
    assert cp["status"] == "ok", cp["reason"]
    assert cp["passed"] is True
    assert cp["comm"] is None  # PyTorch's ring rotates nothing at world size 1 (unlike cp-ring's send to itself)


def test_a_sharded_compare_of_one_rank(tmp_path: Path) -> None:
    document, stderr = compare(tmp_path, "--batch", "4", "--heads", "16", "--seq", "2048", "--head-dim", "64",
                               "--variants", "sdpa-flash", "--variants", "sdpa-math", "--variants", "naive")
    rows = document["results"]
    # the command line's order, as without torchrun
    assert [r["variant"] for r in rows] == ["sdpa-flash", "sdpa-math", "naive"]
    assert all(r["status"] == "ok" and r["rank"] == 0 and r["world_size"] == 1 for r in rows)
    assert all("#0" in r["gpu"] for r in rows)
    folder = Path(document["files"]["dir"])
    stream = [json.loads(line) for line in (folder / "results.rank0.jsonl").read_text().splitlines()]
    assert len(stream) == 1 + len(rows) and "[rank 0] [3/3]" in stderr
    assert all(Path(r["trace"]).parent.name == "rank0" for r in rows)


def test_a_sharded_sweep_of_one_rank_with_the_ring(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node=1 -m attnprof sweep` on NCCL: every cell on rank 0, the ring's collective cells
    among them, its stream `results.rank0.jsonl`, and speed-ups against the baseline in results.json."""
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({
        "device": "cuda", "dtype": "bf16", "shapes": [{"batch": 1, "heads": 16, "head_dim": 128}], "causal": True,
        "sweep": {"seq": [4096, 8192]}, "variants": ["sdpa-flash", "naive", "cp-ring"], "baseline": "sdpa-flash",
        "output_dir": str(tmp_path / "out"),
    }))
    done = torchrun(1, "-m", "attnprof", "--no-plugins", "sweep", str(config), "-f", "json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    rows = document["results"]
    assert sorted((r["variant"], r["seq"]) for r in rows) == sorted(
        (v, s) for v in ("sdpa-flash", "naive", "cp-ring") for s in (4096, 8192))
    assert all(r["status"] == "ok" and r["rank"] == 0 and r["world_size"] == 1 for r in rows), rows
    assert all(r["speedup_vs_baseline"] is not None for r in rows)
    assert document["distributed"]["backend"] == "nccl" and document["distributed"]["ranks"][0]["collective_cells"] == 2
    ring = [r for r in rows if r["variant"] == "cp-ring"]
    assert all(r["passed"] and r["comm"]["kernels_per_forward"] >= 1 for r in ring), ring
    folder = Path(document["files"]["dir"])
    assert document["files"]["rank_streams"] == [str(folder / "results.rank0.jsonl")]
    assert len((folder / "results.rank0.jsonl").read_text().splitlines()) == 1 + len(rows)
