"""Does attnprof's timing agree with independent timers? Runs on a CUDA GPU (the H200) only.

For each fused variant (sdpa-efficient, sdpa-flash, sdpa-cudnn, and triton-flash /
flash-attn style plugins when registered) at 8x16x1024x64 and 4x16x8192x128, bf16, causal,
one process times the same forward five ways:

  attnprof        time_forward default: eager, CUDA events per call, L2 not flushed
  graph           independent: triton.testing.do_bench_cudagraph(fn, rep=25, median): many
                  calls in one CUDA graph, 10 replays -> compared with attnprof-graph
  attnprof-graph  time_forward(..., TimingOptions(cuda_graph=True))
  attnprof-flush  time_forward(..., TimingOptions(flush_l2=True))
  do_bench        triton.testing.do_bench(fn, rep=250, median) (flushes L2 itself)
                                                              -> compared with attnprof-flush

Like is compared with like: do_bench zeroes a 256 MB buffer before every call, so it is
held against attnprof's --flush-l2 timing; the graph replays run back to back on warm L2,
as attnprof's --cuda-graph timing does. Each pair also gets the same length of sustained
load (about 250 ms, attnprof's default `min_time_s`), because under sustained load an H200
can lower its SM clock (seen: 1980 -> 1845 MHz with the SW power cap active), so a 25 ms
burst and a 250 ms run of the same kernel can differ by several percent while both timers
are right. To show when that happens, nvidia-smi samples the SM clock every 25 ms
(attnprof.profiling.clocks, as `run` and `compare` do) and each
timing gets the median clock of its own window. The clock also drifts between timings
(seen: one 250 ms window dipping to 1485 MHz), so every timing runs `--rounds` times (5),
interleaved, the order within each compared pair flipping every round, and the medians of
the rounds are compared. "within 5%" holds when both pairs differ by at most 5 %. The
default (eager) timing is also set against the graph, but that gap is
not an error: an eager call whose CPU dispatch takes longer than its kernel leaves the GPU
idle between calls, the events see it, and users pay it. Rows with a gap over 5 % are
marked launch-bound.

`--mode bwd` (or `fwd+bwd`) times the step of that mode instead (`attnprof.profiling.steps`): every
timer gets the same callable, e.g. in `bwd` the same `torch.autograd.grad(out, (q, k, v), grad_out,
retain_graph=True)` call on one forward's graph, and the gradients are checked against float64 too.
The two graph timings are left out in those modes: autograd runs the backward on its own thread and
stream, which a CUDA-graph capture on the caller's stream does not follow (do_bench_cudagraph fails
with "operation failed due to a previous error during capture", and a kernel that draws a Philox
offset with "Offset increment outside graph capture"). The comparison there is attnprof's default
timing and its --flush-l2 timing against do_bench on the same call; the default timing (warm L2) is
also set against do_bench as `diff_eager_vs_do_bench_pct`, which is not expected to be within 5 %
for kernels that fit in L2 (the flushed pair is the like-for-like one).

Usage (on the GPU machine, from the repo root):
    PYTHONPATH=src python3 benchmarks/fidelity.py [--mode bwd] [--out PATH]
Prints a markdown table and writes JSON to --out, by default attnprof-out/fidelity.json under the
current directory (attnprof's own output folder, which git ignores). About 90 s on an H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

DEFAULT_VARIANTS = ["sdpa-efficient", "sdpa-flash", "sdpa-cudnn"]
FUSED_PLUGINS = ["triton-flash", "flash-attn", "flash-attn2", "flash-attn3", "fa2", "fa3"]
SHAPES = [(8, 16, 1024, 64), (4, 16, 8192, 128)]
TOLERANCE_PCT = 5.0
GRAPH_REP_MS = 25  # do_bench_cudagraph replays its graph 10 times: ~250 ms in all
DO_BENCH_REP_MS = 250
TIMINGS = ("attnprof", "graph", "attnprof_graph", "attnprof_flush", "do_bench")
DEFAULT_OUT = Path("attnprof-out") / "fidelity.json"  # where attnprof writes its own runs; ignored by git


def graph_time_us(fn: Callable[[], Any]) -> float | None:
    """triton.testing.do_bench_cudagraph's median µs per call (about 250 ms of replays), or None."""
    try:
        from triton.testing import do_bench_cudagraph
    except Exception:
        return None
    return float(do_bench_cudagraph(fn, rep=GRAPH_REP_MS, return_mode="median")) * 1e3


def do_bench_us(fn: Callable[[], Any]) -> float | None:
    """triton.testing.do_bench's median in µs over about 250 ms of calls, or None without triton."""
    try:
        from triton.testing import do_bench
    except Exception:
        return None
    return float(do_bench(fn, rep=DO_BENCH_REP_MS, return_mode="median")) * 1e3


def diff_pct(ours: float | None, theirs: float | None) -> float | None:
    """(ours - theirs) / theirs in percent, or None when either is missing."""
    if ours is None or not theirs:
        return None
    return 100.0 * (ours - theirs) / theirs


