"""Contention on a real CUDA GPU: CUDA-event samples of a stable kernel are never taken for a scheduler tick,
and a compare's rows are contended (marked, with the finding and the warning) exactly when their timing says so.
Run on the device: `pytest -m gpu tests/test_gpu_contention.py`."""

from __future__ import annotations

import json

import pytest
import torch

from attnprof.profiling.contention import CONTENTION_LIMIT
from attnprof.profiling.timing import TimingOptions, time_forward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda:0"


@pytest.mark.parametrize("matmuls", [1, 3, 8])
def test_a_stable_millisecond_kernel_is_not_quantized(real_contention, matmuls: int) -> None:
    """8192³ bf16 matmuls back to back: about 1.5 ms each on an H200, so a sample spans several possible ticks;
    CUDA events give one tight cluster, which is a stable timing, not a quantized one."""
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)

    def step() -> None:
        for _ in range(matmuls):
            torch.matmul(a, a)

    t = time_forward(step, DEV, TimingOptions(min_time_s=0.2, warmup_s=0.5))
    assert t.median_us > 500 and t.quantized_tick_ms is None
    assert t.contended == (t.cpu_contention is not None and t.cpu_contention > CONTENTION_LIMIT)


def test_a_gpu_compare_marks_exactly_its_contended_rows(cli, write_config, tmp_path, real_contention) -> None:
    config = write_config(
        device="cuda",
        dtype="bf16",
        shapes=[{"batch": 4, "heads": 16, "seq": 2048, "head_dim": 64}],
        variants=["sdpa", "sdpa-math"],
        baseline="sdpa-math",
    )
    result = cli("compare", str(config), "--min-time", "0.1", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    [folder] = (tmp_path / "out").glob("*-compare")
    rows = json.loads((folder / "results.json").read_text())["results"]
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    for row in rows:
        share, tick = row["cpu_contention"], row["quantized_tick_ms"]
        assert row["contended"] == ((share is not None and share > CONTENTION_LIMIT) or tick is not None), row
        assert ("cpu-contention" in [f["id"] for f in row["findings"]]) == row["contended"]
        assert row["retimed_for_contention"] <= 2
    assert result.stdout.startswith("warning: ") == any(r["contended"] for r in rows)
