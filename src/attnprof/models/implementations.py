"""Attention implementation names of `attnprof model`, resolved without torch or transformers.

A name is transformers' own (`eager`, `sdpa`, `flex_attention`, `flash_attention_2/3/4`), or an attnprof
variant (`triton-flash`, or `attnprof:NAME` to say so explicitly: `attnprof:sdpa` is attnprof's `sdpa`
variant, `sdpa` transformers' own), which runs inside the model through transformers' attention
interface under the name `attnprof:NAME` (see `models.bridge`). A factory model may take names of its
own: they are passed to it as they are.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from attnprof.errors import UnknownVariantError
from attnprof.registry import Variant
from attnprof.variant_registry import Registry

#: The attention implementations transformers ships (the name a model's `attn_implementation` takes).
HF_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
#: The prefix of an attnprof variant registered with transformers' attention interface.
BRIDGE_PREFIX = "attnprof:"


@dataclass(frozen=True)
class Implementation:
    """One implementation to profile: `name` as the user wrote it, `attn_implementation` as the model is given
    it (None: the model as it is built), and the attnprof `variant` behind it (None for transformers' own
    and a factory's names)."""

    name: str
    attn_implementation: str | None
    variant: Variant | None = None

    @property
    def label(self) -> str | None:
        """The implementation as a row names it: an attnprof variant by its own name (`attnprof:triton-flash`,
        not the `attnprof:triton-FLASH` transformers is given), else what the model is given."""
        if self.variant is not None:
            return BRIDGE_PREFIX + self.variant.name
        return self.attn_implementation

    @property
    def source(self) -> str:
        """Where the implementation comes from: `transformers`, the attnprof variant's source (`built-in` or
        its plugin package), or `model` (a factory's own name)."""
        if self.variant is not None:
            return self.variant.source
        return "transformers" if self.attn_implementation in HF_IMPLEMENTATIONS else "model"


#: Words transformers reads inside an `attn_implementation` name and dispatches on ("flash" anywhere sends it
#: to its FlashAttention loader, which looks the name up on the Hub): written upper-case in a bridge name.
RESERVED_WORDS = re.compile(r"flash|sdpa|flex_attention")


def bridge_name(variant: Variant) -> str:
    """The name an attnprof variant is registered under in transformers' attention interface:
    `attnprof:NAME`, with the words transformers dispatches on upper-cased (`attnprof:triton-FLASH`)."""
    return BRIDGE_PREFIX + RESERVED_WORDS.sub(lambda m: m.group(0).upper(), variant.name)


def resolve_implementation(name: str, registry: Registry, passthrough: bool = False) -> Implementation:
    """The implementation `name` stands for. transformers' names come first, then attnprof variants;
    `attnprof:NAME` must name a variant. Any other name is UnknownVariantError (exit 2) with close
    matches, unless `passthrough` (a factory model), which passes it to the model as it is."""
    if name.startswith(BRIDGE_PREFIX):
        variant = registry.get(name.removeprefix(BRIDGE_PREFIX).lower())
        return Implementation(name, bridge_name(variant), variant)
    if name in HF_IMPLEMENTATIONS:
        return Implementation(name, name)
    if name in registry:
        variant = registry.get(name)
        return Implementation(name, bridge_name(variant), variant)
    if passthrough:
        return Implementation(name, name)
    known = [*HF_IMPLEMENTATIONS, *registry.names()]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    raise UnknownVariantError(
        f"unknown attention implementation {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
        hint=f"transformers: {', '.join(HF_IMPLEMENTATIONS)}; attnprof variants: {', '.join(registry.names())}",
    )


def resolve_implementations(names: list[str], registry: Registry, passthrough: bool = False) -> list[Implementation]:
    """`resolve_implementation` for each name, in order."""
    return [resolve_implementation(name, registry, passthrough) for name in names]
