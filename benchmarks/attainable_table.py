"""Write attnprof's attainable-reference table: the best variant's kernel TFLOP/s and GB/s at each shape.

For each shape of a grid (short sequences as a ViT or BERT has them, 197 and 512 tokens at batch x heads 12
and 384, no mask; long ones, 2k and 8k, no mask and causal; decode, one query against 4k and 32k keys; head
dims 64 and 128: 20 shapes in the forward, 16 in the backward) it runs attnprof's own compare pipeline
(`pipeline.engine.run_job`, what `attnprof compare` runs) over every installed fused variant (sdpa-cudnn,
sdpa-flash, sdpa-efficient, flex, and triton-flash and flash-attn where their plugins are installed), one job
per shape, and keeps per key (phase, q_len, kv_len, head dim, mask kind, dtype, batch x heads) the row with the
highest kernel TFLOP/s: the attention calls' FLOPs over their device time in the trace (`kernel_tflops`), and
its `kernel_gbps`. On a CPU, whose trace has no device time, the figures are by latency (`tflops`,
`achieved_gbps`) and the entry says so (`basis`).
The header names the GPU, its compute capability, its measured ceilings (the run's matmul ceiling in the
dtype and its read bandwidth), torch and cuDNN, the date, the attnprof commit and how long the grid took.

Usage (on the H200, from the repo root; each call within the device's 10-minute cap):
    python3 benchmarks/attainable_table.py --phase fwd --out src/attnprof/data/attainable-h200.json
    python3 benchmarks/attainable_table.py --phase bwd --merge --out src/attnprof/data/attainable-h200.json
`--quick` runs three shapes (a minute or so); `--device cpu` a tiny fp32 grid (what the CPU test runs).

Without a GPU at hand, `--from DIR_OR_FILE...` builds the table from the results files (results.json) and
traces attnprof already wrote on that GPU:
    python3 benchmarks/attainable_table.py --out TABLE.json --from tests/data/h200
Each ok row of a fused variant gives its kernel figures. Each trace is analysed as `attnprof analyze` does it;
each forward attention call with recorded shapes gives its key and its rates over its device time. The fastest
per key is kept. The header takes the GPU,
torch, cuDNN, the measured ceilings and the date from the latest results file with both ceilings, and says in
`note` what it was built from.
`--runs-dir DIR` keeps each shape's compare output (results.json and traces) in its own folder under DIR, so the
grid's results can be checked in and the table rebuilt from them with `--from`.
`--add TABLE...` adds tables that grid runs wrote elsewhere (the GPU machine) to `--out`'s, or to what `--from`
builds; where two entries share a shape, the faster is kept. The shipped H200 table is built so, from checked-in
files only (tests/data/h200-grid holds the grid runs' tables):
    python3 benchmarks/attainable_table.py --out src/attnprof/data/attainable-h200.json --from tests/data/h200 \
        --add tests/data/h200-grid/attainable-bwd.json tests/data/h200-grid/attainable-fwd.json
`--max-seconds` stops starting new shapes once the grid has run that long (the header says so).
Progress goes to stderr, one line per cell.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The fused variants compared on a GPU (those not installed here are left out).
GPU_VARIANTS = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex", "triton-flash", "flash-attn")
CPU_VARIANTS = ("sdpa-math", "sdpa-flash", "naive")
PHASES = ("fwd", "bwd")


@dataclass(frozen=True)
class GridShape:
    """One shape of the grid: batch, query heads, queries, keys, head dim, mask ("none" or "causal")."""

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    mask: str

    def config_shape(self) -> dict[str, Any]:
        """The shape as a config's `shapes` entry."""
        shape: dict[str, Any] = {"batch": self.batch, "heads": self.heads, "head_dim": self.head_dim}
        shape |= {"seq": self.kv_len, "mask": self.mask}
        if self.q_len != self.kv_len:
            shape["q_len"] = self.q_len
        return shape

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.heads}x{self.q_len}/{self.kv_len}x{self.head_dim} {self.mask}"


