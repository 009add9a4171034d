"""On a CUDA GPU with Nsight Compute: `--ncu` end to end, `run` (forward and backward), `compare` and `model`,
each row's counters read from the report its pass wrote.

Run on the device with `python -m pytest -m gpu tests/test_gpu_ncu.py`. Skipped without CUDA or `ncu`.
Each pass starts a process under Nsight Compute: about 10 s each at these small shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.analysis.names import explain_kernel
from attnprof.nsight import NsightUnavailableError, find_ncu

torch = pytest.importorskip("torch")


def _ncu_found() -> bool:
    try:
        find_ncu()
    except NsightUnavailableError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _ncu_found(), reason="needs Nsight Compute's ncu"),
]

SHAPE = ("--batch", "1", "--heads", "8", "--seq", "2048", "--head-dim", "64")


def with_counters(row: dict) -> list[dict]:
    """The row's counted kernels, after checking it has its report and counters."""
    assert row["status"] == "ok", row["reason"]
    assert row["ncu_note"] is None, row["ncu_note"]
    report = Path(row["ncu_report"])
    assert report.is_file() and report.parent == Path(row["trace"]).parent
    assert row["counters"] is not None and row["phases_s"]["ncu"] > 0
    return row["counters"]["kernels"]


@pytest.mark.parametrize(("mode", "kernel"), [("fwd", "flash_fwd"), ("bwd", "flash_bwd")])
def test_run_attaches_the_counters_of_the_steps_kernels(cli, tmp_path, mode, kernel) -> None:
    result = cli("run", "--variant", "sdpa-flash", "--device", "cuda", "--dtype", "bf16", *SHAPE, "--mode", mode,
                 "--min-time", "0.05", "-o", str(tmp_path), "--ncu", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    kernels = with_counters(document["results"][0])
    assert any(kernel in k["name"] for k in kernels), [k["name"] for k in kernels]
    assert all(k["duration_us"] and k["duration_us"] > 0 for k in kernels)
    flash = next(k for k in kernels if kernel in k["name"])
    assert flash["dram_read_bytes"] > 0 and flash["achieved_occupancy_pct"] > 0 and flash["stalls"]
    assert document["ncu"]["passes"] == document["ncu"]["with_counters"] == 1 and document["ncu"]["seconds"] > 0
    assert "counters 1/1: sdpa-flash 1x8x2048x64" in result.stderr
    assert "--ncu: 1 of 1 cell(s) got counters" in result.stderr


def test_compare_attaches_counters_to_every_ok_row(cli, tmp_path) -> None:
    result = cli("compare", "--variants", "sdpa-flash,sdpa-efficient,sdpa-cudnn", "--device", "cuda", "--dtype",
                 "bf16", *SHAPE, "--mode", "fwd,bwd", "--min-time", "0.05", "-o", str(tmp_path), "--ncu",
                 "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    ok = [row for row in document["results"] if row["status"] == "ok"]
    assert len(ok) >= 4  # flash and efficient in both modes; cuDNN where this torch and GPU have it
    for row in ok:
        assert with_counters(row), row["variant"]
    assert document["ncu"]["with_counters"] == len(ok) and document["ncu"]["notes"] == []


def test_a_model_rows_pass_profiles_its_attention_kernels_only(cli, model_config) -> None:
    pytest.importorskip("transformers")
    # the tiny Llama holds 128 positions
    config = model_config(device="cuda", dtype="bf16", implementations=["sdpa"], seq=[128])
    result = cli("model", str(config), "--ncu", "--format", "json")
    assert result.exit_code == 0, result.output
    kernels = with_counters(json.loads(result.stdout)["results"][0])
    assert kernels and all(explain_kernel(k["name"]).family == "fused-attention" for k in kernels)
