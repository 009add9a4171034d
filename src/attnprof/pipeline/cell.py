"""One cell, top to bottom: inputs, timing, the profiled loop, correctness, memory, then the trace analysis.

A failing variant becomes a `skipped` or `failed` CellResult; only problems that concern the
whole run (device, output directory) and Ctrl-C raise. Each stage runs under `phase` (its wall
time goes into `phases_s`) and `guard` (any exception of the variant's becomes a one-line
failure; after Ctrl-C, KeyboardInterrupt again). An unstable timing whose median drifted while it
was taken (a loaded machine) is taken again, up to `RETIMES` times; the last sample is kept and
`retimed` counts the samples thrown away. Before its first cell the process is warmed for the
device once (`profiling.warmup`), so no cell's figures depend on running first. Python warnings
raised during the cell are kept on the result (`warnings`), as is the profiler's native stderr
(`native_stderr`), never printed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.config import Config, MeasureOptions
from attnprof.errors import (
    AttnprofError,
    TraceError,
    VariantFailure,
    VariantUnavailableError,
    one_line,
)
from attnprof.interrupts import caused_by_interrupt, raise_if_interrupted
from attnprof.pipeline.measured import CellResult, Throughput
from attnprof.registry import RunSpec, Variant

if TYPE_CHECKING:
    from attnprof.profiling.ceiling import Ceiling, RunCeiling
    from attnprof.profiling.timing import TimingOptions

RETIMES = 1
OOM_REASON = "out of memory"  # how a cell that ran out of memory begins its reason (`profiling.memory`)


def ran_out_of_memory(status: str, reason: str | None) -> bool:
    """True for a cell that failed because it ran out of memory."""
    return status.startswith("failed") and (reason or "").startswith(OOM_REASON)


@contextmanager
def phase(result: CellResult, name: str) -> Iterator[None]:
    """Add the block's wall time to `result.phases_s[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        result.phases_s[name] = result.phases_s.get(name, 0.0) + time.perf_counter() - started


