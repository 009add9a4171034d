"""Run by torchrun from tests/test_distributed.py (gloo, CPU): each rank checks the process-group helpers,
the ring's agreement with single-process attention and the agreed timing, and writes what it saw to
OUT/rank{R}.json for the test to read. Usage: torchrun --nproc-per-node=N tests/dist_worker.py OUT"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnprof.errors import ConfigError
from attnprof.pipeline import distributed
from attnprof.profiling.correctness import check_against_reference
from attnprof.profiling.inputs import make_inputs
from attnprof.profiling.timing import TimingOptions, time_forward
from attnprof.registry import RunSpec
from attnprof.variants.context_parallel import TorchCpState, check_ring, ring_rows, torch_rows
from attnprof.variants.ring import RingState, ring_forward

SPECS = {
    "causal": dict(batch=2, heads=2, seq=64, head_dim=16, causal=True, dtype="fp32"),
    "full": dict(batch=2, heads=2, seq=64, head_dim=16, causal=False, dtype="fp32"),
    "gqa-causal": dict(batch=1, heads=4, kv_heads=2, seq=96, head_dim=32, causal=True, dtype="fp32"),
    "gqa-full": dict(batch=1, heads=4, kv_heads=1, seq=96, head_dim=32, causal=False, dtype="fp32"),
    "bf16-causal": dict(batch=1, heads=2, seq=128, head_dim=64, causal=True, dtype="bf16"),
}


def group_checks(group: distributed.Group) -> dict:
    rank = group.ctx.rank
    seen: dict = {"agree_max": group.agree_max(rank * 10 + 3)}
    seen["broadcast"] = group.broadcast(lambda: {"from": rank})

    def refuse() -> None:
        raise ConfigError("only rank 0 saw this", hint="the hint")

    try:
        group.broadcast(refuse)
    except ConfigError as exc:
        seen["broadcast_error"] = [exc.message, exc.hint]
    seen["gather"] = group.gather({"rank": rank})
    seen["multicast_env"] = {name: os.environ.get(name) for name in distributed.MULTICAST_OFF}
    return seen


def ring_checks() -> dict:
    found = {}
    for name, fields in SPECS.items():
        spec = RunSpec(device="cpu", **fields)
        q, k, v = make_inputs(spec, seed=0)
        state = RingState(spec.seq, spec.causal)
        first = ring_forward(q, k, v, spec.causal, state)
        second = ring_forward(q, k, v, spec.causal, state)  # the buffers are reused: the same result
        rows = ring_rows(spec)
        gqa = {"enable_gqa": True} if spec.n_kv_heads != spec.heads else {}
        single = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=spec.causal, **gqa
        ).index_select(2, torch.tensor(rows))
        check = check_against_reference(first, q, k, v, spec.causal, spec.dtype, rows)
        found[name] = {
            "rows": rows,
            "max_abs_vs_sdpa": (first.float() - single).abs().max().item(),
            "repeat_equal": bool(torch.equal(first, second)),
            "rel_error": check.rel_error,
            "passed": check.passed,
            "scope": check.scope,
            "check": check_ring(spec),
            "transfers": state.transfers,
        }
    return found


def torch_cp_checks() -> dict:
    """PyTorch's context parallelism on CPU: the wiring up to the forward (which only CUDA can run)."""
    from torch.distributed.tensor import DTensor

    spec = RunSpec(device="cpu", **SPECS["causal"])
    q, k, v = make_inputs(spec, seed=0)
    before = q.clone()
    state = TorchCpState(spec)
    shards = state.local(q, k, v)
    rows = torch.tensor(torch_rows(spec))
    found = {
        "rows": torch_rows(spec),
        "shards_match": all(torch.equal(s, t.index_select(2, rows)) for s, t in zip(shards, (q, k, v), strict=True)),
        "inputs_untouched": bool(torch.equal(q, before)),
        "cut_once": state.local(q, k, v) is shards,
    }
    try:
        state.module(*shards, is_causal=True)
    except NotImplementedError as exc:
        found["forward_on_cpu"] = str(exc).splitlines()[0]
    state.dispatch()
    handlers = DTensor._op_dispatcher._custom_op_handlers
    found["dispatcher_on"] = torch.ops.aten._scaled_dot_product_flash_attention.default in handlers
    del state, handlers
    found["dispatcher_off_after"] = (
        torch.ops.aten._scaled_dot_product_flash_attention.default not in DTensor._op_dispatcher._custom_op_handlers
    )
    return found


def timing_checks(group: distributed.Group) -> dict:
    rank = group.ctx.rank
    partner = torch.zeros(1)

    def forward() -> None:  # uneven per rank, and every call needs the other rank's call
        time.sleep(0.0005 * (1 + 3 * rank))
        torch.distributed.all_reduce(partner)

    timing = time_forward(forward, "cpu", TimingOptions(min_time_s=0.02, warmup_s=0.2), agree=group.agree_max)
    return {"reps": timing.reps, "warmup_reps": timing.warmup_reps}


def main() -> None:
    out = Path(sys.argv[1])
    ctx = distributed.detect()
    assert ctx is not None, "run me with torchrun"
    group = distributed.start(ctx, "cpu")
    seen = {"rank": ctx.rank, "world_size": ctx.world_size, "backend": group.backend}
    seen["group"] = group_checks(group)
    seen["ring"] = ring_checks()
    seen["torch_cp"] = torch_cp_checks()
    seen["timing"] = timing_checks(group)
    group.barrier()
    distributed.stop()
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
