"""One torch.profiler run of a forward: schedule, record_function region, Chrome trace export.

What the profiler's native code prints on stderr (kineto's `USDT: ... profiler_start` lines, CUPTI
notices) is captured at the file-descriptor level around its start, steps, stop and export, and
returned as data: the user's terminal (and a progress bar on it) never sees it; `--debug` shows it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from attnprof.config import Schedule
from attnprof.files import create_new
from attnprof.registry import RunSpec


@dataclass
class ProfileRun:
    """What one profiled loop produced."""

    trace_path: Path
    key_averages_table: str | None  # None unless asked for (`run` prints it)
    output: Any
    export_s: float
    native_stderr: list[str] = field(default_factory=list)  # what the profiler's native code printed


def trace_file_name(variant: str, spec: RunSpec) -> str:
    """A file name that carries the cell's parameters; a second trace of the same cell in one folder gets
    `-2` before the extension (see `profile_forward`), so nothing is overwritten."""
    mode = "causal" if spec.causal else "full"
    if spec.backward:
        mode += f"_{spec.mode}"
    device = spec.device.replace(":", "")
    raw = f"{variant}_{spec.shape_label}_{spec.dtype}_{mode}_{device}.json.gz"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", raw)


class NativeStderr:
    """Captures what is written to file descriptor 2 (native code included) inside each `with` block.

    The descriptor is pointed at a temporary file for the block and restored after it, even when
    the block raises; `lines()` returns everything captured so far. Without a descriptor 2 it
    captures nothing.
    """

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None

    @contextmanager
    def capture(self) -> Iterator[None]:
        """Send file descriptor 2 to the capture file for the duration of the block."""
        _flush_stderr()
        try:
            saved = os.dup(2)
        except OSError:
            yield
            return
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile()
            os.dup2(self._file.fileno(), 2)
            yield
        finally:
            try:
                _flush_stderr()  # Python's own writes inside the block belong to the capture too
            finally:  # restored even when Ctrl-C lands in the flush
                os.dup2(saved, 2)
                os.close(saved)

    def lines(self) -> list[str]:
        """The non-empty captured lines, and close the capture file."""
        if self._file is None:
            return []
        self._file.seek(0)
        text = self._file.read().decode(errors="replace")
        self._file.close()
        self._file = None
        return [line.rstrip() for line in text.splitlines() if line.strip()]


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def _sort_key(events: Any, device_type: str) -> str:
    if device_type == "cpu":
        return "self_cpu_time_total"
    sample = next(iter(events), None)
    if sample is not None and hasattr(sample, "self_device_time_total"):
        return "self_device_time_total"
    return "self_cuda_time_total"


#: The trace's top-level metadata key for cuDNN's version (`torch.backends.cudnn.version()`, e.g. "91002"),
#: which the analysis reads for the implementation that served a cuDNN attention call.
CUDNN_VERSION_KEY = "cudnn_version"


def trace_metadata(device_type: str) -> dict[str, str]:
    """What the trace records beside its events: on CUDA, cuDNN's version where cuDNN is available."""
    import torch

    if device_type != "cuda" or not torch.backends.cudnn.is_available():
        return {}
    version = torch.backends.cudnn.version()
    return {CUDNN_VERSION_KEY: str(version)} if version else {}


def profile_forward(
    forward: Callable[[], Any],
    spec: RunSpec | str,
    schedule: Schedule,
    region: str,
    trace_path: Path,
    row_limit: int = 15,
    prepare: Callable[[], Any] | None = None,
    record_shapes: bool = True,
    with_stack: bool = False,
    key_averages: bool = True,
) -> ProfileRun:
    """Profile `forward` (a no-argument closure: the forward, or the step of the spec's mode) under the
    schedule, each call in a `region` range. `spec` is the cell's RunSpec or just the device it runs on
    (`attnprof model`, whose step is a whole model's).

    CPU and CUDA activities on a GPU, CPU alone elsewhere, by default with the ops' input shapes and types
    (`record_shapes`: the analysis reads the attention calls' bytes from them) and on request with each op's
    Python stack (`with_stack`), and `trace_metadata` as top-level keys. Only the active steps are recorded;
    the trace is written as gzipped Chrome JSON (Perfetto opens it), created whole and never over
    an existing file (`name-2.json.gz` when `trace_path` is taken; the result names the file
    written). The profiler's native stderr comes back in `native_stderr`, not on the terminal.
    `prepare`, when given, runs before each call, outside the region (the step's untimed forward).
    `key_averages`: also build the profiler's own key_averages table (tens of ms per cell on a GPU; only
    `run` prints it), else `key_averages_table` is None.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    device = spec if isinstance(spec, str) else spec.device
    device_type = device.split(":", 1)[0]
    activities = [ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    native = NativeStderr()
    output = None
    with warnings.catch_warnings():
        # torch warns that a schedule keeps only the last cycle; one cycle is all attnprof records
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
        prof = profile(
            activities=activities,
            record_shapes=record_shapes,  # the calls' bytes (achieved GB/s, memory-bound) and the mask's type
            with_stack=with_stack,
            schedule=torch.profiler.schedule(
                wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1
            ),
        )
        metadata = trace_metadata(device_type)
        with torch.no_grad(), _entered(prof, native):
            for step in range(schedule.total_steps):
                if step == schedule.wait + schedule.warmup:  # recording: the profiler keeps metadata now
                    for key, value in metadata.items():
                        prof.add_metadata(key, value)
                if prepare is not None:
                    prepare()
                with record_function(region):
                    output = forward()
                if step == schedule.total_steps - 1 and device_type == "cuda":
                    torch.cuda.synchronize(device)  # the last step's kernels must land before the stop
                with native.capture():
                    prof.step()
    started = time.perf_counter()
    with native.capture():
        trace_path = create_new(trace_path, lambda path: prof.export_chrome_trace(str(path)), numbered=True)
        events = prof.key_averages() if key_averages else None
    table = events.table(sort_by=_sort_key(events, device_type), row_limit=row_limit) if events is not None else None
    export_s = time.perf_counter() - started
    return ProfileRun(trace_path, table, output, export_s, native.lines())


@contextmanager
def _entered(prof: Any, native: NativeStderr) -> Iterator[Any]:
    """`with prof:`, with the profiler's start and stop inside the native stderr capture."""
    with native.capture():
        prof.__enter__()
    try:
        yield prof
    finally:
        with native.capture():
            prof.__exit__(None, None, None)
