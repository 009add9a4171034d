"""Shared fixtures: a small CPU config on disk, an isolated cache, a calm CPU for ceilings and timings, and typer's
CliRunner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

SMALL_SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
#: A one-layer Llama with GQA (4 query heads, 2 key/value heads) for `attnprof model` on CPU.
TINY_LLAMA = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "max_position_embeddings": 128,
}


class _CalmCpu:
    """A CPU window in which no other process ran: the tests' ceilings are cached whatever else runs beside them
    (pytest-xdist's workers, a busy CI host); tests of the contention rule patch `start`."""

    @classmethod
    def start(cls) -> _CalmCpu:
        return cls()

    def others(self) -> float | None:
        return None


def calm_cpu(patch: pytest.MonkeyPatch) -> None:
    """Make the machine read as calm to ceilings and timings (the box the suite runs on is shared): no share of
    other processes, no scheduler tick in the samples. For a fixture of a wider scope than the autouse ones."""
    patch.setattr("attnprof.profiling.ceiling.CpuShare", _CalmCpu)
    patch.setattr("attnprof.profiling.profiler_cost.CpuShare", _CalmCpu)
    patch.setattr("attnprof.profiling.timing.CpuShare", _CalmCpu)
    patch.setattr("attnprof.profiling.timing.scheduler_tick_ms", lambda samples_us: None)


@pytest.fixture(autouse=True)
def calm_cpu_for_ceilings_and_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ceiling or a timing measured in a test never reads as contended for the machine's load (`calm_cpu`);
    tests of contention patch these or set the timing's back (`real_contention`)."""
    calm_cpu(monkeypatch)


@pytest.fixture
def real_contention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timings read the machine's real load again (undoes `calm_cpu_for_timing`)."""
    from attnprof.profiling import contention

    monkeypatch.setattr("attnprof.profiling.timing.CpuShare", contention.CpuShare)
    monkeypatch.setattr("attnprof.profiling.timing.scheduler_tick_ms", contention.scheduler_tick_ms)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep the ceiling cache out of the user's home directory."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(cache))
    return cache


def yaml_writer(path: Path, defaults: dict[str, object]):
    """A function that writes `defaults`, updated with its keyword arguments, as YAML into `path` and returns it."""

    def write(**overrides: object) -> Path:
        path.write_text(yaml.safe_dump({**defaults, **overrides}))
        return path

    return write


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a YAML config into tmp_path and return its path; keys override a small CPU config."""
    return yaml_writer(
        tmp_path / "config.yaml",
        {
            "device": "cpu",
            "dtype": "fp32",
            "shapes": [SMALL_SHAPE],
            "causal": True,
            "variants": ["naive", "inplace", "sdpa-math"],
            "baseline": "sdpa-math",
            "schedule": {"wait": 0, "warmup": 1, "active": 2},
            "output_dir": str(tmp_path / "out"),
        },
    )


@pytest.fixture
def model_config(tmp_path: Path):
    """Write an `attnprof model` config into tmp_path and return its path; keys override a tiny Llama on CPU."""
    return yaml_writer(
        tmp_path / "model.yaml",
        {
            "hf": "llama",
            "hf_config": TINY_LLAMA,
            "batch": 1,
            "seq": [16],
            "device": "cpu",
            "dtype": "fp32",
            "implementations": ["eager", "sdpa", "naive"],
            "timing": {"min_time_s": 0.01, "min_reps": 2, "max_reps": 20, "warmup_s": 0.05},
            "schedule": {"wait": 0, "warmup": 0, "active": 2},
            "output_dir": str(tmp_path / "out"),
        },
    )


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
