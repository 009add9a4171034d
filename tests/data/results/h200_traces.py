"""Build `h200-traces.json`: a results document from the real H200 traces in tests/data/h200/<shape>/.

Each row is attnprof's analysis of one checked-in trace (kernels per forward, GPU and CPU time, the
top kernels with decoded names and occupancy, findings), written by the one serializer. Nothing
else was measured for these traces, so latency, TFLOP/s and peak memory are null; speed-ups rest on
the profiler's GPU time (the serializer's rule when there is no latency). `trace` is relative to
this folder. Run from the repository root:

    PYTHONPATH=src:plugins/attnprof-triton/src:plugins/attnprof-flash-attn/src python tests/data/results/h200_traces.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnprof.report.export import to_json
from attnprof.report.serialize import results_document

from attnprof.analysis import analyze_trace
from attnprof.config import Config
from attnprof.pipeline.measured import CellResult, attach_speedups
from attnprof.plugins import load_variants
from attnprof.registry import RunSpec

HERE = Path(__file__).parent
TRACES = HERE.parent / "h200"
SHAPES = ("8x16x1024x64", "4x32x8192x128-kv8")  # the blog shape and GQA at 8k
BASELINE = "sdpa-math"


def spec(folder: str) -> RunSpec:
    """The cell of a trace folder name: BxHxSxD, `-kvN` for GQA; bf16, causal, forward (as captured)."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?:-kv(\d+))?", folder)
    assert match, folder
    batch, heads, seq, head_dim, kv = match.groups()
    return RunSpec("cuda:0", "bf16", int(batch), int(heads), int(seq), int(head_dim), int(kv) if kv else None)


def main() -> None:
    registry = load_variants().registry
    results = []
    for folder in SHAPES:
        for trace in sorted((TRACES / folder).glob("*.json.gz")):
            name = trace.name.removesuffix(".json.gz")
            analysis = analyze_trace(trace, region="attnprof", dtype="bf16")
            results.append(
                CellResult(
                    name,
                    registry.get(name).source,
                    spec(folder),
                    analysis=analysis,
                    trace_path=Path("..", "h200", folder, trace.name),
                )
            )
    attach_speedups(results, BASELINE)
    device = results[0].analysis.device or {}
    environment = {
        "device": "cuda:0",
        "gpu_name": device.get("name"),
        "compute_capability": device.get("compute_capability"),
        "sm_count": device.get("num_sms"),
        "torch": "2.11.0+cu130",  # as captured (tests/test_h200_traces.py)
        "cudnn": "9.19",
        "triton": "3.6.0",
    }
    shapes = [
        {"batch": s.batch, "heads": s.heads, "seq": s.seq, "head_dim": s.head_dim, "kv_heads": s.kv_heads}
        for s in map(spec, SHAPES)
    ]
    config = Config(device="cuda", dtype="bf16", shapes=shapes, baseline=BASELINE)
    document = results_document("analyze", config, environment, None, results, interrupted=False)
    document["created"] = "2026-12-01T00:00:00+0000"  # the capture day; fixed so a rebuild gives the same file
    for entry in document["results"]:
        entry["phases_s"] = {}  # this build's own wall times, not the capture's
    compact = json.dumps(json.loads(to_json(document)), separators=(",", ":"))  # to_json's cleaning, no indent
    (HERE / "h200-traces.json").write_text(compact + "\n")


if __name__ == "__main__":
    main()
