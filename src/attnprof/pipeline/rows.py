"""The row of a measured cell or model row (`results.schema.Row`), made once when the measurement ends, and
the results document of a run.

What a row holds is computed here or in analysis/ (FLOPs, conventions, the attention ledger's figures), never
by the renderers. A part that was not measured gives None, never 0.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from attnprof.model_spec import ModelSpec
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.references import attach_references
from attnprof.registry import RunSpec
from attnprof.results.parts import Analysis, MaskAlternative
from attnprof.results.records import analysis_record, counters_record, finding_of, finding_record
from attnprof.results.schema import SCHEMA_VERSION, Document, Row

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis
    from attnprof.analysis.attainable import Attainable, NoReference
    from attnprof.analysis.findings.registry import Fp8AgainstBf16

#: What each TFLOP/s figure divides the FLOPs by.
TFLOPS_CONVENTION = (
    "tflops: FLOPs / latency (host launch time included); "
    "kernel_tflops: FLOPs / the attention calls' device time per step in the trace"
)


def _r3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _trace_fields(analysis: TraceAnalysis | None, record: Analysis | None) -> dict[str, Any]:
    """The row's fields that come from its trace analysis (None without one)."""
    if analysis is None or record is None:
        return {}
    ledger = analysis.attention
    on_device = ledger is not None and ledger.time_base == "device"
    phases = record.phases
    comm = analysis.comm
    return {
        "region": analysis.region,
        "forwards": analysis.forwards,
        "kernels_per_forward": analysis.kernels_per_forward,
        "memcpy_per_forward": analysis.memcpy_per_forward,
        "memset_per_forward": analysis.memset_per_forward,
        "gpu_time_us": _r3(analysis.gpu_time_us),
        "gpu_annotation_time_us": record.gpu_annotation_time_us,
        "input_dtype": analysis.input_dtype,
        "annotation_mismatches": analysis.annotation_mismatches,
        "top_cpu_ops": record.top_cpu_ops,
        "kernel_time_us": _r3(analysis.kernel_time_us),
        "cpu_time_us": _r3(analysis.cpu_time_us),
        "self_device_time_total_us": _r3(analysis.self_device_time_total_us),
        "transposes_per_forward": analysis.transposes_per_forward,
        "cpu_ops_per_forward": analysis.cpu_ops_per_forward,
        "forward_kernels": phases.forward.kernels if phases else None,
        "forward_kernel_time_us": phases.forward.kernel_time_us if phases else None,
        "backward_kernels": phases.backward.kernels if phases else None,
        "backward_memcpy": phases.backward.memcpy if phases else None,
        "backward_memset": phases.backward.memset if phases else None,
        "backward_kernel_time_us": phases.backward.kernel_time_us if phases else None,
        "backward_outside_region": phases.backward.outside_region if phases else None,
        "attention_calls_per_forward": ledger.calls_per_forward if ledger else None,
        "attention_backends": (ledger.backends_text or None) if ledger else None,
        "attention_impl": ledger.attention_impl if ledger else None,
        "attention_time_us": _r3(ledger.kernel_time_us) if ledger else None,
        "attention_gpu_pct": _r3(ledger.gpu_time_pct) if ledger else None,
        "attention_overhead_us": _r3(ledger.overhead_us) if on_device and ledger else None,
        "kernel_gbps": ledger.achieved_gbps if on_device and ledger else None,
        "kernel_pct_of_read_bandwidth": _r3(record.attention.pct_of_read_bandwidth)
        if on_device and record.attention
        else None,
        "comm_kernels_per_forward": comm.kernels_per_forward if comm else None,
        "comm_time_us": _r3(comm.comm_time_us) if comm else None,
        "comm_overlap_pct": _r3(comm.overlap_pct) if comm else None,
        "comm_exposed_us": _r3(comm.exposed_us) if comm else None,
        "launch_apis": record.launch_apis,
        "kernels": record.kernels,
        "spread": record.spread,
        "phases": record.phases,
        "attention": record.attention,
        "trace_device": record.device,
        "comm": record.comm,
    }


