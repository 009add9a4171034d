"""`triton-flash-fp8`: the fp8 (e4m3) forward of `_fp8`, as an attnprof variant.

attnprof quantizes each cell's q, k and v per (batch, head) outside the timed region (`fp8_scaling`
`per-head`: descales of shape [B, H] for q and [B, H_kv] for k and v, the `quantize` phase of the row);
`prepare_inputs` lays V out keys-contiguous (the K-major operand Hopper's fp8 dot takes), also untimed;
each timed call is one kernel launch that writes O in bf16. Forward only: the kernel saves no
statistics and there is no fp8 backward.

Like `attnprof_triton` this module imports neither torch nor triton; `check`, `setup` and the calls do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnprof import RunSpec, Variant
from attnprof_triton import FP8_VARIANT_NAME, MASKS, TritonState, check, executed_pairs

HEAD_DIMS = (64, 128, 256)
MIN_CAPABILITY = (8, 9)  # fp8 tensor cores: Ada (mma) and Hopper (wgmma)
E4M3 = "float8_e4m3fn"
BACKWARD_REFUSAL = "an fp8 forward kernel: it saves no softmax statistics and has no fp8 backward"
DESCRIPTION = (
    "triton-flash's forward in fp8 (this plugin): e4m3 Q/K/V with per-head descales, fp8 x fp8 dots "
    "accumulated in fp32, P scaled by 448 to e4m3, bf16 output; every triton-flash mask, decode, GQA"
)


def check_fp8(spec: RunSpec) -> str | None:
    """Why `triton-flash-fp8` cannot run `spec`: its head_dims, a GPU without fp8 tensor cores, then
    triton-flash's reasons (heads, triton, no CUDA GPU); or None."""
    if spec.head_dim not in HEAD_DIMS:
        return f"head_dim must be 64, 128 or 256 (got {spec.head_dim})"
    if spec.device_type == "cuda":
        import torch

        if torch.cuda.is_available() and (capability := torch.cuda.get_device_capability(spec.device)) < MIN_CAPABILITY:
            return f"needs fp8 tensor cores: compute capability 8.9 or newer (got {capability[0]}.{capability[1]})"
    return check(spec)


def check_launch(q: Any, k: Any, v: Any, descale_q: Any, descale_k: Any, descale_v: Any) -> None:
    """ValueError unless q [B, H, q_len, D] and k, v [B, H_kv, kv_len, D] are e4m3 with q_len <= kv_len and
    H a multiple of H_kv, and the descales float32 [B, H] (q) and [B, H_kv] (k, v), contiguous."""
    if q.dim() != 4 or k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected 4-d q and k, v alike")
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if k.shape[0] != batch or k.shape[3] != head_dim or q_len > kv_len:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: shapes do not match")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    dtypes = {name: str(t.dtype).removeprefix("torch.") for name, t in (("q", q), ("k", k), ("v", v))}
    if set(dtypes.values()) != {E4M3}:
        raise ValueError(f"q, k, v must be {E4M3} (got {', '.join(f'{n} {d}' for n, d in dtypes.items())})")
    wanted = {"descale_q": (batch, heads), "descale_k": (batch, kv_heads), "descale_v": (batch, kv_heads)}
    for (name, shape), descale in zip(wanted.items(), (descale_q, descale_k, descale_v), strict=True):
        if tuple(descale.shape) != shape or str(descale.dtype) != "torch.float32" or not descale.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous float32 of shape {list(shape)} (per batch and head); got "
                f"{str(descale.dtype).removeprefix('torch.')} {list(descale.shape)}"
            )


def keys_contiguous(v: Any) -> Any:
    """v ([B, H_kv, S, D]) with its keys contiguous (stride 1 along S): itself if so, else a copy."""
    if v.stride(2) == 1:
        return v
    return v.transpose(2, 3).contiguous().transpose(2, 3)


@dataclass(frozen=True)
class Fp8Operands:
    """What `prepare_fp8` leaves for the calls: setup's state and V keys-contiguous."""

    tiles: TritonState
    v: Any


def setup_fp8(spec: RunSpec) -> TritonState:
    """Compile and autotune for this shape and mask on throw-away e4m3 inputs (quantized per head, as the
    cell's will be), outside any timed region; the state carries the mask and the tiles the tuner chose."""
    import torch

    from attnprof.profiling.fp8 import quantize
    from attnprof_triton import _fp8

    def quantized(heads: int, length: int) -> tuple[Any, Any]:
        source = torch.randn(spec.batch, heads, length, spec.head_dim, device=spec.device, dtype=torch.bfloat16)
        return quantize(source, spec.dtype, "per-head")

    (q, dq), (k, dk), (v, dv) = (quantized(h, n) for h, n in _head_lengths(spec))
    _fp8.attention_fp8(q, k, keys_contiguous(v), dq, dk, dv, mask=spec.mask.text)
    if q.is_cuda:
        torch.cuda.synchronize(q.device)
    config = _fp8.launched_config(q, k, spec.mask.text)
    return TritonState(spec.mask.text, (config.block_m, config.block_n) if config is not None else None)


def _head_lengths(spec: RunSpec) -> list[tuple[int, int]]:
    return [(spec.heads, spec.n_queries), (spec.n_kv_heads, spec.n_keys), (spec.n_kv_heads, spec.n_keys)]


def prepare_fp8(spec: RunSpec, state: Any, q: Any, k: Any, v: Any, seed: int) -> Any:
    """The cell's quantized V laid out keys-contiguous, once, untimed (`Fp8State.state` becomes `Fp8Operands`)."""
    state.state = Fp8Operands(state.state, keys_contiguous(state.inputs.v))
    return state


def forward_fp8(q: Any, k: Any, v: Any, causal: bool, state: Any) -> Any:
    """One kernel launch on the cell's e4m3 q, k, v (`state.inputs`, V as `prepare_fp8` laid it out) and their
    per-head descales; q, k, v are the bf16 sources. Returns O [B, H, q_len, D] in bf16."""
    from attnprof_triton import _fp8

    inputs, operands = state.inputs, state.state
    mask = operands.tiles.mask  # the spec's mask text, `causal` included
    return _fp8.attention_fp8(
        inputs.q, inputs.k, operands.v, inputs.descale_q, inputs.descale_k, inputs.descale_v, mask=mask
    )


def make_fp8_variant() -> Variant:
    """The `triton-flash-fp8` Variant."""
    return Variant(
        name=FP8_VARIANT_NAME,
        description=DESCRIPTION,
        forward=forward_fp8,
        devices=("cuda",),
        dtypes=("fp8",),
        check=check_fp8,
        setup=setup_fp8,
        prepare_inputs=prepare_fp8,
        layout="bhsd",
        has_backward=False,
        backward_refusal=BACKWARD_REFUSAL,
        masks=frozenset(MASKS),
        unequal_lengths=True,  # q_len < kv_len, bottom-right aligned, as triton-flash
        executed_pairs=executed_pairs,  # triton-flash's tiles: the same key ranges per query tile
        fp8_scaling="per-head",
        fp8_output="bf16",
    )
