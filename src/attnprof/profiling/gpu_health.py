"""The GPU's health while a cell's timed calls run, sampled through NVML (`pynvml`, the `nvml` extra).

`profiling.clocks` reads nvidia-smi over the whole timing (cold call and warm-up included); this module reads
the timed calls alone, and more of what holds a GPU back: a background thread polls NVML every `PERIOD_S`
from just before the first timed launch until the synchronize after the last (`timing._time_cuda`, CUDA
cells only), taking one sample at once and then one per period. Each sample reads the SM clock, the power
draw (as NVML reports it: on recent drivers an average over about a second), the temperature and the
driver's clock-event reasons (`nvmlDeviceGetCurrentClocksEventReasons`, called
`...ClocksThrottleReasons` before driver 535; bits named as `clocks.REASONS`). The applications SM clock
and the enforced power limit are read once per window.

The reference clock is the applications clock: the clock the driver runs kernels at when nothing holds it
down (`nvidia-smi -q -d CLOCK`: Applications Clocks). The maximum clock is not: a GPU with auto boost
(a GeForce, a T4) sits between the two in normal operation, so a clock below its maximum says nothing.
Where the GPU has no applications clock, NVML says so and the reference stays None.

NVML is opened once per process (`open_device`); without pynvml, when `nvmlInit` fails or NVML cannot find
the device, nothing is sampled and `Watch.note` says why in one line; the cell is measured as before.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from attnprof.errors import one_line
from attnprof.profiling.clocks import IDLE, REASONS

#: Seconds between two NVML samples.
PERIOD_S = 0.01
#: The clock-event reasons' reader, by its name since driver 535, then by the older one.
REASON_READERS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
INSTALL_HINT = "pip install 'attnprof[nvml]'"


@dataclass(frozen=True)
class HealthSample:
    """One NVML sample: SM MHz, power draw (mW), temperature (°C) and the clock-event reason bits; a
    reading this GPU does not give is None."""

    sm_mhz: int
    power_mw: int | None
    temperature_c: int | None
    reasons: int | None


@dataclass(frozen=True)
class GpuHealth:
    """The GPU over one window of timed calls (the samples of `summarize_health`).

    `sm_clock_mhz` and `sm_clock_min_mhz` (median and lowest) are over the samples in which the GPU was not
    idle (over all of them when it was idle in each: `idle_samples` == `samples`); `power_pct` and
    `power_max_pct` are the draw in percent of the enforced power limit (median, highest); `reason_pcts`
    names each reason other than idle with the percentage of samples that showed it."""

    samples: int
    idle_samples: int
    sm_clock_mhz: int
    sm_clock_min_mhz: int
    application_clock_mhz: int | None
    power_pct: float | None
    power_max_pct: float | None
    temperature_max_c: int | None
    reason_pcts: dict[str, float]

    @property
    def limits_text(self) -> str | None:
        """The reasons seen (other than idle), space-separated, in bit order; None when there were none."""
        return " ".join(self.reason_pcts) or None


def summarize_health(
    samples: list[HealthSample], application_clock_mhz: int | None, power_limit_mw: int | None
) -> GpuHealth | None:
    """The window's `GpuHealth`; None without samples."""
    if not samples:
        return None
    busy = [s for s in samples if not (s.reasons or 0) & IDLE]
    clocks = sorted(s.sm_mhz for s in busy or samples)
    power = [100.0 * s.power_mw / power_limit_mw for s in samples if s.power_mw is not None and power_limit_mw]
    temperatures = [s.temperature_c for s in samples if s.temperature_c is not None]
    pcts = {
        name: 100.0 * sum(1 for s in samples if (s.reasons or 0) & bit) / len(samples)
        for bit, name in sorted(REASONS.items())
        if bit != IDLE and any((s.reasons or 0) & bit for s in samples)
    }
    return GpuHealth(
        samples=len(samples),
        idle_samples=len(samples) - len(busy),
        sm_clock_mhz=statistics.median_high(clocks),
        sm_clock_min_mhz=clocks[0],
        application_clock_mhz=application_clock_mhz,
        power_pct=statistics.median(power) if power else None,
        power_max_pct=max(power) if power else None,
        temperature_max_c=max(temperatures) if temperatures else None,
        reason_pcts=pcts,
    )


@dataclass(frozen=True)
class NvmlDevice:
    """One GPU as NVML sees it: the `pynvml` module, the device handle, and the readings it gives (a reading
    the GPU does not support is None; `reasons` is whichever of the two names this pynvml and driver know)."""

    nvml: Any
    handle: Any
    power: bool
    temperature: bool
    reasons: Callable[[Any], int] | None

    def sample(self) -> HealthSample:
        """One sample now."""
        nvml, handle = self.nvml, self.handle
        return HealthSample(
            sm_mhz=int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            power_mw=int(nvml.nvmlDeviceGetPowerUsage(handle)) if self.power else None,
            temperature_c=int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            if self.temperature
            else None,
            reasons=int(self.reasons(handle)) if self.reasons is not None else None,
        )

    def application_clock_mhz(self) -> int | None:
        """The applications SM clock (the reference, see the module docstring); None where the GPU has none."""
        return _read(lambda: int(self.nvml.nvmlDeviceGetApplicationsClock(self.handle, self.nvml.NVML_CLOCK_SM)))

    def power_limit_mw(self) -> int | None:
        """The power limit the driver enforces now (mW); None where NVML does not give it."""
        return _read(lambda: int(self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle))) if self.power else None


def _read(read: Callable[[], int]) -> int | None:
    try:
        return read()
    except Exception:  # NVMLError_NotSupported, or a pynvml without the function
        return None


