"""On a CUDA GPU: packed variable-length batches (issue 34). Each built-in varlen variant against the float64
reference per sequence, forward and gradients (or its skip reason, torch's own for nested tensors), the nested
SDPA call named in the trace's ledger with its sequences, and configs/varlen-h200.yaml end to end.

Run on the device with `python -m pytest -m gpu tests/test_gpu_varlen.py`. Skipped without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from attnprof.errors import VariantUnavailableError  # noqa: E402
from attnprof.profiling.correctness import check_variant_output  # noqa: E402
from attnprof.profiling.gradcheck import check_grads  # noqa: E402
from attnprof.profiling.inputs import make_inputs  # noqa: E402
from attnprof.profiling.steps import build_step  # noqa: E402
from attnprof.registry import RunSpec  # noqa: E402
from attnprof.variants import builtin_variants  # noqa: E402

LENGTHS = (1000, 17, 4096, 300, 2048, 1)
REPO = Path(__file__).resolve().parents[1]


def packed(causal: bool, mode: str = "fwd", kv_heads: int | None = 2) -> RunSpec:
    return RunSpec("cuda", "bf16", 1, 8, sum(LENGTHS), 128, kv_heads, causal=causal, mode=mode, seq_lens=LENGTHS)


@pytest.mark.parametrize("name", ["padded-sdpa", "nested-sdpa", "flex", "naive"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_varlen_variants_match_float64_per_sequence(name, causal, mode):
    spec = packed(causal, mode, kv_heads=None if name == "nested-sdpa" else 2)
    variant = next(v for v in builtin_variants() if v.name == name)
    if reason := variant.unavailable_reason(spec):
        pytest.skip(reason)
    try:
        state = variant.setup(spec)
    except VariantUnavailableError as exc:  # torch's reason (nested tensors: per backend and causality)
        assert str(exc).startswith("SDPA on nested jagged tensors: ")
        pytest.skip(str(exc))
    q, k, v = make_inputs(spec, seed=0, layout=variant.layout)
    if mode == "fwd":
        out = variant.forward(q, k, v, causal, state)
        check = check_variant_output(out, q, k, v, causal=causal, dtype="bf16", layout=variant.layout,
                                     seq_lens=LENGTHS)
        assert check.passed, check.reason
        return
    step = build_step(spec, lambda q, k, v_: variant.forward(q, k, v_, causal, state), (q, k, v), seed=0)
    result = step.call()
    check = check_grads(result.grads, q, k, v, step.grad_out, causal=causal, dtype="bf16", layout=variant.layout,
                        seq_lens=LENGTHS)
    assert check.passed, (check.reason, check.rel_errors)


def test_nested_sdpa_on_cuda_is_a_varlen_call_in_the_ledger(tmp_path):
    """SDPA hands jagged inputs to its backend op with cum_seq_q: the ledger names the call and its sequences."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function

    from attnprof.analysis import analyze_trace

    lengths = [700, 33, 2048, 5]
    values = torch.randn(sum(lengths), 8, 128, device="cuda", dtype=torch.bfloat16)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    nested = torch.nested.nested_tensor_from_jagged(values, offsets).transpose(1, 2)
    F.scaled_dot_product_attention(nested, nested, nested)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(3):
            with record_function("attention"):
                F.scaled_dot_product_attention(nested, nested, nested)
        torch.cuda.synchronize()
    path = tmp_path / "nested.json"
    prof.export_chrome_trace(str(path))
    calls = analyze_trace(path, region="attention").attention.calls
    assert [c.varlen.kind if c.varlen else None for c in calls] == ["nested"]
    assert calls[0].varlen.sequences == len(lengths)


def test_the_varlen_h200_config_end_to_end(tmp_path):
    from typer.testing import CliRunner

    from attnprof.cli.app import app

    result = CliRunner().invoke(app, ["compare", str(REPO / "configs" / "varlen-h200.yaml"), "-o", str(tmp_path),
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(Path(json.loads(result.stdout)["files"]["results_json"]).read_text())["results"]
    by = {(r["variant"], r["shape"], r["mode"]): r for r in rows}
    for (variant, shape, mode), row in by.items():
        if variant in ("padded-sdpa", "flex", "flash-attn", "triton-flash") and row["status"] == "ok":
            assert row["passed"] is True and row["flops"] > 0
        if variant == "padded-sdpa" and row["status"] == "ok":
            assert row["executed_flops"] > row["flops"]  # the padding
        if variant == "triton-flash":  # each sequence's own tiles: above the useful pairs, far below the padding's
            assert row["status"] == "ok", row["status"]
            padded = by.get(("padded-sdpa", shape, mode), {}).get("executed_flops")
            assert row["flops"] <= row["executed_flops"] and (padded is None or row["executed_flops"] < padded)
    assert any(r["status"] == "ok" for r in rows if r["variant"] == "padded-sdpa")
