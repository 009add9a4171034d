"""Masks, score mods and decode in the config: forms, defaults, labels, one-line errors, sweep axes, keys."""

from __future__ import annotations

import pytest

from attnprof.config import parse_config
from attnprof.errors import ConfigError
from attnprof.pipeline.run import cell_specs
from attnprof.pipeline.sweep import chain_key, sweep_specs
from attnprof.registry import RunSpec
from attnprof.results.keys import cell_key as row_cell_key
from attnprof.results.schema import Row

SHAPE = {"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}


def specs(data: dict) -> list[RunSpec]:
    return cell_specs(parse_config(data), "cpu")


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.message


def test_default_is_todays_causal_square_prefill() -> None:
    (spec,) = specs({"shapes": [SHAPE]})
    assert spec == RunSpec("cpu", "auto", 1, 2, 64, 16)
    assert (spec.mask.text, spec.score_mod, spec.n_queries, spec.n_keys, spec.causal) == ("causal", None, 64, 64, True)
    assert spec.shape_label == "1x2x64x16"
    assert spec.cell_key[:9] == ("cpu", "auto", 1, 2, 2, 64, 16, True, "fwd")


@pytest.mark.parametrize(
    "mask,text,label",
    [
        ({"sliding_window": 16}, "sliding_window:16", "1x2x64x16 sw16"),
        ({"documents": 4}, "documents:4", "1x2x64x16 doc4"),
        ({"prefix": 8}, "prefix:8", "1x2x64x16 prefix8"),
        ("sliding_window:16", "sliding_window:16", "1x2x64x16 sw16"),
    ],
)
def test_sized_masks_per_shape(mask, text, label) -> None:
    (spec,) = specs({"shapes": [SHAPE | {"mask": mask}]})
    assert (spec.mask.text, spec.causal, spec.shape_label) == (text, False, label)


def test_top_level_mask_is_the_default_a_shape_may_replace() -> None:
    both = specs({"mask": {"documents": 2}, "shapes": [SHAPE, SHAPE | {"mask": "none"}]})
    assert [s.mask.text for s in both] == ["documents:2", "none"]
    assert specs({"mask": "none", "shapes": [SHAPE]})[0].causal is False


def test_causal_shorthand_and_plain_masks_agree() -> None:
    assert parse_config({"mask": "none", "shapes": [SHAPE]}).causal is False
    assert parse_config({"causal": False, "shapes": [SHAPE]}).causal is False
    assert "mask none contradicts causal: True" in error({"mask": "none", "causal": True, "shapes": [SHAPE]})


def test_decode_shape_label_and_alignment() -> None:
    shape = {"batch": 8, "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 16384, "head_dim": 128}
    (spec,) = specs({"shapes": [shape]})
    assert spec.shape_label == "8x32x1/16384x128/kv8"
    assert (spec.seq, spec.n_queries, spec.n_keys, spec.causal_alignment) == (16384, 1, 16384, "bottom-right")
    assert specs({"mask": "none", "shapes": [shape]})[0].causal_alignment is None


def test_score_mods() -> None:
    (spec,) = specs({"score_mod": {"softcap": 30}, "shapes": [SHAPE]})
    assert (spec.score_mod, spec.shape_label) == ("softcap:30", "1x2x64x16 softcap30")
    (spec,) = specs({"shapes": [SHAPE | {"score_mod": "alibi", "mask": {"sliding_window": 8}}]})
    assert spec.shape_label == "1x2x64x16 sw8 alibi"


@pytest.mark.parametrize(
    "data,message",
    [
        (
            {"shapes": [SHAPE | {"mask": {"sliding_window": 65}}]},
            "shapes.0: sliding_window 65 is larger than kv_len 64",
        ),
        ({"shapes": [SHAPE | {"mask": {"documents": 5}}]}, "shapes.0: 5 documents do not divide kv_len 64"),
        ({"shapes": [SHAPE | {"mask": {"prefix": 99}}]}, "shapes.0: prefix 99 is longer than kv_len 64"),
        ({"shapes": [SHAPE | {"q_len": 65}]}, "shapes.0: q_len (65) must not exceed kv_len (64)"),
        ({"shapes": [SHAPE | {"mask": "casual"}]}, "shapes.0.mask: unknown mask 'casual'; did you mean causal?"),
        ({"shapes": [SHAPE | {"mask": {"slidingwindow": 4}}]}, "did you mean sliding_window?"),
        ({"shapes": [SHAPE | {"mask": {"documents": 0}}]}, "documents must be a positive integer (got 0)"),
        ({"shapes": [SHAPE | {"mask": "prefix"}]}, "mask prefix needs a size: {prefix: N}"),
        (
            {"score_mod": "softcapp", "shapes": [SHAPE]},
            "score_mod: unknown score_mod 'softcapp'; did you mean softcap?",
        ),
        ({"score_mod": {"softcap": -1}, "shapes": [SHAPE]}, "softcap must be a positive number (got -1)"),
        ({"mask": {"sliding_window": 128}, "shapes": [SHAPE]}, "shapes.0: sliding_window 128 is larger than kv_len 64"),
        ({"shapes": [{"batch": 1, "heads": 1, "head_dim": 8}]}, "seq is required"),
    ],
)
def test_one_line_errors(data, message) -> None:
    assert message in error(data)


def test_sweep_axes_for_masks_score_mods_and_lengths() -> None:
    config = parse_config(
        {
            "shapes": [{"batch": 1, "heads": 2, "head_dim": 16}],
            "sweep": {
                "q_len": [1],
                "kv_len": [64, 128],
                "mask": ["causal", {"sliding_window": 32}],
                "score_mod": [None, "alibi"],
            },
        }
    )
    points, left_out = sweep_specs(config, "cpu")
    assert left_out == []
    assert len(points) == 8
    assert {(s.n_queries, s.n_keys) for s in points} == {(1, 64), (1, 128)}
    assert {s.mask.text for s in points} == {"causal", "sliding_window:32"}
    assert {s.score_mod for s in points} == {None, "alibi"}
    # the OOM chain follows kv_len for decode
    a, b = (s for s in points if s.mask.text == "causal" and s.score_mod is None)
    assert chain_key("v", a) == chain_key("v", b)


def test_sweep_leaves_out_a_window_too_large() -> None:
    config = parse_config({"shapes": [SHAPE], "sweep": {"seq": [16, 64], "mask": [{"sliding_window": 32}]}})
    points, left_out = sweep_specs(config, "cpu")
    assert [s.seq for s in points] == [64]
    assert left_out == ["sliding_window 32 is larger than kv_len 16"]


def test_rows_written_before_masks_keep_their_keys() -> None:
    spec = RunSpec("cuda:0", "bf16", 1, 2, 64, 16, None, True, "fwd")
    old_row = {
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
    assert row_cell_key(Row(**old_row)) == spec.cell_key
    new_row = old_row | {"mask": "causal", "score_mod": None, "q_len": 64, "kv_len": 64}
    assert row_cell_key(Row(**new_row)) == spec.cell_key
    decode = RunSpec("cuda", "bf16", 1, 2, 64, 16, mask="sliding_window:8", q_len=1)
    assert row_cell_key(Row(**new_row | {"mask": "sliding_window:8", "causal": False, "q_len": 1})) == decode.cell_key


def test_tables_name_a_sized_mask_masked() -> None:
    from attnprof.report.tables import cell_label

    row = Row(shape="1x2x64x16 sw8", dtype="fp32", causal=False, mask="sliding_window:8", mode="fwd")
    assert cell_label(row) == "1x2x64x16 sw8 fp32 masked fwd"
    assert cell_label(Row(shape="1x2x64x16", dtype="fp32", causal=True)) == "1x2x64x16 fp32 causal fwd"
    assert cell_label(Row(shape="1x2x64x16", dtype="fp32", causal=False, mask="none")).endswith("full fwd")


def test_shape_label_shows_its_own_mask() -> None:
    config = parse_config({"shapes": [SHAPE | {"mask": {"prefix": 4}, "score_mod": "alibi"}]})
    assert config.shapes[0].label == "1x2x64x16 prefix4 alibi"


@pytest.mark.parametrize("q_len", [None, 1])
def test_an_earlier_rows_oom_skips_the_longer_cells_of_its_chain(q_len) -> None:
    from attnprof.pipeline.sweep import OomRule
    from attnprof.registry import Variant

    small = RunSpec("cpu", "fp32", 1, 2, 64, 16, q_len=q_len, mask="sliding_window:8")
    row = {
        "variant": "v",
        "device": "cpu",
        "dtype": "fp32",
        "batch": 1,
        "heads": 2,
        "kv_heads": 2,
        "seq": 64,
        "head_dim": 16,
        "causal": False,
        "mode": "fwd",
        "mask": "sliding_window:8",
        "score_mod": None,
        "q_len": small.n_queries,
        "kv_len": 64,
        "status": "failed",
        "reason": "out of memory: CUDA out of memory",
    }
    rule = OomRule()
    rule.note_row(Row(**row))
    variant = Variant("v", "v", forward=lambda *a: None)
    longer = RunSpec("cpu", "fp32", 1, 2, 128, 16, q_len=q_len, mask="sliding_window:8")
    assert rule.skip_reason(variant, longer) == "OOM at smaller size (seq 64)"
