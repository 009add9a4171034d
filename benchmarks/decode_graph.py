"""Decode timed the way it is served (issue 32): attnprof's graph-timed decode cells against triton's
`do_bench_cudagraph` on the same step, in the same process.

For each cell of the config (default `configs/decode-h200.yaml`: each shape × each variant that runs there),
attnprof measures the cell as `attnprof compare` does (`pipeline.run_cell`, default options: decode is
graph-timed, warm L2) and gives its latency, its GB/s by kernel time (`kernel_gbps`, the attention calls'
bytes over their device time in the trace) and that figure's % of the read bandwidth measured in this run
(`profiling.read_probe.probe_read`). Then `triton.testing.do_bench_cudagraph` (one graph of back-to-back
calls, warm L2, median) times the same step, built as the cell builds it (`profiling.steps.cell_step`, same
seed). The ratio is attnprof's latency over do_bench_cudagraph's; a cell is within when |ratio - 1| <= 10%.

Usage (on the GPU machine, from the repo root; CUDA and triton only, about a minute on an H200):
    PYTHONPATH=src python3 benchmarks/decode_graph.py [--config FILE] [--out FILE.json]
Prints a markdown table; exits 1 when a cell is off by more than the tolerance, 2 without CUDA or triton.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path(__file__).parents[1] / "configs" / "decode-h200.yaml"
TOLERANCE = 0.10
MIN_TIME_S = 0.1


@dataclass(frozen=True)
class Entry:
    """One decode cell: attnprof's figures, do_bench_cudagraph's time, and how they compare (None: not measured;
    `problem` then says why)."""

    cell: str
    variant: str
    timing_method: str | None
    latency_us: float | None
    kernel_gbps: float | None
    pct_of_read_bandwidth: float | None
    do_bench_cudagraph_us: float | None
    ratio: float | None
    within: bool | None
    problem: str | None = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the decode config")
    parser.add_argument("--out", type=Path, default=None, help="write the entries as JSON to this file")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest |ratio - 1| (default 0.10)")
    parser.add_argument("--min-time", type=float, default=MIN_TIME_S, help="attnprof's --min-time per cell")
    parser.add_argument("--variants", default=None, help="comma-separated variants (default: the config's)")
    args = parser.parse_args(argv)
    if not 0 < args.tolerance < 1 or args.min_time <= 0:
        parser.error("--tolerance must be in (0, 1) and --min-time > 0")
    return args


def compared(
    latency_us: float | None, bench_us: float | None, tolerance: float
) -> tuple[float | None, bool | None]:
    """attnprof's latency over do_bench_cudagraph's, and whether it is within `tolerance` of 1 (None: either
    missing)."""
    if latency_us is None or bench_us is None or bench_us <= 0:
        return None, None
    ratio = latency_us / bench_us
    return ratio, abs(ratio - 1) <= tolerance + 1e-12  # 110 over 100 is within 10%


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def markdown_table(entries: list[Entry], read_gbps: float | None) -> str:
    """The entries as a markdown table, with the read bandwidth the % column uses."""
    lines = [
        f"read bandwidth measured in this run: {_num(read_gbps, 0)} GB/s",
        "",
        "| cell | variant | attnprof latency µs | kernel GB/s | % of read BW | do_bench_cudagraph µs | ratio "
        "| within 10% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        within = "n/a" if e.within is None else "yes" if e.within else "**no**"
        if e.problem:
            within += f" ({e.problem})"
        lines.append(
            f"| {e.cell} | {e.variant} | {_num(e.latency_us)} | {_num(e.kernel_gbps, 0)} | "
            f"{_num(e.pct_of_read_bandwidth)} | {_num(e.do_bench_cudagraph_us)} | {_num(e.ratio, 3)} | {within} |"
        )
    return "\n".join(lines)


def exit_code(entries: list[Entry]) -> int:
    """1 when a measured cell is off by more than the tolerance, else 0."""
    return 1 if any(e.within is False for e in entries) else 0


def _do_bench_us(step: Any) -> float:
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(step, rep=100, return_mode="median")) * 1e3
    except TypeError:  # a triton without return_mode
        return float(do_bench_cudagraph(step, rep=100, quantiles=[0.5])) * 1e3


def measure(args: argparse.Namespace) -> tuple[list[Entry], float]:
    """Every runnable cell of the config, measured by attnprof and by do_bench_cudagraph."""
    from contextlib import nullcontext

    import torch

    from attnprof.config import MeasureOptions, Schedule, load_config
    from attnprof.pipeline import run_cell
    from attnprof.pipeline.rows import cell_row
    from attnprof.pipeline.run import cell_specs
    from attnprof.plugins import load_variants
    from attnprof.profiling.read_probe import probe_read
    from attnprof.profiling.steps import cell_step

    config = load_config(args.config)
    dtype = "bf16" if config.dtype == "auto" else config.dtype
    config = config.model_copy(update={"schedule": Schedule(wait=0, warmup=1, active=2), "dtype": dtype})
    device = "cuda:0" if config.device in ("auto", "cuda") else config.device
    registry = load_variants().registry
    read_gbps = probe_read(device).gbps
    entries = []
    names = args.variants.split(",") if args.variants else config.variants
    for spec in cell_specs(config, device):
        for name in names:
            variant = registry.get(name)
            if variant.unavailable_reason(spec):
                continue
            print(f"decode_graph: {name} at {spec.cell_label}", file=sys.stderr, flush=True)
            row = cell_row(run_cell(variant, spec, config, MeasureOptions(min_time_s=args.min_time, clocks=False)))
            if not row.ok:
                entries.append(Entry(spec.cell_label, name, None, None, None, None, None, None, None, row.reason))
                continue
            with cell_step(variant, spec, config.seed, lambda what: nullcontext()) as step:
                bench = _do_bench_us(step.call)
            torch.cuda.empty_cache()
            ratio, within = compared(row.latency_us, bench, args.tolerance)
            pct = None if row.kernel_gbps is None else 100.0 * row.kernel_gbps / read_gbps
            figures = (row.timing_method, row.latency_us, row.kernel_gbps, pct, bench, ratio, within)
            entries.append(Entry(spec.cell_label, name, *figures))
    return entries, read_gbps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        print(f"decode_graph: needs torch and triton ({exc})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("decode_graph: needs a CUDA GPU", file=sys.stderr)
        return 2
    entries, read_gbps = measure(args)
    print(markdown_table(entries, read_gbps))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        document = {"read_gbps": read_gbps, "tolerance": args.tolerance, "entries": [asdict(e) for e in entries]}
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return exit_code(entries)


if __name__ == "__main__":
    sys.exit(main())
