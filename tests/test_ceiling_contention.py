"""A CPU ceiling measured while other processes held the CPU serves its run but is not cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.profiling import ceiling as ceiling_mod
from attnprof.profiling.ceiling import Ceiling, device_ceiling, forget


def _probe(device: str, dtype: str) -> Ceiling:
    return Ceiling(0.05, 10.0, "measured", method="stand-in", read_gbps=12.0)


class _Busy:
    def __init__(self, share: float | None) -> None:
        self.share = share

    def others(self) -> float | None:
        return self.share


@pytest.mark.parametrize(("share", "cached"), [(0.6, False), (0.1, True), (None, True)])
def test_a_cpu_ceiling_from_a_busy_moment_is_not_cached(monkeypatch, tmp_path: Path, share, cached) -> None:
    forget()
    monkeypatch.setattr(ceiling_mod.CpuShare, "start", classmethod(lambda cls: _Busy(share)))
    path = tmp_path / "ceilings.json"
    measured = device_ceiling("cpu", "fp32", probe=_probe, path=path)
    assert measured.source == "measured" and measured.tflops == 0.05
    if cached:
        assert json.loads(path.read_text())["entries"], "the figure was cached"
        assert "not kept" not in (measured.reason or "")
    else:
        assert not path.exists()
        assert measured.reason.endswith("not kept: other processes took 60% of the CPU while it was measured")
    forget()
