"""Ring attention over torch.distributed point-to-point: the sequence split across the ranks, each rank's
key/value block passed around the ring while every rank attends its queries to the block it holds.

The split (`shard_rows`): with causal masking the sequence is cut into 2·W chunks and rank r holds
chunks r and 2W−1−r (head and tail, as PyTorch's own context parallelism does), so every rank does
the same work; without masking rank r holds the r-th of W contiguous chunks.

Step i of W: rank r holds the key/value block of rank j = (r − i) mod W, sends it to rank r+1 and
receives the next from rank r−1 (`batch_isend_irecv`), while it attends to the block it holds:

- i = 0, its own block: causal masking as usual (the chunk pair keeps positions in order);
- j < r (causal): every query against the first chunk of the block only (its second chunk lies in
  the future of every query here);
- j > r (causal): only the second chunk of queries, against the whole block;
- without masking: every query against the whole block.

Each block is computed by SDPA's own kernels that also return the log-sum-exp (CUDA: flash for
fp16/bf16, memory-efficient otherwise; CPU: the flash kernel for CPU), and blocks are merged with it
in fp32. At world size 1 the ring still sends its block once, to itself, when the backend allows it
(NCCL; gloo cannot send to itself), so the communication path runs and shows in the trace.
"""

from __future__ import annotations

from typing import Any

SELF_TRANSFER_BACKENDS = ("nccl",)


def chunk_count(world: int, causal: bool) -> int:
    """How many equal chunks the sequence is cut into: 2·W with causal masking (head and tail), else W."""
    return 2 * world if causal else world


def shard_rows(seq: int, world: int, rank: int, causal: bool) -> list[int]:
    """The global sequence positions rank `rank` of `world` holds, in its order (module docstring).
    ValueError when `seq` is not a multiple of `chunk_count(world, causal)`."""
    chunks = chunk_count(world, causal)
    if seq % chunks:
        raise ValueError(f"sequence {seq} is not a multiple of {chunks}")
    size = seq // chunks
    owned = [rank, chunks - 1 - rank] if causal else [rank]
    return [p for c in owned for p in range(c * size, (c + 1) * size)]


def block_attention(q: Any, k: Any, v: Any, causal: bool) -> tuple[Any, Any]:
    """(out, log-sum-exp) of softmax(q·kᵀ/√D)·v over one key/value block, [B, H, S, D] and [B, H, S]
    (fp32); key/value heads are repeated for grouped-query attention."""
    import torch

    if k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    aten = torch.ops.aten
    if not q.is_cuda:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
        return out, lse
    if _flash_fits(q):
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
        return out, lse
    out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)[:2]
    return out, lse[..., : q.shape[2]]


def _flash_fits(q: Any) -> bool:
    import torch

    head_dim = q.shape[-1]
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and head_dim <= 256
        and head_dim % 8 == 0
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


def merge(out: Any, lse: Any, block_out: Any, block_lse: Any) -> None:
    """Merge one block's result into the running (out, lse), in place, in fp32:
    out ← out − σ(lse_b − lse)·(out − out_b), lse ← log(e^lse + e^lse_b)."""
    import torch
    import torch.nn.functional as F

    block_out, block_lse = block_out.float(), block_lse.float()
    out.sub_(torch.sigmoid(block_lse - lse).unsqueeze(-1) * (out - block_out))
    lse.sub_(F.logsigmoid(lse - block_lse))


class InputCache:
    """Remembers the input tensors a rank's shard was cut from, so the cut runs once per cell (the same
    tensors every call), outside the calls that are timed, and again only for other or changed inputs."""

    def __init__(self) -> None:
        self._sources: tuple[Any, ...] = ()
        self._versions: tuple[int, ...] = ()

    def changed(self, *tensors: Any) -> bool:
        """True (and remember them) when `tensors` are not the same, unmodified tensors as last time."""
        versions = tuple(t._version for t in tensors)
        same = len(self._sources) == len(tensors) and all(a is b for a, b in zip(self._sources, tensors, strict=True))
        if same and versions == self._versions:
            return False
        self._sources, self._versions = tensors, versions
        return True


class RingState:
    """One cell's ring: this rank's place, its shard of the inputs (cut once per input tensors, outside
    the calls that are timed), and the two receive buffers the blocks rotate through."""

    def __init__(self, seq: int, causal: bool) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())
        self.rows = shard_rows(seq, self.world, self.rank, causal)
        self.transfers = self.world - 1 if self.world > 1 else int(self.backend in SELF_TRANSFER_BACKENDS)
        self._inputs = InputCache()
        self.q: Any = None
        self.kv: Any = None
        self.buffers: list[Any] = []

    def local(self, q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        """This rank's queries and its [2, B, H_kv, S/W, D] key/value block, cut from the full inputs."""
        import torch

        if self._inputs.changed(q, k, v):
            rows = torch.tensor(self.rows, device=q.device)
            self.q = q.index_select(2, rows)
            self.kv = torch.stack([k.index_select(2, rows), v.index_select(2, rows)])
            self.buffers = [torch.empty_like(self.kv) for _ in range(min(self.transfers, 2))]
        return self.q, self.kv


def ring_forward(q: Any, k: Any, v: Any, causal: bool, state: RingState) -> Any:
    """This rank's rows of the attention output (`state.rows`), computed around the ring."""
    import torch.distributed as dist

    q, cur = state.local(q, k, v)
    rank, world = state.rank, state.world
    half = q.shape[2] // 2
    out: Any = None
    lse: Any = None
    for i in range(world):
        requests = []
        if i < state.transfers:
            received = state.buffers[i % 2]
            requests = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, cur, (rank + 1) % world),
                    dist.P2POp(dist.irecv, received, (rank - 1) % world),
                ]
            )
        source = (rank - i) % world
        key, value = cur[0], cur[1]
        if i == 0:
            block_out, block_lse = block_attention(q, key, value, causal)
            out, lse = block_out.float(), block_lse.float()
        elif not causal:
            merge(out, lse, *block_attention(q, key, value, False))
        elif source < rank:
            merge(out, lse, *block_attention(q, key[:, :, :half], value[:, :, :half], False))
        else:
            merge(out[:, :, half:], lse[:, :, half:], *block_attention(q[:, :, half:], key, value, False))
        for request in requests:
            request.wait()
        if requests and world > 1:
            cur = received
    assert out is not None
    return out.to(q.dtype)
