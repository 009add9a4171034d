"""Run cells (one variant at one shape): set up, time, profile, analyse, check. No formatting.

A failing variant becomes a `skipped` or `failed` CellResult; only problems that concern the
whole run (device, output directory) raise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnprof.config import Config, Schedule
from attnprof.errors import AttnprofError, OutputError, TraceError, VariantFailure, VariantUnavailableError
from attnprof.profiling.memory import is_oom, oom_failure, release_cached_memory
from attnprof.registry import RunSpec, Variant


@dataclass
class RunOptions:
    """How each cell is measured."""

    schedule: Schedule = field(default_factory=Schedule)
    region: str = "attnprof"
    seed: int = 0
    output_dir: Path = Path("attnprof-out")
    timing: bool = True
    min_time_s: float = 0.25
    cuda_graph: bool = False
    flush_l2: bool = False
    check_masking: bool = False
    ceiling: Any = None
    sample_clocks: bool = True


@dataclass
class CellResult:
    """The outcome of one cell. `status` is ok, skipped or failed; `reason` says why not ok."""

    variant: str
    source: str
    spec: RunSpec
    status: str = "ok"
    reason: str | None = None
    trace_path: Path | None = None
    key_averages_table: str | None = None
    analysis: dict[str, Any] | None = None
    measures: dict[str, Any] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    timing_window: tuple[float, float] | None = None  # wall time (time.time) of the timed calls

    @property
    def ok(self) -> bool:
        """True when the cell ran and passed its checks."""
        return self.status == "ok"


def cell_specs(config: Config, device: str) -> list[RunSpec]:
    """One RunSpec per configured shape, on the resolved device."""
    return [
        RunSpec(device=device, dtype=config.dtype, batch=s.batch, heads=s.heads, seq=s.seq,
                head_dim=s.head_dim, kv_heads=s.kv_heads, causal=config.causal)
        for s in config.shapes
    ]


def ensure_output_dir(path: Path) -> Path:
    """Create the output directory and prove it is writable, or raise OutputError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".attnprof-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write to output directory {path}: {exc.strerror or exc}") from None
    return path


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _guard(stage: str, variant: Variant, call: Callable[[], Any]) -> Any:
    """Run one stage of a cell, turning any exception into a one-line VariantFailure."""
    try:
        return call()
    except AttnprofError:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if is_oom(exc):
            raise oom_failure(exc) from None
        who = "" if variant.source == "built-in" else f" (plugin {variant.source})"
        raise VariantFailure(f"{stage} raised {type(exc).__name__}{who}: {_one_line(exc)[:200]}") from None


def run_cell(variant: Variant, spec: RunSpec, options: RunOptions) -> CellResult:
    """Profile and measure `variant` on `spec`; never raises for the variant's own failures."""
    result = CellResult(variant=variant.name, source=variant.source, spec=spec)
    if variant.load_error:  # a broken plugin is a failure, not something this machine merely lacks
        result.status, result.reason = "failed", variant.load_error
        return result
    reason = variant.unavailable_reason(spec)
    if reason:
        result.status, result.reason = "skipped", reason
        return result
    try:
        _run(variant, spec, options, result)
    except VariantUnavailableError as exc:
        result.status, result.reason = "skipped", exc.message
    except VariantFailure as exc:
        result.status, result.reason = "failed", exc.message
    if not result.ok:
        _release(spec)  # a failed cell (OOM above all) may leave memory the next cell needs
    return result


def _release(spec: RunSpec) -> None:
    """Collect garbage and hand cached CUDA memory back; costs ~0.1 s, so only after a failure."""
    if spec.device_type == "cuda":
        import gc

        gc.collect()
        release_cached_memory()