def grid(device: str, quick: bool, phase: str) -> list[GridShape]:
    """The shapes to measure (see the module docstring); decode (one query) only in the forward."""
    if device == "cpu":
        return [GridShape(1, 2, 32, 32, 16, "none"), GridShape(1, 2, 1, 64, 16, "none")]
    if quick:
        shapes = [GridShape(32, 12, 256, 256, 64, "none"), GridShape(2, 16, 4096, 4096, 128, "causal")]
        return shapes + ([GridShape(8, 32, 1, 8192, 128, "none")] if phase == "fwd" else [])
    shapes = []
    for head_dim in (64, 128):
        for seq in (197, 512):  # encoders (ViT, BERT): no mask, batch x heads 12 and 384
            shapes += [GridShape(1, 12, seq, seq, head_dim, "none"), GridShape(32, 12, seq, seq, head_dim, "none")]
        for mask in ("none", "causal"):
            shapes += [GridShape(4, 16, 2048, 2048, head_dim, mask), GridShape(1, 16, 8192, 8192, head_dim, mask)]
        if phase == "fwd":
            shapes += [GridShape(8, 32, 1, kv, head_dim, "none") for kv in (4096, 32768)]
    return shapes


class Progress:
    """A `pipeline.engine.Watcher` that prints one line per cell on stderr."""

    def __init__(self, shape_index: int, shapes: int, started: float) -> None:
        self.shape_index, self.shapes, self.started = shape_index, shapes, started

    def ceiling(self, ceiling: Any) -> None:
        pass

    def ceiling_replaced(self, ceiling: Any, beaten: list[str]) -> None:
        pass

    @contextmanager
    def cells(self, total: int, time_left: Any) -> Any:
        yield self

    def on_start(self, index: int, total: int, variant: Any, spec: Any) -> None:
        elapsed = time.perf_counter() - self.started
        print(
            f"[shape {self.shape_index}/{self.shapes}, cell {index + 1}/{total}, {elapsed:.0f} s] "
            f"{variant.name} @ {spec.cell_label}",
            file=sys.stderr,
            flush=True,
        )

    def on_done(self, result: Any) -> None:
        if not result.ok:
            print(f"    {result.variant}: {result.status}: {result.reason}", file=sys.stderr, flush=True)

    def on_counters(self, index: int, total: int, variant: Any, spec: Any) -> None:
        pass


def best_entry(rows: list[Any], phase: str, dtype: str) -> Any:
    """The table entry of one shape's rows: the ok row with the highest kernel TFLOP/s (by latency where no
    row has a kernel figure); None when none ran ok."""
    from attnprof.analysis.attainable import TableEntry, canonical_mask

    ok = [r for r in rows if r.ok and (r.kernel_tflops or r.tflops)]
    if not ok:
        return None
    by_kernel = any(r.kernel_tflops for r in ok)
    if by_kernel:
        ok = [r for r in ok if r.kernel_tflops]
    best = max(ok, key=lambda r: (r.kernel_tflops if by_kernel else r.tflops) or 0.0)
    return TableEntry(
        phase=phase,
        q_len=best.q_len or best.seq,
        kv_len=best.kv_len or best.seq,
        head_dim=best.head_dim,
        mask=canonical_mask(best.mask, best.causal),
        dtype=dtype,
        batch_heads=best.batch * best.heads,
        variant=best.variant,
        tflops=best.kernel_tflops if by_kernel else best.tflops,
        gbps=best.kernel_gbps if by_kernel else best.achieved_gbps,
        latency_us=best.latency_us,
        basis="kernel" if by_kernel else "latency",
        variants=len(ok),
    )


def _commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _gpu(device: str) -> tuple[str, str | None, str | None]:
    """(GPU name, compute capability, cuDNN version) of `device`; ("cpu", None, None) on a CPU."""
    import torch

    if not device.startswith("cuda"):
        return "cpu", None, None
    major, minor = torch.cuda.get_device_capability(device)
    cudnn = torch.backends.cudnn.version()
    return torch.cuda.get_device_name(device), f"{major}.{minor}", str(cudnn) if cudnn else None


