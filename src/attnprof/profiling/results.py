"""Cell results as flat rows, with the baseline's speed-up: the shape JSON and CSV share."""

from __future__ import annotations

from typing import Any

from attnprof.profiling.runner import CellResult

ANALYSIS_FIELDS = (
    "forwards", "kernels_per_forward", "memcpy_per_forward", "memset_per_forward",
    "gpu_time_us", "kernel_time_us", "cpu_time_us", "self_device_time_total_us",
    "transposes_per_forward", "cpu_ops_per_forward",
)
MEASURE_FIELDS = (
    "backend", "latency_us", "latency_iqr_us", "cold_ms", "unstable", "timing_method", "tflops",
    "pct_of_peak", "peak_tflops", "achieved_gbps", "bound", "peak_memory_mib", "rel_error", "passed",
    "nan_on_fully_masked", "sm_clock_mhz", "sm_clock_min_mhz", "sm_clock_max_mhz", "clock_limits",
)
ROW_FIELDS = (
    "variant", "source", "shape", "batch", "heads", "kv_heads", "seq", "head_dim", "dtype", "device",
    "causal", "status", "reason", *ANALYSIS_FIELDS, *MEASURE_FIELDS, "speedup_vs_baseline", "findings", "trace",
)


def speed_basis(row: dict[str, Any]) -> tuple[str, float] | None:
    """The time a speed-up is computed from: clean latency, else profiler GPU time, else CPU time."""
    for key in ("latency_us", "gpu_time_us", "cpu_time_us"):
        value = row.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return key, float(value)
    return None


def result_row(result: CellResult) -> dict[str, Any]:
    """One flat row (scalars only, for CSV) plus the nested analysis parts (for JSON)."""
    spec = result.spec
    analysis = result.analysis or {}
    row: dict[str, Any] = {
        "variant": result.variant, "source": result.source, "shape": spec.shape_label,
        "batch": spec.batch, "heads": spec.heads, "kv_heads": spec.n_kv_heads, "seq": spec.seq,
        "head_dim": spec.head_dim, "dtype": spec.dtype, "device": spec.device, "causal": spec.causal,
        "status": result.status if result.ok else f"{result.status}: {result.reason}",
        "reason": result.reason,
    }
    row.update({key: analysis.get(key) for key in ANALYSIS_FIELDS})
    row.update({key: result.measures.get(key) for key in MEASURE_FIELDS})
    row["speedup_vs_baseline"] = None
    row["findings"] = " ".join(f["id"] for f in analysis.get("findings", []))
    row["trace"] = str(result.trace_path) if result.trace_path else None
    return row


def result_rows(results: list[CellResult], baseline: str | None) -> list[dict[str, Any]]:
    """Rows for every result, with `speedup_vs_baseline` = baseline time / variant time per shape."""
    rows = [result_row(r) for r in results]
    if baseline:
        for shape in {row["shape"] for row in rows}:
            base = next((r for r in rows if r["shape"] == shape and r["variant"] == baseline), None)
            base_time = speed_basis(base) if base and base["status"] == "ok" else None
            if base_time is None:
                continue
            key, base_value = base_time
            for row in rows:
                value = row.get(key)
                if row["shape"] == shape and row["status"] == "ok" and isinstance(value, (int, float)) and value > 0:
                    row["speedup_vs_baseline"] = base_value / value
    return rows


def result_document(results: list[CellResult], baseline: str | None) -> list[dict[str, Any]]:
    """Rows for JSON: the flat fields plus kernels, launch APIs, findings and spread."""
    documents = []
    for result, row in zip(results, result_rows(results, baseline)):
        analysis = result.analysis or {}
        entry = dict(row)
        entry["finding_ids"] = row["findings"]
        entry["findings"] = analysis.get("findings", [])
        for key in ("launch_apis", "kernels", "spread"):
            if key in analysis:
                entry[key] = analysis[key]
        entry["trace_device"] = analysis.get("device")
        entry["phases_s"] = result.phases_s
        documents.append(entry)
    return documents
