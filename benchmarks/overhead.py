"""attnprof's overhead per profiled cell: its runner against a minimal raw loop doing the same work.

For each of the blog's six variants (naive, inplace, sdpa-math, sdpa-efficient, sdpa-flash,
sdpa-cudnn) at one shape, one process runs the cell twice:

  attnprof  `attnprof.pipeline.run_cell(variant, spec, config, measure)`: inputs and
            setup, time_forward (cold call, settling warm-up, time-based reps), torch.profiler
            under the schedule with a record_function region, Chrome trace export plus the
            key_averages table, the float64 correctness check, the peak-memory probe and trace
            analysis (cached memory is released only after a failed cell).
  raw       what one would write by hand for the same measurements: seeded inputs, setup, the
            same number of calls as attnprof made (1 cold, the warm-up calls, each synchronized
            and timed, then the timed reps back to back with CUDA events or perf_counter), the
            same profiler schedule and region, and `export_chrome_trace` of the same trace.
            Nothing else: no correctness check, no memory probe, no analysis.

Both use the variant's own forward and setup, so the device does the same work; the ratio is
attnprof's bookkeeping. Before anything is measured the process is warmed as attnprof warms it before
its first cell (`profiling.warmup.warm_process`: allocator, thread pool, CUDA context and clock, the
profiler; timed apart, once per process), every variant runs a few times and the profiler runs once
(cuBLAS/cuDNN handles are paid by neither side), and the modules run_cell imports on first use are
imported (timed apart: once per process);
before each cell, of either side, the variant runs three untimed calls on fresh inputs and the
CUDA caching allocator is emptied, so both start equally warm. The comparison runs
`--repeats` times (medians reported) while the time budget allows. Per-phase seconds come from
`CellResult.phases_s` (setup, timing = cold call + warm-up + timed reps, retiming = the same again
for an unstable sample whose median drifted, profile, trace_export, correctness, memory, analysis)
and from the raw loop's own clocks. Each attnprof cell also reports its sample: whether it was
re-timed, its IQR and drift (halves' medians apart) in % of the median, and the share of the CPU
other processes took while it was timed; a second table gives them per round. Afterwards the variant
with the worst ratio runs once more under cProfile and the top functions go into the JSON.

Target (issue #25): attnprof within 1.10x of the raw loop end to end, on the H200.

Usage, from the repo root:
    python3 benchmarks/overhead.py                                           # GPU: a100 shape, bf16
    python3 benchmarks/overhead.py --device cpu --shape 1x4x256x64 --dtype fp32
Prints a markdown table last and writes the JSON to --out, by default attnprof-out/overhead.json
under the current directory (attnprof's own output folder, which git ignores). About 30-60 s on
an H200.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BLOG_VARIANTS = ["naive", "inplace", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn"]
TARGET_RATIO = 1.10
DEFAULT_OUT = Path("attnprof-out") / "overhead.json"  # where attnprof writes its own runs; ignored by git


def _import_attnprof() -> None:
    """Make `attnprof` importable from a plain checkout (src layout) when it is not installed."""
    try:
        import attnprof  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """`BxHxSxD` as four ints."""
    parts = [int(p) for p in text.lower().split("x")]
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"shape must be BxHxSxD, got {text!r}")
    return parts[0], parts[1], parts[2], parts[3]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def release(device: str) -> None:
    """What run_cell does after each CUDA cell: collect garbage and empty the caching allocator."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def warm(variant: Any, spec: Any, calls: int = 3) -> None:
    """A few untimed calls of `variant` on fresh inputs, then release: both sides start a cell equally warm.

    A variant that fails here (a backend that rejects the input at run time) is left to the cells,
    which report it.
    """
    import torch

    from attnprof.profiling.inputs import make_inputs

    try:
        with torch.no_grad():
            q, k, v = make_inputs(spec, 0, variant.layout)
            state = variant.setup(spec) if variant.setup is not None else None
            for _ in range(calls):
                variant.forward(q, k, v, spec.causal, state)
            _sync(spec.device)
    except Exception:
        pass
    release(spec.device)


def lazy_imports() -> float:
    """Import what run_cell imports on its first call (analysis, correctness, ...): a once-per-process
    cost of attnprof, reported apart from the per-cell figures. Seconds taken."""
    started = time.perf_counter()
    import attnprof.analysis  # noqa: F401
    from attnprof.profiling import correctness, memory, profiler, timing  # noqa: F401

    return time.perf_counter() - started


