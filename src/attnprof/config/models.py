"""The run configuration's models: `Config` (shapes, masking defaults, variants, schedule, sweep) and
`MeasureOptions` (how each cell is measured). Pydantic only; no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from attnprof.config.fields import (
    KvCache,
    MaskText,
    Mode,
    ScoreModText,
    Strict,
    device_name,
    mask_problem,
    mask_text,
    nonempty,
    page_size_of,
)
from attnprof.config.shapes import REQUIRED_SHAPE_FIELDS, Shape, Sweep
from attnprof.kv_cache import page_size_problem
from attnprof.masks import PLAIN_KINDS
from attnprof.registry import DEFAULT_REGION, MODES


class Schedule(Strict):
    """torch.profiler schedule: steps skipped, warmed up, then recorded."""

    wait: int = Field(default=1, ge=0)
    warmup: int = Field(default=1, ge=0)
    active: int = Field(default=3, ge=1)

    @property
    def total_steps(self) -> int:
        """Steps the profiled loop must run for one full cycle."""
        return self.wait + self.warmup + self.active


class Exclusion(Strict):
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


class Config(Strict):
    """Everything one `attnprof run`, `compare` or `sweep` needs."""

    device: str = "auto"
    dtype: Literal["auto", "bf16", "fp16", "fp32", "fp8", "fp8_e5m2"] = "auto"  # auto: see devices.resolve_dtype
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
        if shape.seq_lens is not None:
            given = ", ".join(f"{name} {value}" for name, value in self.packed_defaults().items() if value is not None)
            return f"seq_lens takes no sized mask, score_mod or kv_cache (the config gives {given})" if given else None
        if self.mask is not None and shape.mask is None:
            if problem := mask_problem(self.mask, shape.q_len_in_force, shape.kv_len_in_force):
                return problem
        if shape.kv_cache is None:
            return page_size_problem(page_size_of(self.kv_cache), shape.kv_len_in_force)
        return None

    def packed_defaults(self) -> dict[str, Any]:
        """The config's defaults that a packed shape (seq_lens) cannot take: a sized mask, a score mod, a
        paged cache (None where not set)."""
        return {
            "mask": self.mask if self.mask not in (None, *PLAIN_KINDS) else None,
            "score_mod": self.score_mod,
            "kv_cache": self.kv_cache.page_size if self.kv_cache is not None else None,
        }

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


#: --cuda-graph: "auto" replays a CUDA graph for decode-like forward cells (`profiling.cuda_graphs.graph_choice`),
#: "on" wherever the variant allows capture, "off" never. A results file of before "auto" wrote true or false.
CudaGraph = Literal["auto", "on", "off"]
#: --cold-l2: "off" (warm L2, back-to-back calls), "flush" (= --flush-l2: a buffer zeroed before each call) or
#: "rotate" (each call reads the next of enough copies of its inputs to exceed 5x the L2).
ColdL2 = Literal["off", "flush", "rotate"]


def cuda_graph_choice(value: Any) -> Any:
    """A `cuda_graph` value as "auto", "on" or "off": true and false (results files of before "auto") are
    "on" and "off"; anything else is left to the field's validation."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


class MeasureOptions(Strict):
    """How each cell is measured: the flags `run` and `compare` share, each with its one default.
    `flush_l2` and `cold_l2` say one thing two ways (`--flush-l2` is `--cold-l2 flush`); either one given
    sets the other."""

    timing: bool = True
    min_time_s: float = Field(default=0.25, gt=0)
    contention_retimes: int = Field(default=2, ge=0)  # re-times of a contended timing, each once the CPU is calm
    cuda_graph: CudaGraph = "auto"
    flush_l2: bool = False
    cold_l2: ColdL2 = "off"
    check_masking: bool = False
    refresh_ceiling: bool = False
    clocks: bool = True
    record_shapes: bool = True  # the profiler records each op's input shapes and types (the calls' bytes)
    with_stack: bool = False  # the profiler records the Python stack of each op
    key_averages_table: bool = False  # build the profiler's own key_averages table (`run` prints it)
    ncu: bool = False  # each ok cell's step run again under Nsight Compute, its counters attached
    ncu_launches: int = Field(default=NCU_LAUNCHES, gt=0)  # kernel launches one Nsight Compute pass profiles
    time_fixes: bool = False  # each row's findings' fixes timed at its trace's shapes (`attnprof model` sets it)

    @field_validator("cuda_graph", mode="before")
    @classmethod
    def _graph_from_bool(cls, value: Any) -> Any:
        return cuda_graph_choice(value)

    @model_validator(mode="after")
    def _one_cold_l2(self) -> "MeasureOptions":
        if self.flush_l2 and self.cold_l2 == "rotate":
            raise ValueError("--flush-l2 and --cold-l2 rotate contradict each other: give one")
        if self.flush_l2 or self.cold_l2 == "flush":
            object.__setattr__(self, "flush_l2", True)
            object.__setattr__(self, "cold_l2", "flush")
        return self
