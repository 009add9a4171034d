"""F.scaled_dot_product_attention, pinned to one backend or left to dispatch."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

from attnprof import devices
from attnprof.errors import VariantUnavailableError
from attnprof.masks import MASK_KINDS, PLAIN_KINDS, SIZED_KINDS, dense_mask
from attnprof.registry import RunSpec, Variant

# backend key -> (SDPBackend member name, devices it exists on)
BACKENDS = {
    "math": ("MATH", ("cpu", "cuda")),
    "efficient": ("EFFICIENT_ATTENTION", ("cuda",)),
    "flash": ("FLASH_ATTENTION", ("cpu", "cuda")),
    "cudnn": ("CUDNN_ATTENTION", ("cuda",)),
}


def _compute_capability(device: str) -> tuple[int, int]:
    return devices.compute_capability(device)  # nvidia-smi unless torch is imported: `list` stays torch-free


def _check_flash(spec: RunSpec) -> str | None:
    if spec.device_type != "cuda":
        return None
    if spec.dtype == "fp32":
        return "flash needs fp16/bf16 on CUDA"
    if spec.head_dim > 256 or spec.head_dim % 8:
        return f"flash needs head_dim <= 256 and a multiple of 8 (got {spec.head_dim})"
    if _compute_capability(spec.device) < (8, 0):
        return "flash needs compute capability 8.0 or newer"
    return None


def _check_efficient(spec: RunSpec) -> str | None:
    if spec.head_dim % 8 and spec.dtype != "fp32":
        return f"efficient needs head_dim a multiple of 8 for fp16/bf16 (got {spec.head_dim})"
    return None


def _check_cudnn(spec: RunSpec) -> str | None:
    if spec.dtype == "fp32":
        return "cudnn attention needs fp16/bf16"
    if not devices.cudnn_available():
        return "cuDNN is not available in this torch build"
    if _compute_capability(spec.device) < (8, 0):
        return "cudnn attention needs compute capability 8.0 or newer"
    if spec.head_dim > 256 or spec.head_dim % 8:
        return f"cudnn attention needs head_dim <= 256 and a multiple of 8 (got {spec.head_dim})"
    return None


CHECKS: dict[str, Callable[[RunSpec], str | None]] = {
    "flash": _check_flash,
    "efficient": _check_efficient,
    "cudnn": _check_cudnn,
}


def _sdpa(q: Any, k: Any, v: Any, causal: bool, attn_mask: Any = None) -> Any:
    import torch.nn.functional as F

    extra: dict[str, Any] = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    if attn_mask is not None:
        extra["attn_mask"] = attn_mask
    # causal without a mask: square (is_causal's top-left alignment is then right) or one query
    # token, which sees every key when aligned bottom-right
    is_causal = causal and attn_mask is None and q.shape[-2] == k.shape[-2]
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, **extra)


def sdpa_setup(spec: RunSpec) -> Any:
    """The `attn_mask` built once per cell: a dense [q_len, kv_len] bool tensor for a sized mask,
    torch's lower-right CausalBias for causal with 1 < q_len < kv_len (no tensor), None otherwise
    (plain causal goes as is_causal, none as no mask; one query token, as in decode, sees the whole
    cache, so it needs no mask: cuDNN and math would build a dense one from the CausalBias)."""
    if spec.mask.kind in SIZED_KINDS:
        return dense_mask(spec.mask, spec.n_queries, spec.n_keys, spec.device)
    if spec.causal and 1 < spec.n_queries < spec.n_keys:
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(spec.n_queries, spec.n_keys)
    return None


#: The backends that take a dense attn_mask run every mask; flash and cuDNN only the plain ones.
DENSE_BACKENDS = ("math", "efficient")


SDPA_SINKS_REFUSAL = "SDPA's softmax runs over the keys alone, and an attn_mask can only bias a key's score"


def _masking(dense: bool) -> dict[str, Any]:
    return {
        "masks": frozenset(MASK_KINDS if dense else PLAIN_KINDS),
        "dense_masks": frozenset(SIZED_KINDS if dense else ()),
        "unequal_lengths": True,
        "score_mod_refusals": {"sinks": SDPA_SINKS_REFUSAL},
    }


def pinned_forward(backend: str) -> Callable[..., Any]:
    """A forward that runs SDPA with only `backend` enabled."""
    member = BACKENDS[backend][0]

    def forward(q: Any, k: Any, v: Any, causal: bool, state: Any, attn_mask: Any = None) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        attn_mask = state if attn_mask is None else attn_mask
        try:
            with sdpa_kernel(getattr(SDPBackend, member)):
                return _sdpa(q, k, v, causal, attn_mask)
        except RuntimeError as exc:
            text = str(exc)
            if "No available kernel" in text or "No viable backend" in text:
                reasons = refusal_reasons(
                    lambda: _sdpa(q, k, v, causal, attn_mask), getattr(SDPBackend, member), backend
                )
                raise VariantUnavailableError(
                    reasons
                    or (
                        f"SDPA {backend} backend rejected this input "
                        f"({tuple(q.shape)}, {str(q.dtype).removeprefix('torch.')}, {q.device})"
                    )
                ) from None
            raise

    forward.__name__ = f"sdpa_{backend}_forward"
    return forward


def refusal_reasons(call: Callable[[], Any], member: Any, backend: str) -> str | None:
    """Why the pinned `backend` refused, in one line (`refusal_line`), from the warnings torch gives
    when `call` runs again with only `member` enabled; None when it gives none. Only the refusal path
    pays for the second call and the warning capture."""
    from torch.nn.attention import sdpa_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(member):
                call()
        except RuntimeError:
            pass
    return refusal_line([str(w.message) for w in caught], backend)


#: How torch's warnings open the reasons of each backend ("Memory efficient kernel not used because:").
REFUSAL_HEADERS = {
    "flash": "flash attention kernel not used because",
    "efficient": "memory efficient kernel not used because",
    "cudnn": "cudnn attention kernel not used because",
}
_HEADER = re.compile(r"^.* kernel not used because:?", re.IGNORECASE)


def refusal_line(messages: list[str], backend: str) -> str | None:
    """The pinned `backend`'s reasons in one line, from torch's warnings ("Memory efficient kernel not
    used because: <its reasons>"). Torch warns for every backend in turn, each under a "<Backend>
    kernel not used because:" line (the others only "has been runtime disabled"), and may repeat
    them; only the pinned backend's group is kept, each reason once and only its first sentence (the
    rule; torch goes on with the tensors' sizes and advice), the "(Triggered internally at ...)" tails
    dropped. Without that group, every distinct line; None without any."""
    groups: dict[str, tuple[str, list[str]]] = {}  # lower-case header -> (its text, its reasons)
    current: list[str] | None = None
    loose: list[str] = []
    for message in messages:
        line = " ".join(_TRIGGERED.sub(" ", message).split())  # one message, one line
        header = _HEADER.match(line)
        if header:
            text = header.group(0).rstrip(":").strip()
            current = groups.setdefault(text.lower(), (text, []))[1]
            line = line[header.end() :].strip()
        if line:
            (current if current is not None else loose).append(line)
    head, reasons = groups.get(REFUSAL_HEADERS.get(backend, ""), ("", []))
    if not reasons:  # no group of its own: every line, but the headers
        head, reasons = "", loose + [line for _, group in groups.values() for line in group]
    reasons = list(dict.fromkeys(_SENTENCE_END.split(r, 1)[0] for r in reasons))
    if not reasons:
        return None
    said = " ".join(r if r.endswith((".", ":", ";", "!", "?")) else r + "." for r in reasons)
    return f"{head}: {said}" if head else said


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# torch's C++ warnings end with "(Triggered internally at /path/file.cpp:99.)"
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*")


def dispatched_forward(q: Any, k: Any, v: Any, causal: bool, state: Any, attn_mask: Any = None) -> Any:
    """SDPA with every backend enabled: PyTorch picks one."""
    return _sdpa(q, k, v, causal, state if attn_mask is None else attn_mask)


def variants() -> list[Variant]:
    """`sdpa` plus one pinned variant per backend."""
    pinned = [
        Variant(
            name=f"sdpa-{key}",
            description=f"F.scaled_dot_product_attention pinned to the {key} backend with sdpa_kernel",
            forward=pinned_forward(key),
            devices=devices,
            check=CHECKS.get(key),
            setup=sdpa_setup,
            by_design=frozenset({"backend-fallback"}) if key == "math" else frozenset(),
            **_masking(key in DENSE_BACKENDS),
        )
        for key, (_, devices) in BACKENDS.items()
    ]
    dispatched = Variant(
        name="sdpa",
        description="F.scaled_dot_product_attention with no backend pinned; reports the backend it chose",
        forward=dispatched_forward,
        setup=sdpa_setup,
        **_masking(True),
    )
    return [dispatched, *pinned]
