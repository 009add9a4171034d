"""Build compare.json beside this file: the results document of the H200 compare of 2026-11-30
(`attnprof compare configs/h200.yaml` on 2026-11-30; its CSV is compare.csv beside this file).

Its measured fields (status, latency, throughput, memory, correctness, speed-ups) are that run's
compare.csv; its trace fields (kernels, memcpy, findings with their messages, ...)
are today's analysis of the same run's traces, checked in under tests/data/h200/<shape>/ (their GPU
times match the CSV's to the nanosecond). Fields the CSV predates (mode, clocks, gradients) are null
or their fwd-mode value. Run from the project root:  python tests/data/h200/results/build.py

Not a test: pytest does not collect it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from attnprof.report.serialize import CSV_FIELDS

from attnprof.analysis import analyze_trace, dispatched_backend
from attnprof.config import load_config

ROOT = Path(__file__).resolve().parents[4]
HERE = Path(__file__).resolve().parent
CSV = HERE / "compare.csv"
TRACES = HERE.parent
ANALYSIS_FIELDS = (
    "forwards",
    "kernels_per_forward",
    "memcpy_per_forward",
    "memset_per_forward",
    "gpu_time_us",
    "kernel_time_us",
    "cpu_time_us",
    "self_device_time_total_us",
    "transposes_per_forward",
    "cpu_ops_per_forward",
)
ENVIRONMENT = {
    "device": "cuda:0",
    "gpu_name": "NVIDIA H200",
    "compute_capability": "9.0",
    "torch": "2.11.0+cu130",
    "torch_cuda": "13.0",
    "cudnn": "91900",
    "triton": "3.6.0",
    "driver_version": "580.159.04",
}


def value(text: str):
    """A CSV cell as JSON: empty is null, then bool, int, float, else the text."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def entry(row: dict[str, str]) -> dict:
    measured = {name: value(text) for name, text in row.items() if name != "findings"}
    result = {name: measured.get(name) for name in CSV_FIELDS} | {"mode": "fwd", "trace": None}
    result["reason"] = measured.get("reason")
    trace = TRACES / row["shape"].replace("/", "-") / f"{row['variant']}.json.gz"
    result["finding_ids"], result["findings"] = "", []
    if result["status"] == "ok":
        analysis = analyze_trace(trace, dtype=row["dtype"])
        facts = analysis.to_dict()
        result |= {name: facts[name] for name in ANALYSIS_FIELDS}
        result["backend"] = dispatched_backend(analysis)
        result["finding_ids"] = " ".join(analysis.finding_ids)
        result["findings"] = facts["findings"]
        result["launch_apis"] = facts["launch_apis"]
        result["trace"] = str(trace.relative_to(ROOT))
    return result


def main() -> None:
    with CSV.open() as handle:
        rows = [entry(row) for row in csv.DictReader(handle)]
    config = load_config(ROOT / "configs" / "h200.yaml").model_dump(mode="json")
    document = {
        "attnprof_version": "0.1.0",
        "command": "compare",
        "created": "2026-11-30T12:00:00+0000",
        "interrupted": False,
        "files": None,
        "environment": ENVIRONMENT,
        "config": config,
        "ceiling": None,
        "results": rows,
    }
    (HERE / "compare.json").write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
