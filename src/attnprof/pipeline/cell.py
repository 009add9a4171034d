"""One cell: its inputs and step (`profiling.steps.cell_step`), then the stages every measurement shares
(`pipeline.stages`: timing, the profiled loop, the check, memory, the trace analysis), the cell's own checks
and masking probe, and the throughput of its latency.

A failing variant becomes a `skipped` or `failed` CellResult; only problems that concern the
whole run (device, output directory) and Ctrl-C raise. An unstable timing whose median drifted while it
was taken (a loaded machine) is taken again, up to `stages.RETIMES` times; the last sample is kept and
`retimed` counts the samples thrown away. Before its first cell the process is warmed for the
device once (`profiling.warmup`), so no cell's figures depend on running first. Python warnings
raised during the cell are kept on the result (`warnings`), as is the profiler's native stderr
(`native_stderr`), never printed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.config import Config, MeasureOptions
from attnprof.errors import VariantFailure
from attnprof.pipeline.measured import CellResult, Throughput
from attnprof.pipeline.stages import analyse_trace, guard, measure_step, measured, phase, warm_process
from attnprof.registry import RunSpec, Variant

if TYPE_CHECKING:
    from attnprof.profiling.ceiling import Ceiling, RunCeiling
OOM_REASON = "out of memory"  # how a cell that ran out of memory begins its reason (`profiling.memory`)


def ran_out_of_memory(status: str, reason: str | None) -> bool:
    """True for a cell that failed because it ran out of memory."""
    return status.startswith("failed") and (reason or "").startswith(OOM_REASON)


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
    if spec.fp8:
        result.fp8_scaling, result.output_dtype = variant.fp8_scaling, variant.fp8_output

    def body() -> None:
        _measure(variant, spec, config, measure, result, trace_dir or Path(config.output_dir), agree)
        _analyse(result, config.region, ceiling)
        if result.check is not None and not result.check.passed:
            raise VariantFailure(result.check.reason or "output does not match the float64 reference")
        if result.grad_check is not None and not result.grad_check.passed:
            raise VariantFailure(result.grad_check.reason or "gradients do not match float64 autograd")

    return measured(result, body)


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
    from attnprof.profiling.profiler import trace_file_name
    from attnprof.profiling.steps import cell_step
    from attnprof.profiling.timing import TimingOptions

    warm_process(result)

    quantized: list[bool] = []

    @contextmanager
    def setup_stage(what: str) -> Iterator[None]:
        # an fp8 cell's quantization is its own phase (phases_s["quantize"]), beside the latency, never in it;
        # that of the input copies --cold-l2 rotate makes is setup
        first = what == "quantization" and not quantized
        with phase(result, "quantize" if first else "setup"), guard(what, variant):
            yield
        if first:
            quantized.append(True)

    def executed(state: Any) -> None:
        if variant.executed_pairs is None:
            return
        from attnprof.analysis.roofline import executed_convention, executed_flops

        with phase(result, "setup"), guard("executed_pairs", variant):
            pairs = variant.executed_pairs(spec, state)
        if pairs is not None:
            result.executed_flops = executed_flops(spec, pairs)
            result.executed_convention = executed_convention(pairs)

    with cell_step(variant, spec, config.seed, setup_stage, executed) as step:
        options = TimingOptions.from_measure(measure, spec)
        if spec.device.startswith("cuda"):
            result.working_set_bytes = step.input_bytes
        copies: list[Callable[[], Any]] = []
        if options.rotate and measure.timing and spec.device.startswith("cuda"):
            copies = [replica.call for replica in rotation_replicas(step, spec)]  # each built under setup_stage
        measure_step(
            result,
            step.call,
            lambda output: _check(step, output, variant, spec, result),
            variant=variant,
            stage="backward" if spec.backward else "forward",
            check_stage="correctness check",
            options=options,
            measure=measure,
            schedule=config.schedule,
            region=config.region,
            trace_path=trace_dir / trace_file_name(variant.name, spec),
            whole=step.whole,
            prepare=step.prepare,
            agree=agree,
            copies=copies,
        )
        del copies
        if measure.check_masking:
            from attnprof.profiling import masking_probe

            with phase(result, "masking_probe"), guard("masking probe", variant):
                result.nan_on_fully_masked = masking_probe.probe_fully_masked(
                    variant, spec.device, spec.dtype, config.seed
                )


#: --cold-l2 rotate: the share of the GPU's free memory the input copies may take.
ROTATE_MEMORY_SHARE = 0.9


def rotation_replicas(step: Any, spec: RunSpec) -> list[Any]:
    """The steps over the extra input copies that `--cold-l2 rotate` needs at `spec` (`cuda_graphs.rotation_copies`:
    together over 5x the L2; none when one copy alone is); VariantFailure when they would not fit in the
    GPU's free memory, or when the step needs an untimed forward before each call (no copy has one)."""
    import torch

    from attnprof.profiling.cuda_graphs import l2_cache_bytes, rotation_copies

    if step.prepare is not None or step.replica is None:
        raise VariantFailure("--cold-l2 rotate: n/a for a backward that needs an untimed forward before each call")
    dev = torch.device(spec.device)
    l2 = l2_cache_bytes(dev)
    if l2 is None:
        raise VariantFailure(f"--cold-l2 rotate: {spec.device} does not report its L2 size")
    copies = rotation_copies(step.input_bytes, l2)
    free, _ = torch.cuda.mem_get_info(dev)
    free += torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    more = copies - 1
    if more * step.input_bytes > ROTATE_MEMORY_SHARE * free:
        raise VariantFailure(
            f"--cold-l2 rotate: {more} more {'copy' if more == 1 else 'copies'} of the inputs ({more} x "
            f"{step.input_bytes / 2**30:.2f} GiB, to exceed 5x the {l2 / 2**20:.0f} MiB L2) do not fit in the "
            f"{free / 2**30:.2f} GiB free on {spec.device}"
        )
    return [step.replica() for _ in range(copies - 1)]