def _timing_fields(result: CellResult) -> dict[str, Any]:
    timing = result.timing
    if timing is None:
        return {}
    return {
        "latency_us": timing.median_us,
        "latency_iqr_us": timing.iqr_us,
        "cold_ms": timing.cold_ms,
        "unstable": timing.unstable,
        "cpu_contention": timing.cpu_contention,
        "quantized_tick_ms": timing.quantized_tick_ms,
        "contended": timing.contended,
        "retimed_for_contention": result.retimed_for_contention,
        "timing_method": timing.method,
        "cuda_graph": timing.cuda_graph,
        "l2_state": timing.l2_state,
        "l2_bytes": timing.l2_bytes,
        "latency_p25_us": timing.p25_us,
        "latency_p75_us": timing.p75_us,
        "latency_min_us": timing.min_us,
        "timing_reps": timing.reps,
        "warmup_reps": timing.warmup_reps,
        "forwards_per_sample": timing.forwards_per_sample,
    }


def _health_fields(result: CellResult) -> dict[str, Any]:
    """The GPU over the timed calls (NVML); none when it was not sampled."""
    health = result.timing.gpu_health if result.timing is not None else None
    if health is None:
        return {}
    return {
        "timed_sm_clock_mhz": health.sm_clock_mhz,
        "timed_sm_clock_min_mhz": health.sm_clock_min_mhz,
        "sm_clock_application_mhz": health.application_clock_mhz,
        "timed_power_pct": _r3(health.power_pct),
        "timed_power_max_pct": _r3(health.power_max_pct),
        "timed_temperature_max_c": health.temperature_max_c,
        "timed_clock_limits": health.limits_text,
        "nvml_samples": health.samples,
    }


def _shared_fields(result: CellResult) -> dict[str, Any]:
    """What a cell's row and a model's row both take the same way; its findings are the judge's."""
    from attnprof.analysis.findings import judge

    record = analysis_record(result.analysis) if result.analysis is not None else None
    clock = result.clock
    counters = None
    if result.counters is not None:
        from attnprof.analysis.counters import occupancy_notes

        kernels = result.analysis.kernels if result.analysis is not None else []
        counters = counters_record(result.counters, occupancy_notes(kernels, result.counters))
    report = result.ncu_report or (result.counters.report_path if result.counters is not None else None)
    seconds = result.counters.seconds if result.counters is not None else None
    return {
        "status": result.status if result.ok else f"{result.status}: {result.reason}",
        "reason": result.reason,
        "peak_memory_mib": result.memory_mib,
        "sm_clock_mhz": clock.sm_mhz if clock else None,
        "sm_clock_min_mhz": clock.min_sm_mhz if clock else None,
        "sm_clock_max_mhz": clock.max_sm_mhz if clock else None,
        "clock_limits": clock.limits_text if clock else None,
        "speedup_vs_baseline": result.speedup_vs_baseline,
        "speedup_reliable": result.speedup_reliable,
        "speedup_vs_dtype": result.speedup_vs_dtype,
        "findings": [finding_record(f) for f in judge(result.verdict())],
        "trace": str(result.trace_path) if result.trace_path else None,
        "ncu_report": None if report is None else str(report),
        "ncu_note": result.ncu_note,
        "ncu_seconds": None if seconds is None else round(seconds, 3),
        "counters": counters,
        "phases_s": dict(result.phases_s),
        "notes": list(result.analysis.notes) if result.analysis is not None else [],
        "warnings": list(result.warnings),
        **_timing_fields(result),
        **_health_fields(result),
        **_trace_fields(result.analysis, record),
        **_kernel_bandwidth(result),
    }


def _kernel_bandwidth(result: CellResult) -> dict[str, Any]:
    """`kernel_gbps` of a cell whose ledger has no bytes of its own (its call's recorded inputs are not Q, K and
    V, as with a Triton kernel under its own op): the cell's bytes (those of `achieved_gbps`) over the attention
    calls' device time per step, beside `kernel_tflops` over the same time, with its % of the run's read ceiling.
    {} where the ledger has bytes (its figure stands) or `kernel_tflops` is None."""
    from attnprof.analysis.instance.ledger import gbps

    ledger = result.analysis.attention if result.analysis is not None else None
    rates = result.throughput
    if ledger is None or ledger.achieved_gbps is not None or result.kernel_tflops is None:
        return {}
    if rates is None or not rates.bytes_moved:
        return {}
    found = gbps(int(rates.bytes_moved), ledger.kernel_time_us)
    peak = rates.peak_read_gbps
    pct = _r3(min(100.0, 100.0 * found / peak)) if found is not None and peak else None
    return {"kernel_gbps": found, "kernel_pct_of_read_bandwidth": pct}


