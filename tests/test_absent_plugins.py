"""A config that names an optional plugin's variant (flash-attn, triton-flash) on a machine without the plugin:
what is installed runs, the rest is a skipped row "plugin not installed (...)" (`check`: not run), and a typo
still fails with close matches. The plugins' entry points are hidden by patching the discovery."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from attnprof import plugins
from attnprof.errors import UnknownVariantError
from attnprof.pipeline.measured import CellResult
from attnprof.registry import RunSpec

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = metadata.EntryPoint(plugins.BUILTIN_ENTRY_POINT, plugins.BUILTIN_TARGET, plugins.ENTRY_POINT_GROUP)
SPEC = RunSpec("cpu", "fp32", 1, 2, 32, 16, causal=True)


@pytest.fixture
def no_plugins_installed(monkeypatch):
    """Entry-point discovery finds the built-ins only, as on a machine without the plugin packages."""
    monkeypatch.setattr(plugins, "_entry_points", lambda: [BUILTIN])
    plugins.forget_loaded_variants()
    yield
    plugins.forget_loaded_variants()


def test_the_known_plugin_variants_are_the_shipped_plugins_entry_points():
    """Each name in OPTIONAL_PLUGIN_VARIANTS is the VARIANT_NAME (or another *VARIANT_NAME) of a plugin under
    plugins/, whose pyproject declares the entry point and distribution named beside it."""
    found = {}
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        text = pyproject.read_text()  # read by pattern: tomllib needs Python 3.11
        package = re.search(r'^name = "([^"]+)"', text, re.MULTILINE).group(1)
        group = re.escape(f'[project.entry-points."{plugins.ENTRY_POINT_GROUP}"]')
        entry, module = re.search(group + r'\n(\S+) = "([^"]+)"', text).groups()
        source = (pyproject.parent / "src" / module / "__init__.py").read_text()
        names = re.findall(r'^[A-Z0-9_]*VARIANT_NAME = "([^"]+)"', source, re.MULTILINE)
        assert names, f"{pyproject.parent.name} names no VARIANT_NAME"
        found |= dict.fromkeys(names, (entry, package))
    assert found == plugins.OPTIONAL_PLUGIN_VARIANTS


def test_a_stand_in_is_chosen_by_its_name_only_and_skips_with_the_reason(no_plugins_installed):
    registry = plugins.with_absent_plugins(plugins.load_variants())
    assert "flash-attn" in registry and "triton-flash" in registry
    assert not {"flash-attn", "triton-flash"} & {v.name for v in registry.select(["*"])}
    assert [v.name for v in registry.select(["*-flash"])] == ["sdpa-flash"]  # a wildcard never picks a stand-in
    [flash] = registry.select(["flash-attn"])
    assert flash.unavailable_reason(SPEC) == "plugin not installed (attnprof-flash-attn)" and flash.load_error is None
    with pytest.raises(UnknownVariantError, match=r"unknown variant 'flash-atn'; did you mean flash-attn"):
        registry.check_patterns(["flash-atn"])


def test_an_installed_plugin_left_out_by_no_plugins_is_not_loaded_not_missing(monkeypatch):
    installed = metadata.EntryPoint("triton", "attnprof_triton", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [BUILTIN, installed])
    plugins.forget_loaded_variants()
    try:
        registry = plugins.with_absent_plugins(plugins.load_variants(no_plugins=True))
    finally:
        plugins.forget_loaded_variants()
    reason = registry.get("triton-flash").unavailable_reason(SPEC)
    assert reason == "plugin attnprof-triton not loaded (--no-plugins or ATTNPROF_PLUGINS)"


def test_a_broken_plugin_fails_its_rows_rather_than_missing(monkeypatch):
    """Installed but failing to import: the stand-in carries the plugin's error, a failed row as for any
    broken plugin (the entry point `triton` is not the variant's name, so only the stand-in names it)."""
    broken = metadata.EntryPoint("triton", "not_a_real_module_xyz", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [BUILTIN, broken])
    plugins.forget_loaded_variants()
    try:
        registry = plugins.with_absent_plugins(plugins.load_variants())
    finally:
        plugins.forget_loaded_variants()
    stand_in = registry.get("triton-flash")
    assert stand_in.load_error.startswith("plugin failed to import: ModuleNotFoundError")
    assert stand_in.not_installed is None


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_compare_and_sweep_run_what_is_installed(cli, write_config, no_plugins_installed, tmp_path, command):
    fields = {"variants": ["sdpa-math", "flash-attn", "triton-flash"], "baseline": "sdpa-math"}
    if command == "sweep":
        fields |= {"shapes": [{"batch": 1, "heads": 2, "head_dim": 16}], "sweep": {"seq": [32, 64]}}
    result = cli(command, str(write_config(**fields)), "--format", "json", "--min-time", "0.02")
    assert result.exit_code == 0, result.output
    assert ("not run: flash-attn: plugin not installed (attnprof-flash-attn); "
            "triton-flash: plugin not installed (attnprof-triton)") in result.stderr
    rows = json.loads(result.stdout)["results"]
    assert {r["status"] for r in rows if r["variant"] == "sdpa-math"} == {"ok"}
    skipped = {(r["variant"], r["status"]) for r in rows if r["variant"] != "sdpa-math"}
    assert skipped == {
        ("flash-attn", "skipped: plugin not installed (attnprof-flash-attn)"),
        ("triton-flash", "skipped: plugin not installed (attnprof-triton)"),
    }
    assert len(rows) == 3 * (2 if command == "sweep" else 1)


def test_check_on_the_shipped_config_counts_the_plugin_variants_not_run(cli, no_plugins_installed, monkeypatch,
                                                                         tmp_path):
    """`attnprof check configs/expect-masks.yaml` without the plugins: no refusal; the plugins' rows are
    skipped with the reason (real `run_cell`), and check counts them not run. The other cells (H200 shapes,
    run here on the CPU) are replaced by skipped rows, to keep this test fast."""
    from attnprof.pipeline import run

    real = run.run_cell

    def only_the_stand_ins(variant, spec, *args, **kwargs):
        if variant.not_installed:
            return real(variant, spec, *args, **kwargs)
        return CellResult(variant.name, variant.source, spec, status="skipped", reason="not measured in this test")

    monkeypatch.setattr(run, "run_cell", only_the_stand_ins)
    result = cli("check", str(ROOT / "configs" / "expect-masks.yaml"), "--device", "cpu", "--no-timing",
                 "--output-dir", str(tmp_path / "out"), "--format", "json")
    assert result.exit_code == 0, result.output
    assert "unknown variant" not in result.output
    assert result.stderr.count("not run: flash-attn: plugin not installed (attnprof-flash-attn); "
                               "triton-flash: plugin not installed (attnprof-triton)") == 1  # masks-h200 only
    rows = [r for f in sorted((tmp_path / "out").glob("*-check/results.json"))
            for r in json.loads(f.read_text())["results"]]
    plugin_rows = [r for r in rows if r["variant"] in ("flash-attn", "triton-flash")]
    assert len(plugin_rows) == 2 * 6  # the six shapes of masks-h200.yaml
    assert {r["status"] for r in plugin_rows} == {
        "skipped: plugin not installed (attnprof-flash-attn)", "skipped: plugin not installed (attnprof-triton)"}
    checked = json.loads(result.stdout)
    assert checked["not run"] > 0 and checked["missed"] == 0, checked
    flash_lines = [o for o in checked["checks"] if o["variant"] == "flash-attn"]
    assert len(flash_lines) == 6 and all(o["verdict"] == "not run" for o in flash_lines)  # `"*": status: ok`
    assert {o["measured"] for o in flash_lines} == {"skipped: plugin not installed (attnprof-flash-attn)"}


def test_a_typo_in_the_shipped_config_still_fails_with_close_matches(cli, no_plugins_installed, tmp_path):
    config = yaml.safe_load((ROOT / "configs" / "masks-h200.yaml").read_text())
    config["variants"] = [("flash-atn" if v == "flash-attn" else v) for v in config["variants"]]
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    result = cli("compare", str(path), "--device", "cpu")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: unknown variant 'flash-atn'; did you mean flash-attn, sdpa-flash?"
    assert "Traceback" not in result.output
