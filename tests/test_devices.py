"""attnprof.devices: CUDA availability without importing torch, and agreement with torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnprof import devices
from attnprof.errors import DeviceError

_BUILD_INFO = devices.torch_build_info


@pytest.fixture
def no_torch(monkeypatch):
    """Pretend torch is not imported yet, with a given build and GPUs."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    _BUILD_INFO.cache_clear()
    devices._smi_compute_capabilities.cache_clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def set_machine(cuda: str | None = "12.8", gpus: int = 0, hip: str | None = None, version: str = "2.13.0"):
        monkeypatch.setattr(devices, "torch_build_info", lambda: {"__version__": version, "cuda": cuda, "hip": hip})
        monkeypatch.setattr(devices, "_physical_gpus", lambda: [f"0000:{i:02x}:00.0" for i in range(gpus)])

    yield set_machine
    _BUILD_INFO.cache_clear()
    devices._smi_compute_capabilities.cache_clear()


def test_build_info_is_read_without_importing_torch() -> None:
    code = ("import sys; from attnprof import devices; info = devices.torch_build_info(); "
            "print(info['__version__'], info['cuda'], devices.cuda_available(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert out[0] == torch.__version__
    assert out[1] == str(torch.version.cuda)
    assert out[2] == str(torch.cuda.is_available())
    assert out[3] == "False"


def test_torch_version_gate() -> None:
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert devices.torch_version() == (major, minor)


def test_cpu_build_has_no_cuda(no_torch) -> None:
    no_torch(cuda=None, gpus=2)
    assert not devices.cuda_available() and devices.cuda_device_count() == 0
    assert devices.resolve_device("auto") == "cpu"
    with pytest.raises(DeviceError, match="CPU-only torch build"):
        devices.resolve_device("cuda")
    assert devices.cudnn_available() is False


def test_cuda_build_without_a_gpu(no_torch) -> None:
    no_torch(cuda="12.8", gpus=0)
    assert devices.resolve_device("auto") == "cpu"
    with pytest.raises(DeviceError, match="no visible CUDA device"):
        devices.resolve_device("cuda:0")


def test_gpus_and_cuda_visible_devices(no_torch, monkeypatch) -> None:
    no_torch(cuda="12.8", gpus=4)
    assert devices.cuda_device_count() == 4
    assert devices.resolve_device("auto") == "cuda:0" and devices.resolve_device("cuda:3") == "cuda:3"
    with pytest.raises(DeviceError, match="only 4 CUDA device"):
        devices.resolve_device("cuda:4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    assert devices.cuda_device_ids() == ["2", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,-1,0")  # torch stops at the first invalid entry
    assert devices.cuda_device_ids() == ["3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not devices.cuda_available()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2c0f7e")
    assert devices.cuda_device_ids() == ["GPU-8f2c0f7e"]


def _fake_smi(tmp_path, monkeypatch, output: str) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nprintf "{output}"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_compute_capability_from_nvidia_smi(no_torch, monkeypatch, tmp_path) -> None:
    no_torch(cuda="12.8", gpus=2)
    _fake_smi(tmp_path, monkeypatch, "9.0\\n9.0\\n")
    assert devices.compute_capability("cuda:1") == (9, 0)
    assert "torch" not in sys.modules


def test_mixed_gpus_are_not_guessed(no_torch, monkeypatch, tmp_path) -> None:
    """nvidia-smi's order need not be CUDA's: with two different GPUs, torch must answer."""
    no_torch(cuda="12.8", gpus=2)
    _fake_smi(tmp_path, monkeypatch, "8.0\\n9.0\\n")
    assert devices._smi_compute_capabilities() == ((8, 0), (9, 0))
    asked = []

    class FakeCuda:
        @staticmethod
        def get_device_capability(device):
            asked.append(device)
            return (9, 0)

    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].cuda = FakeCuda
    monkeypatch.setattr(devices, "_torch_loaded", lambda: False)
    assert devices.compute_capability("cuda:1") == (9, 0) and asked == ["cuda:1"]


def test_sdpa_and_compile_checks_do_not_import_torch() -> None:
    code = ("import sys\n"
            "from attnprof.plugins import load_variants\n"
            "from attnprof.registry import RunSpec\n"
            "reg = load_variants(no_plugins=True).registry\n"
            "for dtype in ('fp32', 'bf16'):\n"
            "    spec = RunSpec(device='cpu', dtype=dtype, batch=1, heads=2, seq=16, head_dim=16)\n"
            "    [v.unavailable_reason(spec) for v in reg.all()]\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("smi", "expected"), [("9.0\\n", "bf16"), ("8.6\\n", "bf16"), ("7.5\\n", "fp16")])
def test_auto_dtype_from_the_compute_capability(no_torch, monkeypatch, tmp_path, smi, expected) -> None:
    """`dtype: auto` is bf16 from compute capability 8.0, fp16 below it, fp32 on CPU; without importing torch."""
    no_torch(cuda="12.8", gpus=1)
    _fake_smi(tmp_path, monkeypatch, smi)
    assert devices.resolve_dtype("auto", "cuda:0") == expected
    assert devices.resolve_dtype("auto", "cpu") == "fp32"
    assert devices.resolve_dtype("fp32", "cuda:0") == "fp32" and devices.resolve_dtype("bf16", "cpu") == "bf16"
    assert "torch" not in sys.modules


def test_list_on_an_h200_runs_flash_and_cudnn(no_torch, monkeypatch, tmp_path, cli) -> None:
    """The built-in default on a (faked) H200: bf16, so sdpa-flash and sdpa-cudnn run here."""
    no_torch(cuda="12.8", gpus=1)
    _fake_smi(tmp_path, monkeypatch, "9.0\\n")
    monkeypatch.setattr(devices, "cudnn_available", lambda: True)
    result = cli("--no-plugins", "list", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["device"], data["dtype"]) == ("cuda:0", "bf16")
    by_name = {v["name"]: v for v in data["variants"]}
    assert by_name["sdpa-flash"]["available"] and by_name["sdpa-cudnn"]["available"], by_name
    table = cli("--no-plugins", "list").stdout
    assert table.startswith("variants on cuda:0, bf16, 1x4x256x64:")
    assert "torch" not in sys.modules
