"""One torch.profiler run of a forward: schedule, record_function region, Chrome trace export."""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from attnprof.config import Schedule
from attnprof.files import create_new
from attnprof.registry import RunSpec


@dataclass
class ProfileRun:
    """What one profiled loop produced."""

    trace_path: Path
    key_averages_table: str
    output: Any
    export_s: float


def trace_file_name(variant: str, spec: RunSpec) -> str:
    """A file name that carries the cell's parameters; a second trace of the same cell in one folder gets
    `-2` before the extension (see `profile_forward`), so nothing is overwritten."""
    mode = "causal" if spec.causal else "full"
    device = spec.device.replace(":", "")
    raw = f"{variant}_{spec.shape_label}_{spec.dtype}_{mode}_{device}.json.gz"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", raw)


def _sort_key(events: Any, device_type: str) -> str:
    if device_type == "cpu":
        return "self_cpu_time_total"
    sample = next(iter(events), None)
    if sample is not None and hasattr(sample, "self_device_time_total"):
        return "self_device_time_total"
    return "self_cuda_time_total"


def profile_forward(
    forward: Callable[[], Any],
    spec: RunSpec,
    schedule: Schedule,
    region: str,
    trace_path: Path,
    row_limit: int = 15,
) -> ProfileRun:
    """Profile `forward` (a no-argument closure) under the schedule, each call in a `region` range.

    CPU and CUDA activities on a GPU, CPU alone elsewhere. Only the active steps are recorded;
    the trace is written as gzipped Chrome JSON (Perfetto opens it), created whole and never over
    an existing file (`name-2.json.gz` when `trace_path` is taken; the result names the file
    written).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if spec.device_type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    output = None
    with warnings.catch_warnings():
        # torch warns that a schedule keeps only the last cycle; one cycle is all attnprof records
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
        with torch.no_grad(), profile(activities=activities, schedule=torch.profiler.schedule(
                wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1)) as prof:
            for step in range(schedule.total_steps):
                with record_function(region):
                    output = forward()
                if step == schedule.total_steps - 1 and spec.device_type == "cuda":
                    torch.cuda.synchronize(spec.device)  # the last step's kernels must land before the stop
                prof.step()
    started = time.perf_counter()
    trace_path = create_new(trace_path, lambda path: prof.export_chrome_trace(str(path)), numbered=True)
    events = prof.key_averages()
    table = events.table(sort_by=_sort_key(events, spec.device_type), row_limit=row_limit)
    export_s = time.perf_counter() - started
    return ProfileRun(trace_path, table, output, export_s)
