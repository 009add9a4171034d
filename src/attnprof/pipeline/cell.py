"""One cell, top to bottom: inputs, timing, the profiled loop, correctness, memory, then the trace analysis.

A failing variant becomes a `skipped` or `failed` CellResult; only problems that concern the
whole run (device, output directory) and Ctrl-C raise. Each stage runs under `phase` (its wall
time goes into `phases_s`) and `guard` (any exception of the variant's becomes a one-line
failure; after Ctrl-C, KeyboardInterrupt again). Python warnings raised during the cell are kept
on the result (`warnings`), as is the profiler's native stderr (`native_stderr`), never printed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnprof.config import Config, MeasureOptions
from attnprof.errors import (
    AttnprofError,
    TraceError,
    VariantFailure,
    VariantUnavailableError,
    one_line,
)
from attnprof.interrupts import caused_by_interrupt, raise_if_interrupted
from attnprof.registry import RunSpec, Variant
from attnprof.results import CellResult, Throughput


@contextmanager
def phase(result: CellResult, name: str) -> Iterator[None]:
    """Add the block's wall time to `result.phases_s[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        result.phases_s[name] = result.phases_s.get(name, 0.0) + time.perf_counter() - started


@contextmanager
def guard(stage: str, variant: Variant) -> Iterator[None]:
    """Turn any exception of the variant's inside the block into a one-line VariantFailure
    (out-of-memory into "out of memory: ..."); attnprof's own errors and Ctrl-C pass through.

    Once Ctrl-C has happened (see `attnprof.interrupts`), the block ends in KeyboardInterrupt
    whether it raised something else (torch swallowed the interrupt) or nothing at all.
    """
    try:
        yield
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if caused_by_interrupt(exc):
            raise KeyboardInterrupt from None
        if isinstance(exc, AttnprofError):
            raise
        from attnprof.profiling.memory import is_oom, oom_failure

        if is_oom(exc):
            raise oom_failure(exc) from None
        who = "" if variant.source == "built-in" else f" (plugin {variant.source})"
        raise VariantFailure(f"{stage} raised {type(exc).__name__}{who}: {one_line(exc, with_type=False)}") from None
    raise_if_interrupted()


def run_cell(variant: Variant, spec: RunSpec, config: Config, measure: MeasureOptions,
             ceiling: Any = None, trace_dir: Path | None = None) -> CellResult:
    """Profile and measure `variant` on `spec`; never raises for the variant's own failures.

    `ceiling` is the device's measured `Ceiling` (None: no throughput figures); the trace goes into
    `trace_dir` (default: the config's output directory).
    """
    result = CellResult(variant=variant.name, source=variant.source, spec=spec)
    if variant.load_error:  # a broken plugin is a failure, not something this machine merely lacks
        result.status, result.reason = "failed", variant.load_error
        return result
    reason = variant.unavailable_reason(spec)
    if reason:
        result.status, result.reason = "skipped", reason
        return result
    with warnings.catch_warnings(record=True) as caught:  # the filters in force decide which are recorded
        try:
            _measure(variant, spec, config, measure, result, trace_dir or Path(config.output_dir))
            _analyse(result, config.region, ceiling)
            if result.check is not None and not result.check.passed:
                raise VariantFailure(result.check.reason or "output does not match the float64 reference")
        except VariantUnavailableError as exc:
            result.status, result.reason = "skipped", exc.message
        except VariantFailure as exc:
            result.status, result.reason = "failed", exc.message
    result.warnings = warning_lines(caught)
    if not result.ok and spec.device_type == "cuda":
        _release()  # a failed cell (OOM above all) may leave memory the next cell needs
    return result


def warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    """`Category: first line of the message (file:line)` for each distinct recorded warning, in order."""
    lines = (f"{w.category.__name__}: {one_line(w.message, with_type=False)} ({Path(w.filename).name}:{w.lineno})"
             for w in caught)
    return list(dict.fromkeys(lines))


