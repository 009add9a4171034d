"""The GPU over the timed calls through NVML, with a fake `pynvml`: the sampler, its summary, the row fields, the
`throttled` finding, the run view, and the one line a command says when NVML is missing or fails."""

from __future__ import annotations

import json
import sys
import threading
import types
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from attnprof.analysis.findings import FINDINGS, Verdict, judge
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row
from attnprof.profiling import gpu_health
from attnprof.profiling.gpu_health import HealthSample, device_keys, summarize_health, watching
from attnprof.profiling.timing import Timing
from attnprof.registry import RunSpec

SPEC = RunSpec("cuda:0", "bf16", 1, 1, 16, 16)
POWER_CAP, IDLE, HW_SLOWDOWN, APP_SETTING = 0x4, 0x1, 0x8, 0x2
BUS = "00000000:18:00.0"
FIELDS = (
    "timed_sm_clock_mhz",
    "timed_sm_clock_min_mhz",
    "sm_clock_application_mhz",
    "timed_power_pct",
    "timed_power_max_pct",
    "timed_temperature_max_c",
    "timed_clock_limits",
    "nvml_samples",
)


class NotFound(Exception):
    """What the fake NVML raises for a device it does not know or a reading it does not give."""


def fake_nvml(
    sm_mhz: int = 1980,
    reasons: int = 0,
    power_mw: int = 350_000,
    limit_mw: int = 700_000,
    temperature_c: int = 45,
    application_mhz: int | None = 1980,
    init_error: Exception | None = None,
    event_reasons: bool = True,
) -> types.ModuleType:
    """A `pynvml` stand-in for one GPU at PCI bus `BUS` whose readings are the arguments; `init_error` makes
    nvmlInit raise it; without `event_reasons` it has only the older ThrottleReasons name."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_TEMPERATURE_GPU = 1, 0
    nvml.NVMLError = NotFound
    handle = object()
    nvml.calls = 0

    def init() -> None:
        if init_error is not None:
            raise init_error

    def by_bus(bus: str) -> object:
        if bus != BUS:
            raise NotFound("Not Found")
        return handle

    def refuse(*args: object) -> object:
        raise NotFound("Not Found")

    def clock(h: object, kind: int) -> int:
        assert h is handle and kind == 1
        nvml.calls += 1
        return sm_mhz

    def application(h: object, kind: int) -> int:
        if application_mhz is None:
            raise NotFound("Not Supported")
        return application_mhz

    nvml.nvmlInit = init
    nvml.nvmlDeviceGetHandleByPciBusId = by_bus
    nvml.nvmlDeviceGetHandleByUUID = refuse
    nvml.nvmlDeviceGetHandleByIndex = refuse
    nvml.nvmlDeviceGetClockInfo = clock
    nvml.nvmlDeviceGetApplicationsClock = application
    nvml.nvmlDeviceGetPowerUsage = lambda h: power_mw
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: limit_mw
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: temperature_c
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: reasons
    if event_reasons:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: reasons
    return nvml


@pytest.fixture(autouse=True)
def fresh_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test opens NVML anew, and finds torch's cuda:0 at PCI bus `BUS`."""
    gpu_health.forget_nvml()
    monkeypatch.setattr(gpu_health, "_properties", lambda index: types.SimpleNamespace(
        pci_domain_id=0, pci_bus_id=0x18, pci_device_id=0, uuid="5f3a"))
    yield
    gpu_health.forget_nvml()


def install(monkeypatch: pytest.MonkeyPatch, nvml: types.ModuleType | None) -> None:
    """Put `nvml` where `import pynvml` finds it (None: pynvml is not installed)."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def sampled(samples: int = 3) -> gpu_health.Watch:
    """A window watched on cuda:0 until the sampler has taken `samples` samples (NVML's period made short)."""
    nvml = sys.modules["pynvml"]
    with watching(0) as watch:
        started = nvml.calls if nvml is not None else 0
        deadline = threading.Event()
        for _ in range(500):
            if nvml is None or nvml.calls - started >= samples:
                break
            deadline.wait(0.002)
    return watch


def timed(watch: gpu_health.Watch) -> CellResult:
    timing = Timing(100.0, 1.0, 99.5, 100.5, 99.0, 10, 3, 1.0, False, "CUDA events per call",
                    gpu_health=watch.health, gpu_health_note=watch.note)
    return CellResult("sdpa", "built-in", SPEC, timing=timing)


@pytest.fixture(autouse=True)
def short_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_health, "PERIOD_S", 0.001)


