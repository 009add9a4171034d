"""The run configuration: pydantic models and `load_config`. YAML and validation only; no torch."""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from attnprof.errors import ConfigError
from attnprof.kv_cache import page_size_problem, parse_kv_cache
from attnprof.masks import PLAIN_KINDS, Mask, parse_mask, parse_score_mod
from attnprof.registry import DEFAULT_REGION, MODES, RunSpec

Mode = Literal["fwd", "bwd", "fwd+bwd"]
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
#: The shape fields a sweep axis may stand in for (`Config._sweep_fills_shapes`).
REQUIRED_SHAPE_FIELDS = ("batch", "heads", "seq", "head_dim")
SchemaT = TypeVar("SchemaT", bound=BaseModel)


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def mask_text(value: Any) -> str | None:
    """A config's mask (`causal`, `none`, `{sliding_window: W}`, ...) as its canonical text; None stays None."""
    return None if value is None else parse_mask(value).text


def score_mod_text(value: Any) -> str | None:
    """A config's score mod (null, `{softcap: C}`, `alibi`) as its canonical text or None."""
    return parse_score_mod(value)


#: A mask or score mod field: any config form in, the canonical text kept (`attnprof.masks`).
MaskText = Annotated[str | None, BeforeValidator(mask_text)]
ScoreModText = Annotated[str | None, BeforeValidator(score_mod_text)]


def _mask_problem(mask: str, q_len: int, kv_len: int) -> str | None:
    return parse_mask(mask).problem(q_len, kv_len)


class KvCache(_Strict):
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


def _page_size(kv_cache: KvCache | None) -> int | None:
    return kv_cache.page_size if kv_cache is not None else None


class Shape(_Strict):
    """One attention shape: q is [batch, heads, q_len, head_dim]; k and v have kv_heads heads and kv_len
    positions. q_len and kv_len default to seq; seq may be left out when kv_len is given (decode:
    `{q_len: 1, kv_len: 16384}`). `mask`, `score_mod` and `kv_cache`, when set, replace the config's for
    this shape."""

    batch: int = Field(gt=0)
    heads: int = Field(gt=0)
    seq: int | None = Field(default=None, gt=0)
    head_dim: int = Field(gt=0, le=512)
    kv_heads: int | None = Field(default=None, gt=0)
    q_len: int | None = Field(default=None, gt=0)
    kv_len: int | None = Field(default=None, gt=0)
    mask: MaskText = None
    score_mod: ScoreModText = None
    kv_cache: KvCache | None = None

    @model_validator(mode="after")
    def _gqa_divides(self) -> "Shape":
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.seq is None and self.kv_len is None:
            raise ValueError("seq is required (or kv_len, with q_len for decode)")
        if self.q_len_in_force > self.kv_len_in_force:
            raise ValueError(f"q_len ({self.q_len_in_force}) must not exceed kv_len ({self.kv_len_in_force})")
        if self.mask is not None and (problem := _mask_problem(self.mask, self.q_len_in_force, self.kv_len_in_force)):
            raise ValueError(problem)
        if problem := page_size_problem(_page_size(self.kv_cache), self.kv_len_in_force):
            raise ValueError(problem)
        return self

    @property
    def seq_in_force(self) -> int:
        """`seq`, else `kv_len` (a decode shape that gives only q_len and kv_len)."""
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
        return RunSpec(
            device,
            dtype,
            self.batch,
            self.heads,
            self.seq_in_force,
            self.head_dim,
            self.kv_heads,
            mode=mode,
            mask=chosen if chosen is not None else Mask.plain(causal),
            score_mod=self.score_mod or score_mod,
            q_len=self.q_len,
            kv_len=self.kv_len,
            page_size=_page_size(self.kv_cache or kv_cache),
        )

    @property
    def label(self) -> str:
        """`RunSpec.shape_label` of this shape with its own mask, score mod and kv_cache (not the config's
        defaults)."""
        return self.spec("cpu", "fp32", False, "fwd").shape_label


class Schedule(_Strict):
    """torch.profiler schedule: steps skipped, warmed up, then recorded."""

    wait: int = Field(default=1, ge=0)
    warmup: int = Field(default=1, ge=0)
    active: int = Field(default=3, ge=1)

    @property
    def total_steps(self) -> int:
        """Steps the profiled loop must run for one full cycle."""
        return self.wait + self.warmup + self.active


