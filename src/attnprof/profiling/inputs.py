"""Input tensors for a cell: seeded q, k, v in the variant's layout, a `sinks` cell's sink logits, and
dtype/device helpers."""

from __future__ import annotations

import math
from typing import Any

from attnprof.registry import RunSpec

DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def torch_dtype(name: str) -> Any:
    """The torch dtype for `bf16`, `fp16` or `fp32`; for `fp8` and `fp8_e5m2` that of their bf16 sources
    (`profiling.fp8` quantizes them outside the timed region)."""
    import torch

    from attnprof.profiling.fp8 import SOURCE_DTYPE, TORCH_FP8

    return getattr(torch, DTYPE_NAMES[SOURCE_DTYPE if name in TORCH_FP8 else name])


def resolve_torch_device(requested: str) -> str:
    """Turn `auto`, `cpu`, `cuda` or `cuda:N` into a device this machine has, or raise DeviceError.

    Imports torch first, so the answer is torch's own (see `attnprof.devices` for the torch-free path).
    """
    import torch  # noqa: F401 - loaded, attnprof.devices asks torch itself

    from attnprof.devices import resolve_device

    return resolve_device(requested)


def make_inputs(spec: RunSpec, seed: int, layout: str = "bhsd") -> tuple[Any, Any, Any]:
    """Seeded standard-normal q, k, v for `spec` (an fp8 cell's: its bf16 sources), in `bhsd` ([B, H, S, D])
    or `bshd` layout; q has `n_queries` positions, k and v `n_keys`.

    The values do not depend on the layout: `bshd` tensors are the `bhsd` ones transposed
    and made contiguous, so every variant sees the same numbers.
    """
    import torch

    generator = torch.Generator(device=spec.device).manual_seed(seed)
    dtype = torch_dtype(spec.dtype)
    shapes = [
        (spec.batch, spec.heads, spec.n_queries, spec.head_dim),
        (spec.batch, spec.n_kv_heads, spec.n_keys, spec.head_dim),
        (spec.batch, spec.n_kv_heads, spec.n_keys, spec.head_dim),
    ]
    tensors = []
    for shape in shapes:
        t = torch.randn(shape, generator=generator, dtype=torch.float32, device=spec.device).to(dtype)
        if layout == "bshd":
            t = t.transpose(1, 2).contiguous()
        tensors.append(t)
    return tensors[0], tensors[1], tensors[2]


SINKS_SEED_OFFSET = 2  # the sinks' generator seed = the inputs' seed + this (grad_out's is + 1)


def make_sinks(spec: RunSpec, seed: int) -> Any:
    """A `sinks` cell's sink logits: one per query head, shape (heads,), in the input dtype; None for any
    other score mod. Seeded standard-normal plus ln(n_keys): exp(sink) is then about as large as a
    non-causal row's sum of exp(q·k/√D) over its keys (n_keys times e^0.5 for standard-normal scores), so
    the sink takes a real share of every row's weight and a variant that drops it fails the check."""
    import torch

    if spec.score_mod != "sinks":
        return None
    generator = torch.Generator(device=spec.device).manual_seed(seed + SINKS_SEED_OFFSET)
    logits = torch.randn(spec.heads, generator=generator, dtype=torch.float32, device=spec.device)
    return (logits + math.log(spec.n_keys)).to(torch_dtype(spec.dtype))


def to_bhsd(tensor: Any, layout: str) -> Any:
    """View an output in [B, H, S, D], whatever layout the variant returned it in."""
    return tensor.transpose(1, 2) if layout == "bshd" else tensor
