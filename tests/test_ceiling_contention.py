"""A CPU ceiling measured while other processes held the CPU is neither cached nor used: the run takes the
figure cached before (whatever its age), else none, and says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.pipeline.cell import throughput
from attnprof.profiling import ceiling as ceiling_mod
from attnprof.profiling.ceiling import Ceiling, device_ceiling, forget
from attnprof.registry import RunSpec


def _probe(tflops: float):
    def probe(device: str, dtype: str) -> Ceiling:
        return Ceiling(tflops, 10.0, "measured", method="stand-in", read_gbps=12.0)

    return probe


class _Busy:
    def __init__(self, share: float | None) -> None:
        self.share = share

    def others(self) -> float | None:
        return self.share


def _busy(monkeypatch: pytest.MonkeyPatch, share: float | None) -> None:
    monkeypatch.setattr(ceiling_mod.CpuShare, "start", classmethod(lambda cls: _Busy(share)))


@pytest.mark.parametrize("share", [0.1, None])
def test_a_ceiling_from_a_calm_moment_is_used_and_cached(monkeypatch, tmp_path: Path, share) -> None:
    forget()
    _busy(monkeypatch, share)
    path = tmp_path / "ceilings.json"
    measured = device_ceiling("cpu", "fp32", probe=_probe(0.05), path=path)
    assert measured.source == "measured" and measured.tflops == 0.05 and measured.set_aside is None
    assert json.loads(path.read_text())["entries"], "the figure was cached"
    forget()


def test_a_contended_ceiling_without_a_cached_one_gives_none_and_says_why(monkeypatch, tmp_path: Path) -> None:
    forget()
    _busy(monkeypatch, 0.7)
    path = tmp_path / "ceilings.json"
    found = device_ceiling("cpu", "fp32", probe=_probe(0.0017), path=path)
    assert found.source == "none" and found.tflops is None and found.read_gbps is None
    assert not path.exists(), "a contended figure is never cached"
    assert found.reason == (
        "the fp32 matmul ceiling was measured now at 0.0017 TFLOP/s while other processes took 70% of the CPU, "
        "and no calm figure is cached (a CPU has no datasheet)"
    )
    spec = RunSpec(batch=1, heads=2, seq=64, head_dim=16, dtype="fp32", device="cpu")
    rates = throughput(spec, 100.0, found)
    assert rates.pct_of_peak is None and rates.pct_of_peak_note == found.reason
    forget()


def test_a_contended_ceiling_gives_way_to_the_cached_one_whatever_its_age(monkeypatch, tmp_path: Path) -> None:
    """The calm figure is cached first; a month later (too old to be used as is) it is measured again under
    contention: the old figure is used, the contended one is not kept, and each row's note says so."""
    forget()
    _busy(monkeypatch, 0.05)
    path = tmp_path / "ceilings.json"
    calm = device_ceiling("cpu", "fp32", probe=_probe(0.167), path=path)
    entries = json.loads(path.read_text())
    (key,) = entries["entries"]
    entries["entries"][key]["measured_at"] = "2020-01-01T00:00:00+00:00"  # too old: it will be measured again
    path.write_text(json.dumps(entries))
    forget()
    _busy(monkeypatch, 0.66)
    found = device_ceiling("cpu", "fp32", probe=_probe(0.0017), path=path)
    assert found.source == "cached" and found.tflops == calm.tflops == 0.167
    assert json.loads(path.read_text()) == entries, "the contended figure was not cached"
    assert found.set_aside == (
        "the fp32 matmul ceiling cached on 2020-01-01 (0.167 TFLOP/s): measured now at 0.0017 TFLOP/s while other "
        "processes took 66% of the CPU"
    )
    assert found.reason.endswith("not used, the fp32 matmul ceiling cached on 2020-01-01 (0.167 TFLOP/s) is")
    spec = RunSpec(batch=1, heads=2, seq=64, head_dim=16, dtype="fp32", device="cpu")
    rates = throughput(spec, 1000.0, found)
    assert rates.peak_tflops == 0.167 and rates.pct_of_peak is not None
    assert rates.pct_of_peak_note == f"% of {found.set_aside}"
    forget()
