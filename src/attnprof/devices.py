"""Does this machine have CUDA for torch? Answered without importing torch, unless it already is.

Importing torch takes one to several seconds; `attnprof list` only needs to know whether CUDA
work could run. When torch is already imported, torch answers. Otherwise:

- the torch build: `torch/version.py` (found with `importlib.util.find_spec`, read as text)
  says which CUDA (or HIP) it was built for, and its version;
- a GPU: an NVIDIA driver lists one under /proc/driver/nvidia/gpus or created /dev/nvidia0
  (ROCm: /dev/kfd), narrowed by CUDA_VISIBLE_DEVICES as torch narrows it;
- compute capability: `nvidia-smi --query-gpu=compute_cap`, run only when a GPU is present
  (and used when all GPUs agree: nvidia-smi and CUDA may number mixed GPUs differently);
- cuDNN: torch's wheels ship it as the `nvidia-cudnn-*` distribution or as libcudnn in torch/lib.

What the files cannot tell (no nvidia-smi, say) is asked of torch, never guessed.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata

from attnprof.errors import DeviceError

NVIDIA_SMI_TIMEOUT_S = 5.0
_ASSIGNMENT = re.compile(r"^(\w+)\s*(?::[^=]*)?=\s*(.+?)\s*$")


def _torch_loaded() -> bool:
    return "torch" in sys.modules


@functools.cache
def _torch_dir() -> str | None:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin)


@functools.cache
def torch_build_info() -> dict[str, str | None]:
    """`__version__`, `cuda` and `hip` of the installed torch build, read from torch/version.py
    without importing torch (values None where unset or unreadable; {} without torch)."""
    folder = _torch_dir()
    if folder is None:
        return {}
    info: dict[str, str | None] = {"__version__": None, "cuda": None, "hip": None}
    try:
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as fh:
            for line in fh:
                match = _ASSIGNMENT.match(line)
                if match and match.group(1) in info:
                    value = match.group(2)
                    info[match.group(1)] = None if value == "None" else value.strip("'\"")
    except OSError:
        pass
    if info["__version__"] is None:
        try:
            info["__version__"] = metadata.version("torch")
        except metadata.PackageNotFoundError:
            pass
    return info


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the installed torch, without importing it; None without torch."""
    text = sys.modules["torch"].__version__ if _torch_loaded() else torch_build_info().get("__version__")
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def triton_installed() -> bool:
    """True when the `triton` module can be found (it is not imported)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def _physical_gpus() -> list[str]:
    """NVIDIA GPU entries the driver lists (PCI bus ids), or /dev/nvidiaN nodes."""
    try:
        entries = sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        entries = []
    if entries:
        return entries
    return sorted(p for p in glob.glob("/dev/nvidia[0-9]*") if re.fullmatch(r"/dev/nvidia\d+", p))


def _visible(physical: int) -> list[str]:
    """Device ids torch would see: CUDA_VISIBLE_DEVICES up to its first invalid entry, else all."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return [str(i) for i in range(physical)]
    ids: list[str] = []
    for item in (x.strip() for x in raw.split(",")):
        if item.lstrip("-").isdigit():
            if not 0 <= int(item) < physical:
                break
        elif not item.startswith(("GPU-", "MIG-")):
            break
        ids.append(item)
    return ids