class Exclusion(_Strict):
    """One `exclude` entry: variant patterns a run leaves out, only on one device type when `device` is
    set, for a `reason` the run states. A plain pattern string is the entry `{variants: [pattern]}`
    (and is written back as that string)."""

    variants: list[str] = Field(min_length=1)
    device: Literal["cpu", "cuda"] | None = None
    reason: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_pattern(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"variants": [value]}
        if not isinstance(value, (dict, Exclusion)):
            raise PydanticCustomError(
                "exclude_entry", "must be a variant pattern or a mapping with variants, device and reason"
            )
        return value

    @model_serializer(mode="wrap")
    def _as_pattern(self, handler: SerializerFunctionWrapHandler) -> Any:
        if self.device is None and self.reason is None and len(self.variants) == 1:
            return self.variants[0]
        return handler(self)

    def applies_to(self, device: str) -> bool:
        """True when the entry is in force on the resolved `device` (`cpu`, `cuda` or `cuda:N`)."""
        return self.device is None or device.split(":", 1)[0] == self.device


Positive = Annotated[int, Field(gt=0)]


class Sweep(_Strict):
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
    dtype: Annotated[list[Literal["bf16", "fp16", "fp32"]], Field(min_length=1)] | None = None
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


class Config(_Strict):
    """Everything one `attnprof run`, `compare` or `sweep` needs."""

    device: str = "auto"
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: see devices.resolve_dtype
    shapes: list[Shape] = Field(min_length=1)
    causal: bool = True
    mask: MaskText = None  # the shapes' default; a plain one (causal, none) is read into `causal`
    score_mod: ScoreModText = None
    kv_cache: KvCache | None = None  # the shapes' default: null (contiguous K/V) or {page_size: N}
    modes: list[Mode] = Field(default_factory=lambda: list[Mode](["fwd"]), min_length=1)
    variants: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    exclude: list[Exclusion] = Field(default_factory=list)
    baseline: str | None = None
    schedule: Schedule = Field(default_factory=Schedule)
    seed: int = 0
    region: str = DEFAULT_REGION
    output_dir: Path = Path("attnprof-out")
    sweep: Sweep | None = None

    @model_validator(mode="before")
    @classmethod
    def _sweep_fills_shapes(cls, data: Any) -> Any:
        """With sweep axes for required shape fields, `shapes` may leave those fields out (or be left
        out): each missing one takes its axis' first value, which the sweep replaces anyway."""
        sweep = data.get("sweep") if isinstance(data, dict) else None
        if not isinstance(sweep, dict):
            return data
        fill = {k: v[0] for k, v in sweep.items() if k in REQUIRED_SHAPE_FIELDS and isinstance(v, list) and v}
        kv_axis = sweep.get("kv_len")
        if isinstance(kv_axis, list) and kv_axis:
            fill.setdefault("kv_len", kv_axis[0])  # a shape given neither seq nor kv_len (decode sweeps)
        shapes = data.get("shapes", [{}] if fill else None)
        if not fill or not isinstance(shapes, list):
            return data
        return {**data, "shapes": [_filled(fill, s) for s in shapes]}

    @model_validator(mode="before")
    @classmethod
    def _plain_mask_is_causal(cls, data: Any) -> Any:
        """`mask: causal` and `mask: none` are `causal: true` and `false` (so `--causal` overrides
        them); a `causal` that contradicts them is an error."""
        if not isinstance(data, dict) or data.get("mask") is None:
            return data
        try:
            text = mask_text(data["mask"])
        except ValueError:
            return data  # the field validator reports it
        if text not in PLAIN_KINDS:
            return data
        wanted = text == "causal"
        if "causal" in data and data["causal"] is not None and data["causal"] != wanted:
            raise PydanticCustomError("mask_causal", f"mask {text} contradicts causal: {data['causal']}")
        return {**{k: v for k, v in data.items() if k != "mask"}, "causal": wanted}

    @model_validator(mode="after")
    def _defaults_fit(self) -> "Config":
        for i, shape in enumerate(self.shapes):
            if problem := self.default_problem(shape):
                raise ValueError(f"shapes.{i}: {problem}")
        return self

    def default_problem(self, shape: Shape) -> str | None:
        """Why the config's default mask or kv_cache does not fit `shape` where it sets none, or None."""
        if self.mask is not None and shape.mask is None:
            if problem := _mask_problem(self.mask, shape.q_len_in_force, shape.kv_len_in_force):
                return problem
        if shape.kv_cache is None:
            return page_size_problem(_page_size(self.kv_cache), shape.kv_len_in_force)
        return None

    @field_validator("device")
    @classmethod
    def _device_form(cls, value: str) -> str:
        return device_name(value)

    @field_validator("modes")
    @classmethod
    def _modes_once(cls, value: list[str]) -> list[str]:
        repeated = sorted({m for m in value if value.count(m) > 1}, key=MODES.index)
        if repeated:
            raise ValueError(f"{', '.join(repeated)} given more than once")
        return value

    @field_validator("region")
    @classmethod
    def _region_nonempty(cls, value: str) -> str:
        return nonempty(value)

    @model_validator(mode="after")
    def _baseline_selected(self) -> "Config":
        everywhere = [p for entry in self.exclude if entry.device is None for p in entry.variants]
        if self.baseline is not None and not any(ch in self.baseline for ch in "*?[") and self.baseline in everywhere:
            raise ValueError(f"baseline {self.baseline!r} is excluded")
        return self

    def exclusions(self, device: str) -> list[Exclusion]:
        """The `exclude` entries in force on the resolved `device`."""
        return [entry for entry in self.exclude if entry.applies_to(device)]


