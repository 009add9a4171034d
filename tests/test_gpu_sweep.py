"""On a CUDA GPU: a sweep that really runs out of memory, its streamed rows, and the blog's expectations.

Run on the device with `python -m pytest -m gpu tests/test_gpu_sweep.py`. Skipped without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[1]


def test_a_real_out_of_memory_skips_the_larger_sequences(cli, tmp_path) -> None:
    """naive at 4x4x131072x64 needs 512 GiB for its bf16 scores: out of memory, so 262144 is skipped;
    the streamed row of the cell that ran carries the SM clock of its timing window, as results.json does."""
    config = tmp_path / "sweep.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "device": "cuda",
                "dtype": "bf16",
                "shapes": [{"batch": 4, "heads": 4, "head_dim": 64}],
                "sweep": {"seq": [256, 131072, 262144]},
                "variants": ["naive"],
                "schedule": {"wait": 0, "warmup": 1, "active": 2},
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    result = cli("sweep", str(config), "--min-time", "0.1")
    assert result.exit_code == 0, result.output
    [folder] = (tmp_path / "out").glob("*-sweep")
    lines = (folder / "results.jsonl").read_text().splitlines()
    streamed = {row["seq"]: row for row in map(json.loads, lines[1:])}
    assert streamed[256]["status"] == "ok"
    assert streamed[131072]["status"].startswith("failed: out of memory")
    assert streamed[262144]["status"] == "skipped: OOM at smaller size (seq 131072)"
    final = {row["seq"]: row for row in json.loads((folder / "results.json").read_text())["results"]}
    if final[256]["sm_clock_mhz"] is not None:  # nvidia-smi sampled: the streamed row read it while sampling
        assert streamed[256]["sm_clock_mhz"] is not None, "the streamed row has no clock: nvidia-smi buffers?"


def test_expect_blog_holds_on_this_gpu(cli, tmp_path) -> None:
    """`attnprof check configs/expect-blog.yaml`: the blog's findings at its shape (runs configs/a100.yaml)."""
    result = cli("check", str(REPO / "configs" / "expect-blog.yaml"), "-o", str(tmp_path), "--format", "json")
    document = json.loads(result.stdout)
    missed = [c for c in document["checks"] if c["verdict"] == "missed"]
    assert result.exit_code == 0 and not missed, missed
    assert document["held"] >= 40
