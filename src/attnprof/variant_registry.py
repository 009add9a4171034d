"""The variants by name (`Registry`): registration, lookup with close-match suggestions, glob selection."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable

from attnprof.errors import DuplicateVariantError, UnknownVariantError
from attnprof.registry import Variant


class Registry:
    """Variants by name. Duplicate names raise; unknown names get close-match suggestions."""

    def __init__(self) -> None:
        self._variants: dict[str, Variant] = {}

    def register(self, variant: Variant) -> Variant:
        """Add `variant`; raise DuplicateVariantError if its name is taken."""
        if not isinstance(variant, Variant):
            raise TypeError(f"register() takes an attnprof Variant, got {type(variant).__name__}")
        existing = self._variants.get(variant.name)
        if existing is not None:
            raise DuplicateVariantError(
                f"variant {variant.name!r} from {variant.source} is already registered by {existing.source}"
            )
        self._variants[variant.name] = variant
        return variant

    def names(self) -> list[str]:
        """All variant names, in registration order (built-ins first, in the blog's order)."""
        return list(self._variants)

    def all(self) -> list[Variant]:
        """All variants, in registration order."""
        return [self._variants[n] for n in self.names()]

    def __contains__(self, name: str) -> bool:
        return name in self._variants

    def __len__(self) -> int:
        return len(self._variants)

    def get(self, name: str, role: str = "variant") -> Variant:
        """The variant called `name`; UnknownVariantError with suggestions otherwise. `role` says what
        the name was given as in that message (`unknown baseline 'sdpa-mth'; did you mean sdpa-math?`)."""
        try:
            return self._variants[name]
        except KeyError:
            raise UnknownVariantError(_unknown_message(name, self.names(), role)) from None

    def check_patterns(self, patterns: Iterable[str]) -> None:
        """UnknownVariantError, with suggestions, for the first pattern without wildcards that names no variant."""
        for pattern in patterns:
            if not _is_pattern(pattern):
                self.get(pattern)

    def matching(self, patterns: Iterable[str]) -> list[str]:
        """Names matching any of `patterns`, in registration order (no check: a pattern may match none); a
        stand-in for an absent plugin's variant (`Variant.not_installed`) matches its own name only."""
        patterns = list(patterns)
        return [
            n
            for n, v in self._variants.items()
            if any(n == p if v.not_installed else fnmatch.fnmatchcase(n, p) for p in patterns)
        ]

    def select(self, include: Iterable[str] = ("*",), exclude: Iterable[str] = ()) -> list[Variant]:
        """Variants matching any include pattern and no exclude pattern, in the include order.

        A pattern without wildcards must name a variant exactly, so typos fail loudly.
        """
        include = list(include) or ["*"]
        exclude = list(exclude)
        self.check_patterns(include + exclude)
        chosen: list[str] = []
        for pattern in include:
            for name in self.matching([pattern]):
                if name not in chosen:
                    chosen.append(name)
        excluded = self.matching(exclude)
        chosen = [n for n in chosen if n not in excluded]
        if not chosen:
            raise UnknownVariantError(
                f"no variant matches {', '.join(include)}" + (f" minus {', '.join(exclude)}" if exclude else ""),
                hint=f"known variants: {', '.join(self.names())}",
            )
        return [self._variants[n] for n in chosen]


def _is_pattern(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def _unknown_message(name: str, known: list[str], role: str = "variant") -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    if close:
        return f"unknown {role} {name!r}; did you mean {', '.join(close)}?"
    return f"unknown {role} {name!r}; known variants: {', '.join(known) or '(none)'}"
