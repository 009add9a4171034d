"""Decode timed the way it is served, on a real CUDA GPU (issue 32): graph-timed by default, eager with
--no-cuda-graph, rotating input copies, and each sdpa backend's graph holding the eager step's kernels.
Run on the device: `pytest -m gpu tests/test_gpu_graph_timing.py`."""

from __future__ import annotations

import pytest
import torch

from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.errors import VariantUnavailableError
from attnprof.pipeline import run_cell
from attnprof.pipeline.rows import cell_row
from attnprof.plugins import load_variants
from attnprof.profiling.cuda_graphs import capture_graph
from attnprof.profiling.graph_check import count_device_work, graph_mismatch, trace_events
from attnprof.profiling.steps import cell_step
from attnprof.registry import RunSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda:0"
#: The issue's decode cell: one query against 32k keys, GQA 32/8.
DECODE = dict(batch=1, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128)
SDPA_BACKENDS = ["sdpa", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn"]


def _spec() -> RunSpec:
    return RunSpec(DEV, "bf16", DECODE["batch"], DECODE["heads"], DECODE["kv_len"], DECODE["head_dim"],
                   kv_heads=DECODE["kv_heads"], causal=True, q_len=DECODE["q_len"], kv_len=DECODE["kv_len"])


def _row(tmp_path, name: str, **measure):
    config = Config(shapes=[DECODE], device=DEV, dtype="bf16", schedule=Schedule(wait=0, warmup=1, active=2),
                    output_dir=tmp_path)
    variant = load_variants(no_plugins=True).registry.get(name)
    result = run_cell(variant, _spec(), config, MeasureOptions(min_time_s=0.05, clocks=False, **measure))
    return cell_row(result)


def test_decode_is_graph_timed_by_default_and_eager_with_no_cuda_graph(tmp_path) -> None:
    graph = _row(tmp_path, "sdpa-cudnn")
    assert graph.ok, graph.reason
    assert graph.cuda_graph is True and graph.timing_method.startswith("cuda-graph replay")
    assert "auto: q_len 1 <= 16" in graph.timing_method and graph.l2_state == "warm"
    assert graph.l2_bytes and graph.working_set_bytes and graph.working_set_bytes > 64 * 2**20
    assert graph.kernel_gbps is not None  # achieved_gbps needs the run's ceiling: compare's, not run_cell's
    eager = _row(tmp_path, "sdpa-cudnn", cuda_graph="off")
    assert eager.ok and eager.cuda_graph is False
    assert "eager (--no-cuda-graph)" in eager.timing_method
    assert graph.latency_us < eager.latency_us  # the host's launch time is out of a replay


def test_rotate_times_cold_copies(tmp_path) -> None:
    row = _row(tmp_path, "sdpa-cudnn", cold_l2="rotate")
    assert row.ok, row.reason
    assert row.l2_state == "rotated" and row.cuda_graph is True
    assert "L2 rotated: each call reads the next of" in row.timing_method
    # the copies exceed 5x the L2 together: the graph holds a multiple of them
    assert row.forwards_per_sample is not None and row.forwards_per_sample >= 2


def test_prefill_stays_eager_under_auto(tmp_path) -> None:
    config = Config(shapes=[{"batch": 1, "heads": 8, "seq": 1024, "head_dim": 64}], device=DEV, dtype="bf16",
                    schedule=Schedule(wait=0, warmup=1, active=2), output_dir=tmp_path)
    variant = load_variants(no_plugins=True).registry.get("sdpa")
    spec = RunSpec(DEV, "bf16", 1, 8, 1024, 64, causal=True)
    row = cell_row(run_cell(variant, spec, config, MeasureOptions(min_time_s=0.05, clocks=False)))
    assert row.ok and row.cuda_graph is False and "eager (auto: q_len 1024 > 16)" in row.timing_method


@pytest.mark.parametrize("name", SDPA_BACKENDS)
def test_each_sdpa_backends_graph_holds_its_eager_kernels(name: str) -> None:
    """The kernels, memsets and memcpys of one eager decode step, against one replay of a graph of 3."""
    from contextlib import nullcontext

    variant = load_variants(no_plugins=True).registry.get(name)
    spec = _spec()
    reason = variant.unavailable_reason(spec)
    if reason:
        pytest.skip(reason)
    with cell_step(variant, spec, 0, lambda what: nullcontext()) as step:
        try:
            step.call()
        except VariantUnavailableError as exc:  # e.g. mem-efficient refuses GQA heads at run time
            pytest.skip(str(exc))
        torch.cuda.synchronize()
        eager = count_device_work(trace_events(step.call))
        graph, _ = capture_graph(step.call, 3)
        replay = count_device_work(trace_events(graph.replay), graph_only=True)
    assert eager.kernels >= 1
    assert graph_mismatch(eager, replay, 3) is None, (eager, replay)
