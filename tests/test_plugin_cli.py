"""Plugin failures seen through the CLI: listed as unavailable, failed rows in compare, never a traceback."""

from __future__ import annotations

import json

import pytest
from test_plugins import Site, site  # noqa: F401 - the fixture is used by name

CRASHING = '''
from attnprof import Variant


def _setup(spec):
    raise RuntimeError("cannot build the kernel cache")


def _forward(q, k, v, causal, state):
    raise ValueError("shape mismatch inside the plugin")


def register_variants(register):
    register(Variant(name="crash-setup", description="fails in setup", forward=lambda q, k, v, c, s: q, setup=_setup))
    register(Variant(name="crash-forward", description="fails in forward", forward=_forward))
'''


@pytest.fixture
def crashing(site: Site) -> Site:  # noqa: F811
    site.add("attnprof-crashy", "0.3", entry="crashy", source=CRASHING)
    site.add("attnprof-broken", "1.0", entry="broken", source="import not_a_real_module_xyz\n")
    return site


def test_list_marks_the_broken_plugin_unavailable(cli, write_config, crashing) -> None:
    result = cli("list", "--config", str(write_config()), "--format", "json")
    assert result.exit_code == 0, result.output
    by_name = {v["name"]: v for v in json.loads(result.stdout)["variants"]}
    assert by_name["broken"]["available"] is False
    assert by_name["broken"]["reason"].startswith("plugin failed to import: ModuleNotFoundError")
    assert by_name["broken"]["source"] == "attnprof-broken 1.0"
    assert by_name["crash-setup"]["source"] == "attnprof-crashy 0.3"
    assert by_name["naive"]["available"] is True


def test_compare_records_failed_rows_and_keeps_the_others(cli, write_config, crashing) -> None:
    config = write_config(variants=["naive", "crash-setup", "crash-forward", "broken"], baseline="naive")
    result = cli("compare", str(config), "--format", "json", "--min-time", "0.02")
    assert result.exit_code == 1  # a failure happened
    assert "Traceback" not in result.output
    rows = {r["variant"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["naive"]["status"] == "ok"
    assert rows["crash-setup"]["status"] == (
        "failed: setup raised RuntimeError (plugin attnprof-crashy 0.3): cannot build the kernel cache")
    assert rows["crash-forward"]["status"] == (
        "failed: forward raised ValueError (plugin attnprof-crashy 0.3): shape mismatch inside the plugin")
    assert rows["broken"]["status"].startswith("failed: plugin failed to import: ModuleNotFoundError")


def test_run_of_a_crashing_plugin_is_one_line(cli, write_config, crashing) -> None:
    result = cli("run", "--variant", "crash-forward", "--config", str(write_config()), "--min-time", "0.02")
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "error: crash-forward failed: forward raised ValueError (plugin attnprof-crashy 0.3)" in result.output


def test_no_plugins_hides_them(cli, write_config, crashing) -> None:
    result = cli("--no-plugins", "list", "--config", str(write_config()), "--format", "json")
    names = {v["name"] for v in json.loads(result.stdout)["variants"]}
    assert "crash-setup" not in names and "broken" not in names and "naive" in names


def test_a_duplicate_name_is_a_failed_row_not_a_replacement(cli, write_config, site: Site) -> None:  # noqa: F811
    site.add("attnprof-clash", "2.0", entry="clash", variants=("sdpa-math",))
    config = write_config(variants=["sdpa-math", "sdpa-math-clash"])
    result = cli("compare", str(config), "--format", "json", "--no-timing")
    assert result.exit_code == 1
    rows = {r["variant"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["sdpa-math"]["status"] == "ok" and rows["sdpa-math"]["source"] == "built-in"
    assert rows["sdpa-math-clash"]["status"] == (
        "failed: variant 'sdpa-math' from attnprof-clash 2.0 is already registered by built-in")