def _measure(variant: Variant, spec: RunSpec, config: Config, measure: MeasureOptions, result: CellResult,
             trace_dir: Path) -> None:
    """Everything that runs the variant: timing, the profiled loop, correctness, memory, masking."""
    import torch

    from attnprof.profiling import correctness, memory, timing
    from attnprof.profiling.inputs import make_inputs, to_bhsd
    from attnprof.profiling.profiler import profile_forward, trace_file_name

    with phase(result, "setup"), guard("input creation", variant):
        q, k, v = make_inputs(spec, config.seed, variant.layout)
    state = None
    if variant.setup is not None:
        with phase(result, "setup"), guard("setup", variant):
            state = variant.setup(spec)

    def forward() -> Any:
        return variant.forward(q, k, v, spec.causal, state)

    with torch.no_grad():
        if measure.timing:
            started = time.time()
            with phase(result, "timing"), guard("forward", variant):
                result.timing = timing.time_forward(forward, spec.device, min_time_s=measure.min_time_s,
                                                    cuda_graph=measure.cuda_graph, flush_l2=measure.flush_l2)
            result.timing_window = (started, time.time())
        else:
            with phase(result, "warmup"), guard("forward", variant):
                _warm_up(forward, spec)
        with phase(result, "profile"), guard("forward", variant):
            run = profile_forward(forward, spec, config.schedule, config.region,
                                  trace_dir / trace_file_name(variant.name, spec))
        result.phases_s["profile"] -= run.export_s
        result.phases_s["trace_export"] = run.export_s
        result.trace_path, result.key_averages_table = run.trace_path, run.key_averages_table
        result.native_stderr = run.native_stderr
        with phase(result, "correctness"), guard("correctness check", variant):
            out, q_, k_, v_ = (to_bhsd(t, variant.layout) for t in (run.output, q, k, v))
            result.check = correctness.check_against_reference(out, q_, k_, v_, spec.causal, spec.dtype)
        del run, out
        if measure.timing:
            with phase(result, "memory"), guard("forward", variant):
                result.memory_mib = memory.peak_extra_memory_mib(forward, spec.device)
        if measure.check_masking:
            with phase(result, "masking_probe"), guard("masking probe", variant):
                result.nan_on_fully_masked = correctness.probe_fully_masked(variant, spec.device, spec.dtype,
                                                                            config.seed)


def _analyse(result: CellResult, region: str, ceiling: Any) -> None:
    """The trace analysis, the backend it shows, and the throughput of the latency."""
    from attnprof.analysis import analyze_trace, dispatched_backend

    if result.trace_path is None:
        raise VariantFailure("no trace was written")
    with phase(result, "analysis"):
        try:
            result.analysis = analyze_trace(result.trace_path, region=region, dtype=result.spec.dtype)
        except TraceError as exc:
            raise VariantFailure(f"trace analysis failed: {exc.message}") from None
    result.backend = dispatched_backend(result.analysis)
    if ceiling is not None and result.latency_us:
        result.throughput = throughput(result.spec, result.latency_us, ceiling)


def throughput(spec: RunSpec, latency_us: float, ceiling: Any) -> Throughput:
    """TFLOP/s, share of the measured ceiling, bandwidth and bound for one latency."""
    from attnprof.analysis.roofline import achieved_for

    rates = achieved_for(spec, latency_us * 1e-6, ceiling.tflops, ceiling.bandwidth_gbps)
    return Throughput(tflops=rates["tflops"], pct_of_peak=rates["pct_of_peak"], peak_tflops=ceiling.tflops,
                      achieved_gbps=rates["achieved_gbps"], bound=rates["bound"])


def _warm_up(forward: Any, spec: RunSpec, calls: int = 3) -> None:
    import torch

    for _ in range(calls):
        forward()
    if spec.device_type == "cuda":
        torch.cuda.synchronize(spec.device)


def _release() -> None:
    """Collect garbage and hand cached CUDA memory back; costs ~0.1 s, so only after a failure."""
    import gc

    from attnprof.profiling.memory import release_cached_memory

    gc.collect()
    release_cached_memory()
