import pytest

from attnprof.analysis.roofline import achieved, achieved_for, arithmetic_intensity, attention_flops, min_bytes
from attnprof.registry import RunSpec


def spec(**kw):
    base = dict(device="cpu", dtype="bf16", batch=2, heads=4, seq=8, head_dim=16, causal=False)
    base.update(kw)
    return RunSpec(**base)


def test_flops_full_and_causal():
    assert attention_flops(spec()) == 4 * 2 * 4 * 8 * 8 * 16
    assert attention_flops(spec(causal=True)) == 4 * 2 * 4 * (8 * 9 // 2) * 16  # exact pairs, not S²/2


def test_gqa_does_not_change_flops():
    assert attention_flops(spec(kv_heads=1)) == attention_flops(spec())


@pytest.mark.parametrize("dtype,size", [("bf16", 2), ("fp16", 2), ("fp32", 4)])
def test_min_bytes_by_dtype(dtype, size):
    per_tensor = 2 * 4 * 8 * 16  # B*H*S*D
    assert min_bytes(spec(dtype=dtype)) == 4 * per_tensor * size


def test_min_bytes_gqa_reads_fewer_kv_heads():
    # q and out have 4 heads, k and v 1 head each
    assert min_bytes(spec(kv_heads=1)) == (2 * 2 * 4 * 8 * 16 + 2 * 2 * 1 * 8 * 16) * 2


def test_min_bytes_does_not_depend_on_causal():
    assert min_bytes(spec(causal=True)) == min_bytes(spec(causal=False))


def test_min_bytes_unknown_dtype():
    with pytest.raises(ValueError):
        min_bytes(spec(dtype="int8"))


def test_achieved_compute_bound():
    # intensity 1000 FLOP/B, ridge 100 -> compute bound
    a = achieved(flops=1e12, bytes_moved=1e9, seconds=0.01, peak_flops=200e12, peak_read=2e12)
    assert a["tflops"] == pytest.approx(100.0)
    assert a["achieved_gbps"] == pytest.approx(100.0)
    assert a["pct_of_peak"] == pytest.approx(50.0)
    assert a["pct_of_read_bandwidth"] == pytest.approx(5.0)
    assert a["ridge"] == pytest.approx(100.0)
    assert a["bound"] == "compute"
    assert a["pct_of_roofline"] == pytest.approx(50.0)


def test_achieved_memory_bound():
    # intensity 10 FLOP/B below ridge 100; attainable = 10 * 2e12 = 20 TFLOP/s
    a = achieved(flops=1e10, bytes_moved=1e9, seconds=1e-3, peak_flops=200e12, peak_read=2e12)
    assert a["bound"] == "memory"
    assert a["tflops"] == pytest.approx(10.0)
    assert a["achieved_gbps"] == pytest.approx(1000.0)
    assert a["pct_of_read_bandwidth"] == pytest.approx(50.0)
    assert a["pct_of_roofline"] == pytest.approx(50.0)


def test_achieved_without_peaks_gives_no_percentages():
    a = achieved(1e9, 1e6, 1e-3, None, None)
    assert a["tflops"] == pytest.approx(1.0)
    assert a["pct_of_peak"] is None and a["bound"] is None and a["ridge"] is None
    assert set(a) >= {"tflops", "pct_of_peak", "achieved_gbps", "bound"}


def test_achieved_rejects_nonpositive_time():
    with pytest.raises(ValueError):
        achieved(1.0, 1.0, 0.0, 1.0, 1.0)


def test_achieved_for_uses_tflops_and_gbps_units():
    s = RunSpec("cuda", "bf16", 4, 16, 8192, 128, causal=True)
    flops = attention_flops(s)
    assert flops == 4 * 4 * 16 * (8192 * 8193 // 2) * 128
    a = achieved_for(s, seconds=flops / 500e12, peak_tflops=800.0, read_gbps=4300.0)
    assert a["tflops"] == pytest.approx(500.0)
    assert a["pct_of_peak"] == pytest.approx(62.5)
    assert a["bound"] == "compute"  # long-sequence attention is far above the H200 ridge
    assert arithmetic_intensity(flops, min_bytes(s)) > 800e12 / 4300e9


def test_intensity_without_bytes_is_infinite():
    assert arithmetic_intensity(1.0, 0.0) == float("inf")


def test_backward_flops_follow_the_tritonbench_convention():
    from attnprof.analysis.roofline import step_flops

    forward = 4 * 2 * 4 * 8 * 8 * 16
    assert step_flops(spec()) == forward
    assert step_flops(spec(mode="bwd")) == 2.5 * forward
    assert step_flops(spec(mode="fwd+bwd")) == 3.5 * forward
    assert step_flops(spec(mode="fwd+bwd", causal=True)) == 3.5 * 4 * 2 * 4 * (8 * 9 // 2) * 16


def test_flops_convention_states_the_factor_and_the_pairs():
    from attnprof.analysis.roofline import flops_convention

    assert flops_convention(spec()) == (
        "fwd = 4·B·H·D × Sq·Skv (exact pairs; backward factor of tritonbench / flash-attention)")
    assert flops_convention(spec(mode="bwd", causal=True)) == (
        "bwd = 2.5 × fwd; fwd = 4·B·H·D × the 36 (query, key) pairs causal keeps "
        "(exact pairs; backward factor of tritonbench / flash-attention)")
    assert flops_convention(spec(mode="fwd+bwd")).startswith("fwd+bwd = 3.5 × fwd; ")


def test_backward_bytes_count_the_gradients_too():
    per_tensor = 2 * 4 * 8 * 16 * 2  # B*H*S*D, bf16
    assert min_bytes(spec(mode="bwd")) == 8 * per_tensor  # q, k, v, out, dout read; dq, dk, dv written
    assert min_bytes(spec(mode="fwd+bwd")) == 12 * per_tensor
    rates = achieved_for(spec(mode="fwd+bwd"), 1.0, None, None)
    assert rates["tflops"] == 3.5 * attention_flops(spec()) / 1e12
