"""The read-bandwidth ceiling: the probe's candidates and method, the ridge point and bound from the read
bandwidth (not the copy), rows and analyses that use the higher figure when an achieved one beats the
ceiling and say so, no percentage above 100 on any path, the datasheet by GPU name, and `analyze` stating
which reference (datasheet or measured on this machine) its percentages use."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import textwrap
import types
from datetime import datetime, timezone
from pathlib import Path

import pytest
from analysis_json import analysis_json
from test_attention_bandwidth import percentages, raw  # the H200 mask traces, and every % in a document

from attnprof.analysis import analyze_trace
from attnprof.analysis.hardware import Peaks, datasheet
from attnprof.analysis.instance.ledger import _share_pct
from attnprof.analysis.roofline import achieved, arithmetic_intensity, bytes_moved, step_flops
from attnprof.devices import triton_installed
from attnprof.peaks import cached_peaks, measured_peaks
from attnprof.pipeline.cell import throughput
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.profiling import ceiling, read_probe
from attnprof.profiling.ceiling import CACHE_VERSION, Ceiling
from attnprof.registry import RunSpec
from attnprof.results.files import to_builtins

MASKS = Path(__file__).parent / "data" / "h200" / "masks"
SPEC = RunSpec("cpu", "fp32", 1, 2, 32, 16, causal=True)  # 67,584 FLOPs over 16,384 bytes: 4.125 FLOP/byte
DECODE = RunSpec("cpu", "bf16", 8, 32, 1, 128, kv_heads=8, q_len=1, kv_len=4096)




# --------------------------------------------------------------------------- rows: ridge, bound, notes


def test_the_ridge_point_is_the_matmul_ceiling_over_the_read_bandwidth_not_the_copy():
    assert step_flops(SPEC) == 67_584 and bytes_moved(SPEC) == 16_384
    latency_us = 1000.0  # 0.0676 GFLOP/s, 16.4 MB/s: far below every peak
    read_ridge = Ceiling(tflops=1.0, bandwidth_gbps=1000.0, source="cached", read_gbps=10.0)  # ridge 100
    tp = throughput(SPEC, latency_us, read_ridge)
    assert tp.bound == "memory"  # 4.125 FLOP/byte < 100; against the copy (ridge 1) it would be compute
    assert tp.peak_read_gbps == 10.0 and tp.pct_of_read_bandwidth == pytest.approx(100 * 0.016384 / 10.0)
    row = cell_row(CellResult("sdpa-math", "built-in", SPEC, throughput=tp))
    assert row.read_reference_gbps == 10.0 and row.read_bandwidth_note is None and row.bound == "memory"
    compute = throughput(SPEC, latency_us, Ceiling(tflops=1.0, bandwidth_gbps=1.0, source="cached", read_gbps=1000.0))
    assert compute.bound == "compute"  # ridge 1 FLOP/byte
    assert throughput(SPEC, latency_us, Ceiling(1.0, 1000.0, "cached")).bound is None  # no read figure, no ridge


def test_an_achieved_rate_above_the_read_ceiling_is_the_reference_and_the_row_says_so():
    c = Ceiling(tflops=1.0, bandwidth_gbps=30.0, source="cached", read_gbps=10.0)
    tp = throughput(SPEC, 1.0, c)  # 16,384 bytes in 1 us: 16.4 GB/s, above the 10 GB/s measured
    assert tp.achieved_gbps == pytest.approx(16.384) and tp.pct_of_read_bandwidth == 100.0
    assert tp.bound == "memory"  # ridge 1e12 / 16.4e9 = 61 FLOP/byte, still above 4.125
    row = cell_row(CellResult("sdpa-math", "built-in", SPEC, throughput=tp))
    assert row.pct_of_read_bandwidth == 100.0 and row.read_reference_gbps == pytest.approx(16.384)
    assert row.peak_read_gbps == 10.0 and row.bound == "memory"
    assert row.read_bandwidth_note == (
        "% of read BW is of 16.4 GB/s (sdpa-math at 1x2x32x16 fp32 causal fwd), "
        "above the read bandwidth measured on cpu (10 GB/s)"
    )


def test_achieved_uses_the_higher_figure_for_every_percentage():
    a = achieved(flops=4e12, bytes_moved=1e9, seconds=1e-2, peak_flops=2e14, peak_read=5e10)  # 400 TF/s, 100 GB/s
    assert a["peak_beaten"] and a["read_beaten"]
    assert a["pct_of_peak"] == a["pct_of_read_bandwidth"] == a["pct_of_roofline"] == 100.0
    assert a["ridge"] == pytest.approx(4e14 / 1e11)


def test_no_percentage_above_100_on_any_row_path():
    """Random steps against random ceilings (some far below the rates): every percentage of `achieved`,
    of a row's throughput and of its serialized row lies in [0, 100]."""
    rng = random.Random(24)
    specs = [SPEC, DECODE, RunSpec("cpu", "fp32", 2, 4, 64, 32, causal=False, mode="fwd+bwd")]
    for _ in range(400):
        spec = rng.choice(specs)
        latency_us = 10 ** rng.uniform(-3, 4)
        c = Ceiling(
            tflops=10 ** rng.uniform(-6, 3) if rng.random() > 0.1 else None,
            bandwidth_gbps=10 ** rng.uniform(-2, 4),
            source="cached",
            read_gbps=10 ** rng.uniform(-3, 4) if rng.random() > 0.1 else None,
        )
        rates = achieved(step_flops(spec), bytes_moved(spec), latency_us * 1e-6, *_peaks(c))
        for key in ("pct_of_peak", "pct_of_read_bandwidth", "pct_of_roofline"):
            assert rates[key] is None or 0 <= rates[key] <= 100, (key, rates)
        tp = throughput(spec, latency_us, c)
        for value in (tp.pct_of_peak, tp.pct_of_read_bandwidth):
            assert value is None or 0 <= value <= 100
        row = cell_row(CellResult("v", "built-in", spec, throughput=tp))
        assert all(0 <= p <= 100 for p in percentages(to_builtins(row)))
        if row.read_bandwidth_note:
            assert row.pct_of_read_bandwidth == 100.0 and tp.achieved_gbps > (c.read_gbps or 0)


