"""On a CUDA GPU: `attnprof model` with a 2-layer Llama in bf16, transformers' sdpa and eager and the
attnprof-triton plugin's triton-flash inside the model (through transformers' attention interface).

Run on the device with `python -m pytest -m gpu tests/test_gpu_model.py`. Skipped without CUDA.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from model_factories import LLAMA_2L

from attnprof.plugins import load_variants

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]



@pytest.fixture
def llama_2l(model_config):
    """A model config of the 2-layer Llama on the GPU in bf16 at seq 2048; keys override it."""

    def write(**overrides: object) -> Path:
        defaults = {
            "hf_config": LLAMA_2L,
            "batch": 2,
            "seq": [2048],
            "device": "cuda",
            "dtype": "bf16",
            "implementations": ["sdpa", "eager", "triton-flash"],
            "timing": {"min_time_s": 0.1, "min_reps": 3, "max_reps": 50, "warmup_s": 0.5},
            "schedule": {"wait": 1, "warmup": 1, "active": 2},
        }
        return model_config(**{**defaults, **overrides})

    return write


def _rows(result) -> dict[str, dict]:
    return {row["variant"]: row for row in json.loads(result.stdout)["results"]}


@pytest.fixture
def triton_flash() -> None:
    if "triton-flash" not in load_variants(no_plugins=False).registry:
        pytest.skip("the attnprof-triton plugin is not installed")


def test_sdpa_eager_and_triton_flash_inside_a_llama(cli, llama_2l, triton_flash) -> None:
    result = cli("model", str(llama_2l()), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = _rows(result)
    for name in ("sdpa", "eager", "triton-flash"):
        row = rows[name]
        assert row["status"] == "ok", row["status"]
        assert row["device"].startswith("cuda") and row["dtype"] == "bf16"
        assert row["kernels_per_forward"] > 0 and row["gpu_time_us"] > 0 and row["peak_memory_mib"] > 0
        assert 0 < row["latency_us"] and row["timing_method"].startswith("CUDA events")
        for idle in (f for f in row["findings"] if f["id"] == "gpu-idle" and f["impact_us"] is not None):
            assert idle["impact_us"] <= row["latency_us"], idle  # bounded by the forward timed without the profiler
    # labelled by the variant's name (transformers is given attnprof:triton-FLASH: "flash" would send it to the Hub)
    assert rows["triton-flash"]["implementation"] == "attnprof:triton-flash"
    # the implementation that served the calls, from the kernels' names
    assert rows["sdpa"]["attention_impl"].startswith("cuDNN") or rows["sdpa"]["attention_impl"].startswith("FA")
    assert rows["eager"]["attention_impl"] == "unfused" and rows["triton-flash"]["attention_impl"] == "Triton"
    assert rows["triton-flash"]["source"].startswith("attnprof-triton")  # the plugin's distribution (and version)
    # the same weights and token ids: the logits agree to bf16 rounding
    assert rows["triton-flash"]["logits_rel_diff"] < 2e-2 and rows["eager"]["logits_rel_diff"] < 2e-2
    # the plugin's own kernel runs inside the model's region, in a range named after the implementation
    kernels = [k["name"] for k in rows["triton-flash"]["kernels"]]
    assert any("_attn_fwd" in name for name in kernels), kernels
    with gzip.open(rows["triton-flash"]["trace"], "rt") as handle:
        names = {event.get("name") for event in json.load(handle)["traceEvents"]}
    assert {"model_forward", "attnprof:triton-flash"} <= names


def test_training_step_with_triton_flash_inside_the_model(cli, llama_2l, triton_flash) -> None:
    path = llama_2l(seq=[1024], modes=["fwd+bwd"], implementations=["sdpa", "triton-flash"])
    result = cli("model", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = _rows(result)
    assert rows["sdpa"]["status"] == rows["triton-flash"]["status"] == "ok"
    assert rows["triton-flash"]["mode"] == "fwd+bwd" and rows["triton-flash"]["logits_rel_diff"] < 2e-2
    assert any("_attn_bwd" in k["name"] for k in rows["triton-flash"]["kernels"])
    for name in ("sdpa", "triton-flash"):  # the backward's split-K GEMMs end in a cuBLAS splitKreduce_kernel
        [fp32] = [f["message"] for f in rows[name]["findings"] if f["id"] == "fp32-cuda-cores"]
        assert "splitKreduce" not in fp32, fp32  # a reduction of partial products: no FP32 GEMM of its own
        assert "outside the attention calls, launched by aten::matmul → aten::bmm" in fp32, fp32
        assert fp32.startswith("1 GEMM kernel(s) per step"), fp32  # a training step, not a forward


def test_flex_attention_inside_the_model_on_the_gpu(cli, llama_2l) -> None:
    path = llama_2l(seq=[1024], implementations=["sdpa", "flex_attention"])
    result = cli("model", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    row = _rows(result)["flex_attention"]
    assert row["status"] == "ok" and row["logits_rel_diff"] < 2e-2
    assert any("triton" in k["name"] for k in row["kernels"]), [k["name"] for k in row["kernels"]]


def test_fp32_gemms_are_placed_inside_or_outside_the_attention_calls_of_a_llama(cli, llama_2l) -> None:
    """The rotary embedding's GEMM is FP32 by design and runs outside attention: `fp32-cuda-cores`
    says so with its ops. attnprof's sdpa-math, run inside the model, adds FP32 GEMMs of its own
    (the math backend upcasts), and the finding places those inside the attention calls."""
    path = llama_2l(seq=[1024], implementations=["sdpa", "sdpa-math"])
    result = cli("model", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = _rows(result)
    messages = {}
    for name in ("sdpa", "sdpa-math"):
        assert rows[name]["status"] == "ok", rows[name]["status"]
        [messages[name]] = [f["message"] for f in rows[name]["findings"] if f["id"] == "fp32-cuda-cores"]
    assert "outside the attention calls, launched by aten::matmul → aten::bmm" in messages["sdpa"]
    assert "inside" not in messages["sdpa"]
    assert "outside the attention calls, launched by aten::matmul → aten::bmm" in messages["sdpa-math"]
    assert "inside the attention calls (math)" in messages["sdpa-math"]


def test_flex_s_flash_backend_is_named_from_its_kernels(tmp_path: Path) -> None:
    """flex_attention with kernel_options BACKEND "FLASH" runs FlashAttention-4's CuTe DSL kernels from its
    compiled graph: the ledger names it flex FLASH (skipped where torch or flash-attn cannot run it)."""
    from torch.nn.attention.flex_attention import flex_attention
    from torch.profiler import ProfilerActivity, profile, record_function

    from attnprof.analysis import analyze_trace
    from attnprof.analysis.instance.ledger import FLEX_FLASH

    try:
        from torch._inductor.kernel.flex.flex_flash_attention import ensure_flash_available
    except ImportError:
        pytest.skip("this torch has no flex FLASH backend")
    if not ensure_flash_available():
        pytest.skip("flash_attn.cute (FlashAttention-4) is not installed")
    q, k, v = (torch.randn(2, 8, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flex = torch.compile(flex_attention)
    flex(q, k, v, kernel_options={"BACKEND": "FLASH"})  # compile outside the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("attnprof"):
            flex(q, k, v, kernel_options={"BACKEND": "FLASH"})
        torch.cuda.synchronize()
    path = tmp_path / "flex-flash.json"
    prof.export_chrome_trace(str(path))
    ledger = analyze_trace(path, "attnprof").attention
    assert ledger is not None and ledger.attention_impl == FLEX_FLASH, ledger and [c.kernels for c in ledger.calls]