# ---------------------------------------------------------------- the sampler and the rows


def test_normal_clocks_fill_the_row_and_raise_no_finding(monkeypatch) -> None:
    install(monkeypatch, fake_nvml())
    watch = sampled()
    assert watch.note is None and watch.health is not None and watch.health.samples >= 3
    row = cell_row(timed(watch))
    assert (row.timed_sm_clock_mhz, row.timed_sm_clock_min_mhz, row.sm_clock_application_mhz) == (1980, 1980, 1980)
    assert (row.timed_power_pct, row.timed_power_max_pct, row.timed_temperature_max_c) == (50.0, 50.0, 45)
    assert row.timed_clock_limits is None and row.nvml_samples == watch.health.samples
    assert row.finding("throttled") is None


def test_a_power_cap_in_every_sample_is_a_throttled_finding_with_its_share(monkeypatch) -> None:
    install(monkeypatch, fake_nvml(sm_mhz=1845, reasons=POWER_CAP | APP_SETTING, power_mw=707_000))
    row = cell_row(timed(sampled()))
    assert row.timed_clock_limits == "applications_clocks_setting sw_power_cap"
    found = row.finding("throttled")
    assert found is not None and found.severity == "problem"
    # the upper bound: all of the 100 µs latency following the clock, 1,845 against 1,980 MHz
    assert found.impact_us == pytest.approx(100 * (1 - 1845 / 1980), abs=0.01)
    assert found.impact_pct == pytest.approx(100 * (1 - 1845 / 1980), abs=0.01)
    assert "SM clock 1,845 MHz median (1,845 lowest), 93% of the 1,980 MHz applications clock" in found.message
    said = "SW power cap throttled 100% of samples; power 101% of its limit median, 101% max; 45 °C max"
    assert said in found.message
    assert found.evidence["sw_power_cap_pct"] == 100.0 and found.evidence["power_max_pct"] == 101.0


def test_the_older_throttle_reasons_name_is_read_when_the_newer_is_missing(monkeypatch) -> None:
    install(monkeypatch, fake_nvml(reasons=HW_SLOWDOWN, event_reasons=False))
    row = cell_row(timed(sampled()))
    assert row.timed_clock_limits == "hw_slowdown" and row.finding("throttled") is not None


def test_a_clock_at_80_percent_of_the_applications_clock_is_throttled_with_its_percentage(monkeypatch) -> None:
    install(monkeypatch, fake_nvml(sm_mhz=1584))
    found = cell_row(timed(sampled())).finding("throttled")
    assert found is not None
    assert found.message.startswith("SM clock 1,584 MHz median (1,584 lowest), 80% of the 1,980 MHz applications clock")
    assert found.evidence["clock_pct_of_application"] == 80.0
    assert (found.impact_us, found.impact_pct) == (pytest.approx(20.0), pytest.approx(20.0))


def test_without_an_applications_clock_only_the_reasons_judge(monkeypatch) -> None:
    install(monkeypatch, fake_nvml(sm_mhz=1200, application_mhz=None))
    row = cell_row(timed(sampled()))
    assert row.sm_clock_application_mhz is None and row.timed_sm_clock_mhz == 1200
    assert row.finding("throttled") is None


