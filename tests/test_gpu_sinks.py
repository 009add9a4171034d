"""On a CUDA GPU: attention sinks through naive, inplace and flex (its output scaled by sigmoid(lse − sink)),
forward and backward with dsinks, against the float64 reference; and `compare` of a small sinks config.
Run with `python -m pytest -m gpu tests/test_gpu_sinks.py`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import yaml_writer
from test_sinks import run_cell

from attnprof.registry import RunSpec

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPE = dict(batch=2, heads=8, kv_heads=2, seq=1024, head_dim=64)


@pytest.mark.parametrize("name", ["naive", "inplace", "flex"])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("mask", ["causal", "sliding_window:128"])
def test_sinks_on_cuda_match_the_reference(name: str, mode: str, mask: str) -> None:
    spec = RunSpec(device="cuda", dtype="bf16", mode=mode, mask=mask, score_mod="sinks", **SHAPE)
    check, grads = run_cell(name, spec)
    assert check.passed, check.reason
    if grads is not None:
        assert grads.passed, grads.reason
        assert "dsinks" in grads.rel_errors


def test_flex_sinks_over_a_paged_decode_cache() -> None:
    spec = RunSpec("cuda", "bf16", 8, 32, 4096, 128, 8, q_len=1, page_size=64, score_mod="sinks")
    check, _ = run_cell("flex", spec)
    assert check.passed, check.reason


def test_compare_with_sinks_on_cuda(cli, tmp_path: Path) -> None:
    write = yaml_writer(
        tmp_path / "sinks.yaml",
        {
            "device": "cuda",
            "dtype": "bf16",
            "shapes": [SHAPE],
            "score_mod": {"sinks": True},
            "modes": ["fwd", "fwd+bwd"],
            "variants": ["naive", "flex", "sdpa"],
            "baseline": "naive",
        },
    )
    config = write()
    result = cli("compare", str(config), "-o", str(tmp_path / "out"), "--min-time", "0.05", "--format", "json")
    assert result.exit_code == 0, result.output
    results = Path(json.loads(result.stdout)["files"]["results_json"])
    rows = {(r["variant"], r["mode"]): r for r in json.loads(results.read_text())["results"]}
    for variant in ("naive", "flex"):
        assert rows[(variant, "fwd")]["status"] == "ok" and rows[(variant, "fwd")]["passed"] is True
        step = rows[(variant, "fwd+bwd")]
        assert step["status"] == "ok" and step["grad_rel_error_dsinks"] is not None
    assert rows[("sdpa", "fwd")]["status"].startswith("skipped: score_mod sinks not supported by sdpa")
