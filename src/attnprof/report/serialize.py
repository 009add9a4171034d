"""The one serializer: a `CellResult` as a flat row (CSV, tables) and as a JSON entry (the row plus the
nested parts), and the self-contained results document.

A new field is one entry in `ROW` (name and how to read it from the result); JSON, CSV and the
tables pick it up from there. A part that was not measured gives None, never 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from attnprof.results import CellResult, ModelResult


def _status(r: CellResult | ModelResult) -> str:
    return r.status if r.ok else f"{r.status}: {r.reason}"


def _analysis(key: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.analysis, key) if r.analysis is not None else None


def _attention(attr: str, device_only: bool = False) -> Callable[[CellResult], Any]:
    """A field of the attention ledger (None without an analysis or without an attention call; with
    `device_only`, also for a ledger timed on the CPU, which does not measure it)."""

    def read(r: CellResult) -> Any:
        ledger = r.analysis.attention if r.analysis is not None else None
        if ledger is None or (device_only and ledger.time_base != "device"):
            return None
        return getattr(ledger, attr)

    return read


def _timing(attr: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.timing, attr) if r.timing is not None else None


def _check(attr: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.check, attr) if r.check is not None else None


def _throughput(attr: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.throughput, attr) if r.throughput is not None else None


def _clock(attr: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.clock, attr) if r.clock is not None else None


def _grad_error(name: str) -> Callable[[CellResult], Any]:
    return lambda r: r.grad_check.rel_errors.get(name) if r.grad_check is not None else None


def _scope(r: CellResult) -> str | None:
    """The forward check's scope, and in the backward modes the gradients' after it."""
    if r.check is None or r.grad_check is None:
        return r.check.scope if r.check is not None else None
    return f"output: {r.check.scope}; gradients: {r.grad_check.scope}"


def _has_flops(r: CellResult) -> bool:
    """True when the row carries a FLOP figure: a throughput, or a kernel's executed FLOPs."""
    return r.throughput is not None or r.executed_flops is not None


def _flops(r: CellResult) -> float | None:
    """The step's useful FLOPs (`analysis.roofline.step_flops`); None when the row has no FLOP figure."""
    from attnprof.analysis.roofline import step_flops

    return step_flops(r.spec) if _has_flops(r) else None


def _flops_convention(r: CellResult) -> str | None:
    """How the row's FLOPs (`flops`, `tflops`, and `executed_flops` where present) were counted; None when
    there is no FLOP figure."""
    from attnprof.analysis.roofline import EXECUTED_CONVENTION, flops_convention

    if not _has_flops(r):
        return None
    text = flops_convention(r.spec)
    return text if r.executed_flops is None else f"{text}; {EXECUTED_CONVENTION}"


#: What each TFLOP/s figure divides the FLOPs by.
TFLOPS_CONVENTION = (
    "tflops: FLOPs / latency (host launch time included); "
    "kernel_tflops: FLOPs / the attention calls' device time per step in the trace"
)


def _tflops_convention(r: CellResult) -> str | None:
    """Which time `tflops` and `kernel_tflops` divide by; None when the row has neither figure."""
    return TFLOPS_CONVENTION if r.throughput is not None or r.kernel_tflops is not None else None


def _comm(attr: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.analysis.comm, attr) if r.analysis is not None and r.analysis.comm else None


def _placement(attr: str) -> Callable[[CellResult], Any]:
    return lambda r: getattr(r.placement, attr) if r.placement is not None else None


def _phase(phase: str, key: str) -> Callable[[CellResult], Any]:
    """One fact of the forward or backward phase (`TraceAnalysis.phases`); None without device work."""

    def read(r: CellResult) -> Any:
        phases = r.analysis.phases if r.analysis is not None else None
        return None if phases is None else phases[phase].get(key)

    return read


def _rounded(read: Callable[[CellResult], Any]) -> Callable[[CellResult], Any]:
    return lambda r: None if (value := read(r)) is None else round(value, 3)


