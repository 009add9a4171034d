"""mask-convert: a mask converted on every call, on CPU traces captured here with torch.profiler (the
nn.TransformerEncoder of issue 33: a float causal mask with is_causal=True, converted to bool inside each
layer's fast path), with and without recorded shapes, and where nothing is converted."""

from __future__ import annotations

from statistics import median

import pytest
from profiled import capture_cpu, inside, raw_events, regions

from attnprof.analysis import analyze_trace
from attnprof.analysis.instance.mask_convert import broadcasts_to

CONVERT = "mask-convert"
BATCH, HEADS, SEQ = 2, 4, 128


@pytest.fixture(scope="module")
def encoder():
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=64, nhead=HEADS, dim_feedforward=128, dropout=0.0, batch_first=True
    )
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(BATCH, SEQ, 64)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(SEQ)  # float: 0 and -inf
    return model, x, causal


def _mask_casts(path) -> list[float]:
    """Per instance, the CPU time of the aten::to ops of a batch x heads x seq x seq tensor, from the raw trace."""
    events = raw_events(path)
    casts = [
        e
        for e in events
        if e.get("cat") == "cpu_op"
        and e["name"] == "aten::to"
        and (e["args"].get("Input Dims") or [None])[0] == [BATCH, HEADS, SEQ, SEQ]
    ]
    return [sum(e["dur"] for e in casts if inside(region, e)) for region in regions(events)]


def test_a_float_causal_mask_with_is_causal_is_converted_in_every_layer(encoder, tmp_path):
    model, x, causal = encoder
    path = capture_cpu(lambda: model(x, mask=causal, is_causal=True), tmp_path / "encoder.json")
    f = analyze_trace(path).finding(CONVERT)
    assert f is not None and f.severity == "problem"
    assert "\n" not in f.message and f.message.endswith(".")
    assert f.evidence["conversions"] == 2  # one per layer, every forward
    per_instance = _mask_casts(path)
    assert len(per_instance) == 3 and all(per_instance)
    assert f.evidence["host_us"] == pytest.approx(median(per_instance), abs=1e-3)
    assert f.evidence["device_us"] is None  # a CPU-only trace
    assert f.impact_us == pytest.approx(f.evidence["host_us"], abs=1e-3)  # no device: the host time counts
    assert f"of {BATCH}x{HEADS}x{SEQ}x{SEQ}, float → bool x2 per forward, inside calls 1, 2 (native-mha)" in f.message


def test_without_recorded_shapes_the_cast_inside_the_fused_module_still_counts(encoder, tmp_path):
    model, x, causal = encoder
    path = capture_cpu(lambda: model(x, mask=causal, is_causal=True), tmp_path / "plain.json", record_shapes=False)
    f = analyze_trace(path).finding(CONVERT)
    assert f is not None
    assert f.evidence["conversions"] == 2
    assert "dtype: aten::to → aten::_to_copy → aten::copy_ x2 per forward, inside calls 1, 2 (native-mha)" in f.message


def test_is_causal_alone_converts_nothing(encoder, tmp_path):
    model, x, _ = encoder
    path = capture_cpu(lambda: model(x, is_causal=True), tmp_path / "causal.json")
    assert analyze_trace(path).finding(CONVERT) is None


def test_a_boolean_mask_built_once_and_given_to_sdpa_is_not_a_conversion(tmp_path):
    import torch
    import torch.nn.functional as F

    q = torch.randn(BATCH, HEADS, SEQ, 16)
    keep = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    path = capture_cpu(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=keep), tmp_path / "sdpa.json")
    assert analyze_trace(path).finding(CONVERT) is None  # SDPA's own where-conversion is dense-mask's


def test_an_fp32_mask_cast_before_each_call_is_a_conversion_and_a_cast_of_q_is_not(tmp_path):
    import torch
    import torch.nn.functional as F

    q = torch.randn(BATCH, HEADS, SEQ, 16)  # float32, cast to float64 like the mask
    kv = torch.randn(BATCH, HEADS, SEQ, 16, dtype=torch.float64)
    additive = torch.zeros(1, 1, SEQ, SEQ)

    def step():
        F.scaled_dot_product_attention(q.to(torch.float64), kv, kv, attn_mask=additive.to(torch.float64))

    analysis = analyze_trace(capture_cpu(step, tmp_path / "cast.json"))
    f = analysis.finding(CONVERT)
    assert f is not None
    assert f.evidence["conversions"] == 1
    assert f"of 1x1x{SEQ}x{SEQ}, float → double x1 per forward, before call 1" in f.message


def test_a_mask_broadcasts_over_leading_dims_of_one():
    assert broadcasts_to((1, 1, 128, 128), (2, 4, 128, 128))
    assert broadcasts_to((128, 128), (2, 4, 128, 128))
    assert broadcasts_to((2, 1, 128, 128), (2, 4, 128, 128))
    assert not broadcasts_to((2, 4, 128, 64), (2, 4, 128, 128))  # not the queries x keys
    assert not broadcasts_to((2, 16, 128, 128), (2, 1, 128, 128))  # the scores of a broadcast mask