def pick_variants(registry: Any, names: list[str] | None) -> list[str]:
    """The requested names, or the SDPA fused backends plus any fused plugin that is registered."""
    if names:
        return names
    return DEFAULT_VARIANTS + [n for n in FUSED_PLUGINS if n in registry]


def timed_rounds(fn: Callable[[], Any], device: str, rounds: int, graphs: bool = True) -> dict[str, Any]:
    """Every timing of `fn`, `rounds` times, interleaved (the order of each compared pair flips
    every round, so drift in the GPU's clock hits both sides); medians of the rounds, the
    per-round values, and each timing's (start, end) windows for the clock log. Without `graphs`
    the two CUDA-graph timings are left out (None)."""
    from attnprof.profiling.timing import TimingOptions, time_forward

    values: dict[str, list[float | None]] = {key: [] for key in TIMINGS}
    windows: dict[str, list[tuple[float, float]]] = {key: [] for key in TIMINGS}
    graph_method = None

    def timed(key: str, measure: Callable[[], float | None]) -> None:
        start = time.time()
        values[key].append(measure())
        windows[key].append((start, time.time()))

    def attnprof_graph() -> float | None:
        nonlocal graph_method
        t = time_forward(fn, device, TimingOptions(cuda_graph=True))
        graph_method = t.method
        return t.median_us if t.cuda_graph else None

    measures: dict[str, Callable[[], float | None]] = {
        "attnprof": lambda: time_forward(fn, device).median_us,
        "graph": lambda: graph_time_us(fn),
        "attnprof_graph": attnprof_graph,
        "attnprof_flush": lambda: time_forward(fn, device, TimingOptions(flush_l2=True)).median_us,
        "do_bench": lambda: do_bench_us(fn),
    }
    for i in range(rounds):
        pairs = (
            [("graph", "attnprof_graph"), ("attnprof_flush", "do_bench")]
            if graphs
            else [("attnprof_flush", "do_bench")]
        )
        order = ["attnprof"] + [key for pair in pairs for key in (pair if i % 2 == 0 else pair[::-1])]
        for key in order:
            timed(key, measures[key])
    out: dict[str, Any] = {f"{key}_us": median_or_none(vals) for key, vals in values.items()}
    out["rounds"] = {key: vals for key, vals in values.items()}
    out["attnprof_graph_method"] = graph_method
    out["windows"] = windows
    return out


def median_or_none(values: list[float | None]) -> float | None:
    """The median of the values that are not None, or None when there are none."""
    from attnprof.stats import median

    present = [v for v in values if v is not None]
    return median(present) if present else None


