"""A configured mask inside a transformers model, for transformers' own attention implementations.

transformers builds the mask inside every forward: `create_causal_mask` asks its mask interface
(`masking_utils.ALL_MASK_ATTENTION_FUNCTIONS`, by the model's `attn_implementation`) for it, with a
`mask_function(batch, head, q_idx, kv_idx)` of absolute positions. `MaskOverride` puts a wrapper in that
interface for the duration of each model call: the mask function becomes the configured mask's (the
rules of `attnprof.masks`, here with as many queries as keys) and the `is_causal` shortcut is off, so
`sdpa` gets a dense bool `attn_mask`, `eager` an additive float mask and `flex_attention` a BlockMask, each
built again in every forward, as transformers does. attnprof variants inside the model (`models.bridge`)
take the mask themselves, built once per shape in their setup.

The override is removed after each call, and a call that never asked for a mask (a model that builds
its own) raises VariantUnavailableError rather than run without the configured mask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attnprof.errors import VariantUnavailableError
from attnprof.masks import parse_mask

#: transformers' implementations whose mask function returns padding only: they run causal or nothing else.
PADDING_ONLY = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def hf_refusal(implementation: str, mask: str | None, score_mod: str | None, model_causal: bool | None) -> str | None:
    """Why transformers' `implementation` cannot run the configured mask and score mod, or None."""
    if score_mod is not None:
        kind = score_mod.split(":", 1)[0]
        return (
            f"score_mod {kind} is not applied by transformers' {implementation} (only attnprof variants take a "
            "score_mod here; a model type may have its own field, such as attn_logit_softcapping)"
        )
    if needs_override(mask, model_causal) and implementation in PADDING_ONLY:
        kind = parse_mask(mask).kind
        return f"mask {kind} cannot be given to transformers' {implementation} (it takes no mask tensor)"
    return None


def needs_override(mask: str | None, model_causal: bool | None) -> bool:
    """True when the configured mask is not what the model builds anyway (causal, for a causal model)."""
    return mask is not None and not (mask == "causal" and model_causal)


def mask_function(mask: str, seq: int) -> Callable[..., Any]:
    """transformers' mask function of `mask` for `seq` queries and keys: True where a query may attend."""
    from attnprof.variants.compiled import mask_mod

    parsed = parse_mask(mask)
    mod = mask_mod(parsed, seq, seq)
    if mod is not None:
        return mod

    def everything(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx >= 0) & (kv_idx >= 0)

    return everything


class MaskOverride:
    """Puts the configured mask into transformers' mask interface for one implementation during each call
    (`applied`), and counts how many masks it built."""

    def __init__(self, implementation: str, mask: str, seq: int) -> None:
        self.implementation, self.mask = implementation, mask
        self.function = mask_function(mask, seq)
        self.built = 0

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The override in force inside the block; VariantUnavailableError after a block that built no mask."""
        from transformers import masking_utils

        interface = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS
        local = interface._local_mapping
        original = interface[self.implementation]
        before = local.get(self.implementation)

        def build(*args: Any, **kwargs: Any) -> Any:
            self.built += 1
            kwargs["mask_function"] = self.function
            kwargs["allow_is_causal_skip"] = False
            return original(*args, **kwargs)

        built = self.built
        local[self.implementation] = build
        try:
            yield
        finally:
            if before is None:
                local.pop(self.implementation, None)
            else:
                local[self.implementation] = before
        if self.built == built:
            raise VariantUnavailableError(
                f"the model did not ask transformers' mask interface for a mask under {self.implementation}: "
                f"mask {self.mask} cannot be applied to it"
            )
