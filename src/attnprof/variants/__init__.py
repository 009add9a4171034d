"""Built-in variants, registered through the same entry-point path as plugins."""

from __future__ import annotations

from collections.abc import Callable

from attnprof.registry import Variant
from attnprof.variants import compiled, context_parallel, handwritten, sdpa, sdpa_fp8, varlen


def builtin_variants() -> list[Variant]:
    """Every built-in variant, in the order the blog meets them, then the context-parallel ones."""
    return [
        *handwritten.variants(),
        *sdpa.variants(),
        *sdpa_fp8.variants(),
        *compiled.variants(),
        *varlen.variants(),
        *context_parallel.variants(),
    ]


def register_variants(register: Callable[[Variant], Variant]) -> None:
    """The built-ins' entry point: register each built-in variant."""
    for variant in builtin_variants():
        register(variant)
