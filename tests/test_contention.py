"""A cell timed while other processes held the CPU never passes silently: it is timed again once the CPU is
calm (a bounded wait, a bounded number of re-times), and a row still contended is marked in every table, has
the `cpu-contention` finding and a warning line at the top of the command's output. Latencies on a scheduler
tick count as contended too."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnprof.config import Config, MeasureOptions
from attnprof.pipeline import run_cell
from attnprof.pipeline.rows import cell_row
from attnprof.plugins import load_variants
from attnprof.profiling import contention, retime, timing
from attnprof.profiling.contention import CALM_WAIT_S, CONTENTION_LIMIT, Calm, scheduler_tick_ms, wait_for_calm
from attnprof.registry import RunSpec

SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
SPEC = RunSpec("cpu", "fp32", **SHAPE)
FAST = MeasureOptions(min_time_s=0.02)


# ------------------------------------------------------------------ scheduler-tick detection


def _jitter(values_ms: list[float], spread_us: float = 40.0, seed: int = 0) -> list[float]:
    """The values in µs, each moved by up to `spread_us` either way."""
    rng = random.Random(seed)
    return [v * 1e3 + rng.uniform(-spread_us, spread_us) for v in values_ms]


@pytest.mark.parametrize("tick", [4.0, 10.0, 1.0])
def test_latencies_on_multiples_of_a_tick_are_quantized_to_it(tick: float) -> None:
    """Most samples on one multiple (a tiny IQR) and some on others: the tick is found from the samples."""
    multiples = [2] * 30 + [1] * 4 + [3] * 4 + [5] * 2
    found = scheduler_tick_ms(_jitter([k * tick for k in multiples], spread_us=0.01 * tick * 1e3))
    assert found == pytest.approx(tick, rel=0.02)
    stats = timing.summarize([s / 1e6 for s in _jitter([k * tick for k in multiples])], **_SUMMARY)
    assert stats.iqr_us / stats.median_us < 0.1 and not stats.unstable, "it looks stable"


def test_a_long_backward_on_many_ticks_is_quantized() -> None:
    """56 ms is 14 ticks of 4 ms: the samples spread over 12 to 16 ticks."""
    rng = random.Random(1)
    found = scheduler_tick_ms(_jitter([4.0 * rng.choice([12, 13, 14, 14, 14, 15, 16]) for _ in range(60)]))
    assert found == pytest.approx(4.0, rel=0.02)


@pytest.mark.parametrize(
    "samples_us",
    [
        pytest.param([1380 + random.Random(2).uniform(-30, 30) for _ in range(40)], id="stable-1.4ms"),
        pytest.param(_jitter([8.0] * 40, spread_us=5), id="one-multiple-only"),
        pytest.param([random.Random(3).uniform(1000, 20000) for _ in range(500)], id="spread-out"),
        pytest.param([1380 * random.Random(4).lognormvariate(0, 0.2) for _ in range(200)], id="lognormal"),
        pytest.param([2000.0] * 30 + [4000.0], id="one-outlier-on-a-multiple"),
        pytest.param(_jitter([4.0, 8.0, 4.0, 8.0]), id="too-few-samples"),
        pytest.param(_jitter([0.3, 0.6, 0.3, 0.6, 0.9] * 4, spread_us=2), id="tick-under-1ms"),
    ],
)
def test_latencies_that_are_not_on_a_tick_are_not_quantized(samples_us: list[float]) -> None:
    assert scheduler_tick_ms(samples_us) is None


_SUMMARY = {"reps": 40, "warmup_reps": 3, "cold_s": 0.01, "method": "m"}


def test_the_tick_reaches_the_timing_and_makes_it_contended(real_contention) -> None:
    quantized = timing.summarize([s / 1e6 for s in _jitter([4.0] * 30 + [8.0] * 10)], **_SUMMARY)
    assert quantized.quantized_tick_ms == pytest.approx(4.0, rel=0.02) and quantized.contended
    assert quantized.contention_text.startswith("samples on multiples of a 4")
    quiet = timing.summarize([1e-3] * 40, **_SUMMARY, cpu_contention=0.1)
    assert quiet.quantized_tick_ms is None and not quiet.contended
    busy = timing.summarize([1e-3] * 40, **_SUMMARY, cpu_contention=0.7)
    assert busy.contended and busy.contention_text == "other processes took 70% of the CPU"


# ------------------------------------------------------------------ waiting for calm, bounded


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Sampler:
    """A fake `CpuShare.start`: each window it opens reports the next share of `shares` (the last repeats)."""

    def __init__(self, *shares: float | None) -> None:
        self.shares, self.windows = list(shares), 0

    def __call__(self) -> Sampler:
        self.windows += 1
        return self

    def others(self) -> float | None:
        return self.shares[min(self.windows, len(self.shares)) - 1]


def test_waiting_for_calm_on_a_cpu_that_stays_busy_ends_at_the_bound() -> None:
    clock, busy = FakeClock(), Sampler(0.9)
    calm = wait_for_calm(2.0, 0.2, start=busy, sleep=clock.sleep, clock=clock)
    assert not calm.calm and calm.share == 0.9
    assert 2.0 <= calm.waited_s < 2.0 + 0.2 + 1e-9 and busy.windows <= math.ceil(2.0 / 0.2) + 1


def test_waiting_for_calm_ends_at_the_first_calm_window() -> None:
    clock, calming = FakeClock(), Sampler(0.9, 0.8, 0.1)
    calm = wait_for_calm(2.0, 0.2, start=calming, sleep=clock.sleep, clock=clock)
    assert calm == Calm(True, 0.1, pytest.approx(0.6)) and calming.windows == 3


def test_waiting_for_calm_without_a_reading_ends_at_once() -> None:
    clock = FakeClock()
    calm = wait_for_calm(2.0, 0.2, start=Sampler(None), sleep=clock.sleep, clock=clock)
    assert calm == Calm(False, None, pytest.approx(0.2))
    assert retime.retimes_after(calm), "without a reading, a tick-quantized sample is timed again at once"


# ------------------------------------------------------------------ re-timing a contended cell


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(
        device="cpu",
        dtype="fp32",
        shapes=[SHAPE],
        variants=["naive", "sdpa-math"],
        baseline="sdpa-math",
        schedule={"wait": 0, "warmup": 1, "active": 2},
        output_dir=str(tmp_path / "out"),
    )


def builtin(name: str):
    return load_variants(no_plugins=True).registry.get(name)


def fake_timings(monkeypatch, *shares: float) -> list[float]:
    """`time_forward` returns a stable sample with each share of other processes in turn (the last repeats);
    returns the shares it handed out."""
    handed: list[float] = []

    def time_forward(fn, device, options, **kwargs):
        share = shares[min(len(handed), len(shares) - 1)]
        handed.append(share)
        return timing.summarize([1e-4] * 20, reps=20, warmup_reps=3, cold_s=0.01, method="fake", cpu_contention=share)

    monkeypatch.setattr(timing, "time_forward", time_forward)
    return handed


def fake_waits(monkeypatch, clock: FakeClock, *shares: float) -> list[Calm]:
    """`wait_for_calm` runs on a fake clock and sampler (the shares in turn, the last repeats), with the real
    bound; returns what each wait found."""
    found: list[Calm] = []
    sampler = Sampler(*shares)

    def wait(max_wait_s: float = CALM_WAIT_S, window_s: float = contention.CALM_WINDOW_S) -> Calm:
        found.append(wait_for_calm(max_wait_s, window_s, start=sampler, sleep=clock.sleep, clock=clock))
        return found[-1]

    monkeypatch.setattr(contention, "wait_for_calm", wait)
    return found


def test_a_contended_cell_is_timed_again_once_the_cpu_is_calm_and_the_calm_sample_kept(config, monkeypatch) -> None:
    handed = fake_timings(monkeypatch, 0.7, 0.05)
    waits = fake_waits(monkeypatch, FakeClock(), 0.8, 0.1)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert result.ok and handed == [0.7, 0.05] and len(waits) == 1 and waits[0].calm
    assert result.retimed_for_contention == 1 and result.retimed == 0 and not result.timing.contended
    assert result.timing.method == (
        "fake; contended (other processes took 70% of the CPU); timed again after 0.4 s for the CPU to calm "
        "(others 10%); kept sample calm"
    )
    row = cell_row(result)
    assert (row.contended, row.retimed_for_contention, row.cpu_contention) == (False, 1, 0.05)
    assert "cpu-contention" not in row.finding_ids and "calm_wait" in result.phases_s


@pytest.mark.parametrize("retimes", [0, 1, 2, 3])
def test_re_timing_for_contention_is_bounded_in_count_and_time(config, monkeypatch, retimes: int) -> None:
    """Contended every time, the CPU calm in each wait: at most `contention_retimes` re-times, each after one
    bounded wait; the time spent waiting is at most that many waits of `CALM_WAIT_S` and a window."""
    handed = fake_timings(monkeypatch, 0.7)
    clock = FakeClock()
    waits = fake_waits(monkeypatch, clock, 0.9, 0.9, 0.2)  # each wait: two busy windows, then calm
    result = run_cell(builtin("naive"), SPEC, config, FAST.model_copy(update={"contention_retimes": retimes}))
    assert len(handed) == retimes + 1 and len(waits) == retimes == result.retimed_for_contention
    assert clock.now <= retimes * (CALM_WAIT_S + contention.CALM_WINDOW_S)
    assert result.timing.contended and cell_row(result).contended


def test_a_cpu_that_never_calms_ends_the_re_timing_after_one_bounded_wait(config, monkeypatch) -> None:
    handed = fake_timings(monkeypatch, 0.7)
    clock = FakeClock()
    waits = fake_waits(monkeypatch, clock, 0.95)
    result = run_cell(builtin("naive"), SPEC, config, FAST)
    assert len(handed) == 1 and len(waits) == 1 and result.retimed_for_contention == 0
    assert CALM_WAIT_S <= clock.now <= CALM_WAIT_S + contention.CALM_WINDOW_S
    assert result.timing.method.endswith(
        f"contended (other processes took 70% of the CPU); not timed again: the CPU did not calm within "
        f"{clock.now:.1f} s (others 95%); kept sample still contended (other processes took 70% of the CPU)"
    )
    # the row's finding says why the latency was not timed again, not only that it was not
    assert result.uncalm_wait_s == pytest.approx(waits[0].waited_s)
    found = cell_row(result).finding("cpu-contention")
    assert found is not None and found.evidence["uncalm_wait_s"] == pytest.approx(waits[0].waited_s)
    assert f"(not re-timed; the CPU did not calm in {waits[0].waited_s:.1f} s of waiting)" in found.message


def test_a_still_contended_row_is_marked_and_has_the_finding_with_its_share(config, monkeypatch) -> None:
    fake_timings(monkeypatch, 0.7, 0.66, 0.72)
    fake_waits(monkeypatch, FakeClock(), 0.1)
    row = cell_row(run_cell(builtin("naive"), SPEC, config, FAST))
    assert row.contended and row.retimed_for_contention == 2 and row.cpu_contention == 0.72
    assert row.finding_ids[0] == "cpu-contention"
    finding = row.finding("cpu-contention")
    assert finding.severity == "problem" and finding.impact_us is None
    assert finding.evidence == {
        "cpu_contention": 0.72,
        "contention_limit": CONTENTION_LIMIT,
        "quantized_tick_ms": None,
        "retimed_for_contention": 2,
    }
    assert finding.message.startswith("While the latency was timed, other processes took 72% of the CPU (limit 25%)")


# ------------------------------------------------------------------ what the commands show


class BusyWindow:
    """A `CpuShare` whose every window saw other processes take 70% of the CPU."""

    @classmethod
    def start(cls) -> BusyWindow:
        return cls()

    def others(self) -> float:
        return 0.7


@pytest.fixture
def busy_machine(monkeypatch) -> list[Calm]:
    """Every timing reads 70% taken by other processes, and every wait for calm ends at once, still busy."""
    monkeypatch.setattr("attnprof.profiling.timing.CpuShare", BusyWindow)
    waits: list[Calm] = []

    def wait(max_wait_s: float = CALM_WAIT_S, window_s: float = contention.CALM_WINDOW_S) -> Calm:
        waits.append(Calm(False, 0.7, 0.0))
        return waits[-1]

    monkeypatch.setattr(contention, "wait_for_calm", wait)
    return waits


def test_compare_on_a_busy_machine_warns_first_and_marks_every_row(cli, write_config, busy_machine, tmp_path) -> None:
    result = cli("compare", str(write_config()), "--min-time", "0.01", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("warning: 3 of 3 timed rows were timed while other processes held the CPU (up to 70%")
    assert len(busy_machine) == 3, "each cell waited for calm once"
    table = [line for line in lines if line.split()[:2] in (["naive", "ok"], ["inplace", "ok"], ["sdpa-math", "ok"])]
    assert len(table) == 3 and all(" !" in line for line in table), table
    legend = "! marks a latency timed while other processes held the CPU"
    assert any(line.startswith(legend) for line in lines)
    assert "cpu-contention" in result.stdout
    [folder] = (tmp_path / "out").glob("*-compare")
    rows = json.loads((folder / "results.json").read_text())["results"]
    assert all(r["contended"] and r["findings"][0]["id"] == "cpu-contention" for r in rows)
    assert all(r["speedup_reliable"] is False for r in rows if r["variant"] != "sdpa-math")

    report = cli("report", str(folder / "results.json"))
    assert report.exit_code == 0, report.output
    page = Path(report.stdout.strip()).read_text()
    headline = page[page.index("<h2 id='headline'>") : page.index("</table>", page.index("<h2 id='headline'>"))]
    assert "<p class='warn'>warning: 3 of 3 timed rows were timed while other processes held the CPU" in headline
    assert "!" in headline.split("<tbody>")[1], "the fastest variant's latency is marked"
    # the warning says it for every row: the headline's findings lists leave cpu-contention to the section below
    assert "#finding-cpu-contention" not in headline.split("<tbody>")[1]
    findings = page[page.index("<h2 id='findings'>") :]
    assert "cpu-contention" in findings

    diff = cli("diff", str(folder / "results.json"), str(folder / "results.json"))
    assert diff.exit_code == 3, diff.output


def test_run_on_a_busy_machine_warns_first_and_says_why_in_its_latency(cli, write_config, busy_machine) -> None:
    result = cli("run", str(write_config()), "--variant", "naive", "--min-time", "0.01", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("warning: 1 of 1 timed rows were timed while other processes held the CPU")
    latency = next(line for line in result.stdout.splitlines() if line.startswith("latency (µs, median ± IQR)"))
    assert latency.split("IQR)")[1].strip().startswith("!")
    assert "held the CPU)" in " ".join(result.stdout.split()).partition("latency (µs, median ± IQR)")[2][:200]


def test_sweep_on_a_busy_machine_warns_first_and_marks_its_pivot_cells(cli, write_config, busy_machine) -> None:
    config = write_config(variants=["naive", "sdpa-math"], sweep={"seq": [16, 32]})
    result = cli("sweep", str(config), "--min-time", "0.01", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("warning: 4 of 4 timed rows were timed while other processes held the CPU")
    naive = next(line for line in result.stdout.splitlines() if line.startswith("naive "))
    assert naive.count("!") == 2, naive
    assert "! marks a latency timed while other processes held the CPU" in result.stdout


def test_model_on_a_busy_machine_warns_first_and_marks_its_rows(cli, model_config, busy_machine) -> None:
    result = cli("model", str(model_config(implementations=["sdpa", "eager"])), env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("warning: 2 of 2 timed rows were timed while other processes held the CPU")
    rows = [line for line in result.stdout.splitlines() if line.startswith(("sdpa ", "eager "))]
    assert len(rows) == 2 and all(" !" in line and "cpu-contention" in line for line in rows), rows
    assert "! marks a latency timed while other processes held the CPU" in result.stdout


def test_json_output_keeps_stdout_to_the_document_and_warns_on_stderr(cli, write_config, busy_machine) -> None:
    result = cli("compare", str(write_config()), "--min-time", "0.01", "--format", "json", "--variants", "naive")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["contended"] is True
    assert "warning: 1 of 1 timed rows were timed while other processes held the CPU" in result.stderr


def test_a_quiet_run_has_no_warning_no_mark_and_no_finding(cli, write_config) -> None:
    result = cli("compare", str(write_config()), "--min-time", "0.01", "--variants", "naive", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stdout and "cpu-contention" not in result.stdout and " !" not in result.stdout


# ------------------------------------------------------------------ the real thing


@pytest.mark.slow
def test_busy_processes_beside_a_compare_mark_its_rows_or_it_waits_for_calm(
    cli, write_config, tmp_path, real_contention
) -> None:
    """A busy loop per core (two on the development VM) beside a tiny compare: each row is contended, or was
    timed again once the CPU calmed; never a contended timing passing silently."""
    loops = min(os.cpu_count() or 2, 32)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
    try:
        time.sleep(0.5)
        result = cli("compare", str(write_config(variants=["naive", "sdpa-math"])), "--min-time", "0.05")
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    assert result.exit_code == 0, result.output
    [folder] = (tmp_path / "out").glob("*-compare")
    rows = json.loads((folder / "results.json").read_text())["results"]
    assert rows and all(r["contended"] or r["retimed_for_contention"] for r in rows), [
        (r["variant"], r["cpu_contention"], r["quantized_tick_ms"], r["retimed_for_contention"]) for r in rows
    ]
    for row in rows:
        assert row["contended"] == (row["findings"][0]["id"] == "cpu-contention")
    if any(r["contended"] for r in rows):
        assert result.stdout.startswith("warning: ")
