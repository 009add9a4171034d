"""Trace-analysis speed and memory: `attnprof analyze` on traces of 100k, 1M and 5M events,
next to a bare msgspec decode of the same file, and HTA.

Traces come from benchmarks/scaletrace.py: the real H200 traces of the tests, replicated with
shifted timestamps and new correlation and External ids (every copy keeps cpu ops with input
types, runtime/driver calls, kernels with launch facts, memcpys, memsets, flows and GPU
annotations). Each size is written as plain JSON (what `export_chrome_trace("x.json")` writes)
and, with `--formats json,gz`, gzipped (what attnprof writes).

Every measurement runs in a fresh child process:

  attnprof  load_trace (parse) then analyze_trace (forwards, metrics, findings) and to_dict,
            in-process: events/s = events / (parse + analysis). Peak RSS is the child's
            whole-process high-water mark (interpreter and imports included) plus the high-water
            mark of the worker process that parses half of a large file (`analysis/trace/parallel.py`):
            an upper bound of the two together (pages they share are counted twice). "above
            start" subtracts the RSS the child had before parsing.
  CLI       `attnprof analyze TRACE --format json`, wall time end to end (start-up included).
  bare      the reference: `python -c` that reads the file and decodes it with msgspec into a
            minimal struct (ph, cat, name, ts, dur, tid, args.correlation), and nothing else;
            wall time end to end, like the CLI. ratio = CLI s / bare s.
  HTA       Holistic Trace Analysis (`pip install -e '.[bench]'`): TraceAnalysis(trace_dir) then
            get_gpu_kernel_breakdown(), on the same plain-JSON trace, killed after --hta-timeout.
            HTA parses at a few thousand events/s, so by default it runs at the sizes in
            --hta-sizes only; a size it does not finish is reported as a lower bound.

`--stages-size 1M` times the stages of the analysis (CPU seconds: imports, parse in this process
and in the worker, find_forwards, forward_metrics, kernel_stats, findings, gc) in one more child.
CLI and bare runs alternate, `--repeats` times each (the machine is shared: the minimum is kept,
all runs are in the JSON; with `--before-src DIR` that tree's CLI runs alternate with them too).
Targets: CLI within 1.5x of the bare decode; peak memory under 1x
the trace's uncompressed size. `--src DIR` measures another checkout's `src` (say, the commit
before a change). With --cprofile-size, one more attnprof child runs under cProfile and its top
functions go into the JSON: where the time goes.

Usage (from the repo root; several minutes, mostly HTA):
    python3 benchmarks/analysis_scale.py
    python3 benchmarks/analysis_scale.py --sizes 1M,5M --formats json --hta-sizes '' --cprofile-size ''
Prints a markdown table last and writes the JSON to --out, by default attnprof-out/analysis_scale.json
under the current directory (attnprof's own output folder, which git ignores).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TARGET_RATIO = 1.5  # CLI wall time / bare msgspec decode wall time
TARGET_MEMORY_RATIO = 1.0  # peak RSS / uncompressed trace bytes
DEFAULT_OUT = Path("attnprof-out") / "analysis_scale.json"  # where attnprof writes its own runs; ignored by git
SRC = REPO / "src"  # the attnprof source measured (--src)
WARM_TRACE = REPO / "tests" / "data" / "synthetic" / "real_h200" / "sdpa_flash.json.gz"  # fills the bytecode cache


def parse_size(text: str) -> int:
    """`100k`, `1M`, `5M` or a plain number of events."""
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * scale)


def label(n: int) -> str:
    """100k, 1M, 5M."""
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


PYCACHE: Path | None = None  # the children's bytecode cache, where this environment writes none (main)


def _python_env(src_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    src = str(src_dir or SRC)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if PYCACHE is not None:
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def bytecode_cache(workdir: Path, trees: list[Path]) -> None:
    """Where this environment writes no bytecode (PYTHONDONTWRITEBYTECODE, as in our sandbox), every
    child would compile attnprof's modules from source on each run (about 45 ms of the CLI's start-up
    here), which an installed attnprof never does: pip writes its bytecode, and an editable install
    writes it on first import. Then the children get a cache in the workdir (PYTHONPYCACHEPREFIX,
    which holds the standard library's and site-packages' bytecode too), filled before any timed run
    by one CLI run and one bare decode of a small trace per tree. `PYCACHE` says which (None: the
    environment keeps bytecode as usual)."""
    if not (sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    global PYCACHE
    PYCACHE = workdir / "pycache"
    for tree in trees:
        subprocess.run([sys.executable, "-m", "attnprof", "analyze", str(WARM_TRACE), "--format", "json"],
                       env=_python_env(tree), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-c", BARE_DECODE, str(WARM_TRACE)], env=_python_env(), check=True,
                   stdout=subprocess.DEVNULL)


def _peak_rss_bytes(who: str = "self") -> int:
    import resource

    kib = resource.getrusage(resource.RUSAGE_CHILDREN if who == "children" else resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024 if sys.platform != "darwin" else kib  # KiB on Linux


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- children

def _json_text(analysis: Any) -> str:
    """The analysis' JSON as `attnprof analyze --format json` writes it (a tree from before the schema's
    records has `to_dict`)."""
    if hasattr(analysis, "to_dict"):
        return json.dumps(analysis.to_dict(), indent=2)
    from attnprof.results.files import to_json
    from attnprof.results.records import analysis_record

    return to_json(analysis_record(analysis))


def child_attnprof(path: str, cprofile: bool, one_process: bool = False) -> dict[str, Any]:
    """Parse and analyse one trace; clocks, counts and peak RSS (this process and its worker)."""
    from attnprof.analysis import analyze_trace, load_trace

    if one_process:
        from attnprof.analysis.trace import parallel

        parallel.PARALLEL_MIN_BYTES = 1 << 62
    start_rss = _current_rss_bytes()
    profiler = None
    if cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    trace = load_trace(path)
    t1 = time.perf_counter()
    analysis = analyze_trace(trace, region="attnprof")
    document = _json_text(analysis)
    t2 = time.perf_counter()
    out: dict[str, Any] = {
        "events": trace.event_count, "forwards": analysis.forwards, "kernels": len(trace.device),
        "parse_s": t1 - t0, "analysis_s": t2 - t1, "total_s": t2 - t0, "start_rss_bytes": start_rss,
        "main_peak_rss_bytes": _peak_rss_bytes(), "worker_peak_rss_bytes": _peak_rss_bytes("children"),
        "json_bytes": len(document),
    }
    out["peak_rss_bytes"] = out["main_peak_rss_bytes"] + out["worker_peak_rss_bytes"]
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        for key in ("tottime", "cumulative"):
            stream = io.StringIO()
            pstats.Stats(profiler, stream=stream).sort_stats(key).print_stats(18)
            out[f"cprofile_{key}"] = [ln for ln in stream.getvalue().splitlines() if ln.strip()]
    return out


def child_stages(path: str) -> dict[str, Any]:
    """CPU seconds of each stage of the analysis, in one process that imports what the CLI imports."""
    import gc
    import resource

    started = time.process_time()
    import attnprof.cli.app  # noqa: F401 - what `attnprof analyze` has imported when it parses
    from attnprof.analysis import analyze

    spent: dict[str, float] = {"import attnprof.cli.app": time.process_time() - started, "gc (inside the stages)": 0.0}

    def timed(function: Any, stage: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[stage] = spent.get(stage, 0.0) + time.process_time() - t0
        return run

    for name, stage in (("load_trace", "parse (this process)"), ("find_forwards", "find_forwards"),
                        ("forward_metrics", "forward_metrics"), ("kernel_stats", "kernel_stats"),
                        ("build_findings", "findings")):
        setattr(analyze, name, timed(getattr(analyze, name), stage))
    gc_started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started.append(time.process_time())
        elif gc_started:
            spent["gc (inside the stages)"] += time.process_time() - gc_started.pop()

    gc.callbacks.append(on_gc)
    t0, w0 = time.process_time(), time.perf_counter()
    with analyze.gc_paused():  # as `attnprof analyze` does: the collector stays off until the JSON is written
        document = _json_text(analyze.analyze_trace(path, region="attnprof"))
    spent["analyze_trace + to_dict + json, CPU"] = time.process_time() - t0
    spent["analyze_trace + to_dict + json, wall"] = time.perf_counter() - w0
    worker = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent["parse (worker process)"] = worker.ru_utime + worker.ru_stime
    spent["json_bytes"] = len(document)
    return spent


# The reference: read the file and decode it into a minimal struct, nothing else (run by `python -c`).
BARE_DECODE = """
import gzip, sys, time, msgspec
t0 = time.perf_counter()
class Args(msgspec.Struct):
    correlation: int = -1
class Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    tid: int | str = 0
    args: Args | None = None
class Trace(msgspec.Struct):
    traceEvents: list[Event]
with open(sys.argv[1], "rb") as fh:
    data = fh.read()
if data[:2] == b"\\x1f\\x8b":
    data = gzip.decompress(data)
t1 = time.perf_counter()
events = msgspec.json.decode(data, type=Trace).traceEvents
t2 = time.perf_counter()
print(len(events), t1 - t0, t2 - t1)
"""


def bare_decode(path: Path) -> dict[str, Any] | None:
    """Wall time (and peak RSS) of the reference decode in a fresh process; None if it failed."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", BARE_DECODE, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0 or not out.strip():
        return None
    events, read_s, decode_s = out.split()
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "events": int(events), "read_s": float(read_s),
            "decode_s": float(decode_s), "peak_rss_bytes": usage.ru_maxrss * 1024}


def child_hta(trace_dir: str) -> dict[str, Any]:
    """HTA's kernel breakdown: parse time (TraceAnalysis) and breakdown time, peak RSS."""
    import contextlib
    import io

    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t1 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        analyzer = TraceAnalysis(trace_dir=trace_dir)
        t2 = time.perf_counter()
        kernel_types, kernels = analyzer.get_gpu_kernel_breakdown(visualize=False)
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "parse_s": t2 - t1, "breakdown_s": t3 - t2, "total_s": t3 - t1,
            "kernel_rows": int(len(kernels)), "peak_rss_bytes": _peak_rss_bytes()}