def warm_process(device: str) -> float:
    """attnprof's once-per-process warm-up (run_cell does it before its first cell), here before either
    side's first cell; seconds taken."""
    from attnprof.profiling.warmup import warm_process as warm

    started = time.perf_counter()
    warm(device)
    return time.perf_counter() - started


def prime(variants: list[Any], spec: Any, region: str) -> float:
    """Run every variant a few times and the profiler once, so neither side pays one-time costs."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    started = time.perf_counter()
    for variant in variants:
        warm(variant, spec)
    with torch.no_grad():
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if spec.device_type == "cuda" else [])
        x = torch.ones(64, 64, device=spec.device)
        with profile(activities=activities) as prof:
            with record_function(region):
                (x @ x).sum()
            _sync(spec.device)
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(str(Path(tmp) / "prime.json.gz"))
    release(spec.device)
    return time.perf_counter() - started


def raw_cell(variant: Any, spec: Any, warmup_calls: int, reps: int, schedule: Any, region: str,
             trace_path: Path) -> dict[str, Any]:
    """The hand-written loop: same inputs, calls, schedule and trace as attnprof's cell. Seconds per phase."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.profiler import schedule as make_schedule

    phases: dict[str, float] = {}
    cuda = spec.device_type == "cuda"
    started = t = time.perf_counter()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    gen = torch.Generator(device=spec.device).manual_seed(0)
    shapes = [(spec.batch, spec.heads, spec.seq, spec.head_dim)] + [(spec.batch, spec.n_kv_heads, spec.seq,
                                                                     spec.head_dim)] * 2
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float32, device=spec.device).to(dtype) for s in shapes)
    if variant.layout == "bshd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    state = variant.setup(spec) if variant.setup is not None else None
    now = time.perf_counter()
    phases["setup"], t = now - t, now

    def fn() -> Any:
        return variant.forward(q, k, v, spec.causal, state)

    with torch.no_grad():
        _sync(spec.device)
        fn()  # the cold call
        _sync(spec.device)
        for _ in range(warmup_calls):  # each call timed on its own, as attnprof's warm-up does
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                s.elapsed_time(e)
            else:
                t0 = time.perf_counter()
                fn()
                time.perf_counter() - t0
        now = time.perf_counter()
        phases["cold_warmup"], t = now - t, now
        samples = []
        if cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            torch.cuda.synchronize(spec.device)
            for i in range(reps):
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize(spec.device)
            samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]
        else:
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6)
        median_us = statistics.median(samples) if samples else None
        now = time.perf_counter()
        phases["timed_reps"], t = now - t, now

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        total = schedule.wait + schedule.warmup + schedule.active
        with profile(activities=activities, schedule=make_schedule(wait=schedule.wait, warmup=schedule.warmup,
                                                                   active=schedule.active, repeat=1)) as prof:
            for step in range(total):
                with record_function(region):
                    fn()
                if step == total - 1 and cuda:
                    torch.cuda.synchronize(spec.device)
                prof.step()
        now = time.perf_counter()
        phases["profile"], t = now - t, now
        prof.export_chrome_trace(str(trace_path))
        now = time.perf_counter()
        phases["trace_export"] = now - t
    return {"wall_s": now - started, "phases_s": phases, "median_us": median_us,
            "calls": 1 + warmup_calls + reps + total}


def attnprof_cell(variant: Any, spec: Any, options: Any) -> tuple[Any, float]:
    """run_cell and its wall time."""
    from attnprof.pipeline import run_cell

    started = time.perf_counter()
    result = run_cell(variant, spec, *options)
    return result, time.perf_counter() - started


