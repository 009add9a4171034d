"""`results.keys`: a typed row's cell key is its spec's (`RunSpec.cell_key`), for rows written before masks,
decode and paged caches too, and its cell label."""

from __future__ import annotations

from pathlib import Path

import msgspec

from attnprof.registry import RunSpec
from attnprof.results.files import load_results
from attnprof.results.keys import cell_key, cell_label
from attnprof.results.schema import Row

OLD_ROW = {
    "device": "cuda:1",
    "dtype": "bf16",
    "batch": 1,
    "heads": 2,
    "kv_heads": 2,
    "seq": 64,
    "head_dim": 16,
    "causal": True,
    "mode": "fwd",
}


def typed(fields: dict) -> Row:
    return msgspec.convert(fields, Row)


def test_rows_written_before_masks_keep_their_keys() -> None:
    spec = RunSpec("cuda:0", "bf16", 1, 2, 64, 16, None, True, "fwd")
    assert cell_key(typed(OLD_ROW)) == spec.cell_key
    new_row = OLD_ROW | {"mask": "causal", "score_mod": None, "q_len": 64, "kv_len": 64}
    assert cell_key(typed(new_row)) == spec.cell_key
    decode = RunSpec("cuda", "bf16", 1, 2, 64, 16, mask="sliding_window:8", q_len=1)
    assert cell_key(typed(new_row | {"mask": "sliding_window:8", "causal": False, "q_len": 1})) == decode.cell_key


def test_a_paged_row_keys_its_page_size() -> None:
    row = OLD_ROW | {"batch": 32, "heads": 32, "kv_heads": 8, "seq": 4096, "head_dim": 128, "mask": "causal"}
    row |= {"q_len": 1, "kv_len": 4096}
    paged = RunSpec("cuda:0", "bf16", 32, 32, 4096, 128, 8, q_len=1, page_size=64)
    assert cell_key(typed(row | {"page_size": 64})) == paged.cell_key
    contiguous = RunSpec("cuda:0", "bf16", 32, 32, 4096, 128, 8, q_len=1)
    assert cell_key(typed(row)) == contiguous.cell_key  # a row written before paged caches
    assert cell_key(typed(row | {"page_size": None})) == contiguous.cell_key


def test_the_rows_of_a_real_compare_have_distinct_keys_and_labels() -> None:
    rows = load_results(Path(__file__).parent / "data" / "h200" / "results" / "compare.json").rows
    assert len({(r.variant, cell_key(r)) for r in rows}) == len(rows)
    assert {"8x16x1024x64 bf16 causal fwd", "4x16x8192x128 bf16 causal fwd"} <= {cell_label(r) for r in rows}
    assert cell_label(typed(OLD_ROW | {"shape": "4x16x4096x64 sw256", "mask": "sliding_window:256"})) == (
        "4x16x4096x64 sw256 bf16 masked fwd"
    )
    assert (
        cell_label(typed(OLD_ROW | {"shape": "1x2x64x16", "causal": False, "mode": "bwd"})) == "1x2x64x16 bf16 full bwd"
    )