def _ncu_report(r: CellResult | ModelResult) -> str | None:
    """The Nsight Compute report of the row: the one its --ncu pass wrote (also when it could not be read),
    else the one its counters were read from."""
    if r.ncu_report is not None:
        return str(r.ncu_report)
    return r.counters.report_path if r.counters is not None else None


#: The flat row, in column order: (field, how to read it from a CellResult).
ROW: tuple[tuple[str, Callable[[CellResult], Any]], ...] = (
    ("variant", lambda r: r.variant),
    ("source", lambda r: r.source),
    ("shape", lambda r: r.spec.shape_label),
    ("batch", lambda r: r.spec.batch),
    ("heads", lambda r: r.spec.heads),
    ("kv_heads", lambda r: r.spec.n_kv_heads),
    ("seq", lambda r: r.spec.seq),
    ("head_dim", lambda r: r.spec.head_dim),
    ("dtype", lambda r: r.spec.dtype),
    ("device", lambda r: r.spec.device),
    ("causal", lambda r: r.spec.causal),
    ("mode", lambda r: r.spec.mode),
    ("mask", lambda r: r.spec.mask.text),
    ("score_mod", lambda r: r.spec.score_mod),
    ("q_len", lambda r: r.spec.n_queries),
    ("kv_len", lambda r: r.spec.n_keys),
    ("page_size", lambda r: r.spec.page_size),
    ("causal_alignment", lambda r: r.spec.causal_alignment),
    ("fully_masked_rows", lambda r: r.spec.fully_masked_rows),
    ("dense_mask", lambda r: r.dense_mask),
    ("status", _status),
    ("reason", lambda r: r.reason),
    ("forwards", _analysis("forwards")),
    ("kernels_per_forward", _analysis("kernels_per_forward")),
    ("memcpy_per_forward", _analysis("memcpy_per_forward")),
    ("memset_per_forward", _analysis("memset_per_forward")),
    ("gpu_time_us", _rounded(_analysis("gpu_time_us"))),
    ("kernel_time_us", _rounded(_analysis("kernel_time_us"))),
    ("cpu_time_us", _rounded(_analysis("cpu_time_us"))),
    ("self_device_time_total_us", _rounded(_analysis("self_device_time_total_us"))),
    ("transposes_per_forward", _analysis("transposes_per_forward")),
    ("cpu_ops_per_forward", _analysis("cpu_ops_per_forward")),
    ("forward_kernels", _phase("forward", "kernels")),
    ("forward_kernel_time_us", _rounded(_phase("forward", "kernel_time_us"))),
    ("backward_kernels", _phase("backward", "kernels")),
    ("backward_memcpy", _phase("backward", "memcpy")),
    ("backward_memset", _phase("backward", "memset")),
    ("backward_kernel_time_us", _rounded(_phase("backward", "kernel_time_us"))),
    ("backward_outside_region", _phase("backward", "outside_region")),
    ("backend", lambda r: r.backend),
    ("attention_calls_per_forward", _attention("calls_per_forward")),
    ("attention_backends", lambda r: _attention("backends_text")(r) or None),  # "cudnn:2"; None: no call
    ("attention_time_us", _rounded(_attention("kernel_time_us"))),
    ("attention_gpu_pct", _rounded(_attention("gpu_time_pct"))),
    ("attention_overhead_us", _rounded(_attention("overhead_us", device_only=True))),
    ("latency_us", _timing("median_us")),
    ("latency_iqr_us", _timing("iqr_us")),
    ("cold_ms", _timing("cold_ms")),
    ("unstable", _timing("unstable")),
    ("retimed", lambda r: r.retimed if r.timing is not None else None),
    ("cpu_contention", _timing("cpu_contention")),
    ("timing_method", _timing("method")),
    ("flops", _flops),
    ("executed_flops", lambda r: r.executed_flops),
    ("tflops", _throughput("tflops")),
    ("kernel_tflops", lambda r: r.kernel_tflops),
    ("tflops_convention", _tflops_convention),
    ("pct_of_peak", _throughput("pct_of_peak")),
    ("kernel_pct_of_peak", lambda r: r.kernel_pct_of_peak),
    ("pct_of_peak_note", _throughput("pct_of_peak_note")),
    ("peak_tflops", _throughput("peak_tflops")),
    ("bytes_moved", _throughput("bytes_moved")),
    ("achieved_gbps", _throughput("achieved_gbps")),
    ("pct_of_read_bandwidth", _throughput("pct_of_read_bandwidth")),
    ("peak_read_gbps", _throughput("peak_read_gbps")),
    ("read_bandwidth_note", _throughput("read_bandwidth_note")),
    ("bound", _throughput("bound")),
    ("peak_memory_mib", lambda r: r.memory_mib),
    ("rel_error", _check("rel_error")),
    ("passed", lambda r: r.passed),
    ("grad_rel_error_dq", _grad_error("dq")),
    ("grad_rel_error_dk", _grad_error("dk")),
    ("grad_rel_error_dv", _grad_error("dv")),
    ("nan_on_fully_masked", lambda r: r.nan_on_fully_masked),
    ("sm_clock_mhz", _clock("sm_mhz")),
    ("sm_clock_min_mhz", _clock("min_sm_mhz")),
    ("sm_clock_max_mhz", _clock("max_sm_mhz")),
    ("clock_limits", _clock("limits_text")),
    ("latency_p25_us", _timing("p25_us")),
    ("latency_p75_us", _timing("p75_us")),
    ("latency_min_us", _timing("min_us")),
    ("timing_reps", _timing("reps")),
    ("warmup_reps", _timing("warmup_reps")),
    ("forwards_per_sample", _timing("forwards_per_sample")),
    ("rel_error_threshold", _check("threshold")),
    ("grad_rel_error_threshold", lambda r: r.grad_check.threshold if r.grad_check is not None else None),
    ("correctness_scope", _scope),
    ("flops_convention", _flops_convention),
    ("speedup_vs_baseline", lambda r: r.speedup_vs_baseline),
    ("speedup_reliable", lambda r: r.speedup_reliable),
    ("findings", lambda r: " ".join(f.id for f in r.findings)),
    ("trace", lambda r: str(r.trace_path) if r.trace_path else None),
    ("ncu_report", _ncu_report),
    ("ncu_note", lambda r: r.ncu_note),
    ("comm_kernels_per_forward", _comm("kernels_per_forward")),
    ("comm_time_us", _rounded(_comm("comm_time_us"))),
    ("comm_overlap_pct", _rounded(_comm("overlap_pct"))),
    ("comm_exposed_us", _rounded(_comm("exposed_us"))),
    ("rank", _placement("rank")),
    ("local_rank", _placement("local_rank")),
    ("world_size", _placement("world_size")),
    ("hostname", _placement("hostname")),
    ("gpu", _placement("gpu")),
    ("ncu_seconds", lambda r: round(r.counters.seconds, 3) if r.counters and r.counters.seconds is not None else None),
)
CSV_FIELDS = tuple(name for name, _ in ROW)


