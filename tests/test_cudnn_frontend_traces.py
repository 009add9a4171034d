"""`analyze` on traces of cudnn-frontend's graph API, captured on the H200 by the attnprof-cudnn-frontend plugin
(configs/fp8-h200.yaml at 1x64x8192x128/kv8 causal): the cuDNN kernel is launched by the library under no torch
op, so the ledger finds the call by its kernel and says why its bytes are unknown instead of printing zeros."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprof.analysis import analyze_trace

DATA = Path(__file__).parent / "data" / "h200-cudnn-frontend"


def _analysis(name: str):
    return analyze_trace(DATA / f"{name}.json.gz")


@pytest.mark.parametrize(
    ("name", "knob", "dtype"),
    [("cudnn-fe_1x64x8192x128-kv8_bf16_causal_cuda0", "knob 7", "bf16"),
     ("cudnn-fe-fp8_1x64x8192x128-kv8_fp8_causal_cuda0", "knob 32", "fp8")],
)
def test_a_graph_api_forward_is_one_cudnn_call_without_shapes(name, knob, dtype):
    analysis = _analysis(name)
    (call,) = analysis.attention.calls
    assert (call.backend, call.phase) == ("cudnn", "forward")
    assert call.op.startswith("cudnn_generated_fort_native_sdpa")
    assert knob in call.attention_impl()
    assert analysis.attention.calls_per_forward == 1 and analysis.input_dtype == dtype
    assert call.traffic is None  # no op, so no recorded shapes: bytes unknown, never zero
    (note,) = [n for n in analysis.notes if n.startswith("attention bytes")]
    assert "ran under no torch op" in note and call.op in note
    # the kernel is nearly all of the forward's device time (the rest: cuDNN's memsets)
    assert call.time_us > 0.99 * analysis.kernel_time_us


def test_the_fp8_backward_counts_its_dequantizing_kernels_outside_the_attention_call():
    analysis = _analysis("cudnn-fe-fp8_1x64x8192x128-kv8_fp8_causal_bwd_cuda0")
    (call,) = analysis.attention.calls
    assert call.phase == "backward" and call.backend == "cudnn"
    # the plugin's scale updates and bf16 gradients are elementwise kernels around cuDNN's one backward kernel
    assert analysis.kernels_per_forward > 20
    assert 0.8 * analysis.kernel_time_us < call.time_us < 0.95 * analysis.kernel_time_us
