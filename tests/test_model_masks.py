"""Masks and score mods in `attnprof model`: the config's `mask` and `score_mod` in every implementation of a
tiny Llama on CPU (transformers' own through its mask interface, attnprof variants through the bridge),
unsupported combinations skipped with their reasons, and the rows carrying the mask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_LLAMA

from attnprof.errors import ConfigError, VariantUnavailableError
from attnprof.model_config import load_model_config

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def _rows(result) -> dict[str, dict]:
    assert result.exit_code == 0, result.output
    return {row["variant"]: row for row in json.loads(result.stdout)["results"]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"mask": {"sliding_window": 64}, "seq": [16, 64]},
            "mask: sliding_window 64 is larger than kv_len 16 (seq 16)",
        ),
        ({"mask": {"documents": 3}}, "mask: 3 documents do not divide kv_len 16 (seq 16)"),
        ({"mask": "casual"}, "unknown mask 'casual'; did you mean causal?"),
        ({"score_mod": {"softcap": -1}}, "softcap must be a positive number"),
        ({"factory": "pkg.mod:fn", "hf": None, "hf_config": {}, "mask": "none"}, "mask and score_mod need hf"),
    ],
)
def test_mask_config_errors_are_one_line(model_config, data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_model_config(model_config(**data))
    assert message in info.value.message


def test_every_implementation_runs_the_configured_mask(cli, model_config) -> None:
    config = model_config(
        mask={"sliding_window": 4},
        implementations=["eager", "sdpa", "naive", "attnprof:sdpa", "sdpa-flash", "flash_attention_2"],
    )
    rows = _rows(cli("model", str(config), "--format", "json"))
    for name in ("eager", "sdpa", "naive", "attnprof:sdpa"):
        row = rows[name]
        assert row["status"] == "ok", row["status"]
        assert (row["mask"], row["causal"], row["score_mod"]) == ("sliding_window:4", False, None)
        assert row["shape"] == "1x4x16x8/kv2 sw4"
    # transformers' eager (its mask function: attnprof's rules) and naive (attnprof's dense mask) agree
    for name in ("sdpa", "naive", "attnprof:sdpa"):
        assert rows[name]["logits_rel_diff"] < 1e-5, (name, rows[name]["logits_rel_diff"])
    assert rows["sdpa-flash"]["status"] == (
        "skipped: attnprof:sdpa-flash: mask sliding_window not supported by sdpa-flash (it runs causal, none)"
    )
    assert rows["flash_attention_2"]["status"] == (
        "skipped: mask sliding_window cannot be given to transformers' flash_attention_2 (it takes no mask tensor)"
    )


def test_the_mask_changes_the_logits(cli, model_config) -> None:
    """A sliding window of 4 over 16 tokens is not causal: naive (which applies the config's mask) differs
    from transformers' eager left causal, and agrees with it under the same window."""
    causal = model_config(implementations=["eager", "naive"])
    assert _rows(cli("model", str(causal), "--format", "json"))["naive"]["logits_rel_diff"] < 1e-5
    from attnprof.models.bridge import register_variant
    from attnprof.models.hf import build_hf_model, hf_config, prepare_hf
    from attnprof.models.masking import MaskOverride
    from attnprof.plugins import load_variants

    config = hf_config("llama", TINY_LLAMA, [16])
    eager = build_hf_model(config, "eager", "cpu", "fp32", 0)
    plain = prepare_hf(eager, config, 1, 16, "fwd", 0).step()
    window = prepare_hf(eager, config, 1, 16, "fwd", 0, MaskOverride("eager", "sliding_window:4", 16)).step()
    assert (plain - window).abs().max() > 1e-3
    name = register_variant(load_variants(no_plugins=True).registry.get("naive"), "sliding_window:4")
    naive = build_hf_model(config, name, "cpu", "fp32", 0)
    assert torch.allclose(prepare_hf(naive, config, 1, 16, "fwd", 0).step(), window, atol=1e-5)


def test_score_mods_go_to_the_variants_that_apply_them(cli, model_config) -> None:
    config = model_config(score_mod={"softcap": 5}, implementations=["naive", "sdpa", "attnprof:sdpa", "inplace"])
    rows = _rows(cli("model", str(config), "--format", "json"))
    assert rows["naive"]["status"] == "ok" and rows["naive"]["score_mod"] == "softcap:5"
    assert rows["naive"]["shape"] == "1x4x16x8/kv2 softcap5"
    assert rows["inplace"]["status"] == "ok" and rows["inplace"]["logits_rel_diff"] < 1e-5
    assert rows["sdpa"]["status"].startswith("skipped: score_mod softcap is not applied by transformers' sdpa")
    assert rows["attnprof:sdpa"]["status"] == (
        "skipped: attnprof:sdpa: score_mod softcap not supported by sdpa (it applies none)"
    )


def test_mask_none_turns_a_causal_model_bidirectional(cli, model_config) -> None:
    rows = _rows(
        cli("model", str(model_config(mask="none", implementations=["eager", "sdpa", "naive"])), "--format", "json")
    )
    for name in ("sdpa", "naive"):
        assert rows[name]["status"] == "ok" and rows[name]["logits_rel_diff"] < 1e-5
        assert (rows[name]["mask"], rows[name]["causal"]) == ("none", False)


def test_the_table_title_names_the_mask(cli, model_config) -> None:
    result = cli("model", str(model_config(mask={"documents": 2}, implementations=["sdpa", "naive"])), "--wide")
    assert result.exit_code == 0, result.output
    assert "batch 1, fp32, mask documents:2, fwd on cpu" in result.output


def test_a_mask_the_model_never_asks_for_is_refused() -> None:
    from attnprof.models.masking import MaskOverride

    override = MaskOverride("sdpa", "prefix:2", 16)
    with pytest.raises(VariantUnavailableError, match="did not ask transformers' mask interface"):
        with override.applied():
            pass
    from transformers import masking_utils

    assert "sdpa" not in masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._local_mapping  # removed after the call


def test_the_masked_h200_config_is_valid() -> None:
    config = load_model_config(ROOT / "configs" / "model-masks-h200.yaml")
    assert config.mask == "sliding_window:1024" and config.device == "cuda"
    assert {"sdpa", "flex_attention", "flex"} <= set(config.implementations)