def _peaks(c: Ceiling) -> tuple[float | None, float | None]:
    return (c.tflops * 1e12 if c.tflops else None, c.read_gbps * 1e9 if c.read_gbps else None)


def test_the_share_of_gpu_time_never_passes_100():
    rng = random.Random(7)
    for _ in range(200):
        busy, gpu = rng.uniform(0, 500), rng.uniform(1, 400)
        assert 0 <= _share_pct(busy, gpu) <= 100
    assert _share_pct(100.1, 100.0) == 100.0 and _share_pct(5.0, None) is None


# --------------------------------------------------------------------------- the probe


def test_cpu_probe_reads_with_torch_sum_and_says_so():
    found = read_probe.read_candidates("cpu")
    assert [c.name for c in found] == ["torch.sum"] and found[0].nbytes == 64 << 20 and found[0].gbps > 0
    probe = read_probe.probe_read("cpu")
    assert probe.gbps > 0 and read_probe.winner(probe.method) == "torch.sum"
    assert probe.method == "torch.sum over 64 MiB of fp32; median of 10 after 3 warm-ups, perf_counter"


def fake_kernel(monkeypatch, read_sum) -> None:
    module = types.ModuleType("attnprof.profiling.read_kernel")
    module.read_sum = read_sum  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "attnprof.profiling.read_kernel", module)


def test_a_triton_candidate_whose_sums_miss_elements_is_dropped(monkeypatch):
    import torch

    def short(src, out, block, unroll, warps, cache=""):
        out.fill_(1.0)  # as a kernel that read one element per program but counted them all
        return src.numel()

    fake_kernel(monkeypatch, short)
    src = torch.ones(1 << 16)
    got = read_probe._triton_candidate(src, 2, (256, 4, 2, 2, ""))
    assert got.gbps is None and got.problem == "its sums came to 4, not the 65536 elements counted"
    assert got.name == "triton grid-stride sum (tile 256, 4 warps, unroll 2, 2 programs/SM)"


