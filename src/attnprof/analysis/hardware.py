"""Datasheet peaks by GPU name: memory bandwidth and the dense 16-bit tensor-core peak.

The figures are the vendors' datasheets (NVIDIA's product datasheets for H200, H100, A100, L40S,
L40, L4, A10 and B200; the Ada Lovelace architecture whitepaper for the RTX 4090): memory
bandwidth in GB/s (10^9 bytes per second) and the dense (no sparsity) BF16/FP16 tensor peak in
TFLOPS with FP32 accumulation. A GPU is found by the `name` its trace's `deviceProperties` gives
(e.g. "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"); the patterns are tried in
order, the most specific first. `datasheet(name)` is None for a GPU not in the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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
        (r"\bA100\b.*\b80GB\b.*\bPCIe\b", "A100 80GB PCIe", 1935.0, 312.0),
        (r"\bA100\b.*\b80GB\b", "A100 80GB SXM", 2039.0, 312.0),
        (r"\bA100\b", "A100 40GB", 1555.0, 312.0),
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
