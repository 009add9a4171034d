"""Datasheet peaks by GPU name, and the peaks a trace's percentages and ridge point use (`Peaks`).

The figures are the vendors' datasheets (NVIDIA's product datasheets for H200, H100, H800, A100,
A800, L40S, L40, L4, A10 and B200; the Ada Lovelace architecture whitepaper for the RTX 4090): memory
bandwidth in GB/s (10^9 bytes per second), the peak a read-only kernel is measured against (the
datasheets give one figure for reads and writes), and the dense (no sparsity) BF16/FP16 tensor peak
in TFLOPS with FP32 accumulation. A GPU is found by the `name` its trace's `deviceProperties` gives
(e.g. "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"); the patterns are tried in
order, the most specific first. `datasheet(name)` is None for a GPU not in the table.

`Peaks` is what an analysis compares against: a datasheet's figures (`Datasheet.peaks`, for a trace
from any machine), or the read bandwidth and matmul ceiling measured on this machine
(`Peaks.measured`, from `profiling.ceiling`), its `basis` saying which.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

#: Where a percentage's reference comes from: the GPU's datasheet, or measured on this machine.
PeaksBasis = Literal["datasheet", "measured"]


@dataclass(frozen=True, slots=True)
class Peaks:
    """The read bandwidth (GB/s) and tensor or matmul peak (TFLOP/s) percentages and the ridge point use.

    `basis` is "datasheet" or "measured"; `source` names the bandwidth in words for the JSON and the
    text: "datasheet H200 4800 GB/s", "read bandwidth measured on this machine 4512 GB/s (2026-05-01)".
    """

    read_gbps: float
    tensor_tflops: float
    basis: PeaksBasis
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the compute peak meets the read bandwidth (see `Datasheet.ridge`)."""
        return self.tensor_tflops * 1e3 / self.read_gbps

    @classmethod
    def measured(cls, read_gbps: float, matmul_tflops: float, measured_on: str) -> Peaks:
        """The read bandwidth and matmul ceiling measured on this machine on `measured_on` (YYYY-MM-DD)."""
        source = f"read bandwidth measured on this machine {read_gbps:.0f} GB/s ({measured_on})"
        return cls(read_gbps, matmul_tflops, "measured", source)


#: Measured peaks for the GPU a trace names and the trace's input dtype, or None (then the datasheet's).
PeaksLookup = Callable[[str | None, str | None], Peaks | None]


@dataclass(frozen=True, slots=True)
class Datasheet:
    """One GPU's datasheet peaks."""

    gpu: str  # the product, as the datasheet names it
    bandwidth_gbps: float  # memory bandwidth, GB/s
    tensor_tflops: float  # dense BF16/FP16 tensor-core peak, TFLOPS

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOPs per byte) where the tensor peak meets the bandwidth: a call
        below it cannot reach the tensor peak, its memory traffic bounds it."""
        return self.tensor_tflops * 1e3 / self.bandwidth_gbps

    @property
    def bandwidth_source(self) -> str:
        """ "datasheet H200 4800 GB/s"."""
        return f"datasheet {self.gpu} {self.bandwidth_gbps:g} GB/s"

    @property
    def peaks(self) -> Peaks:
        """The datasheet's bandwidth and tensor peak as the `Peaks` an analysis compares against."""
        return Peaks(self.bandwidth_gbps, self.tensor_tflops, "datasheet", self.bandwidth_source)


#: (pattern over the deviceProperties name, its datasheet), tried in order.
DATASHEETS: tuple[tuple[re.Pattern[str], Datasheet], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), Datasheet(gpu, bandwidth, tflops))
    for pattern, gpu, bandwidth, tflops in (
        (r"\bB200\b", "B200", 8000.0, 2250.0),
        (r"\bH200 NVL\b", "H200 NVL", 4800.0, 835.0),
        (r"\bH200\b", "H200", 4800.0, 989.0),
        (r"\bH100 NVL\b", "H100 NVL", 3900.0, 835.0),
        (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 2000.0, 756.0),
        (r"\bH100\b", "H100 SXM", 3350.0, 989.0),
        (r"\bH800\b.*\bPCIe\b", "H800 PCIe", 2000.0, 756.0),
        (r"\bH800\b", "H800 SXM", 3350.0, 989.0),
        (r"\bA100\b.*\b80GB\b.*\bPCIe\b", "A100 80GB PCIe", 1935.0, 312.0),
        (r"\bA100\b.*\b80GB\b", "A100 80GB SXM", 2039.0, 312.0),
        (r"\bA100\b", "A100 40GB", 1555.0, 312.0),
        (r"\bA800\b.*\b80GB\b.*\bPCIe\b", "A800 80GB PCIe", 1935.0, 312.0),
        (r"\bA800\b.*\b80GB\b", "A800 80GB SXM", 2039.0, 312.0),
        (r"\bA800\b", "A800 40GB", 1555.0, 312.0),
        (r"\bL40S\b", "L40S", 864.0, 362.0),
        (r"\bL40\b", "L40", 864.0, 181.0),
        (r"\bL4\b", "L4", 300.0, 121.0),
        (r"\bA10\b", "A10", 600.0, 125.0),
        (r"\bRTX 4090\b", "RTX 4090", 1008.0, 165.2),
    )
)


def datasheet(name: str | None) -> Datasheet | None:
    """The datasheet of the GPU called `name` (a deviceProperties name), or None when unknown."""
    if not name:
        return None
    return next((sheet for pattern, sheet in DATASHEETS if pattern.search(name)), None)
