import json
from datetime import datetime, timedelta, timezone

import pytest

from attnprof.profiling import ceiling, fp8
from attnprof.profiling.ceiling import (
    MAX_AGE_DAYS,
    Ceiling,
    RunCeiling,
    cache_path,
    device_ceiling,
    device_key,
    probe_ceiling,
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    ceiling.forget()
    yield
    ceiling.forget()


def fake_probe(calls, tflops=1.5, gbps=20.0, read=30.0):
    def probe(device, dtype):
        calls.append((device, dtype))
        return Ceiling(tflops, gbps, "measured", method=f"fake {dtype}", read_gbps=read, read_method="fake read")

    return probe


def never(device, dtype):
    raise AssertionError("should have come from the cache")


def edit_entry(**changes):
    """Change the one cached entry's fields in the file, as another day or another install would have left it."""
    path = cache_path()
    data = json.loads(path.read_text())
    [entry] = data["entries"].values()
    entry.update(changes)
    path.write_text(json.dumps(data))
    ceiling.forget()


def test_cache_path_follows_env(tmp_path):
    assert cache_path() == tmp_path / "cache" / "ceilings.json"


def test_cache_path_honours_xdg_cache_home_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNPROF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "attnprof" / "ceilings.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/not/allowed")  # the XDG spec says to ignore it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_path() == tmp_path / "home" / ".cache" / "attnprof" / "ceilings.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_path() == tmp_path / "home" / ".cache" / "attnprof" / "ceilings.json"
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "mine" / "ceilings.json"  # ATTNPROF_CACHE_DIR wins


def test_round_trip_through_cache_file():
    import torch

    calls = []
    first = device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert (first.tflops, first.bandwidth_gbps, first.method) == (1.5, 20.0, "fake fp32") and len(calls) == 1
    assert first.source == "measured" and first.reason == "no cached figure"
    assert first.torch_version == torch.__version__ and first.driver_version is None  # no driver on CPU
    entry = json.loads(cache_path().read_text())["entries"][device_key("cpu", "fp32")]
    assert entry["tflops"] == 1.5 and entry["torch_version"] == torch.__version__ and "measured_at" in entry
    ceiling.forget()
    second = device_ceiling("cpu", "fp32", probe=never)
    assert (second.tflops, second.bandwidth_gbps, second.method) == (1.5, 20.0, "fake fp32")
    assert (second.read_gbps, second.read_method) == (30.0, "fake read")
    assert second.source == "cached" and second.reason is None
    assert second.measured_at == first.measured_at and second.measured_on == first.measured_at[:10]


def test_memo_measures_once_per_run_and_then_reads_as_cached():
    calls = []
    assert device_ceiling("cpu", "fp32", probe=fake_probe(calls)).source == "measured"
    cache_path().unlink()
    assert device_ceiling("cpu", "fp32", probe=fake_probe(calls)).source == "cached"
    assert len(calls) == 1


def test_dtypes_are_cached_separately(monkeypatch):
    monkeypatch.setattr(ceiling, "device_key", lambda device, dtype: f"gpu|{dtype}")
    monkeypatch.setattr(ceiling, "software_versions", lambda device: ("2.x", "550.1"))
    calls = []
    device_ceiling("cuda:0", "bf16", probe=fake_probe(calls))
    device_ceiling("cuda:0", "fp16", probe=fake_probe(calls))
    assert [c[1] for c in calls] == ["bf16", "fp16"]
    assert len(json.loads(cache_path().read_text())["entries"]) == 2


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_on_cpu_has_no_ceiling_and_measures_nothing(dtype):
    got = device_ceiling("cpu", dtype, probe=never)
    assert got.source == "none" and got.tflops is None and got.bandwidth_gbps is None
    assert got.reason == f"no meaningful {dtype} matmul ceiling on CPU (attention there computes in fp32)"
    assert not cache_path().exists()


def test_refresh_measures_again():
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=1.0))
    again = device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=2.0), refresh=True)
    assert again.tflops == 2.0 and again.source == "measured" and len(calls) == 2