def cell_row(result: CellResult) -> Row:
    """The row of one result, a cell or a model row: its subject's fields (`_spec_fields`, `_model_fields`),
    then the parts it measured, each None where it has none (a model row has no output check or throughput,
    a cell no logits difference)."""
    subject = result.subject
    fields = _model_fields(subject) if isinstance(subject, ModelSpec) else _spec_fields(result, subject)
    rates, check, grads, where, logits = (
        result.throughput,
        result.check,
        result.grad_check,
        result.placement,
        result.logits,
    )
    scope = check.scope if check is not None else None
    if check is not None and grads is not None:
        scope = f"output: {check.scope}; gradients: {grads.scope}"
    kernel_tflops = result.kernel_tflops
    row = Row(
        variant=result.variant,
        source=result.source,
        **fields,
        dense_mask=result.dense_mask,
        backend=result.backend,
        retimed=result.retimed if result.timing is not None else None,
        executed_flops=result.executed_flops,
        tflops=rates.tflops if rates else None,
        kernel_tflops=kernel_tflops,
        tflops_convention=TFLOPS_CONVENTION if rates is not None or kernel_tflops is not None else None,
        pct_of_peak=rates.pct_of_peak if rates else None,
        pct_of_peak_note=rates.pct_of_peak_note if rates else None,
        peak_tflops=rates.peak_tflops if rates else None,
        bytes_moved=rates.bytes_moved if rates else None,
        achieved_gbps=rates.achieved_gbps if rates else None,
        pct_of_read_bandwidth=rates.pct_of_read_bandwidth if rates else None,
        peak_read_gbps=rates.peak_read_gbps if rates else None,
        bound=rates.bound if rates else None,
        rel_error=check.rel_error if check else None,
        passed=result.passed,
        grad_rel_error_dq=grads.rel_errors.get("dq") if grads else None,
        grad_rel_error_dk=grads.rel_errors.get("dk") if grads else None,
        grad_rel_error_dv=grads.rel_errors.get("dv") if grads else None,
        grad_rel_error_dsinks=grads.rel_errors.get("dsinks") if grads else None,
        nan_on_fully_masked=result.nan_on_fully_masked,
        **_fp8_fields(result),
        rel_error_threshold=check.threshold if check else None,
        grad_rel_error_threshold=grads.threshold if grads else None,
        correctness_scope=scope,
        logits_baseline=logits.baseline if logits else None,
        logits_max_abs_diff=logits.max_abs_diff if logits else None,
        logits_rel_diff=logits.rel_diff if logits else None,
        rank=where.rank if where else None,
        local_rank=where.local_rank if where else None,
        world_size=where.world_size if where else None,
        hostname=where.hostname if where else None,
        gpu=where.gpu if where else None,
        grad_rel_error=dict(grads.rel_errors) if grads is not None else None,
        mask_alternatives=list(result.mask_alternatives),
        working_set_bytes=result.working_set_bytes,
        **_shared_fields(result),
    )
    attach_references([row])  # the row alone; the run's rows together once gathered (pipeline.sharded)
    return row


def _fp8_fields(result: CellResult) -> dict[str, Any]:
    """An fp8 cell's scaling, output dtype, quantization time and accuracy (`profiling.fp8`); {} otherwise."""
    if result.fp8_scaling is None:
        return {}
    accuracy = result.check.fp8 if result.check is not None else None
    quantize_s = result.quantize_s  # the median of timed repeats; None on CPU (no fp8 kernels there)
    return {
        "fp8_scaling": result.fp8_scaling,
        "output_dtype": result.output_dtype,
        "quantize_ms": quantize_s * 1e3 if quantize_s is not None else None,
        "sqnr_db": accuracy.sqnr_db if accuracy else None,
        "rel_error_vs_bf16": accuracy.rel_error_vs_bf16 if accuracy else None,
        "sqnr_db_vs_bf16": accuracy.sqnr_db_vs_bf16 if accuracy else None,
    }


