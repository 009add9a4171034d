"""On a CUDA GPU: the traces users have (no annotations; nn.TransformerEncoder's fast path), the kernel names
cuBLAS, cuBLASLt and ATen give on this GPU decoded by `explain`, and `compare --record-shapes --with-stack`.
Run on the device with `python -m pytest -m gpu tests/test_gpu_usability.py -s` (-s prints the names).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_json import analysis_json

from attnprof.analysis import analyze_trace, explain_kernel
from attnprof.analysis.attribution.regions import WHOLE_TRACE

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=512, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).cuda().eval()
    return model, torch.randn(4, 256, 256, device="cuda")


def test_an_unannotated_cuda_trace_is_one_window_with_its_attention(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    model, x = _encoder()
    with torch.no_grad():
        model(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                model(x)
            torch.cuda.synchronize()
    path = tmp_path / "bare.json"
    prof.export_chrome_trace(str(path))
    analysis = analyze_trace(path)
    assert analysis.region == WHOLE_TRACE and analysis.forwards == 1
    assert analysis.kernels_per_forward and analysis.kernels_per_forward > 0
    ledger = analysis_json(analysis)["attention"]
    print("unannotated encoder on CUDA:", ledger["backends"], ledger["calls_per_forward"], ledger["kernel_time_us"])
    assert ledger["time_base"] == "device" and ledger["calls_per_forward"] == 6  # 3 forwards x 2 layers
    assert set(ledger["backends"]) <= {"native-mha", "flash", "efficient", "cudnn", "math", "eager"}
    assert 0 < ledger["gpu_time_pct"] <= 100


def _kernels(work) -> list:
    """The explanations of the CUDA kernels `work()` launched, each name once."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return [explain_kernel(n) for n in names]


def test_hopper_library_kernel_names_decode(capsys) -> None:
    """bf16 and fp16 GEMMs (matmul, linear with bias, bmm) decode as GEMMs on tensor cores; fp32 GEMMs with
    TF32 on and off decode with a yes or no for tensor cores; every name is printed, for the record."""
    a32 = torch.randn(2048, 2048, device="cuda")
    b32 = torch.randn(2048, 2048, device="cuda")

    def sixteen_bit() -> None:
        for dtype in (torch.bfloat16, torch.float16):
            a, b = a32.to(dtype), b32.to(dtype)
            (a @ b).relu_()
            torch.nn.functional.linear(a, b, bias=b[0])
            torch.bmm(a.view(8, 256, 2048), b.view(8, 2048, 256))

    def fp32() -> None:
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a32 @ b32
        torch.backends.cuda.matmul.allow_tf32 = False
        (a32 * 2 + 1).to(torch.bfloat16)

    half, full = _kernels(sixteen_bit), _kernels(fp32)
    with capsys.disabled():
        for e in half + full:
            print(f"{e.rule or 'unknown':24} {e.family:12} tc={e.tensor_cores!s:5} {e.name[:160]}")
    gemms = [e for e in half if e.family == "gemm"]
    assert gemms and all(e.tensor_cores is True for e in gemms), [(e.rule, e.name) for e in gemms]
    assert all(e.tensor_cores is not None for e in full if e.family == "gemm")
    assert not [e.name for e in half + full if e.family == "unknown" and ("gemm" in e.name or "nvjet" in e.name)]
    assert all(e.family == "elementwise" for e in half + full if "elementwise_kernel" in e.name)


def test_compare_record_shapes_gives_the_attention_bytes(cli, tmp_path: Path) -> None:
    result = cli("compare", "--device", "cuda", "--dtype", "bf16", "--batch", "2", "--heads", "8", "--seq", "1024",
                 "--head-dim", "64", "--variants", "sdpa-flash,sdpa-math", "--record-shapes", "--with-stack",
                 "--min-time", "0.05",
                 "-o", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["measure"]["record_shapes"] is True and document["measure"]["with_stack"] is True
    for row in document["results"]:
        analysis = analyze_trace(row["trace"])
        ledger = analysis_json(analysis)["attention"]
        assert analysis.input_dtype == "bf16"
        assert ledger["bytes_per_forward"] == 4 * 2 * 8 * 1024 * 64 * 2  # q, k, v, o in bf16
        assert ledger["pct_of_read_bandwidth"] is not None
