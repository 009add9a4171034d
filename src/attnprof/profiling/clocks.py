"""The GPU's SM clock while attnprof times each forward, sampled by nvidia-smi in the background.

Under sustained load a GPU may lower its SM clock (power cap, heat), and the same kernel then
takes longer: on an H200 a power-hungry attention kernel ran at 1650 MHz instead of 1980 MHz
after a few hundred milliseconds. A latency is only comparable with another when one knows
the clock it ran at, so every timed cell records the median SM clock over its timing window,
the device's maximum, and the reasons the driver gave for holding the clock down.

One `nvidia-smi -lms` process samples for a whole run; windows are matched to samples by wall
time afterwards. Without nvidia-smi (or on CPU) nothing is sampled and the fields stay null.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from attnprof.devices import nvidia_smi_query

PERIOD_MS = 25
# nvidia-smi's clocks_event_reasons bits (called clocks_throttle_reasons by older drivers).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
IDLE = 0x1
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


@dataclass(frozen=True)
class ClockSample:
    """One nvidia-smi sample: wall time (seconds since the epoch), SM MHz, its maximum, reason bits."""

    when: float
    sm_mhz: int
    max_sm_mhz: int
    reasons: int


@dataclass(frozen=True)
class ClockWindow:
    """The SM clock over one timing window."""

    sm_mhz: int
    min_sm_mhz: int
    max_sm_mhz: int
    limits: tuple[str, ...]
    samples: int

    @property
    def limits_text(self) -> str | None:
        """The reasons the driver held the clock down, space-separated; None when there were none."""
        return " ".join(self.limits) or None


def reason_names(bits: int) -> tuple[str, ...]:
    """The names of the set reason bits other than `gpu_idle`, lowest bit first."""
    return tuple(name for bit, name in sorted(REASONS.items()) if bits & bit and bit != IDLE)


def parse_samples(text: str) -> list[ClockSample]:
    """Samples from nvidia-smi's `timestamp, clocks.sm, clocks.max.sm, reasons` CSV lines (no units);
    lines that do not parse (a header, a partial last line, "[N/A]") are skipped."""
    samples = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            when = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append(ClockSample(when, int(parts[1]), int(parts[2]), int(parts[3], 16)))
        except ValueError:
            continue
    return samples


def clock_window(samples: Sequence[ClockSample], spans: Sequence[tuple[float, float]]) -> ClockWindow | None:
    """Median and lowest SM MHz, the maximum, and the non-idle reasons seen inside any of the
    (start, end) spans; None when no sample falls inside."""
    inside = [s for s in samples if any(start <= s.when <= end for start, end in spans)]
    if not inside:
        return None
    clocks = sorted(s.sm_mhz for s in inside)
    bits = 0
    for s in inside:
        bits |= s.reasons
    return ClockWindow(
        sm_mhz=statistics.median_high(clocks),
        min_sm_mhz=clocks[0],
        max_sm_mhz=max(s.max_sm_mhz for s in inside),
        limits=reason_names(bits),
        samples=len(inside),
    )


def gpu_selector(device: str) -> str | None:
    """nvidia-smi's `-i` value for a torch CUDA device: its UUID (CUDA and nvidia-smi may number
    GPUs differently), or None when torch cannot tell."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
    except Exception:  # an old torch without .uuid, or no such device
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


class ClockSampler:
    """Samples one GPU's SM clock every `period_ms` from `start()` to `stop()`.

    Never raises for a missing or failing nvidia-smi: `stop()` then returns no samples and
    `unavailable` says why.
    """

    def __init__(self, device: str, period_ms: int = PERIOD_MS) -> None:
        self.device = device
        self.period_ms = period_ms
        self.unavailable: str | None = None
        self._proc: subprocess.Popen | None = None
        self._file: Any = None

    def start(self) -> ClockSampler:
        """Start the background nvidia-smi (after checking which reasons field this driver knows)."""
        exe = shutil.which("nvidia-smi")
        selector = gpu_selector(self.device)
        if exe is None or selector is None:
            self.unavailable = "no nvidia-smi" if exe is None else "cannot identify the GPU for nvidia-smi"
            return self
        query = next(
            (
                q
                for q in (f"timestamp,clocks.sm,clocks.max.sm,{field}" for field in REASON_FIELDS)
                if _query_works(selector, q)
            ),
            None,
        )
        if query is None:
            self.unavailable = "nvidia-smi does not report SM clocks here"
            return self
        self._file = tempfile.TemporaryFile("w+")
        try:
            self._proc = subprocess.Popen(
                [
                    exe,
                    "-i",
                    selector,
                    f"--query-gpu={query}",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    str(self.period_ms),
                ],
                stdout=self._file,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            self.unavailable = f"nvidia-smi failed to start: {exc}"
        return self

    def samples_so_far(self) -> list[ClockSample]:
        """The samples nvidia-smi has written so far, read without moving the file offset it shares."""
        if self._proc is None:
            return []
        fd = self._file.fileno()
        return parse_samples(os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace"))

    def stop(self) -> list[ClockSample]:
        """Stop sampling and return the samples taken (none when sampling never started)."""
        if self._proc is None:
            return []
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        self._file.seek(0)
        samples = parse_samples(self._file.read())
        self._file.close()
        if not samples:
            self.unavailable = "nvidia-smi gave no samples"
        return samples


def _query_works(selector: str, query: str) -> bool:
    lines = nvidia_smi_query(query, gpu=selector, units=False)
    return lines is not None and bool(parse_samples("\n".join(lines)))
