"""`python -m attnprof.pipeline.ncu_child JOB`: one cell (or one row of `attnprof model`) run again in a
process of its own, for Nsight Compute to profile (`pipeline.counters` starts it under `ncu`).

JOB is one JSON object, made by `pipeline.counters.cell_command` or `model_command` in the parent:

* a cell: the variant's name, whether plugins must load (`no_plugins` for a built-in variant), the
  `RunSpec`'s fields and the seed. The step is built as every cell builds it (`profiling.steps.cell_step`:
  the inputs, the variant's setup and `prepare_inputs`, the step of the spec's mode);
* a model row: the model config (as `attnprof model` resolved it), the device, the implementation's name,
  the seq and the mode. The model is built as its row built it (`pipeline.model.open_model`, then the
  source's `prepare`).

Then `profiling.ncu.profiled_steps`: a warm-up, then `steps` calls between the profiler's start and stop.
A cell that cannot run prints one line, `attnprof-ncu-child: failed: REASON` (or `skipped:`) on stderr,
and exits with `CHILD_FAILED`; the parent reads that line.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from attnprof.errors import AttnprofError, VariantUnavailableError
from attnprof.profiling.ncu import CHILD_FAILED, CHILD_MARK, WARMUP_STEPS

if TYPE_CHECKING:
    from attnprof.variant_registry import Registry


def main(argv: list[str] | None = None) -> int:
    """Run the job of `argv[0]`; 0, or CHILD_FAILED after one line on stderr."""
    args = sys.argv[1:] if argv is None else argv
    try:
        job = json.loads(args[0])
        registry = _registry(bool(job.get("no_plugins")))
        if "cell" in job:
            run_cell_again(job["cell"], registry, int(job.get("steps", 1)))
        else:
            run_model_row_again(job["model"], registry, int(job.get("steps", 1)))
    except VariantUnavailableError as exc:
        print(f"{CHILD_MARK} skipped: {exc.message}", file=sys.stderr, flush=True)
        return CHILD_FAILED
    except AttnprofError as exc:
        print(f"{CHILD_MARK} failed: {exc.message}", file=sys.stderr, flush=True)
        return CHILD_FAILED
    return 0


def _registry(no_plugins: bool) -> Registry:
    from attnprof.plugins import load_variants

    return load_variants(no_plugins=no_plugins).registry


def run_cell_again(cell: dict[str, Any], registry: Registry, steps: int) -> None:
    """The cell of a job's `cell` part, its variant from `registry`: its step built as the cell built it, warmed
    up, then `steps` calls between the profiler's start and stop. The variant's failures raise one line."""
    from attnprof.pipeline.stages import guard
    from attnprof.profiling.ncu import profiled_steps
    from attnprof.profiling.steps import cell_step
    from attnprof.registry import RunSpec

    variant = registry.get(cell["variant"])
    spec = RunSpec(**cell["spec"])
    if variant.load_error:
        raise AttnprofError(variant.load_error)
    stage = "backward" if spec.backward else "forward"
    with cell_step(variant, spec, int(cell["seed"]), lambda what: guard(what, variant)) as step:
        with guard(stage, variant):
            profiled_steps(step.call, spec.device, step.prepare, steps, WARMUP_STEPS)


def run_model_row_again(row: dict[str, Any], registry: Registry, steps: int) -> None:
    """The model row of a job's `model` part (attnprof variants from `registry`): the model built as its row
    built it, its step warmed up, then `steps` calls between the profiler's start and stop."""
    from attnprof.model_config import ModelConfig
    from attnprof.models.implementations import resolve_implementations
    from attnprof.pipeline.model import open_model
    from attnprof.pipeline.stages import guard
    from attnprof.profiling.ncu import profiled_steps

    config = ModelConfig.model_validate(row["config"])
    device, mode = str(row["device"]), str(row["mode"])
    chosen = resolve_implementations(config.implementations, registry, passthrough=config.factory is not None)
    source, implementations, _ = open_model(config, device, chosen)
    implementation = next(i for i in implementations if i.name == row["implementation"])
    with guard("model build", implementation.variant):
        built = source.prepare(implementation, row["seq"], mode)
    with guard("training step" if mode == "fwd+bwd" else "forward", implementation.variant):
        profiled_steps(built.step, device, None, steps, WARMUP_STEPS)


if __name__ == "__main__":
    raise SystemExit(main())