def compare_once(variants: list[Any], spec: Any, options: Any, trace_dir: Path, round_no: int) -> list[dict[str, Any]]:
    """One attnprof cell and one raw cell per variant."""
    rows = []
    for variant in variants:
        row: dict[str, Any] = {"variant": variant.name, "round": round_no}
        if variant.unavailable_reason(spec) is None:
            warm(variant, spec)
        result, wall = attnprof_cell(variant, spec, options)
        phases = dict(result.phases_s)
        phases["other"] = wall - sum(phases.values())  # availability check, memory release, bookkeeping
        row.update(status=result.status, reason=result.reason, attnprof_wall_s=wall,
                   attnprof_phases_s=phases, attnprof_median_us=result.latency_us, **sample_facts(result))
        if result.status == "ok" or (result.status == "failed" and "timing" in result.phases_s):
            warmup_calls = result.timing.warmup_reps if result.timing else 0
            reps = result.timing.reps if result.timing else 0
            warm(variant, spec)
            try:
                raw = raw_cell(variant, spec, warmup_calls, reps, options[0].schedule, options[0].region,
                               trace_dir / f"raw_{variant.name}_{round_no}.json.gz")
            except Exception as exc:
                row["raw_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
                rows.append(row)
                continue
            finally:
                release(spec.device)
            row.update(raw_wall_s=raw["wall_s"], raw_phases_s=raw["phases_s"], raw_median_us=raw["median_us"],
                       forward_calls=raw["calls"], warmup_calls=warmup_calls, timed_reps=reps,
                       ratio=wall / raw["wall_s"] if raw["wall_s"] > 0 else None,
                       trace_bytes={"attnprof": _size(result.trace_path),
                                    "raw": _size(trace_dir / f"raw_{variant.name}_{round_no}.json.gz")})
        rows.append(row)
    return rows


def sample_facts(result: Any) -> dict[str, Any]:
    """What became of attnprof's timing sample: re-timed or not, and the kept sample's IQR, drift and the
    CPU share other processes took, in % (None when not timed)."""
    t = result.timing
    if t is None:
        return dict.fromkeys(("retimed", "unstable", "iqr_pct", "drift_pct", "contention_pct", "timing_method"))
    return {
        "retimed": result.retimed,
        "unstable": t.unstable,
        "iqr_pct": 100 * t.iqr_us / t.median_us if t.median_us else None,
        "drift_pct": 100 * t.drift,
        "contention_pct": None if t.cpu_contention is None else 100 * t.cpu_contention,
        "timing_method": t.method,
    }


def _size(path: Path | None) -> int | None:
    return path.stat().st_size if path is not None and path.exists() else None


def merge_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant: medians over the rounds of wall times and phases."""
    merged = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        first = dict(mine[0])
        timed = [r for r in mine if r.get("raw_wall_s")]
        if timed:
            first["attnprof_wall_s"] = statistics.median(r["attnprof_wall_s"] for r in timed)
            first["raw_wall_s"] = statistics.median(r["raw_wall_s"] for r in timed)
            first["ratio"] = first["attnprof_wall_s"] / first["raw_wall_s"]
            first["ratios"] = [round(r["ratio"], 3) for r in timed]
            for side in ("attnprof_phases_s", "raw_phases_s"):
                keys = dict.fromkeys(k for r in timed for k in r[side])
                first[side] = {k: statistics.median(r[side].get(k, 0.0) for r in timed) for k in keys}
            first["retimed_rounds"] = sum(1 for r in timed if r.get("retimed"))
            for key in ("iqr_pct", "drift_pct", "contention_pct"):
                values = [r[key] for r in timed if r.get(key) is not None]
                first[key] = statistics.median(values) if values else None
        first["rounds"] = len(mine)
        first.pop("round", None)
        merged.append(first)
    return merged


def profile_cell(variant: Any, spec: Any, options: Any, top: int = 25) -> dict[str, Any]:
    """run_cell once under cProfile: the wall time and the top functions by cumulative time."""
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    from attnprof.pipeline import run_cell

    result = run_cell(variant, spec, *options)
    profiler.disable()
    wall = time.perf_counter() - started
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(top)
    return {"variant": variant.name, "status": result.status, "wall_s_under_cprofile": wall,
            "phases_s": dict(result.phases_s), "top_cumulative": stream.getvalue().splitlines()}


def _f(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """Per-variant rows and a total: wall times, the ratio, and attnprof's phases next to the raw loop's
    (`retime a`: the second sample of a re-timed cell; `retimed`: in how many rounds)."""
    head = ("| variant | status | attnprof s | raw s | ratio | setup a/r | timing a / warm-up+reps r | retime a | "
            "profile a/r | export a/r | correctness a | memory a | analysis a | other a | retimed | IQR % | "
            "drift % | others' CPU % |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    total_a = total_r = 0.0
    sums: dict[str, float] = {}
    for r in rows:
        if not r.get("raw_wall_s"):
            why = r.get("reason") or (f"raw loop failed: {r['raw_error']}" if r.get("raw_error") else "")
            lines.append(f"| {r['variant']} | {r['status']}: {why} |" + " |" * 16)
            continue
        a, w = r["attnprof_phases_s"], r["raw_phases_s"]
        timing_a = a.get("timing", 0.0) + a.get("warmup", 0.0)
        total_a += r["attnprof_wall_s"]
        total_r += r["raw_wall_s"]
        for key, value in a.items():
            sums[key] = sums.get(key, 0.0) + value
        for key, value in w.items():
            sums["raw_" + key] = sums.get("raw_" + key, 0.0) + value
        lines.append(
            f"| {r['variant']} | {r['status']} | {_f(r['attnprof_wall_s'])} | {_f(r['raw_wall_s'])} | "
            f"{r['ratio']:.3f} | {_f(a.get('setup'))}/{_f(w['setup'])} | "
            f"{_f(timing_a)} / {_f(w['cold_warmup'] + w['timed_reps'])} | {_f(a.get('retiming', 0.0))} | "
            f"{_f(a.get('profile'))}/{_f(w['profile'])} | "
            f"{_f(a.get('trace_export'))}/{_f(w['trace_export'])} | {_f(a.get('correctness'))} | "
            f"{_f(a.get('memory'))} | {_f(a.get('analysis'))} | {_f(a.get('other'))} | "
            f"{r.get('retimed_rounds', 0)} of {r.get('rounds', 1)} | {_f(r.get('iqr_pct'), 1)} | "
            f"{_f(r.get('drift_pct'), 1)} | {_f(r.get('contention_pct'), 0)} |")
    if total_r:
        g = sums.get
        lines.append(
            f"| **all** | | **{total_a:.3f}** | **{total_r:.3f}** | **{total_a / total_r:.3f}** | "
            f"{_f(g('setup'))}/{_f(g('raw_setup'))} | "
            f"{_f(g('timing', 0.0) + g('warmup', 0.0))} / {_f(g('raw_cold_warmup', 0.0) + g('raw_timed_reps', 0.0))} | "
            f"{_f(g('retiming', 0.0))} | "
            f"{_f(g('profile'))}/{_f(g('raw_profile'))} | {_f(g('trace_export'))}/{_f(g('raw_trace_export'))} | "
            f"{_f(g('correctness'))} | {_f(g('memory'))} | {_f(g('analysis'))} | {_f(g('other'))} | | | | |")
    return "\n".join(lines)


def rounds_markdown(rows: list[dict[str, Any]]) -> str:
    """Every round of every attnprof cell: its timing and retiming seconds and what its sample showed, so a
    re-time (and why it happened) is visible round by round."""
    head = ("| variant | round | timing a s | retime a s | raw warm-up+reps s | retimed | unstable | IQR % | drift % | "
            "others' CPU % | median a µs | median r µs |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if not r.get("raw_wall_s"):
            continue
        a, w = r["attnprof_phases_s"], r["raw_phases_s"]
        lines.append(
            f"| {r['variant']} | {r['round']} | {_f(a.get('timing', 0.0) + a.get('warmup', 0.0))} | "
            f"{_f(a.get('retiming', 0.0))} | {_f(w['cold_warmup'] + w['timed_reps'])} | {r.get('retimed')} | "
            f"{r.get('unstable')} | {_f(r.get('iqr_pct'), 1)} | {_f(r.get('drift_pct'), 1)} | "
            f"{_f(r.get('contention_pct'), 0)} | {_f(r.get('attnprof_median_us'), 1)} | "
            f"{_f(r.get('raw_median_us'), 1)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when it ran (whatever the ratio), 2 when the device is missing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output path (default: {DEFAULT_OUT})")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--shape", type=parse_shape, default=(8, 16, 1024, 64), help="BxHxSxD (default: a100)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--variants", nargs="*", default=BLOG_VARIANTS)
    parser.add_argument("--min-time", type=float, default=0.25, help="attnprof's --min-time (s of timed reps)")
    parser.add_argument("--repeats", type=int, default=3, help="comparison rounds (medians reported)")
    parser.add_argument("--budget-s", type=float, default=75.0,
                        help="start no further round after this many seconds (the GPU run must end within 2 min)")
    parser.add_argument("--no-cprofile", dest="cprofile", action="store_false",
                        help="skip the extra cProfile'd run of the worst cell")
    parser.add_argument("--trace-dir", type=Path, default=None, help="keep the traces here (default: a temp dir)")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    _import_attnprof()
    import torch

    from attnprof.config import Config, MeasureOptions
    from attnprof.errors import AttnprofError
    from attnprof.plugins import load_variants
    from attnprof.profiling.environment import collect_environment
    from attnprof.profiling.inputs import resolve_torch_device
    from attnprof.registry import RunSpec

    try:
        device = resolve_torch_device(args.device)
    except AttnprofError as exc:
        print(f"overhead.py: {exc.message}", file=sys.stderr)
        return 2
    b, h, s, d = args.shape
    spec = RunSpec(device=device, dtype=args.dtype, batch=b, heads=h, seq=s, head_dim=d, causal=args.causal)
    registry = load_variants(no_plugins=True).registry
    chosen = [registry.get(n) for n in args.variants]
    runnable = [v for v in chosen if v.unavailable_reason(spec) is None]
    tmp = None
    if args.trace_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="attnprof-overhead-")
        trace_dir = Path(tmp.name)
    else:
        trace_dir = args.trace_dir
        trace_dir.mkdir(parents=True, exist_ok=True)
    config = Config(shapes=[{"batch": b, "heads": h, "seq": s, "head_dim": d}], output_dir=trace_dir)
    options = (config, MeasureOptions(min_time_s=args.min_time))  # run_cell's config and measure
    print(f"overhead.py: {', '.join(v.name for v in chosen)} at {spec.shape_label} {spec.dtype} "
          f"{'causal' if spec.causal else 'full'} on {device}", file=sys.stderr)
    imports_s = lazy_imports()
    warm_s = warm_process(device)
    prime_s = prime(runnable, spec, config.region)
    rows: list[dict[str, Any]] = []
    rounds = 0
    round_s: list[float] = []
    while rounds < max(1, args.repeats):
        elapsed = time.perf_counter() - started
        if rounds and elapsed + statistics.mean(round_s) > args.budget_s:
            print(f"overhead.py: stopping after {rounds} round(s): the next would end past the {args.budget_s:g} s "
                  "budget", file=sys.stderr)
            break
        t0 = time.perf_counter()
        rows += compare_once(chosen, spec, options, trace_dir, rounds)
        round_s.append(time.perf_counter() - t0)
        rounds += 1
        print(f"overhead.py: round {rounds} took {round_s[-1]:.1f} s", file=sys.stderr)
    merged = merge_rounds(rows)
    timed = [r for r in merged if r.get("raw_wall_s")]
    total_a = sum(r["attnprof_wall_s"] for r in timed)
    total_r = sum(r["raw_wall_s"] for r in timed)
    ratio = total_a / total_r if total_r else None
    profile = None
    if args.cprofile and timed and time.perf_counter() - started < args.budget_s + 15:
        worst = max(timed, key=lambda r: r["ratio"])
        profile = profile_cell(registry.get(worst["variant"]), spec, options)
    document = {
        "benchmark": "overhead", "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "environment": collect_environment(device),
        "spec": {"shape": spec.shape_label, "dtype": spec.dtype, "causal": spec.causal, "device": device},
        "schedule": config.schedule.model_dump(), "min_time_s": args.min_time, "rounds": rounds,
        "prime_s": prime_s, "attnprof_lazy_imports_s": imports_s, "attnprof_process_warmup_s": warm_s,
        "target_ratio": TARGET_RATIO,
        "ratio_end_to_end": ratio,
        "target_met": None if ratio is None else ratio <= TARGET_RATIO,
        "attnprof_total_s": total_a, "raw_total_s": total_r, "variants": merged, "rounds_raw": rows,
        "cprofile_worst_cell": profile, "wall_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, default=str))
    if tmp is not None:
        tmp.cleanup()
    torch_line = f"torch {torch.__version__}" + (f", {torch.cuda.get_device_name(device)}" if device != "cpu" else "")
    verdict = "n/a" if ratio is None else ("met" if ratio <= TARGET_RATIO else "MISSED")
    print(f"\n{torch_line}; {spec.shape_label} {spec.dtype}; {rounds} round(s), medians; priming {prime_s:.1f} s "
          f"(plus attnprof's once-per-process imports, {imports_s:.2f} s, and process warm-up, {warm_s:.2f} s); "
          f"whole run {document['wall_s']:.1f} s; JSON: {args.out}")
    ratio_text = "n/a" if ratio is None else f"{ratio:.3f}x"
    print(f"attnprof {total_a:.3f} s vs raw loop {total_r:.3f} s: {ratio_text} (target <= {TARGET_RATIO}x: {verdict}). "
          "Columns a/r: attnprof / raw loop, seconds per cell (median over rounds).\n")
    print(markdown(merged))
    print("\nPer round (a re-time shows as retime a s > 0, with the IQR and drift of the kept sample):\n")
    print(rounds_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