def _filled(fill: dict[str, Any], shape: Any) -> Any:
    """A shape mapping with the sweep's first values where it lacks a required field; kv_len only
    when it gives neither seq nor kv_len, and seq then not at all (the shape is a decode one)."""
    if not isinstance(shape, dict):
        return shape
    fill = dict(fill)
    if "seq" in shape or "kv_len" in shape:
        fill.pop("kv_len", None)
    elif "kv_len" in fill:
        fill.pop("seq", None)
    return fill | shape


#: --ncu: kernel launches one Nsight Compute pass profiles at most, by default: a cell's step (a backward
#: launches a handful of kernels), and a model row's attention kernels (the first layers' of its step).
NCU_LAUNCHES = 16
MODEL_NCU_LAUNCHES = 8


class MeasureOptions(_Strict):
    """How each cell is measured: the flags `run` and `compare` share, each with its one default."""

    timing: bool = True
    min_time_s: float = Field(default=0.25, gt=0)
    cuda_graph: bool = False
    flush_l2: bool = False
    check_masking: bool = False
    refresh_ceiling: bool = False
    clocks: bool = True
    record_shapes: bool = True  # the profiler records each op's input shapes and types (the calls' bytes)
    with_stack: bool = False  # the profiler records the Python stack of each op
    key_averages_table: bool = False  # build the profiler's own key_averages table (`run` prints it)
    ncu: bool = False  # each ok cell's step run again under Nsight Compute, its counters attached
    ncu_launches: int = Field(default=NCU_LAUNCHES, gt=0)  # kernel launches one Nsight Compute pass profiles


#: Where the user typed a field, by its path without list indices (`shapes.0.seq` is ("shapes", "seq")):
#: e.g. {("shapes", "seq"): "--seq"}. "" names a check of several fields at that path (`heads must be a
#: multiple of kv_heads`), said in its own words.
FieldNames = Mapping[tuple[str, ...], str]


def close_matches(word: str, choices: Any, n: int = 3) -> list[str]:
    """The `n` choices nearest to `word` (difflib's ratio, at least 0.6), nearest first."""
    from difflib import get_close_matches

    return get_close_matches(word, [str(c) for c in choices], n=n, cutoff=0.6)


def did_you_mean(word: str, choices: Any) -> str:
    """`; did you mean causal?` (or `a or b?`) for the nearest choices to `word`; "" without any."""
    near = close_matches(word, choices)
    if not near:
        return ""
    return "; did you mean " + (near[0] if len(near) == 1 else ", ".join(near[:-1]) + " or " + near[-1]) + "?"


