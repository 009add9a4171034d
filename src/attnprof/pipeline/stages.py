"""The stages every measurement runs, a cell's (`pipeline.cell`) and a model row's (`pipeline.model_row`) alike.

`measured` is the frame: what the subject's body raises as a variant's or a model's own failure becomes a
`skipped` or `failed` result with a one-line reason; Python warnings (and the named libraries' log
messages) raised inside are kept on the result, never printed; after a failure on a GPU, cached memory is
handed back. Inside it, `measure_step` takes a step (a no-argument callable, built by the subject) through
the shared sequence: timing (`profiling.timing`, re-timed once when an unstable sample drifted, and up to
`--contention-retimes` times, once the CPU is calm, when other processes held it; with `--no-timing` a short
warm-up instead) → the profiled loop (`profiling.profiler`) → the subject's check of
the output (a cell's against float64, a model row's logits against the baseline's) → peak memory; then
`analyse_trace` reads the trace. Each stage runs under `phase` (its wall time goes into `phases_s`) and
`guard` (any exception of the variant's becomes a one-line failure; after Ctrl-C, KeyboardInterrupt
again). The row's findings are the judge's (`CellResult.findings`).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.config import MeasureOptions, Schedule
from attnprof.errors import AttnprofError, TraceError, VariantFailure, VariantUnavailableError, one_line
from attnprof.interrupts import caused_by_interrupt, raise_if_interrupted
from attnprof.pipeline.measured import CellResult
from attnprof.registry import Variant

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis
    from attnprof.analysis.hardware import PeaksLookup
    from attnprof.profiling.timing import TimingOptions

RETIMES = 1


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


def measured(result: CellResult, body: Callable[[], None], loggers: tuple[str, ...] = ()) -> CellResult:
    """Run the subject's `body` on `result` (see the module docstring): a VariantUnavailableError makes it
    skipped, a VariantFailure failed; the warnings raised and what `loggers` logged are kept on it."""
    with warnings.catch_warnings(record=True) as caught, captured_logs(loggers) as logs:
        try:
            body()
        except VariantUnavailableError as exc:
            result.status, result.reason = "skipped", exc.message
        except VariantFailure as exc:
            result.status, result.reason = "failed", exc.message
    result.warnings = warning_lines(caught) + list(dict.fromkeys(logs))
    if not result.ok and result.subject.device.startswith("cuda"):
        release_after_failure()  # a failed row (OOM above all) may leave memory the next one needs
    return result


def warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    """`Category: first line of the message (file:line)` for each distinct recorded warning, in order."""
    lines = []
    for w in caught:
        text = one_line(w.message, with_type=False) if isinstance(w.message, Warning) else str(w.message)
        lines.append(f"{w.category.__name__}: {text} ({Path(w.filename).name}:{w.lineno})")
    return list(dict.fromkeys(lines))


@contextmanager
def captured_logs(names: tuple[str, ...]) -> Iterator[list[str]]:
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


def warm_process(result: CellResult) -> None:
    """Warm the process for the device once, before its first measurement (`profiling.warmup`)."""
    from attnprof.profiling.warmup import warm_process as warm

    with phase(result, "process_warmup"), guard("process warm-up", None):
        warm(result.subject.device)


def measure_step(
    result: CellResult,
    call: Callable[[], Any],
    check: Callable[[Any], None],
    *,
    variant: Variant | None,
    stage: str,
    check_stage: str,
    options: TimingOptions,
    measure: MeasureOptions,
    schedule: Schedule,
    region: str,
    trace_path: Path,
    whole: Callable[[], Any] | None = None,
    prepare: Callable[[], Any] | None = None,
    agree: Callable[[int], int] | None = None,
    copies: Sequence[Callable[[], Any]] = (),
) -> None:
    """Timing (or, with `--no-timing`, a warm-up), the profiled loop, `check(output)`, then peak memory of
    `whole` (default: `call`) when timed. `stage` names the step in a failure, `check_stage` the check;
    `prepare` runs untimed before each call; `agree` makes the ranks of a collective cell take the same
    number of calls (`pipeline.cell.run_cell`); `copies`: the step over other copies of its inputs, which
    the timing cycles through (`--cold-l2 rotate`)."""
    from attnprof.profiling import memory
    from attnprof.profiling.profiler import profile_forward

    device = result.subject.device
    if measure.timing:
        _time(call, variant, options, result, stage, prepare, agree, copies, measure.contention_retimes)
    else:
        with phase(result, "warmup"), guard(stage, variant):
            _warm_up(call, device, prepare)
    with phase(result, "profile"), guard(stage, variant):
        run = profile_forward(
            call,
            _profiled(result),
            schedule,
            region,
            trace_path,
            prepare=prepare,
            record_shapes=measure.record_shapes,
            with_stack=measure.with_stack,
            key_averages=measure.key_averages_table,
        )
    result.phases_s["profile"] -= run.export_s
    result.phases_s["trace_export"] = run.export_s
    result.trace_path, result.key_averages_table = run.trace_path, run.key_averages_table
    result.native_stderr = run.native_stderr
    with phase(result, "correctness"), guard(check_stage, variant):
        check(run.output)
    del run
    if measure.timing:
        with phase(result, "memory"), guard(stage, variant):
            result.memory_mib = memory.peak_extra_memory_mib(whole or call, device)


def _profiled(result: CellResult) -> Any:
    """What the profiler is told it runs: a cell's RunSpec, or the device of a model row."""
    from attnprof.registry import RunSpec

    return result.subject if isinstance(result.subject, RunSpec) else result.subject.device


