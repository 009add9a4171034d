"""NVML on a real CUDA GPU with the real `pynvml` (the nvml extra). Run on the device:
`pytest -m gpu tests/test_gpu_nvml.py`."""

import pytest
import torch

from attnprof.registry import RunSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda:0"


@pytest.fixture
def nvml():
    """The real pynvml (skip without it), NVML opened afresh for the test."""
    from attnprof.profiling import gpu_health

    module = pytest.importorskip("pynvml")
    gpu_health.forget_nvml()
    yield module
    gpu_health.forget_nvml()


def test_nvml_finds_the_gpu_torch_calls_cuda_0(nvml):
    from attnprof.profiling.gpu_health import NvmlDevice, open_device

    torch.cuda.init()
    device = open_device(0)
    assert isinstance(device, NvmlDevice), device
    uuid = nvml.nvmlDeviceGetUUID(device.handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    assert uuid.removeprefix("GPU-") == str(torch.cuda.get_device_properties(0).uuid).removeprefix("GPU-")
    assert device.reasons is not None and device.power and device.temperature


def test_a_real_cell_carries_plausible_nvml_fields(nvml, tmp_path):
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import run_cells
    from attnprof.pipeline.rows import cell_row
    from attnprof.variants import sdpa

    variant = next(v for v in sdpa.variants() if v.name == "sdpa-flash")
    spec = RunSpec(DEV, "bf16", 4, 16, 4096, 128, causal=True)
    config = Config(shapes=[{"batch": 4, "heads": 16, "seq": 4096, "head_dim": 128}], output_dir=tmp_path)
    results, interrupted = run_cells([(variant, spec)], config, MeasureOptions(min_time_s=0.3))
    assert not interrupted and results[0].ok, results[0].reason
    assert results[0].gpu_health_note is None
    row = cell_row(results[0])
    assert row.nvml_samples is not None and row.nvml_samples >= 5, row.nvml_samples
    assert 0 < row.timed_sm_clock_min_mhz <= row.timed_sm_clock_mhz
    assert row.sm_clock_application_mhz is None or row.sm_clock_application_mhz > 0
    assert 0 < row.timed_power_pct <= row.timed_power_max_pct < 150
    assert 10 < row.timed_temperature_max_c < 110
    assert "gpu_idle" not in (row.timed_clock_limits or "")
    throttled = row.finding("throttled")
    assert throttled is None or "NVML samples over the timed calls" in throttled.message


def test_no_clocks_samples_nothing(nvml, tmp_path):
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import run_cells
    from attnprof.pipeline.rows import cell_row
    from attnprof.variants import sdpa

    variant = next(v for v in sdpa.variants() if v.name == "sdpa-flash")
    spec = RunSpec(DEV, "bf16", 1, 8, 1024, 64, causal=True)
    config = Config(shapes=[{"batch": 1, "heads": 8, "seq": 1024, "head_dim": 64}], output_dir=tmp_path)
    results, _ = run_cells([(variant, spec)], config, MeasureOptions(min_time_s=0.05, clocks=False))
    row = cell_row(results[0])
    assert results[0].ok and row.nvml_samples is None and results[0].gpu_health_note is None