def test_a_triton_candidate_that_fails_is_dropped_with_one_line(monkeypatch):
    import torch

    def broken(*args, **kwargs):
        raise RuntimeError("PTX JIT compilation failed\nmore lines")

    fake_kernel(monkeypatch, broken)
    got = read_probe._triton_candidate(torch.ones(1024), 1, (256, 4, 2, 2, ".cg"))
    assert got.gbps is None and got.problem == "RuntimeError: PTX JIT compilation failed"
    assert got.name.endswith("2 programs/SM, .cg)")


def test_a_good_triton_candidate_counts_the_bytes_it_read(monkeypatch):
    import torch

    def exact(src, out, block, unroll, warps, cache=""):
        elements = src.numel() // (out.numel() * unroll * block) * out.numel() * unroll * block
        out.fill_(elements / out.numel())
        return elements

    fake_kernel(monkeypatch, exact)
    got = read_probe._triton_candidate(torch.ones(10_000), 2, (1024, 4, 2, 2, ""))
    assert got.problem is None and got.nbytes == 8192 * 4 and got.gbps > 0


def test_the_method_names_the_winner_then_the_others_and_the_dropped(monkeypatch):
    found = [
        read_probe.ReadCandidate("torch.sum", 2 << 30, 4200.0),
        read_probe.ReadCandidate(read_probe.triton_name(4096, 8, 2, 4, ""), 2 << 30, 4480.5),
        read_probe.ReadCandidate(read_probe.triton_name(2048, 4, 4, 8, ""), 0, None, "RuntimeError: no"),
        read_probe.ReadCandidate("torch.amax", 2 << 30, 4150.0),
    ]
    monkeypatch.setattr(read_probe, "read_candidates", lambda device: found)
    probe = read_probe.probe_read("cpu")
    assert probe.gbps == 4480.5
    assert probe.method == (
        "triton grid-stride sum (tile 4096, 8 warps, unroll 2, 4 programs/SM) over 2,048 MiB of fp32, the fastest of "
        "4 read-only candidates (others, GB/s: torch.sum 4,200, torch.amax 4,150); dropped triton grid-stride sum "
        "(tile 2048, 4 warps, unroll 4, 8 programs/SM): RuntimeError: no; median of 10 after 3 warm-ups, perf_counter"
    )
    assert read_probe.winner(probe.method) == found[1].name


INTERPRETED = textwrap.dedent(
    """
    import json, torch
    from attnprof.profiling.read_kernel import read_sum
    src = torch.ones(3 * 4096 + 100)
    src[5], src[4096 + 7] = 3.0, 5.0   # 2 and 4 above the ones
    results = []
    for block, unroll, programs, cache in ((256, 2, 4, ""), (512, 1, 3, ".cg")):
        out = torch.empty(programs)
        elements = read_sum(src, out, block, unroll, 4, cache)
        results.append([elements, out.tolist()])
    print(json.dumps(results))
    """
)


@pytest.mark.skipif(not triton_installed(), reason="needs triton (its interpreter runs the kernel on CPU)")
def test_the_triton_kernel_reads_every_counted_element_once_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode and "0-dimensional arrays" in out.stderr:
        pytest.skip("this triton's interpreter cannot run a loop bounded by a runtime value (numpy 2.5)")
    assert out.returncode == 0, out.stderr[-2000:]
    (n1, sums1), (n2, sums2) = json.loads(out.stdout)
    assert n1 == 12 * 1024 and sum(sums1) == n1 + 2 + 4  # 12 steps of 4 x 2 x 256; both marked elements inside
    assert sums1[0] == n1 / 4 + 2 + 4  # both in program 0's tiles of 256: tile 0, and tile 16 (16 % 4 programs == 0)
    assert n2 == 8 * 3 * 512 and sum(sums2) == n2 + 2 + 4  # 8 steps of 3 x 512 = 12,288 of 12,388 elements


