"""The attention shapes of a config and the axes of a sweep: their checks (GQA heads, lengths, the mask
and paged KV cache that must fit them) and the cell spec a shape gives. Pydantic only; no torch."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from attnprof.config.fields import (
    KvCache,
    MaskText,
    Mode,
    Positive,
    ScoreModText,
    Strict,
    mask_problem,
    page_size_of,
)
from attnprof.kv_cache import page_size_problem
from attnprof.masks import PLAIN_KINDS, Mask
from attnprof.registry import RunSpec
from attnprof.varlen import fit_problem, parse_seq_lens

#: The shape fields a sweep axis may stand in for (`Config._sweep_fills_shapes`).
REQUIRED_SHAPE_FIELDS = ("batch", "heads", "seq", "head_dim")


class Shape(Strict):
    """One attention shape: q is [batch, heads, q_len, head_dim]; k and v have kv_heads heads and kv_len
    positions. q_len and kv_len default to seq; seq may be left out when kv_len is given (decode:
    `{q_len: 1, kv_len: 16384}`). `mask`, `score_mod` and `kv_cache`, when set, replace the config's for
    this shape. `seq_lens` (`attnprof.varlen`) packs sequences of those lengths into batch 1 of their total
    tokens; batch and seq may then be left out (seq, when given, bounds each length)."""

    batch: int | None = Field(default=None, gt=0)
    heads: int = Field(gt=0)
    seq: int | None = Field(default=None, gt=0)
    head_dim: int = Field(gt=0, le=512)
    kv_heads: int | None = Field(default=None, gt=0)
    q_len: int | None = Field(default=None, gt=0)
    kv_len: int | None = Field(default=None, gt=0)
    mask: MaskText = None
    score_mod: ScoreModText = None
    kv_cache: KvCache | None = None
    seq_lens: tuple[int, ...] | None = None

    @field_validator("seq_lens", mode="before")
    @classmethod
    def _lengths(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_seq_lens(value)
        except ValueError as exc:
            raise PydanticCustomError("seq_lens", str(exc)) from None

    @model_validator(mode="after")
    def _packed_fits(self) -> "Shape":
        if self.seq_lens is None:
            if self.batch is None:
                raise ValueError("batch is required (or seq_lens)")
            return self
        if problem := fit_problem(self.seq_lens, self.seq, self.batch):
            raise ValueError(problem)
        given = [name for name in ("q_len", "kv_len", "kv_cache", "score_mod") if getattr(self, name) is not None]
        if given:
            raise ValueError(f"seq_lens takes no {', '.join(given)}")
        if self.mask is not None and self.mask not in PLAIN_KINDS:
            raise ValueError(f"seq_lens takes the causal or none mask (got {self.mask})")
        return self

    @model_validator(mode="after")
    def _gqa_divides(self) -> "Shape":
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.seq is None and self.kv_len is None and self.seq_lens is None:
            raise ValueError("seq is required (or kv_len, with q_len for decode)")
        if self.q_len_in_force > self.kv_len_in_force:
            raise ValueError(f"q_len ({self.q_len_in_force}) must not exceed kv_len ({self.kv_len_in_force})")
        if self.mask is not None and (problem := mask_problem(self.mask, self.q_len_in_force, self.kv_len_in_force)):
            raise ValueError(problem)
        if problem := page_size_problem(page_size_of(self.kv_cache), self.kv_len_in_force):
            raise ValueError(problem)
        return self

    @property
    def seq_in_force(self) -> int:
        """`seq`, else `kv_len` (a decode shape that gives only q_len and kv_len); a packed shape's total tokens."""
        if self.seq_lens is not None:
            return sum(self.seq_lens)
        return self.seq if self.seq is not None else int(self.kv_len or 0)

    @property
    def q_len_in_force(self) -> int:
        """`q_len`, else the sequence length."""
        return self.q_len or self.seq_in_force

    @property
    def kv_len_in_force(self) -> int:
        """`kv_len`, else the sequence length."""
        return self.kv_len or self.seq_in_force

    def spec(
        self,
        device: str,
        dtype: str,
        causal: bool,
        mode: str,
        mask: str | None = None,
        score_mod: str | None = None,
        kv_cache: KvCache | None = None,
    ) -> RunSpec:
        """The cell spec of this shape on `device` with `dtype`, masking and mode. `mask`, `score_mod` and
        `kv_cache` are the config's defaults, used where the shape sets none; without either mask, `causal`
        chooses the plain one (a mask, plain or sized, overrides it)."""
        chosen = self.mask or mask
        if self.seq_lens is not None:
            return RunSpec(
                device,
                dtype,
                1,
                self.heads,
                self.seq_in_force,
                self.head_dim,
                self.kv_heads,
                mode=mode,
                mask=chosen if chosen in PLAIN_KINDS else Mask.plain(causal),
                seq_lens=self.seq_lens,
            )
        return RunSpec(
            device,
            dtype,
            self.batch or 1,
            self.heads,
            self.seq_in_force,
            self.head_dim,
            self.kv_heads,
            mode=mode,
            mask=chosen if chosen is not None else Mask.plain(causal),
            score_mod=self.score_mod or score_mod,
            q_len=self.q_len,
            kv_len=self.kv_len,
            page_size=page_size_of(self.kv_cache or kv_cache),
        )

    @property
    def label(self) -> str:
        """`RunSpec.shape_label` of this shape with its own mask, score mod and kv_cache (not the config's
        defaults)."""
        return self.spec("cpu", "fp32", False, "fwd").shape_label


