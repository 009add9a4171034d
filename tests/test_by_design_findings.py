"""A variant's `by_design` findings restate what it is on purpose (sdpa-math pins the math backend), so
the judge leaves them out of its cells (`CellResult.findings`); `analyze` on the same trace still reports them."""

from __future__ import annotations

from pathlib import Path

from attnprof.analysis import analyze_trace
from attnprof.pipeline.cell import _analyse
from attnprof.pipeline.measured import CellResult
from attnprof.plugins import load_variants
from attnprof.registry import RunSpec

TRACE = Path(__file__).resolve().parent / "data" / "h200" / "8x16x1024x64" / "sdpa-math.json.gz"


def cell_findings(by_design: frozenset[str]) -> list[str]:
    spec = RunSpec(device="cuda:0", dtype="bf16", batch=8, heads=16, seq=1024, head_dim=64)
    result = CellResult(variant="sdpa-math", source="built-in", subject=spec)
    result.trace_path, result.by_design = TRACE, by_design
    _analyse(result, "attnprof", None)
    assert result.analysis is not None
    return [f.id for f in result.findings]


def test_sdpa_math_pins_the_math_backend_on_purpose():
    registry = load_variants(no_plugins=True).registry
    assert registry.get("sdpa-math").by_design == {"backend-fallback"}
    assert not registry.get("sdpa").by_design and not registry.get("sdpa-flash").by_design


def test_a_cell_leaves_out_its_variants_by_design_findings_and_analyze_keeps_them():
    assert "backend-fallback" in analyze_trace(TRACE, dtype="bf16").finding_ids
    assert "backend-fallback" in cell_findings(frozenset())
    kept = cell_findings(frozenset({"backend-fallback"}))
    assert "backend-fallback" not in kept and "fp32-cuda-cores" in kept
