"""Shared fixtures: a small CPU config on disk, an isolated cache, and typer's CliRunner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

SMALL_SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep the ceiling cache out of the user's home directory."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a YAML config into tmp_path and return its path; keys override a small CPU config."""

    def write(**overrides: object) -> Path:
        data = {
            "device": "cpu",
            "dtype": "fp32",
            "shapes": [SMALL_SHAPE],
            "causal": True,
            "variants": ["naive", "inplace", "sdpa-math"],
            "baseline": "sdpa-math",
            "schedule": {"wait": 0, "warmup": 1, "active": 2},
            "output_dir": str(tmp_path / "out"),
        }
        data.update(overrides)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


@pytest.fixture
def cli():
    """Invoke the attnprof CLI in-process; returns typer's Result."""
    from typer.testing import CliRunner

    from attnprof.cli.app import app
    from attnprof.cli.common import STATE

    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None):
        STATE.debug = STATE.no_plugins = False
        return runner.invoke(app, list(args), env=env)

    return invoke
