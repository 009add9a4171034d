"""CPU traces captured inside a test with torch.profiler, and their raw events read back apart from
attnprof's reader (to check its figures against)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REGION = "attention"


def capture_cpu(fn: Callable[[], object], path: Path, record_shapes: bool = True) -> Path:
    """`fn` under torch.no_grad() profiled on the CPU, each call in the region `REGION`, three active
    profiler steps after a wait and a warm-up step; the Chrome trace written to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    with torch.no_grad():
        fn()
        with profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=record_shapes,
            schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        ) as prof:
            for _ in range(5):
                with record_function(REGION):
                    fn()
                prof.step()
    prof.export_chrome_trace(str(path))
    return path


def raw_events(path: Path) -> list[dict[str, Any]]:
    """The complete ("X") events of a Chrome trace, gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def inside(outer: dict[str, Any], e: dict[str, Any]) -> bool:
    """True when event `e` lies within `outer`'s time span."""
    return outer["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= outer["ts"] + outer["dur"]


def regions(events: list[dict[str, Any]], name: str = REGION) -> list[dict[str, Any]]:
    """The record_function ranges called `name`."""
    return [e for e in events if e.get("cat") == "user_annotation" and e["name"] == name]
