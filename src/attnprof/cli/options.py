"""The option block `run`, `compare`, `sweep`, `check` and `model` share: config overrides and measurement
flags, declared once (and the variant selection of `compare`, `sweep` and `check`).

`shared_options` adds every option below to a command's signature (`model`: those that apply to a whole
model, `MODEL_CONFIG_FIELDS` and `MODEL_MEASURE_FIELDS`). The command receives them gathered: `overrides` (a
dict of config fields the user set) and `measure` (a `MeasureOptions`). A new measurement option is one field
on `config.MeasureOptions` plus one entry in `MEASURE_OPTIONS`; its default comes from the model. A
measurement option whose default is None for a command (`model`'s `--min-time`: its config's `timing`
decides) is left out of `measure.model_fields_set` when not given.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from attnprof.cli.common import DeviceOpt, DtypeOpt
from attnprof.config import MODEL_NCU_LAUNCHES, MeasureOptions
from attnprof.profiling.contention import CALM_WAIT_S

#: Config fields a command-line option overrides; None means "as the config says".
CONFIG_OPTIONS: dict[str, Any] = {
    "device": DeviceOpt,
    "dtype": DtypeOpt,
    "batch": Annotated[
        int | None, typer.Option(help="Batch size (overrides the config's shapes).", show_default=False)
    ],
    "heads": Annotated[int | None, typer.Option(help="Query heads.", show_default=False)],
    "kv_heads": Annotated[int | None, typer.Option("--kv-heads", help="Key/value heads (GQA).", show_default=False)],
    "seq": Annotated[int | None, typer.Option(help="Sequence length.", show_default=False)],
    "head_dim": Annotated[int | None, typer.Option("--head-dim", help="Head dimension.", show_default=False)],
    "causal": Annotated[bool | None, typer.Option("--causal/--no-causal", help="Causal masking.", show_default=False)],
    "mode": Annotated[
        str | None,
        typer.Option(
            "--mode",
            metavar="fwd|bwd|fwd+bwd",
            show_default=False,
            help="What is timed: the forward, the backward alone, or a whole step; comma-separated for several "
            "(overrides the config's modes).",
        ),
    ],
    "output_dir": Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="Where traces and results go.", show_default=False)
    ],
    "region": Annotated[
        str | None,
        typer.Option(
            help="Name of the record_function region around each forward (a model's: each step).", show_default=False
        ),
    ],
    "seed": Annotated[
        int | None, typer.Option(help="Seed for the inputs (and a model's weights).", show_default=False)
    ],
    "wait": Annotated[int | None, typer.Option(help="Profiler schedule: steps skipped.", show_default=False)],
    "warmup": Annotated[int | None, typer.Option(help="Profiler schedule: warm-up steps.", show_default=False)],
    "active": Annotated[int | None, typer.Option(help="Profiler schedule: recorded steps.", show_default=False)],
}

#: One entry per field of MeasureOptions.
MEASURE_OPTIONS: dict[str, Any] = {
    "timing": Annotated[
        bool,
        typer.Option(
            "--timing/--no-timing", help="Time the forward outside the profiler (latency, memory, throughput)."
        ),
    ],
    "min_time_s": Annotated[float, typer.Option("--min-time", help="Seconds of timed repetitions per cell.")],
    "contention_retimes": Annotated[
        int,
        typer.Option(
            "--contention-retimes",
            metavar="N",
            min=0,
            help="Time a cell again, at most N times, when other processes held the CPU while it was timed; each "
            f"after waiting up to {CALM_WAIT_S:g} s for the CPU to calm (none when it does not). 0: never.",
        ),
    ],
    "cuda_graph": Annotated[
        bool | None,
        typer.Option(
            "--cuda-graph/--no-cuda-graph",
            show_default=False,
            help="Time CUDA-graph replays (many forwards per graph, each graph checked to hold the eager step's "
            "kernels) or eager calls. Default: graphs for CUDA forward cells with q_len <= 16 (decode, as a serving "
            "engine replays it), eager otherwise.",
        ),
    ],
    "flush_l2": Annotated[bool, typer.Option("--flush-l2", help="Flush the L2 cache between timed calls.")],
    "cold_l2": Annotated[
        str,
        typer.Option(
            "--cold-l2",
            metavar="off|flush|rotate",
            help="How each timed call finds the L2: off (warm, back to back), flush (= --flush-l2: a buffer zeroed "
            "before each call) or rotate (each call reads the next of enough copies of the inputs to exceed 5x the "
            "L2; works inside a CUDA graph, where no flush can run between replays).",
        ),
    ],
    "check_masking": Annotated[
        bool, typer.Option("--check-masking", help="Probe fully masked rows and report NaN per variant.")
    ],
    "refresh_ceiling": Annotated[
        bool,
        typer.Option("--refresh-ceiling", help="Measure the matmul ceiling again instead of using the cached figure."),
    ],
    "clocks": Annotated[
        bool,
        typer.Option(
            "--clocks/--no-clocks",
            help="Sample the GPU while timing (CUDA only): the SM clock with nvidia-smi, and clock, power, "
            "temperature and throttle reasons over the timed calls with NVML (the nvml extra).",
        ),
    ],
    "record_shapes": Annotated[
        bool,
        typer.Option(
            "--record-shapes/--no-record-shapes",
            help="Record each op's input shapes and types in the trace (on by default: the analysis reads the "
            "attention calls' bytes and GB/s and the mask's type from them; off: a smaller trace without them).",
        ),
    ],
    "with_stack": Annotated[
        bool,
        typer.Option("--with-stack", help="Record the Python stack of each op in the trace (a larger trace)."),
    ],
    "ncu": Annotated[
        bool,
        typer.Option(
            "--ncu",
            help="After each cell's measurement, run its step again under Nsight Compute and attach the hardware "
            "counters of its kernels (DRAM bytes, tensor-pipe use, occupancy, warp stalls); about 10-30 s per "
            "cell on a GPU (attnprof model: each row, its attention kernels). The report is written beside the cell's "
            "trace.",
        ),
    ],
    "ncu_launches": Annotated[
        int,
        typer.Option("--ncu-launches", metavar="N", help="With --ncu: kernel launches profiled per cell at most."),
    ],
}


def _patterns(flag: str, help: str) -> Any:
    """A repeatable variant-pattern option."""
    return Annotated[list[str] | None, typer.Option(flag, metavar="PATTERN", help=help, show_default=False)]


#: The `--resume` option of `compare` and `sweep` (`pipeline.resume`).
ResumeOpt = Annotated[
    Path | None,
    typer.Option(
        "--resume",
        metavar="DIR_OR_FILE",
        show_default=False,
        help="Continue the earlier run whose folder (or results file) this is: its finished cells are kept, "
        "and written again with this run's, but not run again. Without a config, the one it ran with.",
    ),
]


#: The variant selection of `compare`, `sweep` and `check` (`shared_options(select=True)`), also config overrides.
SELECT_OPTIONS: dict[str, Any] = {
    "variants": _patterns(
        "--variants",
        "Include pattern, e.g. 'sdpa-*' (repeatable or comma-separated: naive,sdpa-math; replaces the config's "
        "variants and exclude).",
    ),
    "exclude": _patterns("--exclude", "Exclude pattern (repeatable or comma-separated; overrides the config)."),
    "baseline": Annotated[str | None, typer.Option(help="Variant the speed-ups are relative to.", show_default=False)],
}

SHAPE_FIELDS = ("batch", "heads", "kv_heads", "seq", "head_dim")
SCHEDULE_FIELDS = ("wait", "warmup", "active")

#: The config overrides that apply to `attnprof model`: a model states its own attention shape (heads, head
#: dim, causality), and its `--seq` (a list) and `--mode` (fwd or fwd+bwd) are the model command's own.
MODEL_CONFIG_FIELDS = ("device", "dtype", "batch", "output_dir", "region", "seed", *SCHEDULE_FIELDS)
#: The measurement flags that apply to a whole model's step (no CUDA graph of it, no masking probe, no ceiling).
MODEL_MEASURE_FIELDS = (
    "timing",
    "min_time_s",
    "contention_retimes",
    "flush_l2",
    "clocks",
    "record_shapes",
    "with_stack",
    "ncu",
    "ncu_launches",
)
#: `attnprof model`'s own defaults: its config's `timing` decides --min-time; --ncu profiles fewer launches.
MODEL_MEASURE_DEFAULTS = {"min_time_s": None, "ncu_launches": MODEL_NCU_LAUNCHES}
#: Options whose default on the command line is None, "not given": the field's own default then applies
#: (--cuda-graph/--no-cuda-graph given neither: "auto").
UNSET_DEFAULTS = {"cuda_graph": None}


def _parameters(config_options: dict[str, Any], measure: dict[str, Any]) -> list[inspect.Parameter]:
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter(name, keyword, annotation=annotation, default=None)
        for name, annotation in config_options.items()
    ]
    params += [
        inspect.Parameter(name, keyword, annotation=MEASURE_OPTIONS[name], default=default)
        for name, default in measure.items()
    ]
    return params


def shared_options(command: Callable[..., Any] | None = None, *, select: bool = False, model: bool = False) -> Any:
    """Give `command` the shared option block (with `select`, the variant selection too, `SELECT_OPTIONS`; with
    `model`, only what applies to a whole model); it is called with `overrides=` and `measure=` instead. Use
    as `@shared_options`, `@shared_options(select=True)` or `@shared_options(model=True)`."""
    if command is None:
        return functools.partial(shared_options, select=select, model=model)
    config_options = CONFIG_OPTIONS | (SELECT_OPTIONS if select else {})
    defaults = MeasureOptions().model_dump() | UNSET_DEFAULTS
    if model:
        config_options = {name: CONFIG_OPTIONS[name] for name in MODEL_CONFIG_FIELDS}
        defaults = {name: defaults[name] for name in MODEL_MEASURE_FIELDS} | MODEL_MEASURE_DEFAULTS
    defaults = {name: defaults[name] for name in MEASURE_OPTIONS if name in defaults}
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name not in ("overrides", "measure")]
    added = _parameters(config_options, defaults)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        overrides = {name: kwargs.pop(name) for name in config_options}
        measure = measure_options({name: kwargs.pop(name) for name in defaults})
        return command(*args, overrides=overrides, measure=measure, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
    return wrapper


#: The option of each MeasureOptions field whose name differs from `--field` (`measure_options`' errors).
_MEASURE_FLAGS = {"min_time_s": "--min-time"}


def measure_options(values: dict[str, Any]) -> MeasureOptions:
    """The MeasureOptions of the flags given (None: not given, the field's default, left out of
    `model_fields_set`); ConfigError (exit 2) naming the option of a bad value (`--min-time must be > 0
    (got 0.0)`)."""
    from pydantic import ValidationError

    from attnprof.config import validation_error
    from attnprof.errors import ConfigError

    if values.get("flush_l2") and values.get("cold_l2") not in (None, "off", "flush"):
        raise ConfigError(f"--flush-l2 and --cold-l2 {values['cold_l2']} contradict each other: give one")
    try:
        return MeasureOptions(**{name: value for name, value in values.items() if value is not None})
    except ValidationError as exc:
        names: dict[tuple[str, ...], str] = {
            (name,): _MEASURE_FLAGS.get(name, "--" + name.replace("_", "-")) for name in values
        }
        raise validation_error(exc, "command-line options", MeasureOptions, names) from None


def exclude_given(overrides: dict[str, Any]) -> bool:
    """True when the command line chose the exclusions: --exclude, or --variants (which replaces them)."""
    return bool(overrides.get("variants")) or overrides.get("exclude") is not None


def split_patterns(given: list[str] | None) -> list[str]:
    """Repeated pattern options with each comma-separated list split: `--variants naive,sdpa-math
    --variants flex` is three patterns (a name never holds a comma)."""
    return [part.strip() for value in given or [] for part in value.split(",") if part.strip()]


def config_changes(overrides: dict[str, Any]) -> dict[str, Any]:
    """`build_config` keyword arguments from the shared overrides: plain fields, `shape` and `schedule`.
    --variants replaces the config's include and exclude lists together."""
    plain = {k: v for k, v in overrides.items() if k not in SHAPE_FIELDS + SCHEDULE_FIELDS + ("mode",)}
    plain["variants"] = split_patterns(overrides.get("variants")) or None
    if overrides.get("exclude") is not None:
        plain["exclude"] = split_patterns(overrides["exclude"])
    if plain["variants"] and overrides.get("exclude") is None:
        plain["exclude"] = []
    if overrides.get("mode") is not None:
        plain["modes"] = [m.strip() for m in overrides["mode"].split(",")]
    return plain | {
        "shape": {k: overrides.get(k) for k in SHAPE_FIELDS},
        "schedule": {k: overrides.get(k) for k in SCHEDULE_FIELDS},
    }
