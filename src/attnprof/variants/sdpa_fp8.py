"""`sdpa-fp8`: torch's quantized SDPA (`torch.nn.attention.experimental._scaled_dot_product_attention_quantized`)
on e4m3 q, k and v with per-head descales, served by FlashAttention-3 through torch's dispatcher.

torch routes the call to FA3 only once `activate_flash_attention_impl("FA3")` has run, which imports FA3's
`flash_attn_interface` module and replaces the flash kernels for the whole process. So `setup` activates it
for the cell and `teardown` restores torch's default when the cell is done (sdpa-flash cells around it keep
FA2). Without `flash_attn_interface` the cell is skipped, saying so.

The op takes every descale as [B, H_kv], q's too (shared by the query heads of a GQA group), so
`prepare_inputs` quantizes q again per (batch, K/V head) from its bf16 source; attnprof's check reads the q the
kernel reads. Forward only: torch's quantized SDPA has no backward. The output is bf16.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from attnprof.registry import RunSpec, Variant

NAME = "sdpa-fp8"
FA3_MODULE = "flash_attn_interface"  # what torch's FA3 registration imports (flash-attention's hopper/ build)
OP_PATH = "torch.nn.attention.experimental._scaled_dot_product_attention_quantized"


def _quantized_sdpa() -> Any:
    """torch's quantized SDPA function, or None where this torch lacks it."""
    try:
        from torch.nn.attention.experimental._scaled_dot_product_attention_quantized import (
            _scaled_dot_product_attention_quantized,
        )
    except ImportError:
        return None
    return _scaled_dot_product_attention_quantized


def check(spec: RunSpec) -> str | None:
    """Why `sdpa-fp8` cannot run `spec`: heads, this torch, FA3 or the GPU; None when it can."""
    if spec.heads % spec.n_kv_heads:
        return f"heads ({spec.heads}) must be a multiple of kv_heads ({spec.n_kv_heads})"
    if _quantized_sdpa() is None:
        import torch

        return f"needs {OP_PATH} (torch 2.11 or newer; this is {torch.__version__})"
    if importlib.util.find_spec(FA3_MODULE) is None:
        return (
            f"needs FlashAttention-3 ({FA3_MODULE}, built from flash-attention's hopper/ directory): torch's "
            "quantized SDPA runs only on FA3, activated with activate_flash_attention_impl('FA3')"
        )
    if spec.device_type == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(spec.device)
        if major != 9:
            return f"FlashAttention-3 runs on Hopper (sm90) only (got {major}.{minor})"
    return None


@dataclass
class Fa3State:
    """Set by setup: FA3 was activated for this cell; `q_descale` ([B, H_kv]) once q is quantized per group."""

    activated: bool
    q_descale: Any = None


def setup(spec: RunSpec) -> Fa3State:
    """Activate torch's FA3 flash-attention implementation for this cell (undone by `teardown`)."""
    from torch.nn.attention import activate_flash_attention_impl

    activate_flash_attention_impl("FA3")
    return Fa3State(activated=True)


def teardown(state: Any) -> None:
    """Give the process torch's default flash attention back."""
    if isinstance(state, Fa3State) and state.activated:
        from torch.nn.attention import restore_flash_attention_impl

        restore_flash_attention_impl(_raise_warn=False)
        state.activated = False


def quantize_per_group(q: Any, kv_heads: int, dtype: str) -> tuple[Any, Any]:
    """q [B, H, S, D] in fp8 with one descale per (batch, K/V head), shared by the group's query heads: the
    quantized q and that descale, [B, H_kv]."""
    from attnprof.profiling.fp8 import quantize

    batch, heads, seq, dim = q.shape
    grouped = q.reshape(batch, kv_heads, (heads // kv_heads) * seq, dim)  # a group's heads are adjacent
    q8, descale = quantize(grouped, dtype, "per-head")
    return q8.reshape(batch, heads, seq, dim), descale


def prepare_inputs(spec: RunSpec, state: Any, q: Any, k: Any, v: Any, seed: int) -> Any:
    """q quantized again per GQA group from its bf16 source (the op's q descale is [B, H_kv]); the check's
    inputs get that q and its descale per query head."""
    inputs, fa3 = state.inputs, state.state
    q8, group_descale = quantize_per_group(q, spec.n_kv_heads, spec.dtype)
    inputs.q = q8
    inputs.descale_q = group_descale.repeat_interleave(spec.heads // spec.n_kv_heads, dim=1)
    fa3.q_descale = group_descale.contiguous()
    return state


def forward(q: Any, k: Any, v: Any, causal: bool, state: Any) -> Any:
    """One quantized SDPA call on the cell's fp8 q, k, v (q, k, v here are their bf16 sources); bf16 out."""
    inputs = state.inputs
    return _quantized_sdpa()(
        inputs.q,
        inputs.k,
        inputs.v,
        is_causal=causal,
        q_descale=state.state.q_descale,
        k_descale=inputs.descale_k.contiguous(),
        v_descale=inputs.descale_v.contiguous(),
    )


def variants() -> list[Variant]:
    """The `sdpa-fp8` variant."""
    return [
        Variant(
            name=NAME,
            description="torch's quantized SDPA on FlashAttention-3: e4m3 q, k, v with per-head descales, bf16 "
            "out, forward only",
            forward=forward,
            devices=("cuda",),
            dtypes=("fp8",),
            check=check,
            setup=setup,
            teardown=teardown,
            has_backward=False,
            backward_refusal="torch's quantized SDPA is forward only",
            prepare_inputs=prepare_inputs,
            fp8_scaling="per-head",
            fp8_output="bf16",
        )
    ]