class Sweep(Strict):
    """Sweep axes (`attnprof sweep`): each a non-empty list; the sweep runs their cross product.

    A shape axis replaces that field in every configured shape (a shape may then leave it out);
    `dtype`, `causal` and `mode` replace the config's `dtype`, `causal` and `modes`. A `kv_heads`
    value of null means as many as `heads`. `q_len`, `kv_len`, `mask`, `score_mod` and `kv_cache`
    replace those of every shape (`score_mod` null: none; `kv_cache` null: not paged).
    """

    batch: Annotated[list[Positive], Field(min_length=1)] | None = None
    heads: Annotated[list[Positive], Field(min_length=1)] | None = None
    kv_heads: Annotated[list[Positive | None], Field(min_length=1)] | None = None
    seq: Annotated[list[Positive], Field(min_length=1)] | None = None
    head_dim: Annotated[list[Annotated[int, Field(gt=0, le=512)]], Field(min_length=1)] | None = None
    q_len: Annotated[list[Positive], Field(min_length=1)] | None = None
    kv_len: Annotated[list[Positive], Field(min_length=1)] | None = None
    mask: Annotated[list[MaskText], Field(min_length=1)] | None = None
    score_mod: Annotated[list[ScoreModText], Field(min_length=1)] | None = None
    kv_cache: Annotated[list[KvCache | None], Field(min_length=1)] | None = None
    dtype: Annotated[list[Literal["bf16", "fp16", "fp32", "fp8", "fp8_e5m2"]], Field(min_length=1)] | None = None
    causal: Annotated[list[bool], Field(min_length=1)] | None = None
    mode: Annotated[list[Mode], Field(min_length=1)] | None = None

    @field_validator("*")
    @classmethod
    def _each_once(cls, value: list[Any] | None) -> list[Any] | None:
        if value is not None:
            repeated = [v for i, v in enumerate(value) if v in value[:i]]
            if repeated:
                raise ValueError(f"{', '.join(map(str, dict.fromkeys(repeated)))} given more than once")
        return value

    def axes(self) -> dict[str, list[Any]]:
        """The declared axes, by name, in field order."""
        return {name: values for name in type(self).model_fields if (values := getattr(self, name)) is not None}