def measure(args: argparse.Namespace) -> Any:
    """Run the grid and return the table (`analysis.attainable.AttainableTable`)."""
    import torch

    from attnprof.analysis.attainable import AttainableTable, TableHeader, load_table
    from attnprof.config import Config, MeasureOptions, Schedule
    from attnprof.pipeline import plan_cells
    from attnprof.pipeline.engine import Job, run_job, start_on_device
    from attnprof.plugins import load_variants

    registry = load_variants().registry
    wanted = args.variants.split(",") if args.variants else GPU_VARIANTS if args.device != "cpu" else CPU_VARIANTS
    names = [n for n in wanted if n in registry and not registry.get(n).not_installed]
    if not names:
        raise SystemExit(f"none of the variants {', '.join(wanted)} is installed here")
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    phases = PHASES if args.phase == "all" else (args.phase,)
    measure_options = MeasureOptions(min_time_s=args.min_time)
    started = time.perf_counter()
    entries, ceiling, stopped, device = [], None, None, args.device
    plan = [(phase, shape) for phase in phases for shape in grid(args.device, args.quick, phase)]
    with tempfile.TemporaryDirectory(prefix="attainable-") as scratch:
        runs = args.runs_dir or Path(scratch)
        for index, (phase, shape) in enumerate(plan, 1):
            if args.max_seconds and time.perf_counter() - started > args.max_seconds:
                stopped = (
                    f"stopped after {args.max_seconds:.0f} s: {len(plan) - index + 1} of {len(plan)} shapes not run"
                )
                print(stopped, file=sys.stderr)
                break
            config = Config(
                device=args.device,
                dtype=dtype,
                shapes=[shape.config_shape()],
                modes=[phase],
                variants=names,
                schedule=Schedule(wait=0, warmup=1, active=2),
                output_dir=runs / f"{phase}-{shape.label.replace(' ', '-').replace('/', '_')}",
            )
            config, device = start_on_device(config)
            usable = [registry.get(n) for n in names]
            cells = plan_cells(config, usable, device)
            outcome, _ = run_job(
                Job("compare", config, device, measure_options, cells), Progress(index, len(plan), started)
            )
            if outcome is None:
                continue
            ceiling = outcome.document.ceiling or ceiling
            entry = best_entry(outcome.document.results, phase, dtype)
            if entry is not None:
                entries.append(entry)
                rate = f"{entry.tflops:.3g} TFLOP/s, {entry.gbps or 0.0:.4g} GB/s ({entry.basis})"
                print(f"  best at {phase} {shape.label}: {entry.variant}, {rate}", file=sys.stderr, flush=True)
    if args.merge and args.out.exists():
        kept = [e for e in load_table(args.out).entries if e.phase not in phases]
        entries = kept + entries
    gpu, sm, cudnn = _gpu(device)
    header = TableHeader(
        gpu=gpu,
        sm=sm,
        matmul_tflops=(ceiling or {}).get("tflops"),
        read_gbps=(ceiling or {}).get("read_gbps"),
        torch=str(torch.__version__),
        cudnn=cudnn,
        date=time.strftime("%Y-%m-%d"),
        commit=_commit(),
        seconds=round(time.perf_counter() - started, 1),
        note=stopped,
    )
    return AttainableTable(header=header, entries=entries)


#: Backends of a trace's call that are not a fused kernel a user could pick as the best at a shape.
UNFUSED_BACKENDS = ("math", "eager", "unfused")


@dataclass
class Best:
    """The fastest fused implementation seen at one key: kernel TFLOP/s and GB/s, who, its time, and how many
    distinct implementations were seen there."""

    tflops: float
    gbps: float | None
    who: str
    time_us: float
    seen: set[str]

    def offer(self, tflops: float, gbps: float | None, who: str, time_us: float) -> None:
        self.seen.add(who)
        if tflops > self.tflops:
            self.tflops, self.gbps, self.who, self.time_us = tflops, gbps, who, time_us


