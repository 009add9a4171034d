"""configs/masks-cpu.yaml and configs/decode-cpu.yaml end to end through `attnprof compare` on CPU (each run
once for the module), configs/expect-masks-cpu.yaml checked against those two results files, and the H200
configs and expectations validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import calm_cpu
from typer.testing import CliRunner

from attnprof.cli.app import app
from attnprof.cli.common import STATE
from attnprof.config import load_config
from attnprof.pipeline.run import cell_specs
from attnprof.report.expectations import load_expectations

REPO = Path(__file__).resolve().parents[1]
FAST = ("--min-time", "0.02", "--format", "json")


@pytest.fixture(scope="module")
def compares(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The results.json of masks-cpu and decode-cpu, each compared once (with its own ceiling cache)."""
    out = tmp_path_factory.mktemp("mask-configs")
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNPROF_CACHE_DIR", str(out / "cache"))
        calm_cpu(patch)  # module-scoped: the autouse calm of each test is not in place yet
        for name in ("masks-cpu.yaml", "decode-cpu.yaml"):
            STATE.debug = STATE.no_plugins = False
            result = CliRunner().invoke(app, ["compare", str(REPO / "configs" / name), "-o", str(out / name), *FAST])
            assert result.exit_code == 0, result.output
            found[name] = Path(json.loads(result.stdout)["files"]["results_json"])
    return found


def compare(compares: dict[str, Path], name: str) -> dict[tuple[str, str], dict]:
    return {(r["variant"], r["shape"]): r for r in json.loads(compares[name].read_text())["results"]}


def test_masks_cpu_runs_every_mask_and_skips_what_a_variant_lacks(compares) -> None:
    rows = compare(compares, "masks-cpu.yaml")
    for shape in ("1x4x256x64 sw64", "1x4x256x64 doc4", "1x4x256x64 prefix32"):
        for variant in ("naive", "inplace", "sdpa", "sdpa-math"):
            row = rows[(variant, shape)]
            assert row["status"] == "ok", row["status"]
            assert row["rel_error"] < 1e-5
            assert row["dense_mask"] is True
            assert row["causal"] is False and row["causal_alignment"] == "bottom-right"
        skipped = rows[("sdpa-flash", shape)]["status"]
        assert skipped.startswith(f"skipped: mask {rows[('naive', shape)]['mask'].split(':')[0]} not supported")
    assert rows[("sdpa", "1x4x256x64")]["dense_mask"] is False  # plain causal goes as is_causal
    soft = "1x4x256x64 sw64 softcap30"
    assert rows[("naive", soft)]["status"] == "ok" and rows[("naive", soft)]["score_mod"] == "softcap:30"
    assert rows[("sdpa", soft)]["status"] == "skipped: score_mod softcap not supported by sdpa (it applies none)"
    # a sliding window of 64 over 256 positions: 64·65/2 + 192·64 pairs, dense bool mask read once
    sw = rows[("sdpa", "1x4x256x64 sw64")]
    assert sw["bytes_moved"] == 4 * 4 * 256 * 64 * 4 + 256 * 256


def test_decode_cpu_runs_one_query_against_the_cache(compares) -> None:
    rows = compare(compares, "decode-cpu.yaml")
    for variant in ("naive", "sdpa", "sdpa-math", "sdpa-flash", "flex"):
        row = rows[(variant, "4x8x1/1024x64/kv2")]
        assert row["status"] == "ok", row["status"]
        assert (row["q_len"], row["kv_len"], row["seq"]) == (1, 1024, 1024)
        mask = 1024 if variant == "naive" else 0  # naive reads its [1, 1024] causal mask; SDPA needs none
        assert row["dense_mask"] is (variant == "naive")
        assert row["bytes_moved"] == (2 * 4 * 8 * 1 * 64 + 2 * 4 * 2 * 1024 * 64) * 4 + mask
    assert rows[("sdpa", "4x8x16/1024x64/kv2")]["status"] == "ok"
    assert rows[("naive", "4x8x1/1024x64/kv2 sw256")]["status"] == "ok"
    # the paged cache: flex reads it (its output against the reference of the logical K/V), the others skip it
    paged = rows[("flex", "4x8x1/1024x64/kv2 paged64")]
    assert paged["status"] == "ok", paged["status"]
    assert paged["page_size"] == 64 and paged["rel_error"] < 1e-5
    contiguous = rows[("flex", "4x8x1/1024x64/kv2")]
    assert contiguous["page_size"] is None
    assert paged["bytes_moved"] == contiguous["bytes_moved"] + 4 * (1024 // 64) * 4  # the int32 page table
    for variant in ("naive", "inplace", "sdpa", "sdpa-math", "sdpa-flash"):
        row = rows[(variant, "4x8x1/1024x64/kv2 paged64")]
        assert row["status"] == f"skipped: paged KV cache not supported by {variant} (use flex)"


@pytest.mark.parametrize("name", ["masks-h200", "decode-h200"])
def test_h200_configs_validate(name: str) -> None:
    config = load_config(REPO / "configs" / f"{name}.yaml")
    assert config.device == "cuda" and cell_specs(config, "cuda")


def test_decode_h200_has_a_paged_shape_flex_can_read() -> None:
    from attnprof.plugins import load_variants

    specs = cell_specs(load_config(REPO / "configs" / "decode-h200.yaml"), "cuda")
    (paged,) = [spec for spec in specs if spec.page_size is not None]
    assert paged.shape_label == "32x32x1/4096x128/kv8 paged64"
    flex = load_variants(no_plugins=True).registry.get("flex")
    assert flex.masking_reason(paged) is None and flex.check(paged) in (None, "torch.compile on CUDA needs triton")


def test_expect_masks_cpu_holds_on_both_compares(cli, compares) -> None:
    expectations = REPO / "configs" / "expect-masks-cpu.yaml"
    assert load_expectations(expectations).configs == tuple(REPO / "configs" / n for n in compares)
    result = cli("check", str(expectations), *map(str, compares.values()), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["results"] == [str(path) for path in compares.values()]
    checked = {(c["field"], c["verdict"]) for c in document["checks"]}
    assert ("bound", "held") in checked and ("dense_mask", "held") in checked
    assert document["missed"] == 0 and document["held"] > 40


def test_expect_masks_names_both_h200_configs() -> None:
    declared = load_expectations(REPO / "configs" / "expect-masks.yaml")
    assert declared.configs == (REPO / "configs" / "masks-h200.yaml", REPO / "configs" / "decode-h200.yaml")
    kinds = {(e.pattern, e.kind) for e in declared.items}
    assert {("flex", "faster"), ("sdpa", "faster"), ("sdpa", "has"), ("*", "any")} <= kinds
