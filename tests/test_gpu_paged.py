"""On a CUDA GPU: flex over a paged KV cache (a shuffled page pool read through torch's PagedAttention)
against the float64 reference of the logical K/V, and a profiled paged decode cell: one attention call
per forward and the bytes it moved. Run with `python -m pytest -m gpu tests/test_gpu_paged.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprof.plugins import load_variants
from attnprof.registry import RunSpec

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DECODE = dict(batch=32, heads=32, kv_heads=8, seq=4096, head_dim=128, q_len=1)


@pytest.mark.parametrize(
    "fields",
    [
        DECODE | dict(page_size=64),
        DECODE | dict(page_size=16),
        dict(batch=4, heads=16, kv_heads=4, seq=2048, head_dim=64, q_len=4, page_size=32, mask="sliding_window:256"),
        dict(batch=2, heads=8, seq=1024, head_dim=64, q_len=16, page_size=128, causal=False, score_mod="alibi"),
    ],
    ids=["decode-paged64", "decode-paged16", "window-paged32", "none-alibi-paged128"],
)
def test_flex_paged_on_cuda_matches_the_reference(fields: dict) -> None:
    from attnprof.profiling.correctness import check_against_reference
    from attnprof.profiling.inputs import make_inputs

    spec = RunSpec(device="cuda", dtype="bf16", **fields)
    flex = load_variants(no_plugins=True).registry.get("flex")
    assert flex.unavailable_reason(spec) is None
    state = flex.setup(spec)
    q, k, v = make_inputs(spec, seed=0)
    with torch.no_grad():
        state = flex.prepare_inputs(spec, state, q, k, v, 0)
        out = flex.forward(q, torch.zeros_like(k), torch.zeros_like(v), spec.causal, state)  # reads the pool
    torch.cuda.synchronize()
    check = check_against_reference(
        out, q, k, v, causal=spec.causal, dtype="bf16", mask=spec.mask, score_mod=spec.score_mod
    )
    assert check.passed, check.reason


def test_profiled_paged_cell_is_one_call_with_its_bytes(tmp_path: Path) -> None:
    from attnprof.analysis.roofline import bytes_moved
    from attnprof.config import Config, MeasureOptions, Schedule
    from attnprof.pipeline import run_cell
    from attnprof.pipeline.rows import cell_row
    from attnprof.profiling.ceiling import RunCeiling

    shape = {"batch": 32, "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 4096, "head_dim": 128}
    config = Config(shapes=[shape], schedule=Schedule(wait=1, warmup=1, active=3), output_dir=tmp_path)
    registry = load_variants(no_plugins=True).registry
    ceiling = RunCeiling.start("cuda:0", "bf16")
    rows = {}
    for page_size in (None, 64):
        spec = RunSpec(device="cuda:0", dtype="bf16", **DECODE, page_size=page_size)
        result = run_cell(registry.get("flex"), spec, config, MeasureOptions(min_time_s=0.1), ceiling)
        assert result.status == "ok", result.reason
        rows[page_size] = cell_row(result)
    paged, contiguous = rows[64], rows[None]
    assert paged.shape == "32x32x1/4096x128/kv8 paged64" and paged.page_size == 64
    assert paged.attention_calls_per_forward == 1  # the split-KV template and its reduction: one call
    expected = bytes_moved(RunSpec(device="cuda:0", dtype="bf16", **DECODE, page_size=64))
    assert paged.bytes_moved == expected == contiguous.bytes_moved + 32 * 64 * 4
    assert paged.achieved_gbps > 0 and paged.passed is True
    attention = paged.attention
    assert attention.bytes_per_forward and attention.achieved_gbps  # from the recorded pool shapes
    print(  # the figures for docs/validation.md
        f"\npaged64: {paged.latency_us:.1f} us, {paged.achieved_gbps:.0f} GB/s, "
        f"{paged.kernels_per_forward} kernels/fwd; contiguous: {contiguous.latency_us:.1f} us, "
        f"{contiguous.achieved_gbps:.0f} GB/s, {contiguous.kernels_per_forward} kernels/fwd"
    )