def csv_row(result: CellResult) -> dict[str, Any]:
    """The flat row of scalars: CSV's columns, and the base of the JSON entry."""
    return {name: read(result) for name, read in ROW}


def row_cell_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """`RunSpec.cell_key` of a serialized row (a JSON entry or a CSV row read back)."""
    return (
        str(row.get("device")).split(":", 1)[0],
        row.get("dtype"),
        row.get("batch"),
        row.get("heads"),
        row.get("kv_heads"),
        row.get("seq"),
        row.get("head_dim"),
        row.get("causal"),
        row.get("mode") or "fwd",
        row.get("mask") or ("causal" if row.get("causal") else "none"),
        row.get("score_mod") or None,
        _unless_seq(row, "q_len"),
        _unless_seq(row, "kv_len"),
        row.get("page_size") or None,
    )


def _unless_seq(row: dict[str, Any], name: str) -> Any:
    """A row's q_len or kv_len as `RunSpec` keeps it: None when missing (rows written before decode
    existed) or equal to seq."""
    value = row.get(name)
    return None if value in (None, "") or value == row.get("seq") else value


def row_finding_ids(row: dict[str, Any]) -> list[str]:
    """The finding ids of a row read back: a JSON entry's `finding_ids` (or its `findings` list)."""
    ids = row.get("finding_ids")
    if isinstance(ids, str):
        return ids.split()
    return [f["id"] for f in row.get("findings") or [] if isinstance(f, dict) and "id" in f]