def test_a_stale_entry_is_measured_again():
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=0.0021))
    edit_entry(measured_at=(datetime.now(timezone.utc) - timedelta(days=MAX_AGE_DAYS + 11)).isoformat())
    got = device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=1.0))
    assert got.tflops == 1.0 and got.source == "measured" and len(calls) == 2
    assert got.reason == f"the cached figure was {MAX_AGE_DAYS + 11} days old (limit {MAX_AGE_DAYS})"
    ceiling.forget()
    assert device_ceiling("cpu", "fp32", probe=never).tflops == 1.0  # the fresh figure replaced it


def test_a_recent_entry_is_used():
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    edit_entry(measured_at=(datetime.now(timezone.utc) - timedelta(days=MAX_AGE_DAYS - 1)).isoformat())
    assert device_ceiling("cpu", "fp32", probe=never).source == "cached"


def test_another_torch_version_is_measured_again():
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    edit_entry(torch_version="1.0.0")
    got = device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert len(calls) == 2 and got.reason == "the cached figure was measured with torch 1.0.0"


def test_another_driver_version_is_measured_again(monkeypatch):
    monkeypatch.setattr(ceiling, "device_key", lambda device, dtype: f"gpu|{dtype}")
    monkeypatch.setattr(ceiling, "software_versions", lambda device: ("2.x", "550.1"))
    calls = []
    assert device_ceiling("cuda:0", "bf16", probe=fake_probe(calls)).driver_version == "550.1"
    ceiling.forget()
    assert device_ceiling("cuda:0", "bf16", probe=never).source == "cached"
    edit_entry(driver_version="535.0")
    got = device_ceiling("cuda:0", "bf16", probe=fake_probe(calls))
    assert len(calls) == 2 and got.reason == "the cached figure was measured with driver 535.0"


def test_unwritable_cache_is_tolerated(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    calls = []
    got = device_ceiling("cpu", "fp32", probe=fake_probe(calls), path=blocker / "ceilings.json")
    assert got.tflops == 1.5 and len(calls) == 1
    assert got.reason.startswith("no cached figure; not kept: cannot write ")


@pytest.mark.parametrize("bad", [{"tflops": "nonsense"}, {"measured_at": "yesterday"}, {"method": None},
                                 {"measured_at": "2026-01-01T00:00:00"},  # no time zone
                                 {"read_gbps": 0.0}, {"read_gbps": None}, {"read_method": None}])
def test_corrupt_or_bad_entries_are_measured_again(bad):
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    calls = []
    device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert len(calls) == 1
    edit_entry(**bad)
    got = device_ceiling("cpu", "fp32", probe=fake_probe(calls))
    assert len(calls) == 2 and got.reason == "the cached figure was unreadable"


def test_an_old_cache_version_is_measured_again():
    path = cache_path()
    path.parent.mkdir(parents=True)
    old = {"tflops": 0.0021, "bandwidth_gbps": 20.0, "source": "measured: ...", "measured_at": "2026-01-01T00:00:00"}
    path.write_text(json.dumps({"version": 1, "entries": {f"{device_key('cpu', 'fp32')}|torch x": old}}))
    calls = []
    assert device_ceiling("cpu", "fp32", probe=fake_probe(calls)).tflops == 1.5 and len(calls) == 1


def test_a_version_2_entry_without_read_bandwidth_is_measured_again_and_the_file_rewritten():
    import torch

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    v2 = {"tflops": 2.0, "bandwidth_gbps": 20.0, "method": "old", "measured_at": now,
          "torch_version": torch.__version__, "driver_version": None}  # fresh and same torch: only the version differs
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 2, "entries": {device_key("cpu", "fp32"): v2}}))
    calls = []
    got = device_ceiling("cpu", "fp32", probe=fake_probe(calls, tflops=1.5, read=30.0))
    assert len(calls) == 1 and (got.tflops, got.read_gbps, got.read_method) == (1.5, 30.0, "fake read")
    assert got.reason == f"the cache was written by an older attnprof (cache version 2, now {ceiling.CACHE_VERSION})"
    data = json.loads(path.read_text())
    assert data["version"] == ceiling.CACHE_VERSION == 3
    [entry] = data["entries"].values()
    assert (entry["read_gbps"], entry["read_method"], entry["method"]) == (30.0, "fake read", "fake fp32")
    ceiling.forget()
    assert device_ceiling("cpu", "fp32", probe=never).read_gbps == 30.0  # kept: read from the cache now


