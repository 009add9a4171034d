"""Config validation: field paths in the messages, unknown keys, safe loading, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprof.config import Config, apply_overrides, load_config, parse_config
from attnprof.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_builtin_default_matches_the_shipped_file() -> None:
    from importlib import resources

    packaged = resources.files("attnprof").joinpath("default.yaml").read_text()
    assert packaged == (REPO / "configs" / "default.yaml").read_text()
    config = load_config(None)
    assert config.device == "auto"
    assert config.shapes[0].seq <= 512  # small enough for seconds on a 2-core CPU


@pytest.mark.parametrize("name", ["default", "a100", "h200"])
def test_shipped_configs_validate(name: str) -> None:
    config = load_config(REPO / "configs" / f"{name}.yaml")
    assert config.shapes


def test_gpu_configs_pin_cuda_and_the_blog_shape() -> None:
    a100 = load_config(REPO / "configs" / "a100.yaml")
    h200 = load_config(REPO / "configs" / "h200.yaml")
    assert a100.device == h200.device == "cuda"
    blog = (8, 16, 1024, 64)
    assert (a100.shapes[0].batch, a100.shapes[0].heads, a100.shapes[0].seq, a100.shapes[0].head_dim) == blog
    assert a100.dtype == "bf16" and a100.causal
    assert any(s.seq >= 8192 and s.head_dim == 128 for s in h200.shapes)


def test_defaults_fill_schedule_and_region() -> None:
    config = parse_config({"shapes": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 8}]})
    assert (config.schedule.wait, config.schedule.warmup, config.schedule.active) == (1, 1, 3)
    assert config.region == "attnprof"
    assert config.shapes[0].kv_heads is None
    assert config.shapes[0].label == "1x1x8x8"


def test_unknown_key_is_an_error_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"shapes": [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 8, "colour": 3}], "speed": 1})
    text = info.value.message
    assert "shapes.0.colour: unknown key" in text
    assert "speed: unknown key" in text


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"device": "tpu", "dtype": "int8", "shapes": [{"batch": 0, "heads": 1, "seq": 8, "head_dim": 8}]})
    lines = info.value.message.splitlines()
    assert any(line.strip().startswith("device: must be auto, cpu, cuda or cuda:N") for line in lines)
    expected = "dtype: Input should be 'auto', 'bf16', 'fp16', 'fp32', 'fp8' or 'fp8_e5m2'"
    assert any(line.strip().startswith(expected) for line in lines)
    assert any(line.strip().startswith("shapes.0.batch: Input should be greater than 0") for line in lines)


def test_gqa_heads_must_divide() -> None:
    with pytest.raises(ConfigError, match="heads \\(6\\) must be a multiple of kv_heads \\(4\\)"):
        parse_config({"shapes": [{"batch": 1, "heads": 6, "kv_heads": 4, "seq": 8, "head_dim": 8}]})


def test_empty_shapes_rejected() -> None:
    with pytest.raises(ConfigError, match="shapes: List should have at least 1 item"):
        parse_config({"shapes": []})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_invalid_yaml_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("device: cpu\nshapes: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line"):
        load_config(path)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("device: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_non_mapping_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(path)
    path.write_text("")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(path)


def test_overrides_are_validated_too() -> None:
    config = load_config(None)
    changed = apply_overrides(config, dtype="bf16", device=None)
    assert changed.dtype == "bf16" and changed.device == config.device
    with pytest.raises(ConfigError, match="dtype"):
        apply_overrides(config, dtype="int8")
    assert isinstance(changed, Config)


SHAPES = [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 8}]


def test_exclude_entries_are_patterns_or_scoped_mappings() -> None:
    """A plain pattern is an entry everywhere; a mapping may hold to one device type and give its reason.
    Both are written back as they were given."""
    entries = ["naive", {"variants": ["flex", "compiled"], "device": "cpu", "reason": "slow on CPU"}]
    config = parse_config({"shapes": SHAPES, "exclude": entries})
    assert [(e.variants, e.device, e.reason) for e in config.exclude] == [(["naive"], None, None),
                                                                          (["flex", "compiled"], "cpu", "slow on CPU")]
    assert config.model_dump(mode="json")["exclude"] == entries
    assert [e.variants for e in config.exclusions("cuda:0")] == [["naive"]]
    assert [e.variants for e in config.exclusions("cpu")] == [["naive"], ["flex", "compiled"]]
    assert apply_overrides(config, seed=1).exclude == config.exclude


def test_bad_exclude_entries_name_the_field() -> None:
    bad = [{"variants": ["flex"], "device": "cuda:0", "colour": 1}, {"variants": []}, 3]
    with pytest.raises(ConfigError) as info:
        parse_config({"shapes": SHAPES, "exclude": bad})
    lines = [line.strip() for line in info.value.message.splitlines()[1:]]
    assert lines == ["exclude.0.device: Input should be 'cpu' or 'cuda'", "exclude.0.colour: unknown key",
                     "exclude.1.variants: List should have at least 1 item after validation, not 0",
                     "exclude.2: must be a variant pattern or a mapping with variants, device and reason"]


def test_a_baseline_excluded_everywhere_is_an_error_but_not_one_excluded_on_one_device() -> None:
    with pytest.raises(ConfigError, match="baseline 'naive' is excluded"):
        parse_config({"shapes": SHAPES, "exclude": ["naive"], "baseline": "naive"})
    scoped = parse_config({"shapes": SHAPES, "exclude": [{"variants": ["flex"], "device": "cpu"}], "baseline": "flex"})
    assert scoped.baseline == "flex"