def entry_csv_row(entry: dict[str, Any]) -> dict[str, Any]:
    """The flat row of a JSON entry read back (`json_entry`'s inverse for CSV): its `findings` are the ids."""
    return {name: entry.get(name) for name in CSV_FIELDS} | {"findings": entry.get("finding_ids") or ""}


def json_entry(result: CellResult) -> dict[str, Any]:
    """The flat row plus the nested parts: findings with their messages (the trace's and the counters'),
    kernels, launch APIs, spread, phases (forward and backward work, as `analyze` gives them), the attention
    ledger (`attention`, None without device events), `grad_rel_error` as {dq, dk, dv} (None outside the
    backward modes) and `counters` (Nsight Compute's, `counters_entry`; None without --ncu)."""
    entry = csv_row(result)
    entry["grad_rel_error"] = dict(result.grad_check.rel_errors) if result.grad_check is not None else None
    analysis = result.analysis.to_dict() if result.analysis is not None else {}
    entry["finding_ids"] = entry["findings"]
    entry["findings"] = [f.to_dict() for f in result.findings]
    for key in ("launch_apis", "kernels", "spread", "phases"):
        if key in analysis:
            entry[key] = analysis[key]
    entry["attention"] = analysis.get("attention")
    entry["trace_device"] = analysis.get("device")
    entry["phases_s"] = dict(result.phases_s)
    entry["comm"] = analysis.get("comm")
    entry["mask_alternatives"] = [a.to_dict() for a in result.mask_alternatives]
    entry["counters"] = counters_entry(result)
    return entry


def counters_entry(result: CellResult | ModelResult) -> dict[str, Any] | None:
    """A row's counters (`CellCounters.to_dict`) and `occupancy_measured`: a line for each kernel whose achieved
    occupancy the trace did not report and Nsight Compute measured; None without counters."""
    if result.counters is None:
        return None
    from attnprof.analysis.counters import occupancy_notes

    kernels = result.analysis.kernels if result.analysis is not None else []
    return result.counters.to_dict() | {"occupancy_measured": occupancy_notes(kernels, result.counters)}