def _offer(best: dict[Any, Best], key: Any, tflops: float, gbps: float | None, who: str, time_us: float) -> None:
    if key not in best:
        best[key] = Best(tflops, gbps, who, time_us, {who})
    else:
        best[key].offer(tflops, gbps, who, time_us)


def _from_trace(path: Path, best: dict[Any, Best]) -> bool:
    """Offer each fused forward call with recorded shapes in the trace at `path`; False when it has none."""
    from attnprof.analysis import analyze_trace
    from attnprof.analysis.findings.attainable import call_key
    from attnprof.errors import AttnprofError

    try:
        analysis = analyze_trace(path)
    except AttnprofError as error:
        print(f"  {path}: left out: {error}", file=sys.stderr)
        return False
    ledger, used = analysis.attention, False
    if ledger is None or ledger.time_base != "device":
        return False
    for call in ledger.forward_calls:
        key = call_key(call, analysis.input_dtype)
        if key is None or call.traffic is None or not call.time_us or call.backend in UNFUSED_BACKENDS:
            continue
        tflops, gbps = call.traffic.flops / call.time_us / 1e6, call.traffic.bytes / call.time_us / 1e3
        _offer(best, key, tflops, gbps, call.attention_impl() or call.backend, call.time_us)
        used = True
    return used


def _from_results(rows: list[Any], best: dict[Any, Best]) -> bool:
    """Offer each ok row of a fused variant timed on a GPU with its kernel time: its kernel figures, or, for
    a row written before they were fields, its latency figures scaled by latency over kernel time."""
    from attnprof.pipeline.best_known import row_key

    used = False
    for row in rows:
        if not row.ok or row.variant not in (*GPU_VARIANTS, "sdpa") or not row.kernel_time_us or not row.latency_us:
            continue
        key, scale = row_key(row), row.latency_us / row.kernel_time_us
        tflops = row.kernel_tflops or (row.tflops * scale if row.tflops else None)
        gbps = row.kernel_gbps or (row.achieved_gbps * scale if row.achieved_gbps else None)
        if key is None or not tflops:
            continue
        _offer(best, key, tflops, gbps, row.variant, row.kernel_time_us)
        used = True
    return used


def from_runs(paths: list[Path]) -> Any:
    """The table of what attnprof already measured on one GPU: results files (`results.json`) and traces
    (`.json.gz`, folders searched) under `paths`; the header (GPU, versions, ceilings, date) from the latest
    results file with both measured ceilings."""
    from attnprof.analysis.attainable import AttainableTable, TableEntry, TableHeader
    from attnprof.results.files import load_results

    files: list[Path] = []
    for path in paths:
        files += sorted(p for p in path.rglob("*.json*") if p.is_file()) if path.is_dir() else [path]
    best: dict[Any, Best] = {}
    runs, traces, loaded = 0, 0, []
    for path in files:
        if path.name.endswith(".json.gz"):
            traces += _from_trace(path, best)
        elif path.suffix == ".json":
            loaded.append(load_results(path))
            runs += _from_results(loaded[-1].rows, best)
    if not loaded:
        raise SystemExit("--from needs at least one results.json of the GPU (its name, versions and ceilings)")
    measured = [r for r in loaded if any(row.peak_tflops and row.peak_read_gbps for row in r.rows)]
    header_from = max(measured or loaded, key=lambda r: r.header.created or "")
    entries = [
        TableEntry.at(
            key,
            found.who,
            tflops=round(found.tflops, 2),
            gbps=round(found.gbps, 1) if found.gbps else None,
            latency_us=round(found.time_us, 3),
            basis="kernel",
            variants=len(found.seen),
        )
        for key, found in sorted(best.items(), key=lambda item: item[0].text)
    ]
    env = header_from.environment or {}
    ceilings = next((r for r in header_from.rows if r.peak_tflops and r.peak_read_gbps), None)
    cudnn = env.get("cudnn")
    header = TableHeader(
        gpu=env.get("gpu_name") or "unknown",
        sm=env.get("compute_capability"),
        matmul_tflops=ceilings.peak_tflops if ceilings else None,
        read_gbps=ceilings.peak_read_gbps if ceilings else None,
        torch=env.get("torch"),
        cudnn=str(cudnn) if cudnn else None,
        date=str(header_from.header.created or "")[:10],
        commit=_commit(),
        note=f"built from {runs} results file(s) and {traces} trace(s) attnprof wrote on this GPU "
        f"({', '.join(str(p) for p in paths)}), not a grid run: only the shapes they hold",
    )
    return AttainableTable(header=header, entries=entries)


