"""What is a model row's own in `attnprof model`: the model built (or reused) with one implementation at one
seq and mode, its attention shape as the model states it, and its logits compared with the baseline
implementation's.

The rest is a cell's sequence (`pipeline.stages`): the whole step timed (`profiling.timing`: CUDA events on a
GPU, perf_counter on CPU; median and IQR; with `--no-timing` a warm-up instead), profiled a few steps, each
inside the `region` range, the logits checked, peak memory, then the trace analysis of the model's region
(which carries the attention ledger), against the figures measured on this machine when the ceiling cache
holds them. Whatever the model or the implementation raises becomes a skipped or failed row with a one-line
reason, never lost rows; Python warnings and transformers' log messages of the row are kept on it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnprof.config import MeasureOptions
from attnprof.errors import VariantFailure
from attnprof.model_config import ModelConfig
from attnprof.model_spec import ModelSpec
from attnprof.models.implementations import Implementation
from attnprof.models.source import ModelSource
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.stages import analyse_trace, guard, measure_step, measured, phase, warm_process

LOGGERS = ("transformers",)  # libraries whose log messages a row keeps instead of printing


def run_row(
    source: ModelSource,
    implementation: Implementation,
    seq: int | None,
    mode: str,
    config: ModelConfig,
    measure: MeasureOptions,
    device: str,
    trace_dir: Path,
    references: dict[tuple[int | None, str], Any],
    baseline: str,
) -> CellResult:
    """Profile `implementation` inside the model at `seq` and `mode`; never raises for the model's or the
    implementation's own failures. The `baseline` implementation's logits are kept in `references` by
    (seq, mode), and the others' compared with them."""
    subject = ModelSpec(config.model_label, implementation.label, config.batch, seq, mode, config.dtype, device)
    result = CellResult(implementation.name, implementation.source, subject)
    variant = implementation.variant
    if variant is not None and variant.load_error:  # a broken plugin is a failure
        result.status, result.reason = "failed", variant.load_error
        return result

    def body() -> None:
        from attnprof.peaks import cached_peaks

        _measure(source, implementation, result, config, measure, trace_dir, references, baseline)
        analyse_trace(result, config.region, cached_peaks, time_fixes=measure.time_fixes)

    return measured(result, body, LOGGERS)


def _measure(
    source: ModelSource,
    implementation: Implementation,
    result: CellResult,
    config: ModelConfig,
    measure: MeasureOptions,
    trace_dir: Path,
    references: dict[tuple[int | None, str], Any],
    baseline: str,
) -> None:
    from attnprof.profiling.timing import TimingOptions

    variant = implementation.variant
    spec = result.model
    warm_process(result)
    with phase(result, "build"), guard("model build", variant):
        built = source.prepare(implementation, spec.seq, spec.mode)
        result.subject = spec = replace(spec, params=built.params)
    shape = built.shape  # the heads, kv heads, head dim and causality as the model states them (None: it does not)
    result.subject = replace(
        spec,
        seq=built.seq,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        causal=shape.causal if config.mask is None else config.mask == "causal",
        mask=config.mask or ("causal" if shape.causal else None),
        score_mod=config.score_mod,
    )
    measure_step(
        result,
        built.step,
        lambda logits: _compare_logits(result, logits, references, baseline),
        variant=variant,
        stage="training step" if spec.mode == "fwd+bwd" else "forward",
        check_stage="logits check",
        options=TimingOptions(**config.timing.model_dump(), flush_l2=measure.flush_l2, gpu_health=measure.clocks),
        measure=measure,
        schedule=config.schedule,
        region=config.region,
        trace_path=trace_dir / trace_name(result),
    )


def _compare_logits(
    result: CellResult, logits: Any, references: dict[tuple[int | None, str], Any], baseline: str
) -> None:
    """Keep the baseline's logits, or compare the row's with them; NaN or Inf logits fail the row."""
    from attnprof.profiling.correctness import logits_difference, nonfinite_reason

    key = result.model.speed_key
    reference = references.get(key)
    if result.variant == baseline or reference is None:
        bad = nonfinite_reason(logits)
        if bad:
            raise VariantFailure(bad.replace("output", "the logits"))
        if result.variant == baseline:
            references[key] = logits
        return
    result.logits = logits_difference(logits, reference, baseline)


def trace_name(result: CellResult) -> str:
    """`IMPL_MODEL_BxSEQ_DTYPE_MODE_DEVICE.json.gz`, safe as a file name (the profiler numbers a second one)."""
    spec = result.model
    seq = spec.seq if spec.seq is not None else "inputs"
    raw = f"{result.variant}_{spec.model}_{spec.batch}x{seq}_{spec.dtype}_{spec.mode}_{spec.device}"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", raw.replace(":", "")) + ".json.gz"
