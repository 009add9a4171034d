"""An attnprof variant inside a transformers model: registered with transformers' attention interface.

transformers calls an attention function as `fn(module, query, key, value, attention_mask, scaling=None,
dropout=0.0, **kwargs) -> (attn_output, attn_weights)`, with query [b, h, s, d], key and value
[b, h_kv, s, d], and expects the output as [b, s, h, d]. `attention_function(variant)` maps that onto
`Variant.forward(q, k, v, causal, state)`:

* layout: q, k, v go in the variant's `layout` (bhsd as given, bshd transposed, no copy); the output
  comes back as [b, s, h, d].
* masks: the implementation is registered with transformers' SDPA mask function, which gives no mask
  for plain causal (or full) attention and an explicit mask only for padding or a custom pattern. No
  mask: `causal` is the call's `is_causal`, else the module's; a configured `mask` (and `score_mod`,
  `attnprof model`'s config) replaces it, and the variant takes it as it does in a compare (SDPA a dense
  `attn_mask` or `is_causal`, flex a BlockMask, both built once per shape in setup); a variant that does
  not run that mask or score mod is refused with its reason. An explicit mask, dropout, a KV cache
  (query and key lengths differ), the model's own sliding windows, soft-capping and sinks are refused:
  the row is skipped with that reason.
* scaling: attnprof variants scale scores by 1/sqrt(d); a model that scales otherwise is refused.
* GQA: a variant that cannot take fewer key/value heads (its `check` says so) gets them repeated.
* setup: `variant.setup(spec)` runs once per attention shape, on the first call with that shape (the
  timed cold call pays for it); `unavailable_reason(spec)` refuses a shape first.

Each call runs inside a `record_function("attnprof:NAME")` range, so a trace names the variant's calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from attnprof.errors import VariantUnavailableError
from attnprof.models.implementations import BRIDGE_PREFIX, bridge_name
from attnprof.registry import RunSpec, Variant

#: Keyword arguments that change attention in ways attnprof variants do not implement.
REFUSED_KWARGS = {
    "sliding_window": "sliding-window attention",
    "softcap": "logit soft-capping",
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
}
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _refuse(variant: Variant, why: str) -> VariantUnavailableError:
    return VariantUnavailableError(f"{BRIDGE_PREFIX}{variant.name} cannot run this model's attention: {why}")


def call_spec(
    variant: Variant, query: Any, key: Any, causal: bool, mask: str | None = None, score_mod: str | None = None
) -> RunSpec:
    """The RunSpec of one attention call, in `fwd+bwd` when autograd records it; `mask` (None: plain causal or
    none by `causal`) and `score_mod` as configured."""
    import torch

    batch, heads, seq, head_dim = query.shape
    dtype = TORCH_DTYPES.get(str(query.dtype).removeprefix("torch."))
    if dtype is None:
        raise _refuse(variant, f"dtype {query.dtype} (attnprof variants take bf16, fp16 or fp32)")
    recording = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    return RunSpec(
        device=str(query.device),
        dtype=dtype,
        batch=batch,
        heads=heads,
        seq=seq,
        head_dim=head_dim,
        kv_heads=key.shape[1] if key.shape[1] != heads else None,
        causal=causal,
        mode="fwd+bwd" if recording else "fwd",
        mask=mask,
        score_mod=score_mod,
    )


def _check_call(variant: Variant, query: Any, key: Any, mask: Any, scaling: Any, dropout: float, kwargs: Any) -> None:
    """Refuse what the variant cannot compute (see the module docstring)."""
    if mask is not None:
        shape = "x".join(str(n) for n in getattr(mask, "shape", ()))
        raise _refuse(variant, f"the model passes an explicit attention mask ({shape}: padding or a custom pattern)")
    if dropout:
        raise _refuse(variant, f"attention dropout {dropout:g}")
    if query.shape[2] != key.shape[2]:
        raise _refuse(variant, f"query length {query.shape[2]} differs from key length {key.shape[2]} (a KV cache)")
    for name, what in REFUSED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise _refuse(variant, what)
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(float(scaling), head_dim**-0.5, rel_tol=1e-5):
        why = f"the model scales scores by {float(scaling):.4g}, attnprof variants by 1/sqrt({head_dim})"
        raise _refuse(variant, why)


def runnable_spec(variant: Variant, spec: RunSpec) -> RunSpec:
    """The spec `variant` runs for an attention call of `spec`: `spec` itself, or with key/value heads repeated
    when grouped-query attention is all the variant refuses; VariantUnavailableError with its reason otherwise."""
    reason = variant.unavailable_reason(spec)
    if reason is not None and spec.kv_heads is not None:
        repeated = replace(spec, kv_heads=None)
        if variant.unavailable_reason(repeated) is None:
            return repeated
    if reason is not None:
        raise VariantUnavailableError(f"{BRIDGE_PREFIX}{variant.name}: {reason}")
    return spec


def attention_function(
    variant: Variant, mask: str | None = None, score_mod: str | None = None
) -> Callable[..., tuple[Any, None]]:
    """A transformers attention function that runs `variant` (see the module docstring), with the configured
    `mask` and `score_mod` in place of the model's causal mask when given."""
    states: dict[RunSpec, tuple[RunSpec, Any]] = {}  # call spec -> (the spec the variant runs, its setup state)
    label = BRIDGE_PREFIX + variant.name  # the record_function range: the variant's own name

    def prepare(spec: RunSpec) -> tuple[RunSpec, Any]:
        spec = runnable_spec(variant, spec)
        return spec, variant.setup(spec) if variant.setup is not None else None

    def attention(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[Any, None]:
        from torch.profiler import record_function

        _check_call(variant, query, key, attention_mask, scaling, dropout, kwargs)
        causal = kwargs.get("is_causal")
        causal = bool(getattr(module, "is_causal", True) if causal is None else causal) and query.shape[2] > 1
        if mask is not None:
            causal = mask == "causal"
        spec = call_spec(variant, query, key, causal, mask, score_mod)
        if spec not in states:
            states[spec] = prepare(spec)
        run_spec, state = states[spec]
        with record_function(label):
            if run_spec.kv_heads is None and spec.kv_heads is not None:
                groups = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
            if variant.layout == "bshd":
                query, key, value = (t.transpose(1, 2) for t in (query, key, value))
            out = variant.forward(query, key, value, causal, state)
            return (out if variant.layout == "bshd" else out.transpose(1, 2)), None

    attention.__name__ = f"attnprof_{variant.name.replace('-', '_')}_attention"
    return attention


def register_variant(variant: Variant, mask: str | None = None, score_mod: str | None = None) -> str:
    """Register `variant`, with the configured `mask` and `score_mod`, with transformers' attention interface
    (and the SDPA mask function under the same name); returns the name a model's `attn_implementation`
    takes. Registering again replaces it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    name = bridge_name(variant)
    AttentionInterface.register(name, attention_function(variant, mask, score_mod))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
