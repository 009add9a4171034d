"""mask-convert: a mask converted on every call, on CPU traces captured here with torch.profiler (the
nn.TransformerEncoder of issue 33: a float causal mask with is_causal=True, converted to bool inside each
layer's fast path), with and without recorded shapes, and where nothing is converted."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from statistics import median

import pytest
from profiled import capture_cpu, inside, raw_events, regions

from attnprof.analysis import analyze_trace, load_trace
from attnprof.analysis.attribution.attribute import find_forwards
from attnprof.analysis.attribution.regions import choose_region
from attnprof.analysis.instance.calls import find_calls, shape_calls
from attnprof.analysis.instance.index import TraceIndex
from attnprof.analysis.instance.mask_convert import broadcasts_to, convert_kinds, input_dims, mask_converts
from attnprof.analysis.instance.metrics import forward_metrics
from attnprof.analysis.instance.optree import OpTree
from attnprof.errors import AttnprofError

CONVERT = "mask-convert"
BATCH, HEADS, SEQ = 2, 4, 128
DATA = Path(__file__).resolve().parent / "data"
TRACES = sorted(DATA.rglob("*.json.gz"))


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


def _found_alone_and_from_the_shape(source):
    """Per instance of a trace's region: its mask conversions as the analysis found them (each shape's
    converting ops and their kinds found once, dims decoded once per distinct `Input Dims`), and as the
    instance's own ops alone give them (its own tree, calls, kinds and dims); and how many of its ops
    convert something (a kind: whether it is a mask's is then each instance's to say)."""
    trace = load_trace(source)
    attribution = find_forwards(trace, choose_region(trace)[0])
    index = TraceIndex(trace)
    found = []
    for fwd in attribution.forwards:
        metrics = forward_metrics(attribution, fwd, index)
        ledger = metrics.attention if metrics.attention is not None else metrics.cpu_attention
        op_names = tuple(map(trace.cpu_ops.name.__getitem__, fwd.ops))
        tree = OpTree(trace, fwd, tuple(map(index.ledger.role.get, op_names)), op_names)
        own, kinds = shape_calls(tree, index.ledger), convert_kinds(tree, index.ledger)
        alone = mask_converts(tree, find_calls(tree, own), own.in_call, kinds, partial(input_dims, trace))
        found.append((ledger.converts if ledger is not None else [], alone if ledger is not None else [], len(kinds)))
    return found


def test_every_checked_in_trace_converts_the_same_masks_found_per_shape_as_per_instance():
    candidates = 0
    for path in TRACES:
        try:
            found = _found_alone_and_from_the_shape(path)
        except AttnprofError:  # a trace the analysis refuses (tests/data/golden has its message)
            continue
        for from_shape, alone, kinds in found:
            assert from_shape == alone, path.relative_to(DATA)
            candidates += kinds
    assert candidates > 1000  # ops that convert something, each judged per instance: the comparison is not vacuous


def _edited(path: Path, out: Path, edit) -> Path:
    """The trace at `path` with `edit(event)` applied to the cpu ops of its second region instance."""
    document = json.loads(path.read_text())
    second = regions([e for e in document["traceEvents"] if e.get("ph") == "X"])[1]
    for e in document["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and inside(second, e):
            edit(e)
    out.write_text(json.dumps(document))
    return out


@pytest.fixture(scope="module")
def cast_each_call(tmp_path_factory):
    """A CPU trace of three instances that each cast an fp32 mask before their SDPA call."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(BATCH, HEADS, SEQ, 16, dtype=torch.float64)
    additive = torch.zeros(1, 1, SEQ, SEQ)
    path = tmp_path_factory.mktemp("near-miss") / "cast.json"
    return capture_cpu(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=additive.to(torch.float64)), path)


def test_an_instance_of_the_same_shape_whose_cast_is_not_of_the_mask_converts_nothing(cast_each_call, tmp_path):
    def narrower(e):  # the same ops, but the cast's tensors no longer have the mask's dims
        if e["name"] in ("aten::to", "aten::_to_copy", "aten::copy_"):
            dims = e["args"]["Input Dims"]
            e["args"]["Input Dims"] = [[1, 1, SEQ, SEQ // 2] if d == [1, 1, SEQ, SEQ] else d for d in dims]

    found = _found_alone_and_from_the_shape(_edited(cast_each_call, tmp_path / "narrower.json", narrower))
    assert [len(from_shape) for from_shape, _, _ in found] == [1, 0, 1]
    assert all(from_shape == alone for from_shape, alone, _ in found)


def test_an_instance_whose_cast_copies_nothing_converts_nothing(cast_each_call, tmp_path):
    def no_copy(e):  # a cast to the dtype it had: no _to_copy under aten::to (another shape)
        mask_dims = e["args"].get("Input Dims", [None])[0] == [1, 1, SEQ, SEQ]
        if e["name"] in ("aten::_to_copy", "aten::copy_") and mask_dims:
            e["name"] = "aten::alias"

    found = _found_alone_and_from_the_shape(_edited(cast_each_call, tmp_path / "no-copy.json", no_copy))
    assert [len(from_shape) for from_shape, _, _ in found] == [1, 0, 1]
    assert all(from_shape == alone for from_shape, alone, _ in found)