def _check(step: Any, output: Any, variant: Variant, spec: RunSpec, result: CellResult) -> None:
    """The output against float64 (`result.check`) and, in the backward modes, dq, dk and dv (and a `sinks`
    cell's dsinks) against float64 autograd on the same inputs and grad_out (`result.grad_check`)."""
    from attnprof.profiling import correctness
    from attnprof.profiling.gradcheck import check_grads
    from attnprof.profiling.inputs import to_bhsd

    out = output.out if spec.backward else output
    rows = variant.output_rows(spec) if variant.output_rows is not None else None
    if step.fp8 is not None:
        from attnprof.profiling.fp8 import output_values

        result.quantize_s = step.fp8.inputs.time_s

        result.check = correctness.check_fp8_output(
            output_values(out, step.fp8.descale_o),
            step.fp8.inputs,
            step.inputs,
            spec.causal,
            variant.layout,
            rows,
            spec.mask,
            spec.score_mod,
        )
    else:
        out, q, k, v = (to_bhsd(t, variant.layout) for t in (out, *step.inputs))
        result.check = correctness.check_against_reference(
            out, q, k, v, spec.causal, spec.dtype, rows, spec.mask, spec.score_mod, step.sinks, spec.seq_lens
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
            sinks=step.sinks,
            sink_grad=output.sink_grad,
            seq_lens=spec.seq_lens,
        )


def _analyse(result: CellResult, region: str, ceiling: RunCeiling | None) -> None:
    """The trace analysis (`stages.analyse_trace`), the backend it shows, and the throughput of the latency.
    The attention ledger's % of read bandwidth and its memory findings use the run's measured ceiling
    (`peaks.measured_peaks`), else the datasheet of the GPU. A ceiling measured again later in the run
    (`rethroughput`) changes the rows' throughput, not the analyses already made."""
    from attnprof.analysis import dispatched_backend
    from attnprof.peaks import measured_peaks

    peak = ceiling.current.tflops if ceiling is not None else None
    peaks = measured_peaks(ceiling.current) if ceiling is not None else None
    result.analysis = analyse_trace(result, region, lambda gpu, dtype: peaks, ceiling_tflops=peak)
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
    """TFLOP/s, share of the measured ceilings, bandwidth and bound for one latency, this cell alone.

    Without a ceiling (source "none") `pct_of_peak` is None and `pct_of_peak_note` says why; when the run
    uses a cached ceiling because the one measured now was contended (`Ceiling.set_aside`), the note says that
    beside the percentage. An achieved figure above a ceiling takes its place (100%); the row then says so,
    and a run's rows share one raised reference per device (`pipeline.references`). `dense_mask`: the variant
    read the mask as a dense tensor, which `bytes_moved` counts.
    """
    from attnprof.analysis.roofline import achieved_for, bytes_moved

    rates = achieved_for(spec, latency_us * 1e-6, ceiling.tflops, ceiling.read_gbps, dense_mask)
    note = ceiling.reason if ceiling.tflops is None else None
    if note is None and ceiling.set_aside:  # % of the cached figure, the one measured now being contended
        note = f"% of {ceiling.set_aside}"
    return Throughput(
        tflops=rates["tflops"],
        pct_of_peak=rates["pct_of_peak"],
        peak_tflops=ceiling.tflops,
        achieved_gbps=rates["achieved_gbps"],
        bound=rates["bound"],
        pct_of_peak_note=note,
        bytes_moved=bytes_moved(spec, dense_mask),
        pct_of_read_bandwidth=rates["pct_of_read_bandwidth"],
        peak_read_gbps=ceiling.read_gbps,
    )


def rethroughput(results: list[CellResult], ceiling: Ceiling) -> None:
    """Compute every timed result's throughput again against `ceiling` (after it was measured again),
    so all cells of a run share one ceiling."""
    for result in results:
        if result.throughput is not None and (latency_us := result.latency_us):
            result.throughput = throughput(result.spec, latency_us, ceiling, bool(result.dense_mask))
