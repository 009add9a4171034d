"""Measurement on a real CUDA GPU. Run on the device: `pytest -m gpu tests/test_gpu_measure.py`."""

import pytest
import torch
import torch.nn.functional as F

from attnprof.errors import VariantFailure
from attnprof.profiling import ceiling
from attnprof.profiling.correctness import check_variant_output
from attnprof.profiling.cuda_graphs import capture_graph, event_time_s, flush_buffer
from attnprof.profiling.environment import collect_environment
from attnprof.profiling.inputs import make_inputs
from attnprof.profiling.masking_probe import probe_fully_masked
from attnprof.profiling.memory import MIB, peak_extra_memory_mib
from attnprof.profiling.timing import TimingOptions, time_forward
from attnprof.registry import RunSpec, Variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda:0"
QUICK = dict(min_time_s=0.05, warmup_s=0.2)


def sdpa_fn(b=4, h=16, s=2048, d=128, dtype="bf16"):
    spec = RunSpec(DEV, dtype, b, h, s, d, causal=True)
    q, k, v = make_inputs(spec, 0)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_eager_timing_is_sane_for_a_matmul():
    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    t = time_forward(lambda: a @ a, DEV, TimingOptions(**QUICK))
    tflops = 2 * 4096 ** 3 / (t.median_us * 1e-6) / 1e12
    assert 50 < tflops < 2000
    assert "CUDA events per call" in t.method and not t.cuda_graph
    assert 10 <= t.reps <= 1000 and t.cold_ms > 0
    assert t.p25_us <= t.median_us <= t.p75_us


def test_tiny_and_huge_calls_get_time_based_reps():
    x = torch.ones(16, device=DEV)
    tiny = time_forward(lambda: x + 1, DEV, TimingOptions(min_time_s=0.05, max_reps=500))
    assert tiny.reps == 500  # a few µs a call: capped
    big = torch.randn(8192, 8192, device=DEV, dtype=torch.float32)
    huge = time_forward(lambda: big @ big, DEV, TimingOptions(min_time_s=0.01, min_reps=5, warmup_s=0.2))
    assert huge.reps == 5  # each fp32 8192³ product takes milliseconds


def test_cuda_graph_replay_matches_eager_for_a_big_kernel():
    fn = sdpa_fn()
    eager = time_forward(fn, DEV, TimingOptions(**QUICK))
    graphed = time_forward(fn, DEV, TimingOptions(cuda_graph=True, **QUICK))
    assert graphed.cuda_graph and graphed.method.startswith("cuda-graph replay")
    assert abs(graphed.median_us - eager.median_us) / eager.median_us < 0.15


def test_cuda_graph_spreads_its_launch_over_many_forwards():
    x = torch.ones(1024, device=DEV)
    graphed = time_forward(lambda: x + 1, DEV, TimingOptions(cuda_graph=True, **QUICK))
    # a one-forward replay of a ~1 µs kernel measures ~17 µs on an H200 (the graph launch), so k is large
    assert graphed.cuda_graph and graphed.forwards_per_sample >= 16
    assert f"divided by {graphed.forwards_per_sample}" in graphed.method
    single = time_forward(lambda: x + 1, DEV, TimingOptions(cuda_graph=True, flush_l2=True, **QUICK))
    assert single.cuda_graph and single.forwards_per_sample == 1 and "divided" not in single.method
    # a one-element add is ~2 µs of GPU work; one replay per forward would add the graph launch
    assert graphed.median_us < 5.0, graphed


def test_cuda_graph_of_many_forwards_matches_one_big_graph():
    fn = sdpa_fn(b=8, h=16, s=1024, d=64)
    graphed = time_forward(fn, DEV, TimingOptions(cuda_graph=True, **QUICK))
    assert graphed.forwards_per_sample > 1
    graph, _ = capture_graph(fn, 100)
    times = []
    for _ in range(10):
        times.append(event_time_s(graph.replay) / 100 * 1e6)
    reference = sorted(times)[5]
    assert abs(graphed.median_us - reference) / reference < 0.05, (graphed.median_us, reference)


def test_capture_failure_falls_back_and_says_so():
    x = torch.ones(1024, device=DEV)

    def syncs():  # .item() synchronizes, which a capture cannot hold
        return x * float(x.sum().item())

    t = time_forward(syncs, DEV, TimingOptions(cuda_graph=True, **QUICK))
    assert not t.cuda_graph
    assert "cuda-graph capture failed" in t.method and "fell back to eager" in t.method
    assert (x + 1).sum().item() == 2048  # the device still works
    assert torch.randn(8, device=DEV).isfinite().all()  # and the RNG left capture mode