def cuda_device_ids() -> list[str]:
    """One entry per CUDA device torch would number (cuda:0, cuda:1, ...): its CUDA_VISIBLE_DEVICES
    entry, or its index. Without importing torch; empty when the torch build has no CUDA/HIP or no
    GPU is present (ROCm: one entry when /dev/kfd exists)."""
    info = torch_build_info()
    if not info or (info.get("cuda") is None and info.get("hip") is None):
        return []
    if info.get("cuda") is None:  # ROCm: torch.cuda means the AMD GPUs
        return ["0"] if os.path.exists("/dev/kfd") else []
    return _visible(len(_physical_gpus()))


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch unless it is already imported."""
    if _torch_loaded():
        return bool(sys.modules["torch"].cuda.is_available())
    return bool(cuda_device_ids())


def cuda_device_count() -> int:
    """torch.cuda.device_count(), without importing torch unless it is already imported."""
    if _torch_loaded():
        return int(sys.modules["torch"].cuda.device_count())
    return len(cuda_device_ids())


def _index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


def nvidia_smi_query(field: str, gpu: str | None = None, units: bool = True) -> list[str] | None:
    """One line per GPU (only `gpu`, an nvidia-smi `-i` value, when given) for an
    `nvidia-smi --query-gpu` field list, or None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    selector = ["-i", gpu] if gpu else []
    fmt = "--format=csv,noheader" + ("" if units else ",nounits")
    try:
        out = subprocess.run(
            [exe, *selector, f"--query-gpu={field}", fmt],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines if out.returncode == 0 and lines else None


@functools.cache
def _smi_compute_capabilities() -> tuple[tuple[int, int], ...] | None:
    """The compute capability of every GPU nvidia-smi lists, or None when it cannot tell."""
    lines = nvidia_smi_query("compute_cap")
    if lines is None:
        return None
    found = [re.match(r"(\d+)\.(\d+)$", line) for line in lines]
    if not all(found):
        return None
    return tuple((int(m.group(1)), int(m.group(2))) for m in found if m)


def compute_capability(device: str) -> tuple[int, int]:
    """(major, minor) of a CUDA device like `cuda:0`: from nvidia-smi when torch is not imported
    and every GPU has the same one (nvidia-smi and CUDA may number mixed GPUs differently), else
    from torch."""
    if not _torch_loaded() and torch_build_info().get("cuda") is not None and cuda_device_ids():
        caps = set(_smi_compute_capabilities() or ())
        if len(caps) == 1:
            return caps.pop()
    import torch

    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def cudnn_available() -> bool:
    """torch.backends.cudnn.is_available(), from the files of the torch install when torch is not imported."""
    if not _torch_loaded():
        info = torch_build_info()
        if not info or info.get("cuda") is None:
            return False
        folder = _torch_dir() or ""
        if glob.glob(os.path.join(folder, "lib", "libcudnn*")):
            return True
        try:
            if importlib.util.find_spec("nvidia.cudnn") is not None:
                return True
        except (ImportError, ValueError):
            pass
    import torch

    return bool(torch.backends.cudnn.is_available())


def resolve_dtype(requested: str, device: str) -> str:
    """The concrete dtype for a config's `dtype` on a resolved `device` (`cpu` or `cuda:N`): `auto` is
    bf16 on a CUDA device of compute capability 8.0 or newer, fp16 on an older one and fp32 on CPU;
    bf16, fp16 and fp32 are themselves. Torch-free where `compute_capability` is."""
    if requested != "auto":
        return requested
    if not device.startswith("cuda"):
        return "fp32"
    return "bf16" if compute_capability(device) >= (8, 0) else "fp16"


def cuda_absence() -> str | None:
    """Why this machine has no CUDA device (`a CPU-only torch build`, `no visible CUDA device`), or None when
    it has one; torch-free where `cuda_available` is."""
    if cuda_available():
        return None
    version = sys.modules["torch"].version if _torch_loaded() else None
    build = torch_build_info() if version is None else {"cuda": version.cuda, "hip": getattr(version, "hip", None)}
    return (
        "a CPU-only torch build" if build.get("cuda") is None and build.get("hip") is None else "no visible CUDA device"
    )


def resolve_device(requested: str) -> str:
    """`auto`, `cpu`, `cuda` or `cuda:N` as a device this machine has, or DeviceError; torch-free
    (`attnprof list`); once torch is imported (runs: `profiling.inputs.resolve_device`), torch answers."""
    if requested == "auto":
        return "cuda:0" if cuda_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    lacking = cuda_absence()
    if lacking is not None:
        raise DeviceError(
            f"device {requested!r} requested but this machine has {lacking}", hint="use --device cpu or --device auto"
        )
    index = _index(requested)
    count = cuda_device_count()
    if index >= count:
        raise DeviceError(f"device {requested!r} requested but only {count} CUDA device(s) exist")
    return f"cuda:{index}"
