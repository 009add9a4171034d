"""Context-parallel attention: one forward across every rank of a torchrun group, the sequence split
between them. Both variants are `collective` (every rank runs the cell together) and return this
rank's rows of the output; `output_rows` names them for the correctness check.

- `cp-ring`: our ring over torch.distributed point-to-point (`variants.ring`), CUDA (NCCL) and CPU (gloo);
- `cp-torch`: PyTorch's own context parallelism (`torch.distributed.tensor.experimental`), CUDA only:
  its DTensor dispatch handles the CUDA SDPA kernels alone. It uses the module-wrapper form that
  PyTorch's `_ContextParallel` style offers (a one-module wrapper around SDPA), shards the inputs
  once per cell with PyTorch's `_context_parallel_shard` (head-and-tail balanced when causal) and
  keeps PyTorch's dispatcher on while the cell runs (turned off when the cell's state is dropped);
  `check` says which of these names the installed torch lacks. The communication is PyTorch's
  choice (all-gather of the key/value shards by default).

Neither has a backward here (`has_backward=False`). Without a process group (no torchrun) both are
unavailable, with the reason; world size 1 is the degenerate ring of one rank.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from attnprof.registry import RunSpec, Variant
from attnprof.variants.ring import InputCache, RingState, chunk_count, ring_forward, shard_rows

NO_GROUP = "needs torchrun (WORLD_SIZE>=1 with a process group)"
TORCH_CP_NAMES = (
    "_ContextParallel",
    "_context_parallel_shard",
    "_enable_context_parallel_dispatcher",
    "_disable_context_parallel_dispatcher",
    "_HeadTailLoadBalancer",
)


def _group() -> tuple[int, int, str] | None:
    """(rank, world size, backend) of the initialised process group; None without one. Never imports
    torch: a process that has not imported torch.distributed has no group (`attnprof list` stays fast)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())


def check_ring(spec: RunSpec) -> str | None:
    """Why `cp-ring` cannot run `spec` here, or None."""
    group = _group()
    if group is None:
        return NO_GROUP
    _, world, backend = group
    wanted = "nccl" if spec.device_type == "cuda" else "gloo"
    if backend != wanted:
        return f"the process group's backend is {backend}; {spec.device_type} tensors need {wanted}"
    chunks = chunk_count(world, spec.causal)
    if spec.seq % chunks:
        split = "2 × world size (head and tail chunks, causal)" if spec.causal else "the world size"
        return f"needs seq divisible by {split} = {chunks} (got {spec.seq})"
    return None


def check_torch(spec: RunSpec) -> str | None:
    """Why `cp-torch` cannot run `spec` here, or None."""
    reason = check_ring(spec)
    if reason is not None:
        return reason
    try:
        import torch.distributed.tensor.experimental as experimental
        from torch.distributed.tensor.experimental import _attention
    except ImportError as exc:
        return f"torch.distributed.tensor.experimental is not importable here ({exc})"
    missing = [n for n in TORCH_CP_NAMES if not hasattr(_attention, n)]
    if not hasattr(experimental, "context_parallel") or missing:
        names = ", ".join(missing or ["context_parallel"])
        return f"this torch's context parallelism lacks {names}"
    return None


def _ring_setup(spec: RunSpec) -> RingState:
    return RingState(spec.seq, spec.causal)


def _ring_forward(q: Any, k: Any, v: Any, causal: bool, state: RingState) -> Any:
    return ring_forward(q, k, v, causal, state)


def ring_rows(spec: RunSpec) -> list[int]:
    """The global query positions of this rank's `cp-ring` output (`variants.ring.shard_rows`)."""
    group = _group()
    rank, world = (group[0], group[1]) if group else (0, 1)
    return shard_rows(spec.seq, world, rank, spec.causal)


def torch_rows(spec: RunSpec) -> list[int]:
    """The global query positions of this rank's `cp-torch` output, as PyTorch's own head-and-tail
    balancer orders them when causal (the rank's contiguous chunk otherwise)."""
    group = _group()
    if group is None or not spec.causal:
        return ring_rows(spec)
    from torch.distributed.tensor.experimental import _attention as cp

    rank, world, _ = group
    return cp._HeadTailLoadBalancer(spec.seq, world, "cpu")._generate_indices()[0].chunk(world)[rank].tolist()


class TorchCpState:
    """One cell of PyTorch's context parallelism: the device mesh, SDPA wrapped as a module with
    PyTorch's `_ContextParallel` style, the inputs' shards, and the dispatcher (on from the first call
    until the cell's state is dropped)."""

    def __init__(self, spec: RunSpec) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import _attention as cp
        from torch.distributed.tensor.parallel import parallelize_module

        self.cp = cp
        world = dist.get_world_size()
        self.mesh = init_device_mesh(spec.device_type, (world,))
        style = cp._ContextParallel(seq_dim=2, attention_type=cp._ContextParallel.AttentionType.SDPA)
        self.module = parallelize_module(_sdpa_module(), self.mesh, style)
        self.balancer = cp._HeadTailLoadBalancer(spec.seq, world, torch.device(spec.device)) if spec.causal else None
        self._inputs = InputCache()
        self.shards: list[Any] = []
        self._on = False

    def local(self, q: Any, k: Any, v: Any) -> list[Any]:
        """This rank's shards of q, k, v, cut by PyTorch once per input tensors."""
        if self._inputs.changed(q, k, v):  # clones: some torch versions rearrange the buffers in place
            copies = [t.clone() for t in (q, k, v)]
            self.shards = self.cp._context_parallel_shard(self.mesh, copies, [2, 2, 2], self.balancer)
        return self.shards

    def dispatch(self) -> None:
        """Turn PyTorch's context-parallel dispatcher on (a dict assignment once its rules are registered),
        and off again when the cell's state is dropped."""
        self.cp._enable_context_parallel_dispatcher()
        if not self._on:
            weakref.finalize(self, self.cp._disable_context_parallel_dispatcher)
            self._on = True


def _sdpa_module() -> Any:
    """SDPA as a torch.nn.Module, for PyTorch's `_ContextParallel` style to wrap."""
    import torch
    import torch.nn.functional as F

    class Sdpa(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, is_causal: bool = False) -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1])

    return Sdpa()


def _torch_forward(q: Any, k: Any, v: Any, causal: bool, state: TorchCpState) -> Any:
    qs, ks, vs = state.local(q, k, v)
    state.dispatch()
    return state.module(qs, ks, vs, is_causal=causal)


def _collective(name: str, description: str, forward: Any, setup: Any, check: Any, rows: Any, devices: Any) -> Variant:
    """A variant whose cell every rank runs together, each returning its `rows` of the output; forward only."""
    return Variant(
        name,
        description,
        forward,
        devices,
        check=check,
        setup=setup,
        has_backward=False,
        collective=True,
        output_rows=rows,
    )


def variants() -> list[Variant]:
    """`cp-ring` and `cp-torch`."""
    ring = (
        "ring attention across the torchrun ranks: sequence split, K/V blocks passed by P2P send/recv, "
        "merged by log-sum-exp"
    )
    torch_cp = "PyTorch's context parallelism (torch.distributed.tensor.experimental) across the torchrun ranks"
    return [
        _collective("cp-ring", ring, _ring_forward, _ring_setup, check_ring, ring_rows, ("cpu", "cuda")),
        _collective("cp-torch", torch_cp, _torch_forward, TorchCpState, check_torch, torch_rows, ("cuda",)),
    ]