def test_ridge_is_the_matmul_ceiling_over_the_read_bandwidth_not_the_copy():
    c = Ceiling(tflops=800.0, bandwidth_gbps=8400.0, source="cached", read_gbps=4000.0)
    assert c.ridge == pytest.approx(200.0)  # 800e12 / 4000e9; the copy's 8400 GB/s plays no part
    assert Ceiling(800.0, 8400.0, "cached").ridge is None  # no read bandwidth, no ridge
    assert Ceiling(None, None, "none").ridge is None


def test_cached_ceiling_finds_a_gpu_by_name_and_dtype_without_versions(monkeypatch):
    from attnprof.profiling.ceiling import cached_ceiling

    monkeypatch.setattr(ceiling, "device_key", lambda device, dtype: f"NVIDIA H200|{dtype}")
    monkeypatch.setattr(ceiling, "software_versions", lambda device: ("2.x", "550.1"))
    device_ceiling("cuda:0", "bf16", probe=fake_probe([], tflops=750.0, read=4500.0))
    got = cached_ceiling("NVIDIA H200", "bf16")
    assert got is not None and (got.tflops, got.read_gbps, got.source) == (750.0, 4500.0, "cached")
    assert cached_ceiling("NVIDIA H200", "fp16") is None and cached_ceiling("NVIDIA H100 80GB HBM3", "bf16") is None
    edit_entry(torch_version="0.1", driver_version="1.0")  # versions are not compared: torch is not imported
    assert cached_ceiling("NVIDIA H200", "bf16") is not None
    edit_entry(measured_at=(datetime.now(timezone.utc) - timedelta(days=MAX_AGE_DAYS + 1)).isoformat())
    assert cached_ceiling("NVIDIA H200", "bf16") is None  # too old


def test_key_names_device_and_dtype_not_versions():
    import torch

    key = device_key("cpu", "fp32")
    assert key.endswith("|fp32") and "threads" in key and torch.__version__ not in key


def test_run_ceiling_measures_again_once_per_run():
    calls = []
    run = RunCeiling.start("cpu", "fp32", probe=fake_probe(calls, tflops=0.0021))
    assert run.current.tflops == 0.0021 and run.replaced is None
    run.probe = fake_probe(calls, tflops=1.0)
    assert run.measure_again("naive reached 0.02 TFLOP/s") is True
    assert run.current.tflops == 1.0 and run.current.source == "measured"
    assert run.current.reason == "naive reached 0.02 TFLOP/s" and run.replaced.tflops == 0.0021
    assert run.measure_again("again") is False and len(calls) == 2  # once per run
    ceiling.forget()
    assert device_ceiling("cpu", "fp32", probe=never).tflops == 1.0  # and the cache holds the fresh one


def test_run_ceiling_without_a_ceiling_never_measures():
    run = RunCeiling.start("cpu", "bf16", probe=never)
    assert run.current.source == "none" and run.measure_again("why") is False and run.replaced is None


def test_real_cpu_measurement_is_positive_and_labelled():
    c = probe_ceiling("cpu", "fp32")
    assert c.tflops > 0 and c.bandwidth_gbps > 0 and c.read_gbps > 0
    assert c.source == "measured" and "fp32 matmul" in c.method
    assert c.read_method.startswith("torch.sum over 64 MiB of fp32; median of 10 after 3 warm-ups, perf_counter")


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e5m2"])
def test_a_cpu_has_no_fp8_ceiling_and_measures_nothing(dtype):
    found = device_ceiling("cpu", dtype, probe=never)
    assert found.source == "none" and found.tflops is None
    assert found.reason == f"no {dtype} matmul ceiling on CPU (fp8 cells need a GPU)"


@pytest.mark.parametrize("dtype, first", [("fp8", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")])
def test_the_fp8_ceilings_scaled_mm_takes_its_dtype_and_a_column_major_e4m3_second_operand(dtype, first):
    import torch

    a, b, one = fp8.scaled_mm_operands(32, dtype, torch.device("cpu"))
    assert str(a.dtype) == f"torch.{first}" and b.dtype == torch.float8_e4m3fn and b.stride() == (1, 32)
    out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # torch has it on CPU too
    assert torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=0.1)
    assert fp8.scaled_matmul_seconds(32, dtype, torch.device("cpu")) > 0