def test_flush_l2_buffer_and_method():
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = flush_buffer(torch.device(DEV))
    assert buf.numel() >= max(256 * MIB, 2 * l2)
    del buf
    t = time_forward(sdpa_fn(b=1, s=1024, d=64), DEV, TimingOptions(flush_l2=True, **QUICK))
    assert t.flush_l2 and "L2 flushed" in t.method


def test_peak_memory_counts_new_allocations_only():
    held = torch.empty(256 * MIB, dtype=torch.uint8, device=DEV)  # like inputs: already allocated
    mib = peak_extra_memory_mib(lambda: torch.empty(64 * MIB, dtype=torch.uint8, device=DEV), DEV)
    assert 64 <= mib < 66
    del held


def test_real_oom_becomes_variant_failure():
    def too_big():
        return torch.empty(1 << 50, dtype=torch.uint8, device=DEV)  # 1 PiB

    with pytest.raises(VariantFailure, match=r"^out of memory: "):
        time_forward(too_big, DEV)
    with pytest.raises(VariantFailure, match=r"^out of memory: "):
        peak_extra_memory_mib(too_big, DEV)
    assert torch.ones(4, device=DEV).sum().item() == 4


def test_measured_ceiling_is_plausible(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path))
    ceiling.forget()
    c = ceiling.device_ceiling(DEV, "bf16")
    assert 50 < c.tflops < 2500 and 300 < c.bandwidth_gbps < 20000
    assert c.source == "measured" and c.method.startswith("8192x8192x8192 bf16")
    assert c.torch_version == torch.__version__ and c.reason == "no cached figure"
    ceiling.forget()
    cached = ceiling.device_ceiling(DEV, "bf16")
    assert cached.source == "cached" and cached.tflops == c.tflops and cached.driver_version == c.driver_version


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_sdpa_passes_correctness_full_and_subset(dtype):
    small = RunSpec(DEV, dtype, 1, 4, 256, 64, causal=True)
    q, k, v = make_inputs(small, 0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert check_variant_output(out, q, k, v, causal=True, dtype=dtype).scope == "full"
    big = RunSpec(DEV, dtype, 2, 8, 4096, 128, kv_heads=2, causal=True)
    q, k, v = make_inputs(big, 0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    check = check_variant_output(out, q, k, v, causal=True, dtype=dtype)
    assert check.passed and check.scope.startswith("subset"), check


def _masked(forward_name, fn):
    return Variant(name=forward_name, description=forward_name, forward=fn)


def test_masking_probe_on_gpu():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def math_fwd(q, k, v, causal, state, attn_mask=None):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)

    def flash_fwd(q, k, v, causal, state, attn_mask=None):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)

    def naive_fwd(q, k, v, causal, state, attn_mask=None):
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        return torch.softmax(s.masked_fill(~attn_mask, float("-inf")), -1) @ v

    assert probe_fully_masked(_masked("m", math_fwd), DEV, "bf16") is False
    assert probe_fully_masked(_masked("n", naive_fwd), DEV, "bf16") is True
    assert probe_fully_masked(_masked("f", flash_fwd), DEV, "bf16") is None  # flash takes no mask


def test_environment_on_gpu():
    env = collect_environment(DEV)
    assert env["gpu_name"] and env["compute_capability"].count(".") == 1
    assert env["torch_cuda"] and env["sm_count"] > 0


def test_clock_sampler_sees_the_gpu_and_the_runner_attaches_its_clock(tmp_path):
    import shutil
    import time

    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline import run_cells
    from attnprof.pipeline.rows import cell_row
    from attnprof.profiling.clocks import ClockSampler, clock_window
    from attnprof.variants import sdpa

    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi")
    sampler = ClockSampler(DEV).start()
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    start = time.time()
    while time.time() - start < 0.5:
        a @ a
    torch.cuda.synchronize()
    end = time.time()
    samples = sampler.stop()
    assert sampler.unavailable is None and len(samples) >= 5, sampler.unavailable
    window = clock_window(samples, [(start, end)])
    assert window is not None and 300 < window.sm_mhz <= window.max_sm_mhz
    assert "gpu_idle" not in window.limits

    variant = next(v for v in sdpa.variants() if v.name == "sdpa-flash")
    spec = RunSpec(DEV, "bf16", 2, 8, 1024, 64, causal=True)
    config = Config(shapes=[{"batch": 2, "heads": 8, "seq": 1024, "head_dim": 64}], output_dir=tmp_path)
    results, interrupted = run_cells([(variant, spec)], config, MeasureOptions(min_time_s=0.1))
    assert not interrupted and results[0].ok, results[0].reason
    m = cell_row(results[0])
    assert 300 < m.sm_clock_mhz <= m.sm_clock_max_mhz and m.sm_clock_min_mhz <= m.sm_clock_mhz