def run_child(args: list[str], timeout: float | None) -> dict[str, Any]:
    """Run this file as a child with `args`; its JSON result, or {"error": ...}."""
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                             timeout=timeout, env=_python_env(), check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "timed_out": True}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {out.returncode}: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- parent

def make_traces(n: int, workdir: Path, formats: list[str], reuse: bool) -> dict[str, Any]:
    """Write the `n`-event trace as JSON (and gzip); reuse files from an earlier run when asked."""
    sys.path.insert(0, str(HERE))
    import scaletrace

    plain = workdir / f"scale_{label(n)}.json"
    meta_path = workdir / f"scale_{label(n)}.meta.json"
    if reuse and plain.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
    else:
        started = time.perf_counter()
        meta = scaletrace.write_trace(plain, n)
        meta["generate_s"] = time.perf_counter() - started
        meta_path.write_text(json.dumps(meta))
    paths = {"json": plain}
    if "gz" in formats:
        packed = workdir / f"scale_{label(n)}.json.gz"
        if not (reuse and packed.exists()):
            with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        paths["gz"] = packed
    meta["paths"] = {k: str(v) for k, v in paths.items()}
    meta["file_bytes"] = {k: v.stat().st_size for k, v in paths.items()}
    return meta


def cli_run(path: Path, src: Path | None = None) -> dict[str, Any] | None:
    """Wall time of `attnprof analyze PATH --format json`, end to end, its CPU time (with the
    worker's) and the peak RSS of the largest process of its tree (the kernel's figure for a
    waited-for child); None if it failed."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "attnprof", "analyze", str(path), "--format", "json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_python_env(src))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        return None
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024}


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def _ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    return "n/a" if not a or not b else f"{a / b:.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One row per size and format."""
    head = ("| trace | events | MiB (uncompressed) | parse s | analysis s | total s | events/s | parse s, 1 process | "
            "CLI s | bare decode s | CLI / bare | before: CLI s | before / bare | peak RSS MiB (main + worker) | "
            "x uncompressed | CLI peak MiB | HTA s | HTA / attnprof |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        a = r["attnprof"]
        if "error" in a:
            head_cells = f"| {r['name']} | {r['events']:,} | {_mib(r['uncompressed_bytes'])} | {a['error']} |"
            lines.append(head_cells + " |" * 14)
            continue
        hta = r.get("hta") or {}
        if not hta:
            hta_s, ratio = "not run", ""
        elif "error" in hta:
            hta_s = f"> {hta['timeout_s']:g} (killed)" if hta.get("timed_out") else hta["error"]
            ratio = f"> {hta['timeout_s'] / a['total_s']:.0f}x" if hta.get("timed_out") else ""
        else:
            hta_s, ratio = f"{hta['total_s']:.1f}", f"{hta['total_s'] / a['total_s']:.0f}x"
        one = r.get("one_process") or {}
        cli, bare, before = r.get("cli") or {}, r.get("bare") or {}, r.get("cli_before") or {}
        lines.append(
            f"| {r['name']} | {r['events']:,} | {_mib(r['uncompressed_bytes'])} | {a['parse_s']:.2f} | "
            f"{a['analysis_s']:.2f} | {a['total_s']:.2f} | {a['events_per_s']:,.0f} | "
            f"{format(one['parse_s'], '.2f') if 'parse_s' in one else 'n/a'} | "
            f"{format(cli['wall_s'], '.2f') if cli else 'n/a'} | {format(bare['wall_s'], '.2f') if bare else 'n/a'} | "
            f"{_ratio(cli.get('wall_s'), bare.get('wall_s'))} | "
            f"{format(before['wall_s'], '.2f') if before else 'n/a'} | "
            f"{_ratio(before.get('wall_s'), bare.get('wall_s'))} | "
            f"{_mib(a['peak_rss_bytes'])} | "
            f"{a['peak_rss_bytes'] / r['uncompressed_bytes']:.2f} | {_mib(cli.get('peak_rss_bytes'))} | "
            f"{hta_s} | {ratio} |")
    return "\n".join(lines)


def _best(runs: list[dict[str, Any] | None], key: str) -> dict[str, Any] | None:
    """The run with the smallest `key`, with every run's `key` under `all_<key>`; None if all failed."""
    ok = [r for r in runs if r]
    if not ok:
        return None
    best = dict(min(ok, key=lambda r: r[key]))
    best[f"all_{key}"] = [round(r[key], 3) for r in ok]
    return best


def measure(path: Path, meta: dict[str, Any], repeats: int, one_process: bool, before: Path | None) -> dict[str, Any]:
    """attnprof in-process (best of `repeats`), then the CLI, the `before` tree's CLI (if given) and
    the bare decode, alternating, `repeats` times each."""
    runs = [run_child(["--child-attnprof", str(path)], None) for _ in range(repeats)]
    ok = [r for r in runs if "error" not in r]
    best = min(ok, key=lambda r: r["total_s"]) if ok else runs[0]
    if ok:
        best["events_per_s"] = best["events"] / best["total_s"]
        best["parse_events_per_s"] = best["events"] / best["parse_s"]
        best["all_total_s"] = [round(r["total_s"], 3) for r in ok]
    row: dict[str, Any] = {"attnprof": best}
    if one_process:
        row["one_process"] = run_child(["--child-attnprof", str(path), "--child-one-process"], None)
    cli_runs, before_runs, bare_runs = [], [], []
    for _ in range(repeats):
        cli_runs.append(cli_run(path))
        if before is not None:
            before_runs.append(cli_run(path, before))
        bare_runs.append(bare_decode(path))
    row["cli"], row["bare"] = _best(cli_runs, "wall_s"), _best(bare_runs, "wall_s")
    if before is not None:
        row["cli_before"] = _best(before_runs, "wall_s")
    if row["cli"] and row["bare"]:
        row["cli_over_bare"] = row["cli"]["wall_s"] / row["bare"]["wall_s"]
        row["cli_events_per_s"] = meta["events"] / row["cli"]["wall_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    """Generate, measure, report. 0 when it ran."""
    global SRC
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output path (default: {DEFAULT_OUT})")
    parser.add_argument("--sizes", default="100k,1M,5M", help="comma-separated event counts")
    parser.add_argument("--formats", default="json,gz", help="json and/or gz")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind per trace up to 1M events (min kept)")
    parser.add_argument("--large-repeats", type=int, default=1, help="runs of each kind per larger trace")
    parser.add_argument("--one-process", action="store_true", help="also parse in-process without the worker process")
    parser.add_argument("--src", type=Path, default=SRC, help="the attnprof source tree to measure (default: this one)")
    parser.add_argument("--before-src", type=Path, default=None,
                        help="another tree (say, before a change) whose CLI runs alternate with this one's")
    parser.add_argument("--hta-sizes", default="100k,1M", help="sizes HTA runs at ('' for none)")
    parser.add_argument("--hta-timeout", type=float, default=300.0, help="seconds before an HTA child is killed")
    parser.add_argument("--cprofile-size", default="1M", help="size profiled with cProfile ('' for none)")
    parser.add_argument("--workdir", type=Path, default=None, help="where traces go (default: a temp dir, removed)")
    parser.add_argument("--reuse", action="store_true", help="reuse traces already in --workdir")
    parser.add_argument("--child-attnprof", help=argparse.SUPPRESS)
    parser.add_argument("--child-cprofile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-one-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stages-size", default="", help="size whose analysis stages are timed ('' for none)")
    parser.add_argument("--child-stages", help=argparse.SUPPRESS)
    parser.add_argument("--child-hta", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    SRC = args.src.resolve()

    if args.child_attnprof:
        print(json.dumps(child_attnprof(args.child_attnprof, args.child_cprofile, args.child_one_process)))
        return 0
    if args.child_hta:
        print(json.dumps(child_hta(args.child_hta)))
        return 0
    if args.child_stages:
        print(json.dumps(child_stages(args.child_stages)))
        return 0

    started = time.perf_counter()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    hta_sizes = {parse_size(s) for s in args.hta_sizes.split(",") if s.strip()}
    cprofile_size = parse_size(args.cprofile_size) if args.cprofile_size.strip() else None
    stages_size = parse_size(args.stages_size) if args.stages_size.strip() else None
    stages: dict[str, Any] = {}
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="attnprof-scale-")
        workdir = Path(tmp.name)
    else:
        workdir = args.workdir
        workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    bytecode_cache(workdir, [SRC] + ([args.before_src] if args.before_src else []))
    try:
        for n in sizes:
            meta = make_traces(n, workdir, formats, args.reuse)
            print(f"analysis_scale.py: {label(n)}: {meta['events']:,} events, "
                  f"{meta['bytes_uncompressed'] / 2**20:,.0f} MiB", file=sys.stderr)
            for fmt in formats:
                path = Path(meta["paths"][fmt])
                repeats = args.repeats if meta["events"] <= 1_500_000 else args.large_repeats
                row = {"name": f"{label(n)} .{fmt.replace('gz', 'json.gz')}", "size": label(n), "format": fmt,
                       "events": meta["events"], "forwards": meta["forwards"],
                       "uncompressed_bytes": meta["bytes_uncompressed"], "file_bytes": meta["file_bytes"][fmt],
                       **measure(path, meta, repeats, args.one_process, args.before_src)}
                if fmt == "json" and n in hta_sizes:
                    hta_dir = workdir / f"hta_{label(n)}"
                    hta_dir.mkdir(exist_ok=True)
                    link = hta_dir / "rank0.json"
                    if not link.exists():
                        link.symlink_to(path.resolve())
                    print(f"analysis_scale.py: HTA at {label(n)} (up to {args.hta_timeout:g} s)", file=sys.stderr)
                    row["hta"] = run_child(["--child-hta", str(hta_dir)], args.hta_timeout)
                    row["hta"]["timeout_s"] = args.hta_timeout
                rows.append(row)
            if cprofile_size == n:
                profiles[label(n)] = run_child(["--child-attnprof", meta["paths"]["json"], "--child-cprofile"], None)
            if stages_size == n:
                stages[label(n)] = run_child(["--child-stages", meta["paths"]["json"]], None)
    finally:
        if tmp is not None:
            tmp.cleanup()
    document = {
        "benchmark": "analysis_scale", "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "src": str(SRC),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()},
        "targets": {"cli_over_bare_decode": TARGET_RATIO, "peak_memory_x_uncompressed": TARGET_MEMORY_RATIO},
        "rows": rows, "cprofile": profiles, "stages": stages, "wall_s": time.perf_counter() - started,
        "bytecode_cache": None if PYCACHE is None else "PYTHONDONTWRITEBYTECODE was set: children used a "
        "bytecode cache compiled first (PYTHONPYCACHEPREFIX), as an installed attnprof has",
    }
    args.out.write_text(json.dumps(document, indent=2))
    print(f"\nattnprof analysis at scale ({SRC}); targets: CLI <= {TARGET_RATIO:g}x the bare msgspec decode, "
          f"peak RSS < {TARGET_MEMORY_RATIO:g}x the uncompressed trace; whole run {document['wall_s']:.0f} s; "
          f"JSON: {args.out}\n")
    print(markdown(rows))
    for size, spent in stages.items():
        print(f"\nstages at {size} (CPU s):\n" + "\n".join(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}"
                                                        for k, v in spent.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