def _timed(phases: dict[str, float], name: str, call: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    try:
        return call()
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def _run(variant: Variant, spec: RunSpec, options: RunOptions, result: CellResult) -> None:
    import torch

    from attnprof.analysis import analyze_trace, dispatched_backend
    from attnprof.profiling import correctness, memory, timing
    from attnprof.profiling.inputs import make_inputs, to_bhsd
    from attnprof.profiling.profiler import profile_forward, trace_file_name

    phases = result.phases_s
    q, k, v = _timed(phases, "setup", lambda: _guard("input creation", variant,
                                                      lambda: make_inputs(spec, options.seed, variant.layout)))
    state = None
    if variant.setup is not None:
        state = _timed(phases, "setup", lambda: _guard("setup", variant, lambda: variant.setup(spec)))

    def forward() -> Any:
        return variant.forward(q, k, v, spec.causal, state)

    with torch.no_grad():
        if options.timing:
            started = time.time()
            measured = _timed(phases, "timing", lambda: _guard("forward", variant, lambda: timing.time_forward(
                forward, spec.device, min_time_s=options.min_time_s,
                cuda_graph=options.cuda_graph, flush_l2=options.flush_l2)))
            result.timing_window = (started, time.time())
            result.measures.update(measured.to_dict())
        else:
            _timed(phases, "warmup", lambda: _guard("forward", variant, lambda: _warm_up(forward, spec)))
        run = _timed(phases, "profile", lambda: _guard("forward", variant, lambda: profile_forward(
            forward, spec, options.schedule, options.region,
            options.output_dir / trace_file_name(variant.name, spec))))
        phases["trace_export"] = run.export_s
        phases["profile"] -= run.export_s
        result.trace_path, result.key_averages_table = run.trace_path, run.key_averages_table
        output = to_bhsd(run.output, variant.layout)
        check = _timed(phases, "correctness", lambda: correctness.check_against_reference(
            output, to_bhsd(q, variant.layout), to_bhsd(k, variant.layout), to_bhsd(v, variant.layout),
            spec.causal, spec.dtype))
        result.measures.update(check.to_dict())
        del run, output
        if options.timing:
            result.measures["peak_memory_mib"] = _timed(phases, "memory", lambda: _guard(
                "forward", variant, lambda: memory.peak_extra_memory_mib(forward, spec.device)))
        if options.check_masking:
            result.measures["nan_on_fully_masked"] = _timed(phases, "masking_probe", lambda: _guard(
                "masking probe", variant, lambda: correctness.probe_fully_masked(variant, spec.device, spec.dtype, options.seed)))
    try:
        analysis = _timed(phases, "analysis", lambda: analyze_trace(
            result.trace_path, region=options.region, dtype=spec.dtype))
    except TraceError as exc:
        raise VariantFailure(f"trace analysis failed: {exc.message}") from None
    result.analysis = analysis.to_dict()
    backend = dispatched_backend(analysis)
    if backend:
        result.measures["backend"] = backend
    if options.ceiling is not None and result.measures.get("latency_us"):
        result.measures.update(throughput(spec, result.measures["latency_us"], options.ceiling))
    if not check.passed:
        raise VariantFailure(check.reason or "output does not match the float64 reference")


def throughput(spec: RunSpec, latency_us: float, ceiling: Any) -> dict[str, Any]:
    """TFLOP/s, share of the measured ceiling, bandwidth and bound for one latency."""
    from attnprof.analysis.roofline import achieved_for

    return achieved_for(spec, latency_us * 1e-6, ceiling.tflops, ceiling.bandwidth_gbps) | {"peak_tflops": ceiling.tflops}


def _warm_up(forward: Callable[[], Any], spec: RunSpec, calls: int = 3) -> None:
    import torch

    for _ in range(calls):
        forward()
    if spec.device_type == "cuda":
        torch.cuda.synchronize(spec.device)


def run_cells(
    cells: list[tuple[Variant, RunSpec]],
    options: RunOptions,
    on_start: Callable[[int, int, Variant, RunSpec], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
) -> tuple[list[CellResult], bool]:
    """Run every cell in order; returns the results and whether Ctrl-C cut the run short.

    On CUDA with timing on, nvidia-smi samples the SM clock throughout (`clocks`), and each
    timed cell gets the clock of its own timing window in its measures.
    """
    results: list[CellResult] = []
    sampler = _clock_sampler(cells, options)
    try:
        for index, (variant, spec) in enumerate(cells):
            if on_start:
                on_start(index, len(cells), variant, spec)
            try:
                result = run_cell(variant, spec, options)
            except KeyboardInterrupt:
                return results, True
            results.append(result)
            if on_done:
                on_done(result)
        return results, False
    finally:
        if sampler is not None:
            attach_clocks(results, sampler.device, sampler.stop())


def _clock_sampler(cells: list[tuple[Variant, RunSpec]], options: RunOptions) -> Any:
    """A started ClockSampler for the first CUDA device among the cells, or None."""
    device = next((spec.device for _, spec in cells if spec.device_type == "cuda"), None)
    if device is None or not (options.timing and options.sample_clocks):
        return None
    from attnprof.profiling.clocks import ClockSampler

    return ClockSampler(device).start()


def attach_clocks(results: list[CellResult], device: str, samples: list[Any]) -> None:
    """Add each timed result's SM clock (`clocks.ClockWindow.to_measures`) on `device`."""
    from attnprof.profiling.clocks import clock_window

    for result in results:
        if result.timing_window is None or result.spec.device != device:
            continue
        window = clock_window(samples, [result.timing_window])
        if window is not None:
            result.measures.update(window.to_measures())
