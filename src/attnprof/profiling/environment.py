"""What the numbers were measured on: GPU, driver, library versions, CPU, Python, platform.

Every field is best effort: what cannot be read is None, never a guess.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from importlib import metadata
from typing import Any


def cpu_model() -> str | None:
    """The CPU model name from /proc/cpuinfo (Linux) or `platform.processor()`; None if unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution in `names` that exists, without importing it."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def triton_version() -> str | None:
    """Triton's version when the `triton` module can be found (not imported), else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    return package_version("triton", "pytorch-triton")


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver version from `nvidia-smi`, or None when it is absent or fails."""
    from attnprof.devices import nvidia_smi_query

    lines = nvidia_smi_query("driver_version")
    return lines[0] if lines else None


def _gpu_fields(device: str) -> dict[str, Any]:
    import torch

    fields: dict[str, Any] = {
        "gpu_name": None,
        "compute_capability": None,
        "gpu_memory_gib": None,
        "sm_count": None,
        "l2_cache_mib": None,
        "driver_version": None,
    }
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return fields
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    l2 = getattr(props, "L2_cache_size", None)
    fields.update(
        gpu_name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        gpu_memory_gib=round(props.total_memory / 2**30, 2),
        sm_count=props.multi_processor_count,
        l2_cache_mib=round(l2 / 2**20, 2) if l2 else None,
        driver_version=nvidia_driver_version(),
    )
    return fields


def collect_environment(device: str) -> dict[str, Any]:
    """A JSON-ready dict describing the machine and software that `device` runs on.

    Keys: attnprof_version, python, platform, cpu_model, cpu_count, torch_threads, torch,
    torch_cuda, cudnn, triton, device, gpu_name, compute_capability, gpu_memory_gib,
    sm_count, l2_cache_mib, driver_version (GPU fields None on CPU).
    """
    import torch

    import attnprof

    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a broken cuDNN install must not stop a report
        cudnn = None
    env: dict[str, Any] = {
        "attnprof_version": attnprof.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn is not None else None,
        "triton": triton_version(),
        "device": device,
    }
    env.update(_gpu_fields(device))
    return env