def _time(
    forward: Any,
    variant: Variant | None,
    options: TimingOptions,
    result: CellResult,
    stage: str = "forward",
    prepare: Any = None,
    agree: Callable[[int], int] | None = None,
    copies: Sequence[Callable[[], Any]] = (),
    contention_retimes: int = 0,
) -> None:
    """Time the step (`forward`, whatever the mode) into `result.timing`; `stage` names it in a failure.
    A CUDA graph is checked to hold the step on the first sample only (a re-time captures the same step).
    A sample is taken again (in the phase `retiming`; on any rank, with `agree`):

    - up to RETIMES times when it was unstable and its median drifted (`retime.worth_retiming`);
    - up to `contention_retimes` times when it was contended (`Timing.contended`), each after waiting for
      the CPU to calm (`contention.wait_for_calm`, at most `CALM_WAIT_S`); a wait that ends with the CPU
      still busy ends the re-timing, since a sample taken then would be contended again.

    The last sample is kept with its own `timing_window` (the SM clock is read over it) and the first
    sample's `cold_ms` (only the first sample's first call was cold). Its `method` says what became of an
    unstable first sample and of the first contended one; `result.retimed` and `result.retimed_for_contention` count the
    samples thrown away for each reason."""
    from attnprof.profiling import contention, retime, timing

    first = contended = None
    waits: list[contention.Calm] = []
    while True:
        started = time.time()
        with phase(result, "retiming" if first else "timing"), guard(stage, variant):
            sample = timing.time_forward(
                forward, result.subject.device, options, prepare=prepare, agree=agree, copies=copies
            )
        result.timing_window = (started, time.time())
        first = first or sample
        contended = contended or (sample if sample.contended else None)
        result.timing = sample if sample is first else replace(sample, cold_ms=first.cold_ms)
        options = replace(options, check_graph=False)
        if _agreed(retime.worth_retiming(sample) and result.retimed < RETIMES, agree):
            result.retimed += 1
            continue
        if _agreed(sample.contended and result.retimed_for_contention < contention_retimes, agree):
            with phase(result, "calm_wait"):
                waits.append(contention.wait_for_calm())
            if _agreed(retime.retimes_after(waits[-1]), agree):
                result.retimed_for_contention += 1
                continue
            result.uncalm_wait_s += waits[-1].waited_s
        notes = [
            retime.retime_note(first, result.timing, retimed=result.retimed > 0),
            retime.contention_note(contended or first, result.timing, waits),
        ]
        notes = [note for note in notes if note]
        if notes:
            result.timing = replace(result.timing, method="; ".join([result.timing.method, *notes]))
        return


def _agreed(decision: bool, agree: Callable[[int], int] | None) -> bool:
    """`decision`, or with `agree` (a collective cell's ranks) whether any rank decided so."""
    return decision if agree is None else bool(agree(int(decision)))


def _warm_up(forward: Any, device: str, prepare: Any = None, calls: int = 3) -> None:
    import torch

    for _ in range(calls):
        if prepare is not None:
            prepare()
        forward()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def analyse_trace(
    result: CellResult,
    region: str,
    peaks: PeaksLookup,
    ceiling_tflops: float | None = None,
    time_fixes: bool = False,
) -> TraceAnalysis:
    """The trace analysis of `region` (its findings are the trace's; the row's are the judge's), the attention
    ledger's % of read bandwidth and its memory findings against `peaks` (`peaks.measured_peaks`,
    `peaks.cached_peaks`); returns it, as set on `result.analysis`. With `time_fixes`, the fixes its findings
    propose are timed at the trace's shapes (`pipeline.fixes`) into `result.fixes`, which the judge reads."""
    from attnprof.analysis import analyze_trace, load_trace

    if result.trace_path is None:
        raise VariantFailure("no trace was written")
    with phase(result, "analysis"):
        try:
            # with time_fixes, the trace read with every op's scalar inputs, which re-creating its ops needs
            parsed = load_trace(result.trace_path, every_concrete_input=True) if time_fixes else None
            result.analysis = analyze_trace(
                parsed or result.trace_path,
                region=region,
                dtype=result.subject.dtype,
                ceiling_tflops=ceiling_tflops,
                peaks=peaks,
            )
        except TraceError as exc:
            raise VariantFailure(f"trace analysis failed: {exc.message}") from None
    if parsed is not None:
        from attnprof.pipeline.fixes import time_fixes as timed

        with phase(result, "time_fixes"):
            result.fixes = timed(result.analysis, parsed)
    return result.analysis


def release_after_failure() -> None:
    """Collect garbage and hand cached CUDA memory back; costs ~0.1 s, so only after a failure."""
    import gc

    from attnprof.profiling.memory import release_cached_memory

    gc.collect()
    release_cached_memory()
