"""On a CUDA GPU: findings carry their severity and impact in real compares and model rows, the terminal
tables end with "What to look at", and a whole model whose CPU time is mostly a sync wait is not
cpu-bound (the H200 case: sdpa at seq 8192 in configs/model-h200.yaml).

Run on the device with `python -m pytest -m gpu tests/test_gpu_impact.py`. Skipped without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.analysis.findings import FINDINGS

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ("--batch", "4", "--heads", "16", "--seq", "4096", "--head-dim", "128")


def test_compare_findings_carry_severity_and_impact(cli, tmp_path: Path) -> None:
    import msgspec

    from attnprof.report.tables import compare_report
    from attnprof.results.schema import Row

    variants = [arg for name in ("naive", "sdpa-math", "sdpa-flash", "sdpa-cudnn") for arg in ("--variants", name)]
    result = cli("compare", "--device", "cuda", "--dtype", "bf16", *SHAPE, *variants, "--min-time", "0.05",
                 "-o", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {row["variant"]: row for row in json.loads(result.stdout)["results"]}
    for row in rows.values():
        for finding in row["findings"]:
            assert finding["severity"] == FINDINGS.get(finding["id"]).severity
            assert {"impact_us", "impact_pct"} <= set(finding)
            if finding["impact_us"] is not None:
                assert finding["impact_us"] >= 0 and 0 <= finding["impact_pct"] <= 100
    copy = next(f for f in rows["naive"]["findings"] if f["id"] == "hidden-memcpy")
    assert copy["impact_us"] > 0 and 0 < copy["impact_pct"] < 50
    softmax = next(f for f in rows["sdpa-math"]["findings"] if f["id"] == "safe-softmax")
    assert softmax["impact_us"] > 0
    text = compare_report([msgspec.convert(row, Row) for row in rows.values()], "table", None, 120)
    look = text[text.index("What to look at"):]
    assert "hidden-memcpy on naive, 4x16x4096x128 bf16 causal fwd: " in look
    assert "info finding(s) not shown" in text  # the fitted tables leave the info findings to --wide


def test_a_model_forward_that_waits_in_a_sync_is_not_cpu_bound(cli, tmp_path: Path) -> None:
    """The 1.1B Llama at seq 8192 with sdpa: most of the CPU time is one cudaStreamSynchronize wait while the
    GPU computes; the GPU busy time exceeds the CPU's own work, so no cpu-bound, and host-sync costs its bubble."""
    result = cli("model", str(ROOT / "configs" / "model-h200.yaml"), "--attn", "sdpa", "--seq", "8192",
                 "--min-time", "0.2", "-o", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["results"]
    ids = {f["id"]: f for f in row["findings"]}
    assert "cpu-bound" not in ids, ids.get("cpu-bound")
    if "host-sync" in ids:
        sync = ids["host-sync"]
        assert sync["impact_us"] is not None and sync["impact_pct"] < 10  # the bubble, not the wait
        print("host-sync:", sync["message"], sync["impact_us"], sync["impact_pct"])
