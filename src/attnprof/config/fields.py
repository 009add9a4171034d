"""The config's field types and the checks of one value: device names, masks and score mods (their
canonical text), a paged KV cache, positive numbers. Pydantic only; no torch."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from attnprof.kv_cache import parse_kv_cache
from attnprof.masks import parse_mask, parse_score_mod

Mode = Literal["fwd", "bwd", "fwd+bwd"]
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
Positive = Annotated[int, Field(gt=0)]


def device_name(value: str) -> str:
    """`value` when it names a device as configs do (auto, cpu, cuda or cuda:N); ValueError otherwise."""
    if not DEVICE_PATTERN.match(value):
        raise ValueError("must be auto, cpu, cuda or cuda:N")
    return value


def nonempty(value: str) -> str:
    """`value` when it holds more than whitespace; ValueError otherwise."""
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class Strict(BaseModel):
    """A config model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


def mask_text(value: Any) -> str | None:
    """A config's mask (`causal`, `none`, `{sliding_window: W}`, ...) as its canonical text; None stays None."""
    return None if value is None else parse_mask(value).text


def score_mod_text(value: Any) -> str | None:
    """A config's score mod (null, `{softcap: C}`, `alibi`, `{sinks: true}`) as its canonical text or None."""
    return parse_score_mod(value)


#: A mask or score mod field: any config form in, the canonical text kept (`attnprof.masks`).
MaskText = Annotated[str | None, BeforeValidator(mask_text)]
ScoreModText = Annotated[str | None, BeforeValidator(score_mod_text)]


def mask_problem(mask: str, q_len: int, kv_len: int) -> str | None:
    """Why the mask of canonical text `mask` does not fit q_len queries against kv_len keys, or None."""
    return parse_mask(mask).problem(q_len, kv_len)


class KvCache(Strict):
    """A paged KV cache (`attnprof.kv_cache`): keys and values in pages of `page_size` positions, which
    must divide kv_len. Unknown keys are errors with a close match."""

    page_size: int

    @model_validator(mode="before")
    @classmethod
    def _parsed(cls, value: Any) -> Any:
        if isinstance(value, KvCache):
            return value
        try:
            return {"page_size": parse_kv_cache(value)}
        except ValueError as exc:
            raise PydanticCustomError("kv_cache", str(exc)) from None


def page_size_of(kv_cache: KvCache | None) -> int | None:
    """The page size of a paged KV cache setting; None when not paged."""
    return kv_cache.page_size if kv_cache is not None else None
