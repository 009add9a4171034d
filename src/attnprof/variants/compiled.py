"""Variants built by torch.compile: FlexAttention with a causal block mask, and compiled in-place attention."""

from __future__ import annotations

from typing import Any

from attnprof import devices
from attnprof.registry import RunSpec, Variant
from attnprof.variants.handwritten import build_causal_mask, inplace_forward


def _causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return q_idx >= kv_idx


# Checks read versions and find modules without importing torch, so `attnprof list` stays fast.


def _compile_check(spec: RunSpec) -> str | None:
    version = devices.torch_version()
    if version is None or version < (2, 0):
        return "needs torch.compile (torch >= 2.0)"
    if spec.device_type == "cuda" and not devices.triton_installed():
        return "torch.compile on CUDA needs triton"
    return None


def _flex_check(spec: RunSpec) -> str | None:
    version = devices.torch_version()
    if version is None or version < (2, 5):
        return "needs torch.nn.attention.flex_attention (torch >= 2.5)"
    if spec.head_dim < 16 or spec.head_dim & (spec.head_dim - 1):
        return f"flex attention needs a power-of-two head_dim >= 16 (got {spec.head_dim})"
    return _compile_check(spec)


def _flex_setup(spec: RunSpec) -> dict[str, Any]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = None
    if spec.causal:
        block_mask = create_block_mask(_causal, B=None, H=None, Q_LEN=spec.seq, KV_LEN=spec.seq, device=spec.device)
    return {
        "fn": torch.compile(flex_attention, dynamic=False),
        "block_mask": block_mask,
        "gqa": spec.n_kv_heads != spec.heads,
    }


def _flex_forward(q: Any, k: Any, v: Any, causal: bool, state: dict[str, Any]) -> Any:
    return state["fn"](q, k, v, block_mask=state["block_mask"], enable_gqa=state["gqa"])


def _compiled_setup(spec: RunSpec) -> dict[str, Any]:
    import torch

    return {"fn": torch.compile(inplace_forward, dynamic=False), "mask": build_causal_mask(spec)}


def _compiled_forward(q: Any, k: Any, v: Any, causal: bool, state: dict[str, Any]) -> Any:
    return state["fn"](q, k, v, causal, state["mask"])


def variants() -> list[Variant]:
    """`flex` and `compiled`."""
    return [
        Variant(
            name="flex",
            description="torch.compile'd FlexAttention with a causal block mask",
            forward=_flex_forward,
            setup=_flex_setup,
            check=_flex_check,
        ),
        Variant(
            name="compiled",
            description="torch.compile of the in-place variant",
            forward=_compiled_forward,
            setup=_compiled_setup,
            check=_compile_check,
            # its compiled backward mutates what the forward saved: run again on the same graph it gives
            # NaN or "modified by an inplace operation", so `bwd` runs a fresh forward before each one
            repeatable_backward=False,
        ),
    ]