@pytest.mark.parametrize(
    ("nvml", "note"),
    [
        (None, "NVML unavailable: pynvml is not installed (pip install 'attnprof[nvml]')"),
        (
            fake_nvml(init_error=NotFound("Driver Not Loaded")),
            "NVML unavailable: nvmlInit failed (NotFound: Driver Not Loaded)",
        ),
    ],
    ids=["missing", "init-error"],
)
def test_without_nvml_the_row_has_no_fields_and_the_timing_says_why(monkeypatch, nvml, note) -> None:
    install(monkeypatch, nvml)
    watch = sampled()
    assert watch.health is None and watch.note == note
    result = timed(watch)
    assert result.gpu_health_note == note and result.ok
    row = cell_row(result)
    assert all(getattr(row, name) is None for name in FIELDS) and row.findings == []


def test_a_device_nvml_cannot_find_is_said_with_what_was_tried(monkeypatch) -> None:
    install(monkeypatch, fake_nvml())
    monkeypatch.setattr(gpu_health, "_properties", lambda index: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    watch = sampled()
    assert watch.health is None
    assert watch.note == "NVML cannot find cuda:0 (index 3: Not Found)"


def test_device_keys_follow_torch_then_cuda_visible_devices(monkeypatch) -> None:
    assert device_keys(0)[:2] == [("pci", BUS), ("uuid", "GPU-5f3a")]
    monkeypatch.setattr(gpu_health, "_properties", lambda index: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-abc")
    assert device_keys(0) == [("index", "2")] and device_keys(1) == [("uuid", "GPU-abc")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_keys(1) == [("index", "1")]


def test_no_index_samples_nothing_and_says_nothing(monkeypatch) -> None:
    install(monkeypatch, None)
    with watching(None) as watch:
        pass
    assert watch.health is None and watch.note is None


# ---------------------------------------------------------------- the summary and the rule


def samples(*pairs: tuple[int, int]) -> list[HealthSample]:
    return [HealthSample(mhz, 600_000, 70, bits) for mhz, bits in pairs]


def test_the_summary_keeps_idle_samples_out_of_the_clock_and_the_reasons() -> None:
    window = samples((1980, 0), (1410, POWER_CAP), (1410, POWER_CAP), (345, IDLE), (1980, 0))
    health = summarize_health(window, 1980, 700_000)
    assert (health.samples, health.idle_samples, health.sm_clock_mhz, health.sm_clock_min_mhz) == (5, 1, 1980, 1410)
    assert health.reason_pcts == {"sw_power_cap": 40.0} and health.limits_text == "sw_power_cap"
    assert health.power_pct == pytest.approx(600 / 7) and summarize_health([], 1980, 700_000) is None


def test_a_power_cap_in_40_percent_of_the_samples_says_so() -> None:
    window = samples((1410, POWER_CAP), (1410, POWER_CAP), (1980, 0), (1980, 0), (1980, 0))
    [found] = judge(Verdict(gpu_health=summarize_health(window, 1980, 700_000)))
    assert found.id == "throttled"
    assert found.message == (
        "SM clock 1,980 MHz median (1,410 lowest), 100% of the 1,980 MHz applications clock; SW power cap throttled "
        "40% of samples; power 86% of its limit median, 86% max; 70 °C max (5 NVML samples over the timed calls)."
    )


def test_a_rare_reason_or_an_idle_gpu_is_not_throttling() -> None:
    rare = samples(*([(1980, 0)] * 19 + [(1900, POWER_CAP)]))  # 5% of the samples
    assert judge(Verdict(gpu_health=summarize_health(rare, 1980, 700_000))) == []
    idle = samples((345, IDLE), (345, IDLE))  # a low clock while idle is the driver resting, not a throttle
    assert judge(Verdict(gpu_health=summarize_health(idle, 1980, 700_000))) == []


def test_throttled_is_a_registered_problem_and_its_impact_needs_a_latency_and_a_shortfall() -> None:
    rule = FINDINGS.get("throttled")
    assert rule.severity == "problem" and "upper bound" in rule.impact_text
    assert FINDINGS.ids()[-2:] == ("throttled", "fp8-not-faster")  # the last trace-free rules: NVML, then fp8
    slow = summarize_health(samples((1584, 0), (1584, 0)), 1980, 700_000)
    assert judge(Verdict(gpu_health=slow))[0].impact_us is None  # no latency
    [found] = judge(Verdict(gpu_health=slow, latency_us=50.0))
    assert found.impact_us == pytest.approx(10.0) and found.impact_pct == pytest.approx(20.0)
    capped = summarize_health(samples((1980, POWER_CAP), (1980, POWER_CAP)), 1980, 700_000)
    assert judge(Verdict(gpu_health=capped, latency_us=50.0))[0].impact_us == 0.0  # the clock held: nothing lost


# ---------------------------------------------------------------- the run view


def test_the_run_view_shows_the_gpu_and_marks_throttling(monkeypatch) -> None:
    from attnprof.report.run_tables import run_summary_table

    install(monkeypatch, fake_nvml(sm_mhz=1584, reasons=POWER_CAP, temperature_c=83))
    row = cell_row(timed(sampled()))
    table = run_summary_table(row, "markdown")
    line = next(line for line in table.splitlines() if "GPU over the timed calls (NVML)" in line)
    assert "throttled: 1,584 MHz median, 1,584 lowest (applications clock 1,980 MHz); power 50% of its limit" in line
    assert "83 °C max; held down by sw_power_cap;" in line
    calm = run_summary_table(msgspec.structs.replace(row, findings=[]), "markdown")
    assert "| 1,584 MHz median" in calm and "throttled:" not in calm
    unsampled = msgspec.structs.replace(row, nvml_samples=None)
    assert "n/a (not sampled: CPU, NVML unavailable" in run_summary_table(unsampled, "markdown")


# ---------------------------------------------------------------- a command says it once


def _with_nvml_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU cells timed as a CUDA cell would be: the real timing, then a watched window on cuda:0 (no GPU here)."""
    from attnprof.profiling import timing

    real = timing.time_forward

    def time_forward(*args, **kwargs):
        sample = real(*args, **kwargs)
        with watching(0) as watch:
            pass
        return replace(sample, gpu_health=watch.health, gpu_health_note=watch.note)

    monkeypatch.setattr(timing, "time_forward", time_forward)


@pytest.mark.parametrize("nvml", [None, fake_nvml(init_error=NotFound("Driver Not Loaded"))], ids=["missing", "init"])
def test_a_command_says_once_that_nvml_is_unavailable(cli, write_config, tmp_path: Path, monkeypatch, nvml) -> None:
    install(monkeypatch, nvml)
    _with_nvml_on_cpu(monkeypatch)
    result = cli("compare", str(write_config(variants=["naive", "sdpa-math"])), "--min-time", "0.02")
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "over the timed calls" in line]
    assert len(said) == 1 and "NVML unavailable: " in said[0], result.stderr
    [folder] = (tmp_path / "out").glob("*-compare")
    rows = json.loads((folder / "results.json").read_text())["results"]
    assert len(rows) == 2 and all(row[name] is None for row in rows for name in FIELDS)


def test_a_throttled_compare_lists_the_finding_and_fills_the_csv(cli, write_config, tmp_path, monkeypatch) -> None:
    import csv

    install(monkeypatch, fake_nvml(reasons=POWER_CAP, power_mw=700_000))
    _with_nvml_on_cpu(monkeypatch)
    result = cli("compare", str(write_config(variants=["sdpa-math"])), "--min-time", "0.02")
    assert result.exit_code == 0, result.output
    assert "over the timed calls" not in result.stderr
    [folder] = (tmp_path / "out").glob("*-compare")
    [row] = json.loads((folder / "results.json").read_text())["results"]
    assert "throttled" in [f["id"] for f in row["findings"]] and row["timed_clock_limits"] == "sw_power_cap"
    [line] = list(csv.DictReader((folder / "results.csv").open()))
    assert line["timed_power_pct"] == "100.0" and line["nvml_samples"] == str(row["nvml_samples"])
    from attnprof.report.html import report_html
    from attnprof.results.files import load_results

    page = report_html(load_results(folder / "results.json"), tmp_path / "report.html", [], [])
    assert "id='finding-throttled'" in page or 'id="finding-throttled"' in page
    assert "SW power cap throttled 100% of samples" in page