# --------------------------------------------------------------------------- analyses: datasheet or measured


def measured(read_gbps: float, tflops: float = 750.0) -> Peaks:
    return Peaks.measured(read_gbps, tflops, "2026-05-01")


def test_run_cells_compare_attention_with_the_measured_peaks():
    d = analysis_json(analyze_trace(MASKS / "decode-cudnn.json.gz", peaks=lambda gpu, dtype: measured(4500.0)))
    ledger = d["attention"]
    assert ledger["read_bandwidth_basis"] == "measured" and ledger["read_bandwidth_gbps"] == 4500.0
    assert ledger["read_bandwidth_source"] == "read bandwidth measured on this machine 4500 GB/s (2026-05-01)"
    assert ledger["pct_of_read_bandwidth"] == pytest.approx(100 * 4358.7 / 4500, abs=0.01)
    message = next(f["message"] for f in d["findings"] if f["id"] == "bandwidth-bound")
    assert "97% of the read bandwidth measured on this machine 4500 GB/s (2026-05-01)" in message
    assert "below the ridge point of 167" in message  # 750 TFLOP/s over 4,500 GB/s, not the datasheet's 206


def test_without_measured_peaks_analyze_says_it_uses_the_datasheet():
    for peaks in (None, lambda gpu, dtype: None):
        ledger = analysis_json(analyze_trace(MASKS / "decode-cudnn.json.gz", peaks=peaks))["attention"]
        assert (ledger["read_bandwidth_basis"], ledger["read_bandwidth_gbps"]) == ("datasheet", 4800.0)
        assert ledger["read_bandwidth_source"] == "datasheet H200 4800 GB/s"


def test_the_lookup_gets_the_gpu_the_trace_names_and_its_input_dtype():
    asked = []
    analyze_trace(MASKS / "decode-cudnn.json.gz", peaks=lambda gpu, dtype: asked.append((gpu, dtype)))
    assert asked == [("NVIDIA H200", "bf16")]


def test_an_attention_faster_than_the_measured_read_bandwidth_is_the_reference_and_noted():
    d = analysis_json(analyze_trace(MASKS / "decode-cudnn.json.gz", peaks=lambda gpu, dtype: measured(4200.0)))
    ledger = d["attention"]
    assert ledger["read_bandwidth_basis"] == "achieved" and ledger["pct_of_read_bandwidth"] == 100.0
    assert ledger["read_bandwidth_gbps"] == pytest.approx(4358.7, abs=0.1)
    assert ledger["read_bandwidth_source"].startswith("achieved 4359 GB/s, above the read bandwidth measured on")
    assert any(n.startswith("attention achieved 4359 GB/s, above the read bandwidth measured") and
               "the probe's kernels read slower than this attention" in n for n in d["notes"])
    assert max(percentages(d)) <= 100.0


@pytest.mark.parametrize("name", ["decode-flash", "decode-cudnn", "decode-math", "decode-flex", "dense-mask"])
def test_no_percentage_above_100_against_any_measured_figure(name: str):
    rng = random.Random(name)
    for _ in range(4):
        peaks = measured(10 ** rng.uniform(1, 4), 10 ** rng.uniform(1, 3))
        d = analyze_trace(MASKS / f"{name}.json.gz", peaks=lambda gpu, dtype, p=peaks: p)
        found = percentages(analysis_json(d))
        assert found and max(found) <= 100.0


def test_measured_peaks_need_both_figures():
    assert measured_peaks(Ceiling(750.0, 8000.0, "cached", read_gbps=4500.0, measured_at="2026-05-01T10:00:00+00:00"))
    assert measured_peaks(Ceiling(750.0, 8000.0, "cached")) is None
    assert measured_peaks(Ceiling(None, None, "none")) is None and measured_peaks(None) is None
    p = measured_peaks(Ceiling(750.0, 8000.0, "cached", read_gbps=4500.0, measured_at="2026-05-01T10:00:00+00:00"))
    assert p is not None and p.basis == "measured" and p.ridge == pytest.approx(750e3 / 4500)
    assert p.source == "read bandwidth measured on this machine 4500 GB/s (2026-05-01)"