@contextmanager
def guard(stage: str, variant: Variant | None) -> Iterator[None]:
    """Turn any exception of the variant's inside the block into a one-line VariantFailure
    (out-of-memory into "out of memory: ..."); attnprof's own errors and Ctrl-C pass through.
    A plugin variant is named in the message; `variant` None (a whole model's step) names none.

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
        who = "" if variant is None or variant.source == "built-in" else f" (plugin {variant.source})"
        raise VariantFailure(f"{stage} raised {type(exc).__name__}{who}: {one_line(exc, with_type=False)}") from None
    raise_if_interrupted()


def run_cell(
    variant: Variant,
    spec: RunSpec,
    config: Config,
    measure: MeasureOptions,
    ceiling: RunCeiling | None = None,
    trace_dir: Path | None = None,
    agree: Callable[[int], int] | None = None,
) -> CellResult:
    """Profile and measure `variant` on `spec`; never raises for the variant's own failures.

    `ceiling` is the run's ceiling (None: no throughput figures); a cell that exceeds it has it
    measured again once per run (`cell_throughput`). The trace goes into `trace_dir` (default:
    the config's output directory). `agree` (a collective cell that every rank runs together:
    the largest of the ranks' values) makes the ranks take the same number of calls: the timing's
    warm-up, repetitions and re-time are agreed, so every forward has its partners.
    """
    result = CellResult(variant=variant.name, source=variant.source, subject=spec)
    if variant.load_error:  # a broken plugin is a failure, not something this machine merely lacks
        result.status, result.reason = "failed", variant.load_error
        return result
    reason = variant.unavailable_reason(spec)
    if reason:
        result.status, result.reason = "skipped", reason
        return result
    result.dense_mask = variant.takes_dense_mask(spec)
    result.by_design = variant.by_design  # the judge leaves these findings out of the row
    with warnings.catch_warnings(record=True) as caught:  # the filters in force decide which are recorded
        try:
            _measure(variant, spec, config, measure, result, trace_dir or Path(config.output_dir), agree)
            _analyse(result, config.region, ceiling)
            if result.check is not None and not result.check.passed:
                raise VariantFailure(result.check.reason or "output does not match the float64 reference")
            if result.grad_check is not None and not result.grad_check.passed:
                raise VariantFailure(result.grad_check.reason or "gradients do not match float64 autograd")
        except VariantUnavailableError as exc:
            result.status, result.reason = "skipped", exc.message
        except VariantFailure as exc:
            result.status, result.reason = "failed", exc.message
    result.warnings = warning_lines(caught)
    if not result.ok and spec.device_type == "cuda":
        release_after_failure()  # a failed cell (OOM above all) may leave memory the next cell needs
    return result


def warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    """`Category: first line of the message (file:line)` for each distinct recorded warning, in order."""
    lines = []
    for w in caught:
        text = one_line(w.message, with_type=False) if isinstance(w.message, Warning) else str(w.message)
        lines.append(f"{w.category.__name__}: {text} ({Path(w.filename).name}:{w.lineno})")
    return list(dict.fromkeys(lines))


def _measure(
    variant: Variant,
    spec: RunSpec,
    config: Config,
    measure: MeasureOptions,
    result: CellResult,
    trace_dir: Path,
    agree: Callable[[int], int] | None = None,
) -> None:
    """Everything that runs the variant: its setup and input layout (`prepare_inputs`), timing, the
    profiled loop, correctness, memory, masking. What is timed and profiled is the step of the spec's
    mode (`profiling.steps`)."""
    from attnprof.profiling import correctness, memory
    from attnprof.profiling.profiler import profile_forward, trace_file_name
    from attnprof.profiling.steps import cell_step
    from attnprof.profiling.timing import TimingOptions
    from attnprof.profiling.warmup import warm_process

    with phase(result, "process_warmup"), guard("process warm-up", None):
        warm_process(spec.device)

    @contextmanager
    def setup_stage(what: str) -> Iterator[None]:
        with phase(result, "setup"), guard(what, variant):
            yield

    def executed(state: Any) -> None:
        if variant.executed_pairs is None:
            return
        from attnprof.analysis.roofline import executed_flops

        with phase(result, "setup"), guard("executed_pairs", variant):
            pairs = variant.executed_pairs(spec, state)
        result.executed_flops = executed_flops(spec, pairs) if pairs is not None else None

    stage = "backward" if spec.backward else "forward"
    with cell_step(variant, spec, config.seed, setup_stage, executed) as step:
        if measure.timing:
            _time(step.call, variant, TimingOptions.from_measure(measure), result, stage, step.prepare, agree)
        else:
            with phase(result, "warmup"), guard(stage, variant):
                _warm_up(step.call, spec, step.prepare)
        with phase(result, "profile"), guard(stage, variant):
            run = profile_forward(
                step.call,
                spec,
                config.schedule,
                config.region,
                trace_dir / trace_file_name(variant.name, spec),
                prepare=step.prepare,
                record_shapes=measure.record_shapes,
                with_stack=measure.with_stack,
                key_averages=measure.key_averages_table,
            )
        result.phases_s["profile"] -= run.export_s
        result.phases_s["trace_export"] = run.export_s
        result.trace_path, result.key_averages_table = run.trace_path, run.key_averages_table
        result.native_stderr = run.native_stderr
        with phase(result, "correctness"), guard("correctness check", variant):
            _check(step, run.output, variant, spec, result)
        del run
        if measure.timing:
            with phase(result, "memory"), guard(stage, variant):
                result.memory_mib = memory.peak_extra_memory_mib(step.whole, spec.device)
        if measure.check_masking:
            with phase(result, "masking_probe"), guard("masking probe", variant):
                result.nan_on_fully_masked = correctness.probe_fully_masked(
                    variant, spec.device, spec.dtype, config.seed
                )


def _check(step: Any, output: Any, variant: Variant, spec: RunSpec, result: CellResult) -> None:
    """The output against float64 (`result.check`) and, in the backward modes, dq, dk and dv against
    float64 autograd on the same inputs and grad_out (`result.grad_check`)."""
    from attnprof.profiling import correctness
    from attnprof.profiling.gradcheck import check_grads
    from attnprof.profiling.inputs import to_bhsd

    out = output.out if spec.backward else output
    out, q, k, v = (to_bhsd(t, variant.layout) for t in (out, *step.inputs))
    rows = variant.output_rows(spec) if variant.output_rows is not None else None
    result.check = correctness.check_against_reference(
        out, q, k, v, spec.causal, spec.dtype, rows, spec.mask, spec.score_mod
    )
    if spec.backward:
        q_in, k_in, v_in = step.inputs
        result.grad_check = check_grads(
            output.grads,
            q_in,
            k_in,
            v_in,
            step.grad_out,
            causal=spec.causal,
            dtype=spec.dtype,
            layout=variant.layout,
            mask=spec.mask,
            score_mod=spec.score_mod,
        )


def _time(
    forward: Any,
    variant: Variant,
    options: TimingOptions,
    result: CellResult,
    stage: str = "forward",
    prepare: Any = None,
    agree: Callable[[int], int] | None = None,
) -> None:
    """Time the step (`forward`, whatever the mode) into `result.timing`; `stage` names it in a failure.
    An unstable sample whose median drifted (`timing.worth_retiming`; on any rank, with `agree`) is taken
    again, up to RETIMES times, in the phase `retiming`; the last one is kept with its own
    `timing_window` (the SM clock is read over it) and the first sample's `cold_ms` (only the first
    sample's first call was cold). Its `method` says what became of an unstable first sample."""
    from attnprof.profiling import timing

    first = None
    while True:
        started = time.time()
        with phase(result, "retiming" if result.retimed else "timing"), guard(stage, variant):
            sample = timing.time_forward(forward, result.spec.device, options, prepare=prepare, agree=agree)
        result.timing_window = (started, time.time())
        first = first or sample
        result.timing = sample if sample is first else replace(sample, cold_ms=first.cold_ms)
        again = timing.worth_retiming(sample)
        if agree is not None:
            again = bool(agree(int(again)))
        if not again or result.retimed >= RETIMES:
            note = timing.retime_note(first, result.timing, retimed=result.retimed > 0)
            if note:
                result.timing = replace(result.timing, method=f"{result.timing.method}; {note}")
            return
        result.retimed += 1


def _analyse(result: CellResult, region: str, ceiling: RunCeiling | None) -> None:
    """The trace analysis (its findings are the trace's: the row's are the judge's, `CellResult.findings`),
    the backend it shows, and the throughput of the latency. The attention ledger's % of read bandwidth and
    its memory findings use the run's measured ceiling (`peaks.measured_peaks`), else the
    datasheet of the GPU. A ceiling measured again later in the run (`rethroughput`) changes the rows'
    throughput, not the analyses already made."""
    from attnprof.analysis import analyze_trace, dispatched_backend
    from attnprof.peaks import measured_peaks

    if result.trace_path is None:
        raise VariantFailure("no trace was written")
    with phase(result, "analysis"):
        try:
            peak = ceiling.current.tflops if ceiling is not None else None
            peaks = measured_peaks(ceiling.current) if ceiling is not None else None
            result.analysis = analyze_trace(
                result.trace_path,
                region=region,
                dtype=result.spec.dtype,
                ceiling_tflops=peak,
                peaks=lambda gpu, dtype: peaks,
            )
        except TraceError as exc:
            raise VariantFailure(f"trace analysis failed: {exc.message}") from None
    result.backend = dispatched_backend(result.analysis)
    latency_us = result.latency_us
    if ceiling is not None and latency_us:
        result.throughput = cell_throughput(result.variant, result.spec, latency_us, ceiling, bool(result.dense_mask))


def cell_throughput(
    variant: str, spec: RunSpec, latency_us: float, ceiling: RunCeiling, dense_mask: bool = False
) -> Throughput:
    """`throughput` against the run's ceiling; when the cell exceeds it, the ceiling is measured again
    (once per run) and the throughput computed against the fresh one."""
    rates = throughput(spec, latency_us, ceiling.current, dense_mask)
    if exceeds(rates):
        why = f"{variant} at {spec.cell_label} reached {rates.tflops:.3g} TFLOP/s"
        if ceiling.measure_again(why):
            rates = throughput(spec, latency_us, ceiling.current, dense_mask)
    return rates


def exceeds(rates: Throughput) -> bool:
    """True when the achieved TFLOP/s is above the ceiling it was compared against."""
    return rates.peak_tflops is not None and rates.tflops > rates.peak_tflops


def throughput(spec: RunSpec, latency_us: float, ceiling: Ceiling, dense_mask: bool = False) -> Throughput:
    """TFLOP/s, share of the measured ceilings, bandwidth and bound for one latency.

    Without a ceiling (source "none"), or when the latency beats the matmul ceiling (over 100% is
    impossible: the ceiling is no ceiling), `pct_of_peak` is None and `pct_of_peak_note` says why;
    an exceeded matmul ceiling gives no `bound` either. When the achieved GB/s beats the measured
    read bandwidth, the achieved figure is the reference (`pct_of_read_bandwidth` 100) and
    `read_bandwidth_note` says so. `dense_mask`: the variant read the mask as a dense tensor, which
    `bytes_moved` counts.
    """
    from attnprof.analysis.roofline import achieved_for, bytes_moved

    rates = achieved_for(spec, latency_us * 1e-6, ceiling.tflops, ceiling.read_gbps, dense_mask)
    pct, bound, note = rates["pct_of_peak"], rates["bound"], ceiling.reason if ceiling.tflops is None else None
    if rates["peak_beaten"]:
        pct = bound = None
        note = (
            f"the {spec.dtype} matmul on {spec.device} ({ceiling.tflops:.3g} TFLOP/s) is slower than this "
            f"attention ({rates['tflops']:.3g} TFLOP/s): no ceiling"
        )
    read_note = None
    if rates["read_beaten"]:
        read_note = (
            f"achieved {rates['achieved_gbps']:.4g} GB/s, above the read bandwidth measured on {spec.device} "
            f"({ceiling.read_gbps:.4g} GB/s): % of read bandwidth and bound use the achieved figure"
        )
    return Throughput(
        tflops=rates["tflops"],
        pct_of_peak=pct,
        peak_tflops=ceiling.tflops,
        achieved_gbps=rates["achieved_gbps"],
        bound=bound,
        pct_of_peak_note=note,
        bytes_moved=bytes_moved(spec, dense_mask),
        pct_of_read_bandwidth=rates["pct_of_read_bandwidth"],
        peak_read_gbps=ceiling.read_gbps,
        read_bandwidth_note=read_note,
    )


def rethroughput(results: list[CellResult], ceiling: Ceiling) -> None:
    """Compute every timed result's throughput again against `ceiling` (after it was measured again),
    so all cells of a run share one ceiling."""
    for result in results:
        if result.throughput is not None and (latency_us := result.latency_us):
            result.throughput = throughput(result.spec, latency_us, ceiling, bool(result.dense_mask))


def _warm_up(forward: Any, spec: RunSpec, prepare: Any = None, calls: int = 3) -> None:
    import torch

    for _ in range(calls):
        if prepare is not None:
            prepare()
        forward()
    if spec.device_type == "cuda":
        torch.cuda.synchronize(spec.device)


def release_after_failure() -> None:
    """Collect garbage and hand cached CUDA memory back; costs ~0.1 s, so only after a failure."""
    import gc

    from attnprof.profiling.memory import release_cached_memory

    gc.collect()
    release_cached_memory()