def results_document(
    command: str,
    config: Any,
    environment: dict[str, Any],
    ceiling: Any,
    results: list[CellResult] | list[ModelResult],
    interrupted: bool,
    files: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The self-contained JSON document: the files it was written to, environment, config, ceiling and
    every result (`json_entry`, or `model_json_entry` for `attnprof model`). `files` names the run's
    folder, its results files and its traces folder."""
    from attnprof import __version__

    return {
        "attnprof_version": __version__,
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "interrupted": interrupted,
        "files": files,
        "environment": environment,
        "config": config.model_dump(mode="json"),
        "ceiling": None if ceiling is None else ceiling.to_dict(),
        "results": [model_json_entry(r) if isinstance(r, ModelResult) else json_entry(r) for r in results],
    }


# --------------------------------------------------------------------------- attnprof model


def attention_ledger(result: ModelResult) -> dict[str, Any] | None:
    """The attention ledger of the row's trace analysis as a dict (`calls_per_forward`, `backends`,
    `kernel_time_us`, `gpu_time_pct`, `overhead_us`, `calls`, `overhead`), or None when the analysis has none
    (a CPU-only trace).
    The one place that reads `TraceAnalysis.attention`."""
    ledger = getattr(result.analysis, "attention", None) if result.analysis is not None else None
    return ledger.to_dict() if ledger is not None else None


def _ledger(key: str) -> Callable[[ModelResult], Any]:
    return lambda r: (attention_ledger(r) or {}).get(key)


def _backends(r: ModelResult) -> str | None:
    """The ledger's backends as "cudnn:2" ("eager:1 flex:1" for several), as compare's rows write them."""
    backends = (attention_ledger(r) or {}).get("backends") or {}
    return " ".join(f"{name}:{count}" for name, count in backends.items()) or None


def _logits(attr: str) -> Callable[[ModelResult], Any]:
    return lambda r: getattr(r.logits, attr) if r.logits is not None else None


def _shared(*names: str) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """ROW's readers of fields a ModelResult has as a CellResult does (status, timing, analysis, memory,
    clock, speed-up, trace), by name."""
    readers = dict(ROW)
    return tuple((name, readers[name]) for name in names)


#: The row of `attnprof model`, in column order: (field, how to read it from a ModelResult).
MODEL_ROW: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    *((name, attrgetter(name)) for name in ("variant", "implementation", "source", "model", "params", "batch")),
    *((name, attrgetter(name)) for name in ("shape", "seq", "heads", "kv_heads", "head_dim", "dtype", "device")),
    *((name, attrgetter(name)) for name in ("causal", "mask", "score_mod", "mode")),
    *_shared("status", "reason", "latency_us", "latency_iqr_us", "cold_ms", "unstable", "timing_method"),
    *_shared("cpu_contention", "latency_min_us"),
    *_shared("speedup_vs_baseline", "speedup_reliable", "forwards", "kernels_per_forward", "memcpy_per_forward"),
    *_shared("memset_per_forward", "gpu_time_us", "kernel_time_us", "cpu_time_us", "peak_memory_mib"),
    # the attention ledger's figures, under the row's names
    ("attention_calls_per_forward", _ledger("calls_per_forward")),
    ("attention_backends", _backends),
    ("attention_time_us", _ledger("kernel_time_us")),
    ("attention_gpu_pct", _ledger("gpu_time_pct")),
    ("attention_overhead_us", _ledger("overhead_us")),
    *((f"logits_{attr}", _logits(attr)) for attr in ("baseline", "max_abs_diff", "rel_diff")),
    *_shared("sm_clock_mhz", "sm_clock_max_mhz", "clock_limits", "findings", "trace", "ncu_seconds"),
    *_shared("ncu_report", "ncu_note"),
)
MODEL_CSV_FIELDS = tuple(name for name, _ in MODEL_ROW)


def model_csv_row(result: ModelResult) -> dict[str, Any]:
    """The flat row of scalars of `attnprof model` (CSV, and the base of the JSON entry)."""
    return {name: read(result) for name, read in MODEL_ROW}


def model_json_entry(result: ModelResult) -> dict[str, Any]:
    """The row of `attnprof model` plus the nested parts: `attention` (the ledger dict), findings with their
    messages, kernels, the timing's spread, phase times, the Python warnings the row raised and `counters`
    (Nsight Compute's; None without --ncu)."""
    entry = model_csv_row(result)
    analysis = result.analysis.to_dict() if result.analysis is not None else {}
    entry["attention"] = attention_ledger(result)
    entry["finding_ids"] = entry["findings"]
    entry["findings"] = [f.to_dict() for f in result.findings]
    entry["counters"] = counters_entry(result)
    for key in ("kernels", "spread", "notes"):
        if key in analysis:
            entry[key] = analysis[key]
    entry["timing"] = result.timing.to_dict() if result.timing is not None else None
    entry["phases_s"] = dict(result.phases_s)
    entry["warnings"] = list(result.warnings)
    return entry