def write_cache_entry(gpu: str, dtype: str, read_gbps: float, tflops: float) -> None:
    entry = {
        "tflops": tflops, "bandwidth_gbps": 8000.0, "read_gbps": read_gbps, "method": "m", "read_method": "r",
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch_version": "2.11.0",
        "driver_version": "580.1",
    }
    path = ceiling.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": CACHE_VERSION, "entries": {f"{gpu}|{dtype}": entry}}))


def test_analyze_uses_the_figure_measured_on_this_machine_for_that_gpu(cli):
    trace = str(MASKS / "decode-cudnn.json.gz")
    ledger = json.loads(cli("analyze", trace, "--format", "json").stdout)["attention"]
    assert ledger["read_bandwidth_basis"] == "datasheet"  # an empty cache
    write_cache_entry("NVIDIA H200", "bf16", 4450.0, 760.0)
    today = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    assert cached_peaks("NVIDIA H200", "bf16") == Peaks.measured(4450.0, 760.0, today)
    result = cli("analyze", trace, "--format", "json")
    ledger = json.loads(result.stdout)["attention"]
    assert ledger["read_bandwidth_basis"] == "measured" and ledger["read_bandwidth_gbps"] == 4450.0
    text = cli("analyze", trace).stdout
    assert "of the read bandwidth measured on this machine 4450 GB/s" in " ".join(text.split())


def test_analyze_of_another_gpu_or_dtype_keeps_the_datasheet(cli):
    write_cache_entry("NVIDIA H100 80GB HBM3", "bf16", 3000.0, 700.0)
    assert cached_peaks("NVIDIA H200", "bf16") is None
    trace = copy.deepcopy(raw("decode-cudnn"))
    assert analysis_json(analyze_trace(trace, peaks=cached_peaks))["attention"]["read_bandwidth_basis"] == "datasheet"
    write_cache_entry("NVIDIA H200", "fp16", 4450.0, 760.0)
    assert analysis_json(analyze_trace(trace, peaks=cached_peaks))["attention"]["read_bandwidth_basis"] == "datasheet"
    assert cached_peaks(None, "bf16") is None and cached_peaks("NVIDIA H200", None) is None


# --------------------------------------------------------------------------- datasheets by name


@pytest.mark.parametrize(
    ("name", "gpu", "read_gbps"),
    [
        ("NVIDIA H200", "H200", 4800),
        ("NVIDIA H200 NVL", "H200 NVL", 4800),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350),
        ("NVIDIA H100", "H100 SXM", 3350),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000),
        ("NVIDIA H800", "H800 SXM", 3350),
        ("NVIDIA H800 PCIe", "H800 PCIe", 2000),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555),
        ("NVIDIA A800-SXM4-80GB", "A800 80GB SXM", 2039),
        ("NVIDIA A800 80GB PCIe", "A800 80GB PCIe", 1935),
        ("nvidia l40s", "L40S", 864),  # case does not matter
        ("NVIDIA B200", "B200", 8000),
    ],
)
def test_the_datasheet_read_bandwidth_by_name_variant(name: str, gpu: str, read_gbps: float):
    sheet = datasheet(name)
    assert sheet is not None and (sheet.gpu, sheet.bandwidth_gbps) == (gpu, read_gbps)
    assert sheet.peaks == Peaks(read_gbps, sheet.tensor_tflops, "datasheet", f"datasheet {gpu} {read_gbps:g} GB/s")


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "Tesla V100-SXM2-32GB", "NVIDIA A10G", "NVIDIA H20"])
def test_gpus_not_in_the_table_have_no_datasheet(name: str):
    assert datasheet(name) is None


def test_intensity_and_ridge_agree_on_decode_being_memory_bound():
    sheet = datasheet("NVIDIA H200")
    assert sheet is not None
    intensity = arithmetic_intensity(step_flops(DECODE), bytes_moved(DECODE))
    assert intensity < 10 < sheet.peaks.ridge
