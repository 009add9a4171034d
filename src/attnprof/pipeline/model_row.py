"""One row of `attnprof model`: one implementation inside the model at one seq and mode, top to bottom.

Build (or reuse) the model → time the whole step (`profiling.timing`: CUDA events on a GPU,
perf_counter on CPU; median and IQR) → profile a few steps, each inside the `region` range
(`profiling.profiler`) → compare the logits with the baseline implementation's → peak memory → the
trace analysis (`analysis.analyze_trace`, region = the model's), which carries the attention ledger.
As in `pipeline.cell`, each stage runs under `phase` and `guard`: whatever the model or the
implementation raises becomes a skipped or failed row with a one-line reason, never lost rows.
Python warnings and transformers' log messages of the row are kept on it, not printed.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnprof.errors import TraceError, VariantFailure, VariantUnavailableError, one_line
from attnprof.model_config import ModelConfig
from attnprof.model_spec import ModelSpec
from attnprof.models.implementations import Implementation
from attnprof.models.source import ModelSource
from attnprof.pipeline.cell import guard, phase, release_after_failure, warning_lines
from attnprof.pipeline.measured import CellResult

LOGGERS = ("transformers",)  # libraries whose log messages a row keeps instead of printing


def run_row(
    source: ModelSource,
    implementation: Implementation,
    seq: int | None,
    mode: str,
    config: ModelConfig,
    device: str,
    trace_dir: Path,
    references: dict[tuple[int | None, str], Any],
    baseline: str,
) -> CellResult:
    """Profile `implementation` inside the model at `seq` and `mode`; never raises for the model's or the
    implementation's own failures. The `baseline` implementation's logits are kept in `references` by
    (seq, mode), and the others' compared with them."""
    subject = ModelSpec(
        config.model_label, implementation.attn_implementation, config.batch, seq, mode, config.dtype, device
    )
    result = CellResult(implementation.name, implementation.source, subject)
    variant = implementation.variant
    if variant is not None and variant.load_error:  # a broken plugin is a failure
        result.status, result.reason = "failed", variant.load_error
        return result
    with warnings.catch_warnings(record=True) as caught, captured_logs() as logs:
        try:
            _measure(source, implementation, result, config, trace_dir, references, baseline)
            _analyse(result, config.region)  # the row's findings are the judge's (`CellResult.findings`)
        except VariantUnavailableError as exc:
            result.status, result.reason = "skipped", exc.message
        except VariantFailure as exc:
            result.status, result.reason = "failed", exc.message
    result.warnings = warning_lines(caught) + list(dict.fromkeys(logs))
    if not result.ok and device.startswith("cuda"):
        release_after_failure()
    return result


def _measure(
    source: ModelSource,
    implementation: Implementation,
    result: CellResult,
    config: ModelConfig,
    trace_dir: Path,
    references: dict[tuple[int | None, str], Any],
    baseline: str,
) -> None:
    from attnprof.profiling import memory, timing
    from attnprof.profiling.profiler import profile_forward
    from attnprof.profiling.warmup import warm_process

    variant = implementation.variant
    spec = result.model
    stage = "training step" if spec.mode == "fwd+bwd" else "forward"
    with phase(result, "process_warmup"), guard("process warm-up", None):
        warm_process(spec.device)
    with phase(result, "build"), guard("model build", variant):
        built = source.prepare(implementation, spec.seq, spec.mode)
        result.subject = spec = replace(spec, params=built.params)
    shape = built.shape  # the heads, kv heads, head dim and causality as the model states them (None: it does not)
    result.subject = spec = replace(
        spec,
        seq=built.seq,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        causal=shape.causal if config.mask is None else config.mask == "causal",
        mask=config.mask or ("causal" if shape.causal else None),
        score_mod=config.score_mod,
    )
    with phase(result, "timing"), guard(stage, variant):
        started = time.time()
        options = timing.TimingOptions(**config.timing.model_dump())
        result.timing = timing.time_forward(built.step, spec.device, options)
        result.timing_window = (started, time.time())
    with phase(result, "profile"), guard(stage, variant):
        run = profile_forward(built.step, spec.device, config.schedule, config.region, trace_dir / trace_name(result))
    result.phases_s["profile"] -= run.export_s
    result.phases_s["trace_export"] = run.export_s
    result.trace_path, result.native_stderr = run.trace_path, run.native_stderr
    with phase(result, "correctness"), guard("logits check", variant):
        _compare_logits(result, run.output, references, baseline)
    del run
    with phase(result, "memory"), guard(stage, variant):
        result.memory_mib = memory.peak_extra_memory_mib(built.step, spec.device)


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


def _analyse(result: CellResult, region: str) -> None:
    """The trace analysis of the model's region (the attention ledger is part of it), its % of read
    bandwidth against the figures measured on this machine when the ceiling cache holds them."""
    from attnprof.analysis import analyze_trace
    from attnprof.peaks import cached_peaks

    if result.trace_path is None:
        raise VariantFailure("no trace was written")
    with phase(result, "analysis"):
        try:
            result.analysis = analyze_trace(
                result.trace_path, region=region, dtype=result.model.dtype, peaks=cached_peaks
            )
        except TraceError as exc:
            raise VariantFailure(f"trace analysis failed: {exc.message}") from None


def trace_name(result: CellResult) -> str:
    """`IMPL_MODEL_BxSEQ_DTYPE_MODE_DEVICE.json.gz`, safe as a file name (the profiler numbers a second one)."""
    spec = result.model
    seq = spec.seq if spec.seq is not None else "inputs"
    raw = f"{result.variant}_{spec.model}_{spec.batch}x{seq}_{spec.dtype}_{spec.mode}_{spec.device}"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", raw.replace(":", "")) + ".json.gz"


@contextmanager
def captured_logs(names: tuple[str, ...] = LOGGERS) -> Iterator[list[str]]:
    """Keep the warnings (and worse) that these libraries log inside the block, as `name: message` lines,
    instead of letting their handlers print them."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.name}: {one_line(Exception(record.getMessage()), with_type=False)}")

    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = [Keep(logging.WARNING)], False
    try:
        yield lines
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
