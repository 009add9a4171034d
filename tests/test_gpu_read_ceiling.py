"""The read-bandwidth probe on a real CUDA GPU. Run on the device: `pytest -m gpu tests/test_gpu_read_ceiling.py`."""

import re
import time

import pytest
import torch

from attnprof.analysis.hardware import datasheet
from attnprof.devices import triton_installed
from attnprof.profiling import ceiling, read_probe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda:0"


@pytest.fixture(scope="module")
def probe() -> read_probe.ReadBandwidth:
    read_probe.probe_read(DEV)  # compiles the triton configurations (triton's cache keeps them)
    return read_probe.probe_read(DEV)


def test_the_read_ceiling_beats_the_read_half_of_a_copy(probe):
    copy_gbps = 2.0 * ceiling.GPU_COPY_BYTES / ceiling._copy_seconds(ceiling.GPU_COPY_BYTES, torch.device(DEV)) / 1e9
    assert probe.gbps > copy_gbps / 2, (probe.gbps, copy_gbps, probe.method)


def test_the_read_ceiling_reaches_90_percent_of_the_h200_datasheet(probe):
    name = torch.cuda.get_device_name(DEV)
    if "H200" not in name:
        pytest.skip(f"the 90% bar is set for the H200, not {name}")
    sheet = datasheet(name)
    assert sheet is not None and probe.gbps >= 0.9 * sheet.bandwidth_gbps, probe.method


def test_the_method_names_the_winning_candidate(probe):
    timed = [c for c in probe.candidates if c.gbps is not None]
    best = max(timed, key=lambda c: c.gbps or 0.0)
    assert probe.gbps == best.gbps and read_probe.winner(probe.method) == best.name
    opening = rf"{re.escape(best.name)} over [0-9,]+ MiB of fp32, the fastest of {len(probe.candidates)} "
    assert re.match(opening, probe.method)
    assert {"torch.sum", "torch.amax"} <= {c.name for c in timed}


@pytest.mark.skipif(not triton_installed(), reason="needs triton")
def test_every_triton_configuration_compiles_runs_and_sums_right(probe):
    triton = [c for c in probe.candidates if c.name.startswith("triton")]
    assert len(triton) == len(read_probe.TRITON_CONFIGS)
    assert all(c.gbps is not None for c in triton), [c.problem for c in triton]


def test_the_whole_ceiling_takes_under_3_seconds_once_compiled(tmp_path, monkeypatch, probe):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path))
    ceiling.forget()
    started = time.perf_counter()
    c = ceiling.device_ceiling(DEV, "bf16")
    took = time.perf_counter() - started
    assert c.source == "measured" and c.read_gbps and c.read_method and took < 3.0, took
    assert c.ridge == pytest.approx(c.tflops * 1e3 / c.read_gbps)
    ceiling.forget()
    cached = ceiling.device_ceiling(DEV, "bf16")
    assert cached.source == "cached" and (cached.read_gbps, cached.read_method) == (c.read_gbps, c.read_method)