def measure_cell(variant: Any, spec: Any, peak: Any, rounds: int = 3) -> dict[str, Any]:
    """Time one variant at one shape every way and compare; a row dict (status 'ok' or why not)."""
    import torch

    from attnprof.analysis.roofline import achieved_for
    from attnprof.errors import AttnprofError
    from attnprof.profiling.correctness import check_variant_output
    from attnprof.profiling.gradcheck import check_grads
    from attnprof.profiling.inputs import make_inputs
    from attnprof.profiling.steps import build_step, graph_retention

    row: dict[str, Any] = {"variant": variant.name, "shape": spec.shape_label, "mode": spec.mode, "status": "ok"}
    reason = variant.unavailable_reason(spec)
    if not reason and spec.mode == "bwd" and not variant.repeatable_backward:
        reason = "its backward cannot repeat on one graph (do_bench would time a forward with it)"
    if reason:
        row["status"] = f"unavailable: {reason}"
        return row
    try:
        state = variant.setup(spec) if variant.setup is not None else None
        q, k, v = make_inputs(spec, 0, variant.layout)

        with torch.no_grad(), graph_retention(spec.mode):
            step = build_step(spec, lambda q, k, v: variant.forward(q, k, v, spec.causal, state), (q, k, v), 0)
            first = step.call()
            out = first.out if spec.backward else first
            check = check_variant_output(out, q, k, v, causal=spec.causal, dtype=spec.dtype, layout=variant.layout)
            row["correct"] = check.passed
            row["rel_error"] = check.rel_error
            if spec.backward:
                grads = check_grads(
                    first.grads, q, k, v, step.grad_out, causal=spec.causal, dtype=spec.dtype, layout=variant.layout
                )
                row["correct"] = check.passed and grads.passed
                row["grad_rel_error"] = grads.rel_errors
            del first, out
            row.update(timed_rounds(step.call, spec.device, rounds, graphs=not spec.backward))
    except AttnprofError as exc:
        row["status"] = f"failed: {exc.message}"
        return row
    except Exception as exc:
        row["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return row
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    row["diff_eager_vs_graph_pct"] = diff_pct(row["attnprof_us"], row["graph_us"])
    row["diff_graph_vs_graph_pct"] = diff_pct(row["attnprof_graph_us"], row["graph_us"])
    row["diff_flush_vs_do_bench_pct"] = diff_pct(row["attnprof_flush_us"], row["do_bench_us"])
    row["diff_eager_vs_do_bench_pct"] = diff_pct(row["attnprof_us"], row["do_bench_us"])
    diffs = [row[k] for k in ("diff_graph_vs_graph_pct", "diff_flush_vs_do_bench_pct") if row[k] is not None]
    row["within_5pct"] = all(abs(d) <= TOLERANCE_PCT for d in diffs) if diffs else None
    eager_gap = row["diff_eager_vs_graph_pct"]
    row["launch_bound"] = None if eager_gap is None else eager_gap > TOLERANCE_PCT
    rates = achieved_for(spec, row["attnprof_us"] * 1e-6, peak.tflops, peak.read_gbps)
    row["tflops"], row["pct_of_peak"] = rates["tflops"], rates["pct_of_peak"]
    return row


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    head = (
        "| variant | shape | attnprof µs | graph µs | Δ% | attnprof --cuda-graph µs | Δ% | "
        "attnprof --flush-l2 µs | do_bench µs | Δ% | within 5%? | launch-bound | TFLOP/s | % of peak | correct | "
        "SM MHz: attnprof-graph / graph / attnprof-flush / do_bench |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['variant']} | {r['shape']} | {r['status']} |" + " |" * 13)
            continue

        def pct(key: str, r: dict[str, Any] = r) -> str:
            return "n/a" if r.get(key) is None else f"{r[key]:+.1f}"

        lines.append(
            f"| {r['variant']} | {r['shape']} | {_fmt(r['attnprof_us'])} | {_fmt(r['graph_us'])} | "
            f"{pct('diff_eager_vs_graph_pct')} | {_fmt(r['attnprof_graph_us'])} | {pct('diff_graph_vs_graph_pct')} | "
            f"{_fmt(r['attnprof_flush_us'])} | {_fmt(r['do_bench_us'])} | {pct('diff_flush_vs_do_bench_pct')} | "
            f"{_fmt(r['within_5pct'])} | {_fmt(r['launch_bound']).replace('NO', 'no')} | {_fmt(r['tflops'])} | "
            f"{_fmt(r['pct_of_peak'])} | "
            f"{_fmt(r['correct'])} | {clocks(r)} |"
        )
    return "\n".join(lines)


def _window(samples: list[Any], spans: list[tuple[float, float]]) -> dict[str, Any] | None:
    from attnprof.profiling.clocks import clock_window

    window = clock_window(samples, spans)
    return None if window is None else asdict(window)


def clocks(row: dict[str, Any]) -> str:
    """Median SM MHz of each compared timing's windows (n/a without samples), '*' when the
    driver held the clock down (any reason but idle)."""
    parts = []
    for key in ("attnprof_graph", "graph", "attnprof_flush", "do_bench"):
        c = (row.get("sm_clock") or {}).get(key)
        parts.append("n/a" if c is None else f"{c['sm_mhz']}{'*' if c['limits'] else ''}")
    return " / ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when it ran (whatever it found), 2 without a CUDA GPU."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output path (default: {DEFAULT_OUT})")
    parser.add_argument("--variants", nargs="*", help="variant names (default: fused SDPA backends + plugins)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per cell (medians reported)")
    parser.add_argument(
        "--mode",
        choices=("fwd", "bwd", "fwd+bwd"),
        default="fwd",
        help="what is timed: the forward, the backward alone (autograd.grad), or both",
    )
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("fidelity.py needs a CUDA GPU: this torch build sees none (run it on the H200).", file=sys.stderr)
        return 2

    from attnprof.plugins import load_variants
    from attnprof.profiling.ceiling import device_ceiling
    from attnprof.profiling.clocks import ClockSampler
    from attnprof.profiling.environment import collect_environment
    from attnprof.registry import RunSpec

    started = time.perf_counter()
    sampler = ClockSampler(args.device).start()
    registry = load_variants().registry
    peak = device_ceiling(args.device, "bf16")
    rows = []
    for b, h, s, d in SHAPES:
        spec = RunSpec(
            device=args.device, dtype="bf16", batch=b, heads=h, seq=s, head_dim=d, causal=True, mode=args.mode
        )
        for name in pick_variants(registry, args.variants):
            if name not in registry:
                rows.append({"variant": name, "shape": spec.shape_label, "status": "not registered"})
                continue
            rows.append(measure_cell(registry.get(name), spec, peak, args.rounds))
            print(f"  {name} {spec.shape_label}: {rows[-1]['status']}", file=sys.stderr, flush=True)
    samples = sampler.stop()
    for row in rows:
        row["sm_clock"] = {key: _window(samples, spans) for key, spans in row.pop("windows", {}).items()}
    table = markdown(rows)
    print(
        f"mode {args.mode}; bf16 matmul peak {peak.tflops:.0f} TFLOP/s, "
        f"read {peak.read_gbps or 0:.0f} GB/s, copy {peak.bandwidth_gbps:.0f} GB/s ({peak.source})\n"
    )
    print(table)
    doc = {
        "environment": collect_environment(args.device),
        "ceiling": peak.to_dict(),
        "mode": args.mode,
        "tolerance_pct": TOLERANCE_PCT,
        "rows": rows,
        "elapsed_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"\nwrote {args.out} in {doc['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