def _spec_fields(result: CellResult, spec: RunSpec) -> dict[str, Any]:
    """A cell's subject: its spec, and the FLOPs of a step at it when its throughput (or executed FLOPs) was
    measured."""
    from attnprof.analysis.roofline import EXECUTED_CONVENTION, flops_convention, step_flops

    has_flops = result.throughput is not None or result.executed_flops is not None
    convention = None
    if has_flops:
        convention = flops_convention(spec)
        executed = result.executed_convention or EXECUTED_CONVENTION
        convention = convention if result.executed_flops is None else f"{convention}; {executed}"
    return {
        "subject": "cell",
        "shape": spec.shape_label,
        "batch": spec.batch,
        "heads": spec.heads,
        "kv_heads": spec.n_kv_heads,
        "seq": spec.seq,
        "head_dim": spec.head_dim,
        "dtype": spec.dtype,
        "device": spec.device,
        "causal": spec.causal,
        "mode": spec.mode,
        "mask": spec.mask.text,
        "score_mod": spec.score_mod,
        "q_len": spec.n_queries,
        "kv_len": spec.n_keys,
        "page_size": spec.page_size,
        **_packed_fields(spec),
        "causal_alignment": spec.causal_alignment,
        "fully_masked_rows": spec.fully_masked_rows,
        "flops": step_flops(spec) if has_flops else None,
        "flops_convention": convention,
    }


def _packed_fields(spec: RunSpec) -> dict[str, Any]:
    """A packed batch's lengths and their count, min, mean and max (`seq_lens_*`); nothing for any other cell."""
    if spec.seq_lens is None:
        return {}
    from attnprof.varlen import summary

    stats = summary(spec.seq_lens)
    return {"seq_lens": list(spec.seq_lens)} | {f"seq_lens_{k}": stats[k] for k in ("count", "min", "mean", "max")}


def _model_fields(spec: ModelSpec) -> dict[str, Any]:
    """A model row's subject: the model, the implementation it was given, and its attention as the model
    states it."""
    return {
        "subject": "model",
        "implementation": spec.implementation,
        "model": spec.model,
        "params": spec.params,
        "shape": spec.shape,
        "batch": spec.batch,
        "seq": spec.seq,
        "heads": spec.heads,
        "kv_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "dtype": spec.dtype,
        "device": spec.device,
        "causal": spec.causal,
        "mask": spec.mask,
        "score_mod": spec.score_mod,
        "mode": spec.mode,
    }


def join_alternatives(row: Row, found: list[MaskAlternative], dense_us: float) -> None:
    """Join the alternatives to a dense mask `found` after the run among its rows to `row` (its latency
    `dense_us`): they follow its `mask_alternatives`, and the judge weighs its dense-mask finding again
    with them (`analysis.findings.judge.judge_alternatives`)."""
    from attnprof.analysis.findings import judge_alternatives

    findings = judge_alternatives([finding_of(f) for f in row.findings], found, dense_us)
    row.mask_alternatives = row.mask_alternatives + found
    row.findings = [finding_record(f) for f in findings]


def join_best_known(row: Row, reference: Attainable | NoReference) -> None:
    """Judge `row`'s findings against the best known at its cell found after the run (`pipeline.best_known`):
    `memory-bound` and `tensor-pipe-underused` weighed against its rates, or saying why there is none
    (`analysis.findings.judge.judge_best_known`)."""
    from attnprof.analysis.findings import judge_best_known

    unit = "forward" if (row.mode or "fwd") == "fwd" else "step"
    findings = judge_best_known([finding_of(f) for f in row.findings], lambda _key: reference, unit)
    row.findings = [finding_record(f) for f in findings]


def join_fp8_comparison(row: Row, against: Fp8AgainstBf16) -> None:
    """Judge an fp8 `row`'s findings against the fastest bf16 row of its shape and mode found after the run
    (`pipeline.fp8_compare`): `fp8-not-faster` (`analysis.findings.judge.judge_fp8`)."""
    from attnprof.analysis.findings import judge_fp8

    unit = "forward" if (row.mode or "fwd") == "fwd" else "step"
    row.findings = [finding_record(f) for f in judge_fp8([finding_of(f) for f in row.findings], against, unit)]


def results_document(
    command: str,
    config: Any,
    environment: dict[str, Any],
    ceiling: Any,
    rows: list[Row],
    interrupted: bool,
    files: dict[str, str] | None = None,
) -> Document:
    """The self-contained results document: what wrote it, the files it went to, environment, config,
    ceiling and the rows."""
    from attnprof import __version__

    return Document(
        schema_version=SCHEMA_VERSION,
        attnprof_version=__version__,
        command=command,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        interrupted=interrupted,
        files=files,
        environment=environment,
        config=config.model_dump(mode="json"),
        ceiling=None if ceiling is None else ceiling.to_dict(),
        results=rows,
    )