def _model_at(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the last part of `loc` (a field path from `schema`), or None."""
    from typing import get_args

    model: Any = schema
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        found, todo = None, [field.annotation]
        while todo and found is None:  # unwrap Optional, list[...], Annotated[...] to the model inside
            kind = todo.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found = kind
            else:
                todo += list(get_args(kind))
        if found is None:
            return None
        model = found
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unknown_key(schema: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """`unknown key`, with the nearest keys of the mapping it is in (`; did you mean causal?`)."""
    model = _model_at(schema, loc) if schema is not None and loc else None
    if model is None or not isinstance(loc[-1], str):
        return "unknown key"
    return "unknown key" + did_you_mean(loc[-1], model.model_fields)


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _shown(value: Any) -> str:
    """A value as the user typed it: numbers without a trailing `.0`, text quoted."""
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return repr(value)


def _as_typed(item: Any) -> str:
    """A problem in words for a value the user typed: `must be > 0 (got 0)`."""
    kind, ctx, given = item["type"], item.get("ctx") or {}, item.get("input")
    if kind in _BOUNDS:
        sign = _BOUNDS[kind]
        bound = ctx.get({">": "gt", ">=": "ge", "<": "lt", "<=": "le"}[sign])
        text = f"must be {sign} {_shown(bound).strip(chr(39))}"
    elif kind == "literal_error":
        text = f"must be {ctx.get('expected')}"
    else:
        text = item["msg"].removeprefix("Value error, ")
    return f"{text} (got {_shown(given)})" if isinstance(given, (int, float, str)) and given != "" else text


def format_validation_error(
    error: ValidationError, schema: type[BaseModel] | None = None, names: FieldNames | None = None
) -> list[str]:
    """One line per problem, in the order pydantic found them: `field.path: message`, an unknown key with
    the nearest keys of its mapping (`schema`: the model validated), or for a field in `names` (what the
    user typed, e.g. an option) `--seq must be > 0 (got 0)`."""
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        typed = (names or {}).get(tuple(part for part in loc if isinstance(part, str)))
        if typed is not None and item["type"] != "extra_forbidden":
            text = _as_typed(item) if typed else item["msg"].removeprefix("Value error, ")
            lines.append(text if not typed else f"{typed} {text}" if text.startswith("must") else f"{typed}: {text}")
            continue
        path = ".".join(str(part) for part in loc) or "(config)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = _unknown_key(schema, loc)
        lines.append(f"{path}: {message}")
    return lines


def parse_config(data: Any, origin: str = "config", names: FieldNames | None = None) -> Config:
    """Validate a mapping into a Config; ConfigError carries `field.path: message` lines (see
    `validate_mapping` for `names`)."""
    return validate_mapping(Config, data, origin, names)


def validate_mapping(schema: type[SchemaT], data: Any, origin: str, names: FieldNames | None = None) -> SchemaT:
    """Validate a mapping into `schema` (a pydantic model); ConfigError carries `field.path: message` lines,
    or when every problem is in a field the user typed (`names`, see `FieldNames`), those lines alone
    (`--seq must be > 0 (got 0)`)."""
    if data is None:
        raise ConfigError(f"{origin}: the file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, origin, schema, names) from None


def validation_error(
    error: ValidationError, origin: str, schema: type[BaseModel] | None = None, names: FieldNames | None = None
) -> ConfigError:
    """The ConfigError of a failed validation (see `validate_mapping`)."""
    lines = format_validation_error(error, schema, names)
    typed = [
        item
        for item in error.errors()
        if item["type"] != "extra_forbidden" and tuple(p for p in item["loc"] if isinstance(p, str)) in (names or {})
    ]
    if names and len(typed) == len(lines):
        return ConfigError("\n".join(lines))
    return ConfigError(f"{origin} is invalid:\n" + "\n".join(f"  {line}" for line in lines))


def read_yaml(path: str | Path) -> Any:
    """The YAML document in `path`, read with `yaml.safe_load`; ConfigError (one line) when the file is
    missing, unreadable or not valid YAML."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    return _parse_yaml(text, str(path))


def _parse_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML{yaml_problem(exc)}") from None


def yaml_problem(exc: Exception) -> str:
    """Where and what a YAML error found: ` (line 3, column 1): expected ',' or '}', but got '<stream end>'`
    (the line and column where the parser saw the problem, else where the construct it was reading began)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: {problem}"


def load_config(path: str | Path | None = None) -> Config:
    """Read a YAML config with `yaml.safe_load`; None loads the built-in default config."""
    if path is None:
        text = resources.files("attnprof").joinpath("default.yaml").read_text()
        return parse_config(_parse_yaml(text, "built-in default config"), "built-in default config")
    return parse_config(read_yaml(path), str(path))


def apply_overrides(config: Config, names: FieldNames | None = None, **overrides: Any) -> Config:
    """A copy of `config` with the non-None overrides applied and validated again; `names` says where the
    user typed each overridden field (see `FieldNames`), for the errors."""
    data = config.model_dump()
    changed = {key: value for key, value in overrides.items() if value is not None}
    if not changed:
        return config
    data.update(changed)
    return parse_config(data, "command-line options", names)
