"""torchrun support on CPU with gloo: the environment, the process group's helpers, the ring's agreement
with single-process attention (world sizes 2 and 1), and timing that the ranks agree on.

The process-group checks run in real torchrun processes (tests/dist_worker.py), each rank writing what it
saw; the tests here read it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from attnprof.errors import ConfigError, DistributedError
from attnprof.pipeline import distributed
from attnprof.registry import RunSpec
from attnprof.variants.context_parallel import NO_GROUP, check_ring, check_torch
from attnprof.variants.ring import shard_rows

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("dist_worker.py")


def free_port() -> int:
    """A TCP port nobody listens on now (torchrun's MASTER_PORT for one test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env() -> dict[str, str]:
    """The environment for a torchrun child: this tree's sources first, one OpenMP thread per rank
    (the CPU attention kernels crawl when 2 ranks each spin 2 threads on 2 shared cores), and NVLink
    multicast off (on a GPU host it must stay off in every process)."""
    env = {k: v for k, v in os.environ.items() if k not in distributed.TORCHRUN_VARIABLES}
    distributed.multicast_off(env)
    paths = [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]
    return env | {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "OMP_NUM_THREADS": "1"}


def torchrun(nproc: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node=N --master-port=FREE ARGS` (python -m torch.distributed.run)."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               f"--master-port={free_port()}", *args]
    return subprocess.run(command, env=torchrun_env(), capture_output=True, text=True, timeout=timeout)


def test_detect_reads_torchrun_environment() -> None:
    assert distributed.detect({}) is None
    ctx = distributed.detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert ctx is not None and (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size) == (3, 4, 1, 2)
    assert not ctx.is_main and ctx.hostname
    single = distributed.detect({"RANK": "0", "WORLD_SIZE": "1"})
    assert single is not None and single.is_main and single.local_world_size == 1
    with pytest.raises(DistributedError, match="not whole numbers"):
        distributed.detect({"RANK": "zero", "WORLD_SIZE": "2"})
    with pytest.raises(DistributedError, match="not a valid place"):
        distributed.detect({"RANK": "2", "WORLD_SIZE": "2"})


def test_multicast_stays_off_and_keeps_what_is_set() -> None:
    env = {"NCCL_NVLS_ENABLE": "0"}
    distributed.multicast_off(env)
    assert env == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    explicit = {"NVSHMEM_DISABLE_NVLS": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    distributed.multicast_off(explicit)
    assert explicit["NCCL_NVLS_ENABLE"] == "0"


def test_each_rank_takes_its_own_device() -> None:
    ctx = distributed.DistContext(rank=1, world_size=2, local_rank=1, local_world_size=2, hostname="h")
    assert distributed.rank_device(ctx, "cpu") == "cpu"
    assert distributed.rank_device(ctx, "auto") == "cpu"  # no GPU here
    with pytest.raises(ConfigError, match="names one GPU"):
        distributed.rank_device(ctx, "cuda:1")
    where = distributed.placement(ctx, "cpu")
    assert (where.rank, where.local_rank, where.world_size, where.hostname, where.gpu) == (1, 1, 2, "h", None)


def test_without_a_group_the_context_parallel_variants_say_why() -> None:
    spec = RunSpec(device="cpu", dtype="fp32", batch=1, heads=2, seq=64, head_dim=16)
    assert check_ring(spec) == NO_GROUP and check_torch(spec) == NO_GROUP


def test_the_ring_split_is_pytorchs_head_and_tail_split() -> None:
    from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

    for seq, world in [(8, 2), (12, 3), (64, 4), (16, 1)]:
        chunks = _HeadTailLoadBalancer(seq, world, "cpu")._generate_indices()[0].chunk(world)
        assert [shard_rows(seq, world, r, causal=True) for r in range(world)] == [c.tolist() for c in chunks]
    assert shard_rows(12, 3, 1, causal=False) == [4, 5, 6, 7]
    with pytest.raises(ValueError):
        shard_rows(10, 3, 0, causal=True)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist2")
    done = torchrun(2, str(WORKER), str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_group_helpers_across_two_ranks(two_ranks: list[dict]) -> None:
    zero, one = (seen["group"] for seen in two_ranks)
    assert [seen["backend"] for seen in two_ranks] == ["gloo", "gloo"]
    assert zero["agree_max"] == one["agree_max"] == 13
    assert zero["broadcast"] == one["broadcast"] == {"from": 0}
    assert zero["broadcast_error"] == one["broadcast_error"] == ["only rank 0 saw this", "the hint"]
    assert zero["gather"] == [{"rank": 0}, {"rank": 1}] and one["gather"] is None
    assert zero["multicast_env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                     "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.slow
def test_the_ring_agrees_with_single_process_attention(two_ranks: list[dict]) -> None:
    for name in ("causal", "full", "gqa-causal", "gqa-full", "bf16-causal"):
        shards = [seen["ring"][name] for seen in two_ranks]
        assert sorted(shards[0]["rows"] + shards[1]["rows"]) == list(range(len(shards[0]["rows"]) * 2)), name
        for shard in shards:
            assert shard["check"] is None and shard["transfers"] == 1
            assert shard["passed"] and shard["repeat_equal"], (name, shard)
            assert shard["scope"].startswith("this process's")
            if not name.startswith("bf16"):  # fp32: as close as single-process SDPA is to float64
                assert shard["max_abs_vs_sdpa"] < 1e-5 and shard["rel_error"] < 1e-5, (name, shard)
    causal = [seen["ring"]["causal"]["rows"] for seen in two_ranks]
    assert causal[0] == [*range(0, 16), *range(48, 64)] and causal[1] == list(range(16, 48))  # head and tail


@pytest.mark.slow
def test_timing_takes_the_same_calls_on_every_rank(two_ranks: list[dict]) -> None:
    zero, one = (seen["timing"] for seen in two_ranks)
    assert zero == one and zero["reps"] >= 10


@pytest.mark.slow
def test_the_ring_of_one_rank(tmp_path: Path) -> None:
    done = torchrun(1, str(WORKER), str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["world_size"] == 1 and seen["group"]["gather"] == [{"rank": 0}]
    for name, shard in seen["ring"].items():
        assert shard["transfers"] == 0  # gloo cannot send to itself; NCCL does (see the GPU test)
        assert shard["passed"] and shard["rows"] == list(range(len(shard["rows"]))), name


@pytest.mark.slow
def test_pytorchs_context_parallelism_is_wired_up_to_the_cuda_forward(two_ranks: list[dict]) -> None:
    """On CPU its DTensor dispatch has no kernel (the forward is CUDA-only); the shards, rows and the
    dispatcher's lifetime are checked here, the forward on the GPU (tests/test_gpu_distributed.py)."""
    for seen in two_ranks:
        cp = seen["torch_cp"]
        assert cp["rows"] == seen["ring"]["causal"]["rows"]  # PyTorch's split is the ring's
        assert cp["shards_match"] and cp["inputs_untouched"] and cp["cut_once"]
        assert "does not have a sharding strategy" in cp["forward_on_cpu"]  # PyTorch's DTensor path was taken
        assert cp["dispatcher_on"] and cp["dispatcher_off_after"]
