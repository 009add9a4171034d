"""On a CUDA GPU: the dense-mask finding names its measured alternative in compare and run, decode cells show
memory-bound or bandwidth-bound (record_shapes in the cells' traces), and `attnprof model` with a sliding
window shows dense-mask on transformers' sdpa, mask-build on its flex_attention and neither on attnprof's
flex (its BlockMask built once per shape).

Run on the device with `python -m pytest -m gpu tests/test_gpu_masks.py`. Skipped without CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_factories import LLAMA_2L

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPE = {"batch": 2, "heads": 8, "seq": 2048, "head_dim": 64}
#: A window long enough for the skipped blocks to show: at 2048 keys the two took the same time on the H200
#: (0.99x, launch-bound), at 4x16x8192x64 with 1024 keys flex was 9.8x faster.
WINDOW = {**SHAPE, "seq": 8192, "mask": {"sliding_window": 256}}


def _config(tmp_path: Path, shapes: list[dict], variants: list[str]) -> Path:
    import yaml

    path = tmp_path / "masks.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "device": "cuda",
                "dtype": "bf16",
                "shapes": shapes,
                "variants": variants,
                "baseline": variants[0],
                "schedule": {"wait": 1, "warmup": 1, "active": 2},
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    return path


def _ids(row: dict) -> list[str]:
    """The ids of a JSON row's findings, in order (the CSV's `findings` column)."""
    return [f["id"] for f in row["findings"]]


def _message(row: dict, finding: str) -> str:
    return next(f["message"] for f in row["findings"] if f["id"] == finding)


def test_compare_names_the_alternatives_of_a_dense_mask(cli, tmp_path: Path) -> None:
    shapes = [SHAPE, {**SHAPE, "mask": {"prefix": 1}}, WINDOW]
    config = _config(tmp_path, shapes, ["sdpa", "sdpa-efficient", "flex"])
    result = cli("compare", str(config), "--min-time", "0.1", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {(r["variant"], r["shape"]): r for r in json.loads(result.stdout)["results"]}
    causal, dense = rows[("sdpa-efficient", "2x8x2048x64")], rows[("sdpa-efficient", "2x8x2048x64 prefix1")]
    assert "dense-mask" in _ids(dense)
    alternatives = {a["kind"]: a for a in dense["mask_alternatives"]}
    assert alternatives["is_causal"]["variant"] == "sdpa-efficient"  # the same backend without the tensor
    assert alternatives["is_causal"]["latency_us"] == causal["latency_us"]
    assert alternatives["is_causal"]["source"] == "this run"
    assert alternatives["block-mask"]["latency_us"] == rows[("flex", "2x8x2048x64 prefix1")]["latency_us"]
    message = _message(dense, "dense-mask")
    assert "SDPA with is_causal=True (sdpa-efficient at 2x8x2048x64) takes " in message
    assert "FlexAttention with a BlockMask (flex at 2x8x2048x64 prefix1) takes " in message
    assert dense["latency_us"] > causal["latency_us"]  # the dense mask computes every block
    window = rows[("sdpa", "2x8x8192x64 sw256")]
    (alternative,) = window["mask_alternatives"]
    assert (alternative["kind"], alternative["variant"]) == ("block-mask", "flex")
    assert alternative["speedup"] == pytest.approx(window["latency_us"] / alternative["latency_us"], rel=1e-6)
    assert alternative["speedup"] > 1  # the BlockMask skips 31/32 of the blocks


def test_run_measures_the_block_mask_for_comparison(cli, tmp_path: Path) -> None:
    config = _config(tmp_path, [WINDOW], ["sdpa"])
    result = cli("run", str(config), "--variant", "sdpa", "--min-time", "0.1", "--format", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["results"]
    (alternative,) = row["mask_alternatives"]
    assert (alternative["kind"], alternative["variant"], alternative["source"]) == (
        "block-mask",
        "flex",
        "measured for comparison",
    )
    assert alternative["latency_us"] > 0 and alternative["speedup"] > 1
    assert "(measured for comparison, outside the profiled region)" in _message(row, "dense-mask")


def test_decode_cells_are_memory_bound_with_the_finding(cli, tmp_path: Path) -> None:
    decode = {"batch": 8, "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 16384, "head_dim": 128}
    config = _config(tmp_path, [decode], ["sdpa-cudnn", "sdpa-flash", "sdpa-math"])
    result = cli("compare", str(config), "--min-time", "0.1", "--format", "json")
    assert result.exit_code == 0, result.output
    for row in json.loads(result.stdout)["results"]:
        assert row["status"] == "ok", row["status"]
        assert row["bound"] == "memory"
        found = set(_ids(row)) & {"memory-bound", "bandwidth-bound"}
        assert found, (row["variant"], _ids(row))
        assert row["attention"]["achieved_gbps"] > 0  # bytes from the recorded shapes


@pytest.fixture
def llama_2l_window(model_config):
    pytest.importorskip("transformers")
    return model_config(
        hf_config=LLAMA_2L,
        batch=2,
        seq=[2048],
        device="cuda",
        dtype="bf16",
        mask={"sliding_window": 256},
        implementations=["sdpa", "eager", "flex_attention", "flex"],
        timing={"min_time_s": 0.1, "min_reps": 3, "max_reps": 50, "warmup_s": 0.5},
        schedule={"wait": 1, "warmup": 1, "active": 2},
    )


def test_model_with_a_sliding_window(cli, llama_2l_window) -> None:
    result = cli("model", str(llama_2l_window), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {row["variant"]: row for row in json.loads(result.stdout)["results"]}
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["status"])
        assert row["mask"] == "sliding_window:256" and row["shape"].endswith(" sw256")
        if name != "sdpa":
            assert row["logits_rel_diff"] < 2e-2, (name, row["logits_rel_diff"])
    assert "dense-mask" in _ids(rows["sdpa"])  # transformers hands SDPA a bool mask
    assert "mask-build" in _ids(rows["flex_attention"])  # a BlockMask in every forward
    assert not {"mask-build", "dense-mask"} & set(_ids(rows["flex"]))  # built once per shape
