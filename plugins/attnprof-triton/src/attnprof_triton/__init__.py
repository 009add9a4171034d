"""attnprof plugin: `triton-flash`, a FlashAttention-style forward kernel written in Triton.

This module imports neither triton nor torch: `check` and `setup` import them when asked,
so `attnprof list` shows the variant (as unavailable, with the reason) on machines without
them. The forward kernel lives in `attnprof_triton._kernel`; the backward kernels (dQ, dK, dV
from the row statistics the forward saves) in `attnprof_triton._backward`. `forward` launches
the bare forward kernel unless autograd is recording (the `bwd` and `fwd+bwd` modes give q, k, v
`requires_grad=True`); then it goes through `_backward.FlashAttention`, which also saves them.
"""

from __future__ import annotations

from typing import Any

from attnprof import RunSpec, Variant

__version__ = "0.1.0"

VARIANT_NAME = "triton-flash"
HEAD_DIMS = (16, 32, 64, 128, 256)
DESCRIPTION = (
    "FlashAttention-style forward and backward in Triton (this plugin): Q/KV tiling, online softmax, "
    "causal block skip, GQA; forward autotuned per shape"
)


def triton_missing() -> str | None:
    """Why triton cannot be used here, or None when it imports."""
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising something else
        return f"needs triton: {exc}"
    return None


def check(spec: RunSpec) -> str | None:
    """Why `triton-flash` cannot run `spec`, or None."""
    if spec.head_dim not in HEAD_DIMS:
        return f"head_dim must be a power of two from 16 to 256 (got {spec.head_dim})"
    if spec.heads % spec.n_kv_heads:
        return f"heads ({spec.heads}) must be a multiple of kv_heads ({spec.n_kv_heads})"
    if spec.dtype == "fp32" and spec.head_dim > 128:
        return f"fp32 needs head_dim <= 128 (got {spec.head_dim}): the tiles would not fit in shared memory"
    missing = triton_missing()
    if missing:
        return missing
    if spec.device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch sees none)"
        major, minor = torch.cuda.get_device_capability(spec.device)
        if major < 8:
            return f"needs compute capability 8.0 or newer (got {major}.{minor})"
    return None


def setup(spec: RunSpec) -> None:
    """Compile and autotune for this shape (and mode) on throw-away inputs, outside any timed region.

    The autotuner keeps its choice per shape (`_kernel.best_config` reads it back), so `forward`
    launches the tuned kernel and no state is passed on.
    """
    import torch

    from attnprof_triton import _kernel

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    q = torch.randn(spec.batch, spec.heads, spec.seq, spec.head_dim, device=spec.device, dtype=dtype)
    k = torch.randn(spec.batch, spec.n_kv_heads, spec.seq, spec.head_dim, device=spec.device, dtype=dtype)
    v = torch.randn_like(k)
    _kernel.attention(q, k, v, spec.causal, return_lse=spec.backward)  # the backward modes' forward saves lse
    if q.is_cuda:
        torch.cuda.synchronize(q.device)


def forward(q: Any, k: Any, v: Any, causal: bool, state: None = None) -> Any:
    """One attention forward: [B, H, S, D] in, [B, H, S, D] out, a single kernel launch (`state` is
    unused). When autograd records (an input requires grad), the output's backward is ours too."""
    import torch

    from attnprof_triton import _kernel

    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        from attnprof_triton._backward import FlashAttention

        return FlashAttention.apply(q, k, v, causal)
    return _kernel.attention(q, k, v, causal)


def make_variant() -> Variant:
    """The `triton-flash` Variant (also handy for tests that skip the entry point)."""
    return Variant(
        name=VARIANT_NAME,
        description=DESCRIPTION,
        forward=forward,
        devices=("cuda",),
        dtypes=("bf16", "fp16", "fp32"),
        check=check,
        setup=setup,
        layout="bhsd",
        has_backward=True,  # `_backward.py`: dQ, dK, dV kernels of our own
        # plain causal (is_causal) and no mask only, q_len == kv_len, no score mods: what the forward runs today
        masks=frozenset({"causal", "none"}),
        score_mods=frozenset(),
        unequal_lengths=False,
    )


def register_variants(register: Any) -> None:
    """The `attnprof.variants` entry-point hook."""
    register(make_variant())
