import json

import attnprof
from attnprof.profiling import environment
from attnprof.profiling.environment import collect_environment, nvidia_driver_version

KEYS = {"attnprof_version", "python", "platform", "cpu_model", "cpu_count", "torch_threads", "torch", "torch_cuda",
        "cudnn", "triton", "device", "gpu_name", "compute_capability", "gpu_memory_gib", "sm_count",
        "l2_cache_mib", "driver_version"}


def test_cpu_environment_keys_and_values():
    import sys

    import torch

    env = collect_environment("cpu")
    assert set(env) == KEYS
    assert env["attnprof_version"] == attnprof.__version__
    assert env["torch"] == torch.__version__
    assert env["python"] == sys.version.split()[0]
    assert env["device"] == "cpu"
    assert env["gpu_name"] is None and env["compute_capability"] is None and env["driver_version"] is None
    json.dumps(env)  # JSON-ready


def test_missing_nvidia_smi_gives_none(monkeypatch):
    from attnprof import devices

    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert nvidia_driver_version() is None
    assert devices.nvidia_smi_query("compute_cap") is None


def test_triton_absent_gives_none(monkeypatch):
    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: None)
    assert environment.triton_version() is None


def test_cpu_model_is_text_or_none():
    model = environment.cpu_model()
    assert model is None or (isinstance(model, str) and model.strip() == model and model)
