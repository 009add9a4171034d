"""torchrun: who this process is, its process group, and what the ranks share.

`detect()` reads torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`);
without it the process is alone and nothing here runs: no process group, exactly the single-process
behaviour. Under torchrun, `start()` sets the NVLink-multicast switches (`MULTICAST_OFF`, left as they
are when already set), picks the rank's GPU (`cuda:LOCAL_RANK`), and starts the process group: NCCL
on CUDA, gloo on CPU, with torchrun's rendezvous (`env://`), so the same command works across nodes.
Failures are one-line `DistributedError`s. `Group` is what the run needs of it: a barrier, the
largest of the ranks' values (`agree_max`), rank 0's object sent to every rank (`broadcast`, also
its exception), and every rank's object gathered on rank 0 (`gather`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

from attnprof.errors import ConfigError, DeviceError, DistributedError, one_line
from attnprof.pipeline.measured import Placement

#: NVLink multicast stays off in NCCL, PyTorch's symmetric memory and NVSHMEM (shared GPU hosts).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """This process in a torchrun group."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    hostname: str

    @property
    def is_main(self) -> bool:
        """True on rank 0, which writes the results and prints."""
        return self.rank == 0


def detect(environ: Mapping[str, str] | None = None) -> DistContext | None:
    """This process's place in a torchrun group, or None when torchrun did not start it (no `RANK`
    and `WORLD_SIZE`). DistributedError for values that are not whole numbers or do not fit."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        values = {
            name: int(env.get(name, default))
            for name, default in zip(TORCHRUN_VARIABLES, ("", "", "0", "1"), strict=True)
        }
    except ValueError:
        shown = ", ".join(f"{n}={env.get(n)!r}" for n in TORCHRUN_VARIABLES if n in env)
        raise DistributedError(f"torchrun's environment is not whole numbers: {shown}") from None
    rank, world, local, local_world = (values[n] for n in TORCHRUN_VARIABLES)
    if world < 1 or not 0 <= rank < world or not 0 <= local < local_world:
        raise DistributedError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}: not a valid place in a group")
    return DistContext(rank, world, local, local_world, socket.gethostname())


def multicast_off(environ: MutableMapping[str, str] | None = None) -> None:
    """Set `MULTICAST_OFF` in the environment (this process and the ones it starts), keeping values already set."""
    env = os.environ if environ is None else environ
    for name, value in MULTICAST_OFF.items():
        env.setdefault(name, value)


def rank_device(ctx: DistContext, requested: str) -> str:
    """The device of this rank for `auto`, `cpu`, `cuda` or `cuda:N`: `cuda:LOCAL_RANK` for `cuda`
    (and `auto` with a GPU). `cuda:N` is kept only with one process per node. DeviceError when the
    node has no GPU for this rank."""
    import torch

    from attnprof.profiling.inputs import resolve_torch_device

    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if requested.startswith("cuda:"):
        if ctx.local_world_size > 1:
            raise ConfigError(
                f"device {requested!r} names one GPU, but torchrun starts {ctx.local_world_size} processes on "
                "this node, each on its own GPU",
                hint="give --device cuda: each rank takes cuda:LOCAL_RANK",
            )
        return resolve_torch_device(requested)
    resolve_torch_device("cuda")  # a clear DeviceError without CUDA
    count = torch.cuda.device_count()
    if ctx.local_rank >= count:
        raise DeviceError(f"rank {ctx.rank} has LOCAL_RANK {ctx.local_rank}, but {ctx.hostname} has {count} GPU(s)")
    return f"cuda:{ctx.local_rank}"


def placement(ctx: DistContext, device: str) -> Placement:
    """Rank, host and GPU (`name #index (uuid)`, None on CPU) of this process on `device`."""
    gpu = None
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        gpu = f"{props.name} #{index}" + (f" (GPU-{uuid})" if uuid else "")
    return Placement(ctx.rank, ctx.local_rank, ctx.world_size, ctx.hostname, gpu)


class Group:
    """The started process group of this run (see the module docstring)."""

    def __init__(self, ctx: DistContext, backend: str, device: str) -> None:
        self.ctx = ctx
        self.backend = backend
        self.device = device  # where collectives put their tensors: the rank's GPU for NCCL, else CPU

    def barrier(self) -> None:
        """Wait until every rank is here."""
        self.agree_max(0)

    def agree_max(self, value: int) -> int:
        """The largest `value` any rank gives (every rank must call it)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        self._call("all_reduce", lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MAX))
        return int(tensor.item())

    def broadcast(self, make: Callable[[], T]) -> T:
        """`make()` run on rank 0 and its result (or its AttnprofError, raised on every rank) on every rank."""
        import torch.distributed as dist

        payload: list[Any] = [None]
        if self.ctx.is_main:
            try:
                payload[0] = ("ok", make())
            except Exception as exc:  # every rank must stop with rank 0, or the others wait forever
                payload[0] = ("error", exc)
        self._call("broadcast", lambda: dist.broadcast_object_list(payload, src=0))
        kind, value = payload[0]
        if kind == "error":
            raise value
        return value

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0; None on the others."""
        import torch.distributed as dist

        found: list[Any] | None = [None] * self.ctx.world_size if self.ctx.is_main else None
        self._call("gather", lambda: dist.gather_object(obj, found, dst=0))
        return found

    def close(self) -> None:
        """Destroy the process group (once the ranks are done with it)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise DistributedError(f"rank {self.ctx.rank}: {what} across the ranks failed: {one_line(exc)}") from None


_current: Group | None = None


def start(ctx: DistContext, device: str) -> Group:
    """Start the process group for this rank on `device` (once per process; later calls return it)."""
    global _current
    if _current is not None:
        return _current
    multicast_off()
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed: torchrun runs need it")
    cuda = device.startswith("cuda")
    backend = "nccl" if cuda else "gloo"
    available = dist.is_nccl_available() if cuda else dist.is_gloo_available()
    if not available:
        raise DistributedError(f"this torch build has no {backend} backend, which a torchrun run on {device} needs")
    bound = torch.device(device) if cuda else None  # NCCL: this rank's GPU, known from the start
    if cuda:
        torch.cuda.set_device(torch.device(device))
    try:
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, device_id=bound)
    except Exception as exc:
        raise DistributedError(
            f"rank {ctx.rank}: starting the {backend} process group failed: {one_line(exc)}",
            hint="check torchrun's rendezvous options (--rdzv-endpoint, --nnodes, --node-rank)",
        ) from None
    _current = Group(ctx, backend, device if cuda else "cpu")
    return _current


def current() -> Group | None:
    """The started process group of this process, or None (a single process)."""
    return _current


def stop() -> None:
    """Close the current process group, if any."""
    global _current
    if _current is not None:
        _current.close()
        _current = None