def _described(table: Any) -> str:
    """Where a table's entries come from, in a few words: its note when it was built from runs, else its grid."""
    head = table.header
    phases = "/".join(dict.fromkeys(e.phase for e in table.entries))
    if head.note and head.note.startswith("built from"):
        return f"{len(table.entries)} shapes {head.note.removesuffix(', not a grid run: only the shapes they hold')}"
    took = f", {head.seconds:.0f} s" if head.seconds is not None else ""
    short = f"; {head.note}" if head.note else ""
    return f"{len(table.entries)} shapes from a {phases} grid run on {head.date} at {head.commit}{took}{short}"


def add_tables(base: Any, added: list[Any]) -> Any:
    """`base` with the entries of the `added` tables (grid runs written elsewhere, e.g. on the GPU machine),
    keeping the faster entry (kernel TFLOP/s) where two share a shape key. The header is the last added table's
    (its GPU, ceilings, versions, date and commit), without a time; its note says where each part came from."""
    import msgspec

    from attnprof.analysis.attainable import AttainableTable

    best: dict[Any, Any] = {}
    for entry in [e for table in (base, *added) for e in table.entries]:
        held = best.get(entry.key)
        if held is None or (entry.tflops or 0.0) >= (held.tflops or 0.0):
            best[entry.key] = entry
    merged = [e for table in (base, *added) for e in table.entries if best[e.key] is e]
    parts = [_described(t) for t in added] + ([_described(base)] if base.entries else [])
    note = "merged, the faster entry where two share a shape: " + "; ".join(parts) if added else base.header.note
    header = msgspec.structs.replace(added[-1].header if added else base.header, seconds=None, note=note)
    return AttainableTable(header=header, entries=merged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the table file to write")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a tiny fp32 grid)")
    parser.add_argument("--dtype", default=None, help="bf16 on a GPU, fp32 on a CPU (default)")
    parser.add_argument("--phase", choices=(*PHASES, "all"), default="fwd", help="fwd (default), bwd or all")
    parser.add_argument("--quick", action="store_true", help="three shapes, about a minute on an H200")
    parser.add_argument("--merge", action="store_true", help="keep --out's entries of the phases not run now")
    parser.add_argument("--variants", default=None, help="comma-separated variant names (default: the fused ones)")
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds of timed calls per cell (0.1)")
    parser.add_argument("--max-seconds", type=float, default=500.0, help="start no shape after this (500 s)")
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="keep each shape's compare output here (default: a temporary folder)",
    )
    parser.add_argument("--from", dest="runs", type=Path, nargs="+", default=None, help="build from these runs instead")
    parser.add_argument(
        "--add", type=Path, nargs="+", default=None, help="add these tables (grid runs) to --out's (or --from's)"
    )
    args = parser.parse_args(argv)
    import msgspec

    from attnprof.analysis.attainable import load_table

    if args.runs:
        table = from_runs(args.runs)
    elif args.add:
        table = load_table(args.out)
    else:
        table = measure(args)
    if args.add:
        table = add_tables(table, [load_table(path) for path in args.add])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(msgspec.json.format(msgspec.json.encode(table), indent=2) + b"\n")
    took = f", {table.header.seconds:.0f} s" if table.header.seconds is not None else ""
    print(f"wrote {args.out}: {len(table.entries)} entries{took}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
