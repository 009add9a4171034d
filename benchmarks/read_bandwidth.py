"""The read-bandwidth probe, candidate by candidate: what each read-only kernel reaches, and the ceiling.

Runs `profiling.read_probe.read_candidates` `--rounds` times (the first compiles the triton
configurations, unless triton's cache already holds them) and prints, per candidate, the GB/s of each
round and its % of the GPU's datasheet bandwidth; then the winner and its method as the ceiling cache
records it, the copy bandwidth (read + write, 1 GiB) and the seconds each round took, for
docs/validation.md. Nothing is cached.

Usage (from the repo root, attnprof installed, on the GPU machine):
    python3 benchmarks/read_bandwidth.py [--device cuda] [--rounds 2] [--out read_bandwidth.json]
Prints a markdown table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args()

    import torch

    from attnprof.analysis.hardware import datasheet
    from attnprof.profiling.ceiling import CPU_COPY_BYTES, GPU_COPY_BYTES, _copy_seconds
    from attnprof.profiling.environment import collect_environment
    from attnprof.profiling.read_probe import gbps_text, probe_read, read_candidates

    dev = torch.device(args.device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    sheet = datasheet(gpu)
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        started = time.perf_counter()
        found = read_candidates(args.device)
        rounds.append({"seconds": time.perf_counter() - started, "candidates": found})
        print(f"round {i + 1}: {rounds[-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
    started = time.perf_counter()
    probe = probe_read(args.device)
    probe_s = time.perf_counter() - started
    copy_bytes = GPU_COPY_BYTES if dev.type == "cuda" else CPU_COPY_BYTES
    copy_gbps = 2.0 * copy_bytes / _copy_seconds(copy_bytes, dev) / 1e9

    names = [c.name for c in rounds[0]["candidates"]]
    header = ["candidate", *(f"round {i + 1} GB/s" for i in range(len(rounds)))]
    if sheet:
        header.append(f"% of datasheet {sheet.bandwidth_gbps:g}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for j, name in enumerate(names):
        figures = [r["candidates"][j].gbps for r in rounds]
        cells = [
            gbps_text(g) if g is not None else f"dropped: {r['candidates'][j].problem}"
            for g, r in zip(figures, rounds, strict=True)
        ]
        known = [g for g in figures if g is not None]
        if sheet:
            cells.append(f"{100 * max(known) / sheet.bandwidth_gbps:.1f}" if known else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print(f"device: {gpu or args.device}; datasheet: {sheet.bandwidth_source if sheet else 'none'}")
    print(f"read ceiling: {gbps_text(probe.gbps)} GB/s ({probe_s:.2f} s for the probe once compiled)")
    print(f"method: {probe.method}")
    half = gbps_text(copy_gbps / 2)
    print(f"copy (read + write, {copy_bytes >> 20} MiB): {gbps_text(copy_gbps)} GB/s; its read half {half} GB/s")
    took = ", ".join(f"{r['seconds']:.2f} s" for r in rounds)
    print(f"rounds took: {took}\n")
    print("\n".join(lines))
    if args.out:
        doc = {
            "environment": collect_environment(args.device),
            "read_gbps": probe.gbps,
            "read_method": probe.method,
            "probe_seconds": probe_s,
            "copy_gbps": copy_gbps,
            "datasheet_gbps": sheet.bandwidth_gbps if sheet else None,
            "rounds": [{"seconds": r["seconds"], "candidates": [asdict(c) for c in r["candidates"]]} for r in rounds],
        }
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=2)


if __name__ == "__main__":
    main()