#: NVML opened in this process: the module, or why not (one line); the devices found, by torch index.
_session: dict[str, Any] = {}
_devices: dict[int, NvmlDevice | str] = {}


def forget_nvml() -> None:
    """Let the next `open_device` import and initialise NVML again (tests)."""
    _session.clear()
    _devices.clear()


def _nvml() -> Any:
    """The initialised `pynvml` module, or why it is unavailable (a str), decided once per process."""
    if "nvml" not in _session:
        try:
            import pynvml

            pynvml.nvmlInit()
            _session["nvml"] = pynvml
        except ImportError:
            _session["nvml"] = f"NVML unavailable: pynvml is not installed ({INSTALL_HINT})"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _session["nvml"] = f"NVML unavailable: nvmlInit failed ({one_line(exc)})"
    return _session["nvml"]


def open_device(index: int) -> NvmlDevice | str:
    """NVML's view of torch's CUDA device `index` (found by `device_keys`), or why there is none, in one
    line; decided once per device and process."""
    if index not in _devices:
        nvml = _nvml()
        _devices[index] = nvml if isinstance(nvml, str) else _open(nvml, index)
    return _devices[index]


def _open(nvml: Any, index: int) -> NvmlDevice | str:
    handle, tried = None, []
    for how, key in device_keys(index):
        lookup = {"pci": "nvmlDeviceGetHandleByPciBusId", "uuid": "nvmlDeviceGetHandleByUUID"}.get(how)
        try:
            handle = getattr(nvml, lookup)(key) if lookup else nvml.nvmlDeviceGetHandleByIndex(int(key))
            break
        except Exception as exc:
            tried.append(f"{how} {key}: {one_line(exc, with_type=False)}")
    if handle is None:
        return f"NVML cannot find cuda:{index} ({'; '.join(tried)})"
    try:
        nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
    except Exception as exc:
        return f"NVML gives no SM clock for cuda:{index} ({one_line(exc, with_type=False)})"
    power = _read(lambda: int(nvml.nvmlDeviceGetPowerUsage(handle))) is not None
    temperature = _read(lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))) is not None
    readers = (getattr(nvml, name, None) for name in REASON_READERS)
    reasons = next((read for read in readers if read is not None and _reads(read, handle)), None)
    return NvmlDevice(nvml, handle, power, temperature, reasons)


def _reads(read: Callable[[Any], int], handle: Any) -> bool:
    """True when `read(handle)` gives a number here."""
    return _read(lambda: int(read(handle))) is not None


def device_keys(index: int) -> list[tuple[str, str]]:
    """How NVML may find torch's CUDA device `index`, best first: its PCI bus id and UUID as torch reports
    them (exact, whatever CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say), then the index NVML gives it:
    the `index`-th entry of CUDA_VISIBLE_DEVICES (a UUID there is looked up as one), else `index` itself
    (NVML numbers GPUs by PCI bus, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    keys: list[tuple[str, str]] = []
    props = _properties(index)
    domain, bus, device = (getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device"))
    if all(isinstance(part, int) for part in (domain, bus, device)):
        keys.append(("pci", f"{domain:08X}:{bus:02X}:{device:02X}.0"))
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        keys.append(("uuid", uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"))
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    entry = visible[index] if index < len(visible) else str(index)
    keys.append(("index", entry) if entry.isdigit() else ("uuid", entry))
    return list(dict.fromkeys(keys))


def _properties(index: int) -> Any:
    """torch's properties of CUDA device `index`, or None (no CUDA, no such device)."""
    try:
        import torch

        return torch.cuda.get_device_properties(index)
    except Exception:
        return None


class HealthSampler:
    """Samples one `NvmlDevice` every `period_s` (default `PERIOD_S`) on a background thread, from `start()`
    to `stop()`. A sample that fails is left out (the first failure is kept in `failure`); sampling never
    raises."""

    def __init__(self, device: NvmlDevice, period_s: float | None = None) -> None:
        self.device, self.period_s = device, PERIOD_S if period_s is None else period_s
        self.samples: list[HealthSample] = []
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attnprof-nvml", daemon=True)
        self._application: int | None = None
        self._limit: int | None = None

    def start(self) -> HealthSampler:
        """Read the window's reference clock and power limit, then start sampling."""
        self._application = self.device.application_clock_mhz()
        self._limit = self.device.power_limit_mw()
        self._thread.start()
        return self

    def stop(self) -> GpuHealth | None:
        """Stop sampling; the window's health (None when no sample succeeded)."""
        self._stop.set()
        self._thread.join()
        return summarize_health(self.samples, self._application, self._limit)

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self.device.sample())
            except Exception as exc:
                self.failure = self.failure or f"an NVML sample failed: {one_line(exc)}"
            if self._stop.wait(self.period_s):
                return


@dataclass
class Watch:
    """What one watched window gave: its health, or (one line) why there is none."""

    health: GpuHealth | None = None
    note: str | None = None


@contextmanager
def watching(index: int | None) -> Iterator[Watch]:
    """Sample CUDA device `index` (torch's numbering) while the block runs; `index` None samples nothing
    and says nothing. The `Watch` is filled when the block ends."""
    watch = Watch()
    device = open_device(index) if index is not None else None
    if not isinstance(device, NvmlDevice):
        watch.note = device
        yield watch
        return
    sampler = HealthSampler(device).start()
    try:
        yield watch
    finally:
        watch.health = sampler.stop()
        if watch.health is None:
            watch.note = sampler.failure or "NVML gave no sample"
