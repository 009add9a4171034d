"""Executed FLOPs of block-sparse variants: the convention (`analysis.roofline.executed_flops`), flex's count
from its BlockMask on CPU against hand counts, the variant hook through a cell, and the row fields."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnprof.analysis.roofline import EXECUTED_CONVENTION, executed_flops, step_flops
from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.pipeline import run_cell
from attnprof.pipeline.rows import cell_row
from attnprof.plugins import load_variants
from attnprof.registry import ExecutedPairs, RunSpec, Variant

torch = pytest.importorskip("torch")

BLOCK = 128 * 128  # the pairs of one full BlockMask block (flex's default 128 x 128)


def spec(**kw) -> RunSpec:
    fields = dict(device="cpu", dtype="fp32", batch=2, heads=4, kv_heads=2, seq=384, head_dim=16)
    return RunSpec(**{**fields, **kw})


def test_the_convention_follows_flops_modes() -> None:
    """4·D per forward pair, 2.5 × 4·D per backward pair (the backward's own tiles when given)."""
    pairs = ExecutedPairs(forward=1000)
    assert executed_flops(spec(), pairs) == 4 * 16 * 1000
    assert executed_flops(spec(mode="bwd"), pairs) == 2.5 * 4 * 16 * 1000
    assert executed_flops(spec(mode="fwd+bwd"), pairs) == 3.5 * 4 * 16 * 1000
    own = ExecutedPairs(forward=1000, backward=1200)
    assert executed_flops(spec(mode="bwd"), own) == 2.5 * 4 * 16 * 1200
    assert executed_flops(spec(mode="fwd+bwd"), own) == 4 * 16 * 1000 + 2.5 * 4 * 16 * 1200
    # a kernel that visits exactly the kept pairs executes the useful FLOPs
    dense = ExecutedPairs(forward=2 * 4 * 384 * 384)
    assert executed_flops(spec(causal=False, mode="fwd+bwd"), dense) == step_flops(spec(causal=False, mode="fwd+bwd"))


def flex_pairs(rs: RunSpec) -> int:
    flex = load_variants(no_plugins=True).registry.get("flex")
    state = flex.setup(rs)  # builds the BlockMask on CPU; compiles nothing until the first call
    pairs = flex.executed_pairs(rs, state)
    return pairs.forward if pairs is not None and pairs.backward is None else -1


@pytest.mark.parametrize(
    ("overrides", "blocks"),
    [
        # 384 = 3 blocks of 128: causal keeps the 6 blocks on and below the diagonal
        (dict(causal=True), 6),
        # a window of 128: q block 0 sees kv block 0, blocks 1 and 2 the diagonal one and the one before
        (dict(mask="sliding_window:128"), 5),
        # 3 documents of 128: the diagonal blocks only
        (dict(mask="documents:3"), 3),
        # 2 documents of 192: q block 0 sees kv 0; q block 1 (rows 128..255) kv 0 and 1; q block 2 kv 1 and 2
        (dict(mask="documents:2"), 5),
        (dict(causal=False), 9),
    ],
)
def test_flex_counts_the_block_masks_nonempty_blocks(overrides, blocks) -> None:
    rs = spec(**overrides)
    assert flex_pairs(rs) == 2 * 4 * blocks * BLOCK  # batch × query heads (GQA: not the 2 kv heads)


def test_flex_cuts_the_blocks_at_the_lengths() -> None:
    """300 keys: blocks of 128, 128 and 44 rows and columns; decode: one query row against every key block."""
    causal = flex_pairs(spec(seq=300, batch=1, heads=1, kv_heads=None))
    assert causal == 128 * 128 + 128 * 256 + 44 * 300
    decode = flex_pairs(spec(q_len=1, seq=1000, batch=1, heads=1, kv_heads=None))
    assert decode == 1000  # the one query keeps every key: nothing executed beyond the useful pairs
    window = flex_pairs(spec(q_len=1, seq=1000, batch=1, heads=1, kv_heads=None, mask="sliding_window:100"))
    assert window == 1000 - 896  # its window, keys 900..999, lies in the last key block (896..999) alone
    assert window >= spec(q_len=1, seq=1000, mask="sliding_window:100").mask.pairs(1, 1000)


# --- through a cell, with a variant of our own --------------------------------------


def _sdpa(q, k, v, causal, state):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(device="cpu", dtype="fp32", shapes=[SHAPE], schedule=Schedule(wait=0, warmup=1, active=2),
                  output_dir=tmp_path)


def ceiling():
    from attnprof.profiling.ceiling import Ceiling, RunCeiling

    return RunCeiling("cpu", "fp32", Ceiling(tflops=1.0, bandwidth_gbps=10.0, source="cached"))


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_a_cell_carries_the_variants_executed_flops(config, mode) -> None:
    seen = []

    def executed(rs, state):
        seen.append(state)
        return ExecutedPairs(forward=2 * 32 * 32, backward=2 * 32 * 24)

    variant = Variant("blocky", "sdpa that says it computes every tile", _sdpa, setup=lambda rs: "state",
                      executed_pairs=executed)
    rs = RunSpec("cpu", "fp32", **SHAPE, mode=mode)
    result = run_cell(variant, rs, config, MeasureOptions(min_time_s=0.02), ceiling())
    assert result.ok, result.reason
    assert seen == ["state"]  # called once, with setup's state
    expected = 4 * 16 * 2 * 32 * 32 + (2.5 * 4 * 16 * 2 * 32 * 24 if mode == "fwd+bwd" else 0)
    assert result.executed_flops == expected
    entry = cell_row(result)
    assert entry.executed_flops == expected and entry.flops == step_flops(rs)
    assert entry.flops_convention.endswith(f"; {EXECUTED_CONVENTION}")


def test_a_dense_variant_has_no_executed_flops(config) -> None:
    naive = load_variants(no_plugins=True).registry.get("naive")
    rs = RunSpec("cpu", "fp32", **SHAPE)
    row = cell_row(run_cell(naive, rs, config, MeasureOptions(min_time_s=0.02), ceiling()))
    assert row.executed_flops is None and row.flops == 4 * 2 * 16 * (32 * 33 // 2)
    assert "executed_flops" not in row.flops_convention


def test_a_hook_that_raises_fails_the_cell_in_one_line(config) -> None:
    def broken(rs, state):
        raise KeyError("BLOCK_SIZE")

    variant = Variant("blocky", "broken count", _sdpa, executed_pairs=broken)
    result = run_cell(variant, RunSpec("cpu", "fp32", **SHAPE), config, MeasureOptions(min_time_s=0.02))
    assert result.status == "failed" and result.reason == "executed_pairs raised KeyError: 'BLOCK_SIZE'"


def test_a_hook_without_an_answer_leaves_none(config) -> None:
    variant = Variant("blocky", "does not know", _sdpa, executed_pairs=lambda rs, state: None)
    result = run_cell(variant, RunSpec("cpu", "fp32", **SHAPE), config, MeasureOptions(min_time_s=0.02), ceiling())
    assert result.ok and result.executed_flops is None
    assert replace(result, executed_flops=None) == result


# --- tables -----------------------------------------------------------------------------


def test_tables_show_executed_over_useful_where_a_row_has_it(config) -> None:
    from attnprof.report.run_tables import run_summary_table
    from attnprof.report.tables import shape_table

    variant = Variant("blocky", "sdpa that says it computes every tile", _sdpa,
                      executed_pairs=lambda rs, state: ExecutedPairs(forward=2 * 32 * 32))
    naive = load_variants(no_plugins=True).registry.get("naive")
    rs = RunSpec("cpu", "fp32", **SHAPE)
    options = MeasureOptions(min_time_s=0.02)
    blocky_row = cell_row(run_cell(variant, rs, config, options, ceiling()))
    naive_row = cell_row(run_cell(naive, rs, config, options, ceiling()))
    ratio = f"{32 * 32 / (32 * 33 / 2):.2f}×"  # every tile of the causal square over its kept pairs: 1.94×
    wide = shape_table([blocky_row, naive_row], "table", width=None)
    assert "executed/useful FLOPs" in wide.splitlines()[0] and ratio in wide
    summary = run_summary_table(blocky_row, "table")
    assert f"{step_flops(rs):.3g}, {blocky_row.executed_flops:.3g} ({ratio})" in summary
    assert "n/a (the variant does not report its tiles)" in run_summary_table(naive_row, "table")
    fitted = shape_table([naive_row], "table", width=100)  # n/a in every row: the first to go when fitting
    assert "executed" not in fitted.splitlines()[0]
