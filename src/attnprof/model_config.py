"""The `attnprof model` configuration: which model, which attention implementations, what to time. No torch.

A model comes from Hugging Face transformers (`hf: llama` and `hf_config: {hidden_size: ..., ...}`, built
from the config with random weights, never downloaded) or from a factory (`factory: package.module:fn`, a
callable that returns `(model, example_inputs)`). Each implementation × seq × mode is one row.
`mask` and `score_mod` (the syntax of a compare shape's) replace the hf model's own causal mask in every
attention implementation; left out, the model masks as it is built.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from attnprof.config import (
    FieldNames,
    MaskText,
    Schedule,
    ScoreModText,
    device_name,
    nonempty,
    read_yaml,
    validate_mapping,
)
from attnprof.masks import parse_mask

ModelMode = Literal["fwd", "fwd+bwd"]
DEFAULT_MODEL_REGION = "model_forward"  # the record_function name around each forward of the model
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelTiming(_Strict):
    """How the whole forward is timed (`profiling.timing.time_forward`): at least `min_time_s` of calls,
    between `min_reps` and `max_reps` of them, after a warm-up of at most `warmup_s`."""

    min_time_s: float = Field(default=0.25, gt=0)
    min_reps: int = Field(default=5, ge=1)
    max_reps: int = Field(default=200, ge=1)
    warmup_s: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _reps_order(self) -> "ModelTiming":
        if self.max_reps < self.min_reps:
            raise ValueError(f"max_reps ({self.max_reps}) must be at least min_reps ({self.min_reps})")
        return self


class ModelConfig(_Strict):
    """Everything one `attnprof model` needs."""

    hf: str | None = None  # a transformers model type: llama, mistral, qwen2, ...
    hf_config: dict[str, Any] = Field(default_factory=dict)  # fields of that model type's config
    factory: str | None = None  # package.module:callable returning (model, example_inputs)
    batch: int = Field(default=1, gt=0)
    seq: list[int] = Field(default_factory=lambda: [128], min_length=1)
    device: Annotated[str, AfterValidator(device_name)] = "auto"
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    mask: MaskText = None  # causal | none | {sliding_window: W} | {documents: N} | {prefix: P}; None: the model's own
    score_mod: ScoreModText = None  # {softcap: C} | alibi; attnprof variants apply it (sinks: refused)
    implementations: list[str] = Field(default_factory=lambda: ["eager", "sdpa"], min_length=1)
    baseline: str | None = None  # speed-ups and logits differences against it; None: the first implementation
    modes: list[ModelMode] = Field(default_factory=lambda: list[ModelMode](["fwd"]), min_length=1)
    timing: ModelTiming = Field(default_factory=ModelTiming)
    schedule: Schedule = Field(default_factory=lambda: Schedule(wait=1, warmup=1, active=2))
    region: Annotated[str, AfterValidator(nonempty)] = DEFAULT_MODEL_REGION
    seed: int = 0
    output_dir: Path = Path("attnprof-out")

    @field_validator("seq", mode="before")
    @classmethod
    def _seq_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value

    @field_validator("seq")
    @classmethod
    def _seq_positive(cls, value: list[int]) -> list[int]:
        if any(s <= 0 for s in value):
            raise ValueError("every seq must be positive")
        return _once(value, "seq")

    @field_validator("implementations")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value):
            raise ValueError("an implementation name is empty")
        return _once(value, "implementation")

    @field_validator("modes")
    @classmethod
    def _modes_once(cls, value: list[str]) -> list[str]:
        return _once(value, "mode")

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str | None) -> str | None:
        if value is not None and not FACTORY_PATTERN.match(value):
            raise ValueError(f"must be package.module:callable (got {value!r})")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if (self.hf is None) == (self.factory is None):
            raise ValueError("give exactly one model source: hf (a transformers model type) or factory")
        if self.hf_config and self.hf is None:
            raise ValueError("hf_config needs hf (a transformers model type)")
        if self.baseline is not None and self.baseline not in self.implementations:
            raise ValueError(f"baseline {self.baseline!r} is not among the implementations")
        if self.factory is not None and (self.mask is not None or self.score_mod is not None):
            raise ValueError("mask and score_mod need hf: a factory model builds its own masks")
        if self.score_mod == "sinks":
            raise ValueError("score_mod sinks is for compare, run and sweep: a model's sinks are its own weights")
        for seq in self.seq if self.mask is not None else []:
            if problem := parse_mask(self.mask).problem(seq, seq):
                raise ValueError(f"mask: {problem} (seq {seq})")
        return self

    @property
    def model_label(self) -> str:
        """The model as rows name it: the transformers model type, or the factory's import path."""
        return self.hf if self.hf is not None else str(self.factory)

    @property
    def baseline_name(self) -> str:
        """The implementation speed-ups and logits differences are measured against."""
        return self.baseline or self.implementations[0]


def _once(values: list[Any], what: str) -> list[Any]:
    repeated = [str(v) for v in dict.fromkeys(v for v in values if values.count(v) > 1)]
    if repeated:
        raise ValueError(f"{what} {', '.join(repeated)} given more than once")
    return values


def load_model_config(path: str | Path) -> ModelConfig:
    """Read and validate a model config (YAML); ConfigError with one `field.path: message` line per problem."""
    return validate_mapping(ModelConfig, read_yaml(path), str(path))


def apply_model_overrides(config: ModelConfig, names: FieldNames | None = None, **overrides: Any) -> ModelConfig:
    """A copy of `config` with the non-None overrides applied and validated again. Giving `hf` drops the
    config's factory and giving `factory` drops its hf and hf_config, so the command line can switch source.
    `names` says where the user typed each field (`config.FieldNames`), for the errors."""
    changed = {key: value for key, value in overrides.items() if value is not None}
    if not changed:
        return config
    data = config.model_dump()
    if "hf" in changed:
        data["factory"] = None
    if "factory" in changed:
        data["hf"], data["hf_config"] = None, {}
    if "implementations" in changed and data.get("baseline") not in changed["implementations"]:
        data["baseline"] = None
    data.update(changed)
    given = {key: name for key, name in (names or {}).items() if key[0] in changed}
    return validate_mapping(ModelConfig, data, "command-line options", given)
