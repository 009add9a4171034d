"""On a CUDA GPU: every built-in variant profiles at the blog's shape, and the blog's findings appear.

Run on the device with `python -m pytest -m gpu`. Skipped on machines without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprof.plugins import load_variants
from attnprof.results.parts import KernelRecord

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

A100_SHAPE = dict(batch=8, heads=16, seq=1024, head_dim=64)
#: The built-ins that run a dense bf16 batch in one process (packed-only and fp8-only ones have their own GPU tests)
BUILTINS = [
    v.name
    for v in load_variants(no_plugins=True).registry.all()
    if not v.collective and not v.varlen_only and "bf16" in v.dtypes
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Profile every built-in once at the a100 shape (bf16, causal) and keep the results."""
    from types import SimpleNamespace

    from attnprof.config import Config, MeasureOptions, Schedule
    from attnprof.pipeline import run_cell
    from attnprof.pipeline.rows import cell_row
    from attnprof.profiling.ceiling import RunCeiling
    from attnprof.registry import RunSpec

    out = tmp_path_factory.mktemp("gpu")
    spec = RunSpec(device="cuda:0", dtype="bf16", causal=True, **A100_SHAPE)
    config = Config(shapes=[A100_SHAPE], schedule=Schedule(wait=1, warmup=1, active=3), output_dir=out)
    measure = MeasureOptions(min_time_s=0.1)
    ceiling = RunCeiling.start("cuda:0", "bf16")
    registry = load_variants(no_plugins=True).registry
    results = {}
    for name in BUILTINS:
        result = run_cell(registry.get(name), spec, config, measure, ceiling)
        entry = cell_row(result)  # the typed row: the fields as JSON carries them
        results[name] = SimpleNamespace(status=result.status, reason=result.reason, trace_path=result.trace_path,
                                        analysis=entry, measures=entry)
    return results


def findings(result) -> set[str]:
    return {f.id for f in result.analysis.findings}


def kernels(result) -> list[KernelRecord]:
    """Kernel entries only (memcpy and memset entries are listed too, with another `kind`)."""
    return [k for k in result.analysis.kernels if k.kind == "kernel"]


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_runs_and_is_correct(results: dict, name: str) -> None:
    result = results[name]
    assert result.status == "ok", result.reason
    assert result.analysis.forwards == 3
    assert result.analysis.kernels_per_forward >= 1
    assert result.analysis.gpu_time_us > 0 and result.analysis.cpu_time_us > 0
    assert result.measures.passed is True
    assert 0 < result.measures.latency_us < 1e6
    assert Path(result.trace_path).stat().st_size > 0


def test_naive_has_the_hidden_memcpy_and_inplace_does_not(results: dict) -> None:
    naive, inplace = results["naive"].analysis, results["inplace"].analysis
    assert naive.memcpy_per_forward == 1
    assert inplace.memcpy_per_forward == 0
    assert naive.kernels_per_forward == inplace.kernels_per_forward
    assert "hidden-memcpy" in findings(results["naive"]) and "hidden-memcpy" not in findings(results["inplace"])
    message = next(f.message for f in results["naive"].analysis.findings if f.id == "hidden-memcpy")
    assert "masked_fill" in message


def test_math_backend_decomposes_on_fp32_cuda_cores(results: dict) -> None:
    math = results["sdpa-math"]
    assert math.analysis.kernels_per_forward > results["inplace"].analysis.kernels_per_forward
    assert {"fp32-cuda-cores", "mask-rebuilt", "safe-softmax"} <= findings(math)


@pytest.mark.parametrize("name", ["sdpa-efficient", "sdpa-flash", "sdpa-cudnn"])
def test_fused_backends_are_one_kernel(results: dict, name: str) -> None:
    result = results[name]
    assert result.analysis.kernels_per_forward == 1
    assert "single-fused-kernel" in findings(result)
    [kernel] = kernels(result)
    assert kernel.tensor_cores is True


def test_flash_occupancy_is_low_by_design(results: dict) -> None:
    [kernel] = kernels(results["sdpa-flash"])
    assert kernel.theoretical_occupancy_pct <= 25
    assert "low-occupancy-by-design" in findings(results["sdpa-flash"])


def test_cudnn_launches_through_the_driver_and_occupancy_is_unreported(results: dict) -> None:
    cudnn = results["sdpa-cudnn"].analysis
    [kernel] = kernels(results["sdpa-cudnn"])
    assert kernel.launch_api.startswith("cuLaunchKernel")
    assert kernel.achieved_occupancy_pct is None
    assert "occupancy-unreported" in findings(results["sdpa-cudnn"])
    assert cudnn.transposes_per_forward == 0


def test_flash_and_efficient_transpose_on_the_cpu_only(results: dict) -> None:
    for name in ("sdpa-flash", "sdpa-efficient"):
        assert results[name].analysis.transposes_per_forward > 0
        assert "metadata-transposes" in findings(results[name])


def test_sdpa_reports_the_backend_it_dispatched_to(results: dict) -> None:
    assert results["sdpa"].measures.backend in {"flash", "efficient", "cudnn"}


def test_throughput_and_memory_are_measured(results: dict) -> None:
    flash = results["sdpa-flash"].measures
    assert flash.tflops > 0 and 0 < flash.pct_of_peak < 100
    assert flash.peak_memory_mib is not None
    assert results["naive"].measures.peak_memory_mib > flash.peak_memory_mib  # naive materialises [S, S]


LEDGER_BACKENDS = {"naive": "eager", "inplace": "eager", "compiled": "eager", "flex": "flex", "sdpa-math": "math",
                   "sdpa-efficient": "efficient", "sdpa-flash": "flash", "sdpa-cudnn": "cudnn"}


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_is_one_attention_call_in_the_ledger(results: dict, name: str) -> None:
    row = results[name].measures
    backend = LEDGER_BACKENDS.get(name, row.backend)  # sdpa: the backend it dispatched to
    assert row.attention_calls_per_forward == 1 and row.attention_backends == f"{backend}:1"
    shares = (name, row.attention_time_us, row.gpu_time_us, row.attention_gpu_pct)
    assert 0 < row.attention_time_us <= row.gpu_time_us and 50 < row.attention_gpu_pct <= 100, shares
    assert row.attention.calls[0].phase == "forward"
    assert not {"gpu-idle", "attention-overhead", "host-sync"} & findings(results[name])


#: The implementation each built-in's attention call ran on the H200, read from its kernels' names.
IMPLEMENTATIONS = {
    "sdpa-flash": "FA2",
    "sdpa-efficient": "mem-efficient",
    "sdpa-math": "unfused",
    "naive": "unfused",
    "flex": "flex Triton",
}


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_every_builtin_names_the_implementation_that_served_it(results: dict, name: str) -> None:
    row = results[name].measures
    assert row.attention_impl == IMPLEMENTATIONS[name]
    assert row.attention is not None and all(c.attention_impl == IMPLEMENTATIONS[name] for c in row.attention.calls)


def test_cudnn_s_implementation_carries_its_engine_knob_and_the_run_s_cudnn_version(results: dict) -> None:
    import gzip
    import json
    import re

    from attnprof.analysis.names import cudnn_version_text

    version = cudnn_version_text(torch.backends.cudnn.version())
    result = results["sdpa-cudnn"]
    assert re.fullmatch(rf"cuDNN {re.escape(str(version))} native-sdpa knob \d+", result.measures.attention_impl or "")
    with gzip.open(result.trace_path, "rt") as handle:
        assert json.load(handle)["cudnn_version"] == str(torch.backends.cudnn.version())  # the profiler wrote it
