import json

import pytest

from attnprof.profiling import ceiling
from attnprof.profiling.ceiling import Ceiling, cache_path, device_ceiling, device_key, probe_ceiling


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    ceiling.forget()
    yield
    ceiling.forget()


def fake_probe(calls, tflops=1.5, gbps=20.0):
    def probe(device, dtype):
        calls.append((device, dtype))
        return Ceiling(tflops, gbps, f"fake {dtype}")

    return probe


def never(device, dtype):
    raise AssertionError("should have come from the cache")


def test_cache_path_follows_env(tmp_path):
    assert cache_path() == tmp_path / "cache" / "ceilings.json"


def test_round_trip_through_cache_file(tmp_path):
    calls = []
    first = device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert first == Ceiling(1.5, 20.0, "fake fp32") and len(calls) == 1
    data = json.loads(cache_path().read_text())
    entry = data["entries"][device_key("cpu", "fp32")]
    assert entry["tflops"] == 1.5 and entry["bandwidth_gbps"] == 20.0 and "measured_at" in entry
    ceiling.forget()
    second = device_ceiling("cpu", "fp32", probe=never)
    assert (second.tflops, second.bandwidth_gbps) == (1.5, 20.0)
    assert second.source.startswith("cached") and "fake fp32" in second.source


def test_memo_measures_once_per_run():
    calls = []
    device_ceiling("cpu", "bf16", probe=fake_probe(calls))
    cache_path().unlink()
    device_ceiling("cpu", "bf16", probe=fake_probe(calls))
    assert len(calls) == 1


def test_dtypes_are_cached_separately():
    calls = []
    device_ceiling("cpu", "bf16", probe=fake_probe(calls))
    device_ceiling("cpu", "fp16", probe=fake_probe(calls))
    assert [c[1] for c in calls] == ["bf16", "fp16"]
    assert len(json.loads(cache_path().read_text())["entries"]) == 2


def test_refresh_measures_again():
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=1.0))
    again = device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=2.0), refresh=True)
    assert again.tflops == 2.0 and len(calls) == 2


def test_unwritable_cache_is_tolerated(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    calls = []
    got = device_ceiling("cpu", "fp32", probe=fake_probe(calls), path=blocker / "ceilings.json")
    assert got.tflops == 1.5 and len(calls) == 1


def test_corrupt_or_bad_entries_are_measured_again():
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert len(calls) == 1
    data = json.loads(path.read_text())
    data["entries"][device_key("cpu", "fp32")]["tflops"] = "nonsense"
    path.write_text(json.dumps(data))
    ceiling.forget()
    device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert len(calls) == 2


def test_key_names_device_dtype_and_torch():
    import torch

    key = device_key("cpu", "bf16")
    assert "|bf16|" in key and torch.__version__ in key and "threads" in key


def test_real_cpu_measurement_is_positive_and_labelled():
    c = probe_ceiling("cpu", "fp32")
    assert c.tflops > 0 and c.bandwidth_gbps > 0
    assert c.source.startswith("measured:") and "fp32 matmul" in c.source
