"""Tables for `list`, `run` and `compare`, rendered with tabulate. Formatting only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from attnprof.report.formatting import fmt_count, fmt_number, table_style


def render(rows: list[list[Any]], headers: Iterable[str], fmt: str, widths: list[int | None] | None = None) -> str:
    """One table in the `table` or `markdown` style."""
    return tabulate(rows, headers=list(headers), tablefmt=table_style(fmt), maxcolwidths=widths, disable_numparse=True)


def variant_list_table(entries: list[dict[str, Any]], fmt: str) -> str:
    """`attnprof list`: name, availability here, reason, source, description."""
    rows = [[e["name"], "yes" if e["available"] else "no", e["reason"] or "", e["source"], e["description"]]
            for e in entries]
    return render(rows, ["variant", "runs here", "why not", "from", "description"], fmt,
                  widths=[None, None, 40, None, 60] if fmt == "table" else None)


def _latency(row: dict[str, Any]) -> str:
    if row.get("latency_us") is None:
        return "n/a"
    text = f"{fmt_number(row['latency_us'])} ± {fmt_number(row.get('latency_iqr_us'))}"
    if clock_held_down(row):
        text += f" @ {fmt_count(row['sm_clock_mhz'])} MHz"
    return text + (" (unstable)" if row.get("unstable") else "")


def clock_held_down(row: dict[str, Any]) -> bool:
    """True when the median SM clock while timing was more than 1% under the device's maximum."""
    mhz, top = row.get("sm_clock_mhz"), row.get("sm_clock_max_mhz")
    return bool(mhz and top and mhz < 0.99 * top)


def _clock(row: dict[str, Any]) -> str:
    if not row.get("sm_clock_mhz"):
        return "n/a (not sampled: CPU, no nvidia-smi, --no-clocks or --no-timing)"
    text = f"{fmt_count(row['sm_clock_mhz'])} MHz median, {fmt_count(row.get('sm_clock_min_mhz'))} lowest, " \
           f"{fmt_count(row.get('sm_clock_max_mhz'))} max"
    return text + (f"; held down by {row['clock_limits']}" if row.get("clock_limits") else "")


def _speedup(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _throughput(row: dict[str, Any]) -> str:
    """TFLOP/s with its % of the measured peak, or `n/a: why` when there is no meaningful peak."""
    if row.get("pct_of_peak") is None and row.get("pct_of_peak_note"):
        return f"{fmt_number(row.get('tflops'))} (n/a: {row['pct_of_peak_note']})"
    return f"{fmt_number(row.get('tflops'))} ({fmt_number(row.get('pct_of_peak'))}%)"


def _error(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1e}"


def shape_table(rows: list[dict[str, Any]], fmt: str) -> str:
    """One comparison table for the rows of one shape."""
    body = []
    for row in rows:
        if row["status"] != "ok" and row.get("forwards") is None:
            body.append([row["variant"], row["status"]] + ["" for _ in range(10)])
            continue
        body.append([
            row["variant"], row["status"] if row["status"] == "ok" else row["status"],
            fmt_count(row.get("kernels_per_forward")), fmt_number(row.get("gpu_time_us")),
            fmt_number(row.get("cpu_time_us")), _latency(row), fmt_number(row.get("tflops")),
            fmt_number(row.get("pct_of_peak")), fmt_number(row.get("peak_memory_mib")),
            _error(row.get("rel_error")), _speedup(row.get("speedup_vs_baseline")), row.get("finding_ids") or "",
        ])
    headers = ["variant", "status", "kernels/fwd", "GPU µs", "CPU µs", "latency µs ± IQR", "TFLOP/s",
               "% peak", "peak MiB", "rel err", "speed-up", "findings"]
    widths = [None, 36, None, None, None, None, None, None, None, None, None, 40] if fmt == "table" else None
    return render(body, headers, fmt, widths)


def glance_table(results: list[dict[str, Any]], fmt: str) -> str:
    """One row per variant: kernels/forward, GPU and CPU time, and what the trace revealed."""
    body = []
    for entry in results:
        if entry.get("forwards") is None:
            body.append([entry["variant"], entry["shape"], "", "", "", entry["status"]])
            continue
        revealed = "; ".join(f["message"] for f in entry.get("findings", [])) or "nothing unusual"
        body.append([entry["variant"], entry["shape"], fmt_count(entry.get("kernels_per_forward")),
                     fmt_number(entry.get("gpu_time_us")), fmt_number(entry.get("cpu_time_us")), revealed])
    headers = ["variant", "shape", "kernels/fwd", "GPU µs/fwd", "CPU µs/fwd", "what the trace revealed"]
    return render(body, headers, fmt, [None, None, None, None, None, 90] if fmt == "table" else None)


def run_summary_table(row: dict[str, Any], fmt: str) -> str:
    """`attnprof run`: the cell and its measurements outside the profiler (the trace facts follow it)."""
    items = [
        ("variant", f"{row['variant']} ({row['source']})"),
        ("shape", f"{row['shape']} {row['dtype']} {'causal' if row['causal'] else 'full'} on {row['device']}"),
        ("status", row["status"]),
        ("backend dispatched", row.get("backend") or "n/a"),
        ("latency (µs, median ± IQR)", _latency(row)),
        ("timing method", row.get("timing_method") or "n/a"),
        ("SM clock while timed", _clock(row)),
        ("cold first call (ms)", fmt_number(row.get("cold_ms"))),
        ("TFLOP/s (% of measured peak)", _throughput(row)),
        ("achieved GB/s, bound", f"{fmt_number(row.get('achieved_gbps'))}, {row.get('bound') or 'n/a'}"),
        ("peak extra memory (MiB)", fmt_number(row.get("peak_memory_mib"))),
        ("rel. error vs float64", _error(row.get("rel_error"))),
        ("trace", row.get("trace") or "n/a"),
    ]
    return render([list(item) for item in items], ["metric", "value"], fmt)
