"""--ncu's collection side on CPU, with a fake `ncu` (tests/fake_ncu.py): the command line a pass runs, each failure
as one line (run-wide ones stop further passes), a failing pass that costs no other row anything, resume, the
child entry point running a cell's step (and a model row's) between the profiler's start and stop, and the
attention-kernel name filter of `attnprof model`.

Reading the report is `pipeline.counters.attach_counters`' job; the tests that are not about it replace it with
one that records what it was given."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TINY_LLAMA
from fake_ncu import child_job, install

from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.errors import CountersUnavailableError
from attnprof.nsight import NsightUnavailableError
from attnprof.pipeline import counters as collection
from attnprof.pipeline import plan_cells
from attnprof.pipeline.counters import attention_kernel_regex, cell_command, model_command
from attnprof.pipeline.engine import Job, resume_rows, run_job
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.ncu_child import run_cell_again, run_model_row_again
from attnprof.pipeline.resume import inherit_measure, open_previous
from attnprof.plugins import load_variants
from attnprof.profiling import ncu as ncu_module
from attnprof.profiling.ncu import NcuPassFailed, NcuRequest, ncu_command, run_ncu
from attnprof.registry import RunSpec, Variant
from attnprof.variant_registry import Registry

SHAPE = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
WITH_NCU = MeasureOptions(min_time_s=0.02, ncu=True)
SECTIONS = ("SpeedOfLight", "Occupancy")
CPU_NOTE = "hardware counters need a CUDA GPU (this run is on cpu)"


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(device="cpu", dtype="fp32", shapes=[SHAPE], variants=["naive", "sdpa-math"], baseline="sdpa-math",
                  schedule=Schedule(wait=0, warmup=1, active=1), output_dir=tmp_path / "out")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return install(tmp_path, monkeypatch)


@pytest.fixture
def read(monkeypatch):
    """Passes run on CPU (the fake needs no GPU), and each report read is recorded: (variant, report, seconds)."""
    seen = []
    monkeypatch.setattr(collection, "device_problem", lambda device: None)
    monkeypatch.setattr(collection, "attach_counters",
                        lambda result, report, seconds, ceiling, ncu: seen.append((result.variant, report, seconds)))
    return seen


def variants():
    registry = load_variants(no_plugins=True).registry
    return [registry.get("naive"), registry.get("sdpa-math")]


def rows(outcome):
    return {row.variant: row for row in outcome.document.results}


# --------------------------------------------------------------------------- the command and one pass


def test_the_command_profiles_from_the_childs_start_with_the_clocks_left_alone(tmp_path) -> None:
    child = [sys.executable, "-m", "attnprof.pipeline.ncu_child", "{}"]
    metrics = ("dram__bytes_read.sum", "lts__t_sector_hit_rate.pct")
    request = NcuRequest(child, tmp_path / "r.ncu-rep", SECTIONS, metrics, launch_count=5)
    command = ncu_command(Path("/opt/ncu"), request, tmp_path / "tmp.ncu-rep")
    assert command[:5] == ["/opt/ncu", "--profile-from-start", "off", "--clock-control", "none"]
    assert command[5:9] == ["--section", "SpeedOfLight", "--section", "Occupancy"]
    assert command[9:11] == ["--metrics", "dram__bytes_read.sum,lts__t_sector_hit_rate.pct"]
    assert command[11:13] == ["--launch-count", "5"] and "--kernel-name" not in command
    assert command[13:16] == ["-f", "-o", str(tmp_path / "tmp.ncu-rep")] and command[16:] == child
    filtered = ncu_command(Path("ncu"), replace(request, kernel_regex="flash"), tmp_path / "t.ncu-rep")
    assert filtered[filtered.index("--kernel-name") + 1] == "regex:flash"


def test_a_pass_writes_its_report_whole_and_never_over_another(tmp_path, fake) -> None:
    request = NcuRequest([sys.executable, "-c", "pass"], tmp_path / "traces" / "cell.ncu-rep", SECTIONS)
    first, second = run_ncu(fake.path, request), run_ncu(fake.path, request)
    assert first.report == tmp_path / "traces" / "cell.ncu-rep" and second.report.name == "cell-2.ncu-rep"
    assert first.report.read_bytes().startswith(b"NVIDIA Nsight Compute report") and first.seconds > 0
    assert sorted(p.name for p in first.report.parent.iterdir()) == ["cell-2.ncu-rep", "cell.ncu-rep"]  # no partial
    written = fake.calls[0][fake.calls[0].index("-o") + 1]
    assert Path(written).parent == first.report.parent and written.endswith(".ncu-rep")  # the temporary, then linked


@pytest.mark.parametrize(("mode", "error", "words"), [
    ("permission", NsightUnavailableError, "ERR_NVGPUCTRPERM"),
    ("library", NsightUnavailableError, "Failed to initialize the profiler: LibraryNotLoaded"),
    ("no-kernels", NcuPassFailed, "Nsight Compute profiled no kernel between the profiler's start and stop"),
    ("child-oom", NcuPassFailed, "the cell ran out of memory under Nsight Compute: CUDA out of memory. Tried"),
    ("child-failed", NcuPassFailed, "the cell failed under Nsight Compute: forward raised RuntimeError: boom"),
    ("crash", NcuPassFailed, "killed by SIGKILL (the system may have run out of memory)"),
    ("error", NcuPassFailed, "Nsight Compute exited with status 1: ==ERROR== The application returned an error"),
    ("empty", NcuPassFailed, "Nsight Compute wrote no report: ==PROF== Report:"),
])
def test_each_known_failure_is_one_line_and_leaves_no_file(tmp_path, fake, mode, error, words) -> None:
    fake.behave(mode)
    request = NcuRequest([sys.executable, "-c", "pass"], tmp_path / "traces" / "cell.ncu-rep", SECTIONS)
    with pytest.raises(error) as raised:
        run_ncu(fake.path, request)
    line = raised.value.message + (f"; {raised.value.hint}" if raised.value.hint else "")
    assert words in line and "\n" not in line
    assert list((tmp_path / "traces").iterdir()) == []
    if mode == "permission":
        assert "https://developer.nvidia.com/ERR_NVGPUCTRPERM" in line and "NVreg_RestrictProfilingToAdminUsers" in line


def test_a_pass_past_its_time_limit_is_stopped(tmp_path, fake) -> None:
    fake.behave("hang")
    request = NcuRequest([sys.executable, "-c", "pass"], tmp_path / "cell.ncu-rep", SECTIONS, timeout_s=1.0)
    started = time.perf_counter()
    with pytest.raises(NcuPassFailed, match="ran past its 1 s limit and was stopped"):
        run_ncu(fake.path, request)
    assert time.perf_counter() - started < 30


def test_a_report_this_machine_cannot_open_is_exported_as_its_raw_page(tmp_path, fake) -> None:
    report = tmp_path / "cell.ncu-rep"
    report.write_bytes(b"report")
    exported = ncu_module.export_raw_page(fake.path, report)
    assert exported == tmp_path / "cell.raw.csv"
    assert fake.calls[-1] == ["--import", str(report), "--csv", "--page", "raw"]
    assert exported.read_text().startswith('"ID","Process ID"')


# --------------------------------------------------------------------------- passes inside a run


class Seen:
    """A Watcher that keeps what it was told, with the time each Nsight Compute pass began."""

    def __init__(self):
        self.events = []

    def ceiling(self, ceiling):
        pass

    def ceiling_replaced(self, ceiling, beaten):
        pass

    @contextmanager
    def cells(self, total, time_left):
        yield self

    def on_start(self, index, total, variant, spec):
        self.events.append(("start", index, total, variant.name))

    def on_counters(self, index, total, variant, spec):
        self.events.append(("counters", index, total, variant.name, time.time()))

    def on_done(self, result):
        self.events.append(("done", result.variant, result.timing_window))


def test_each_cell_runs_again_under_ncu_after_its_measurement(config, fake, read) -> None:
    seen = Seen()
    outcome, code = run_job(Job("compare", config, "cpu", WITH_NCU, plan_cells(config, variants(), "cpu")), seen)
    assert outcome is not None and code == 0
    by_variant = rows(outcome)
    assert [e[0] for e in seen.events] == ["start", "counters", "done", "start", "counters", "done"]
    for index, (counters, done) in enumerate(((seen.events[1], seen.events[2]), (seen.events[4], seen.events[5]))):
        assert counters[1:4] == (index, 2, done[1])
        assert done[2][1] <= counters[4]  # the timing window closed before the pass began
    for call, (variant, report, seconds) in zip(fake.passes(), read, strict=True):
        row = by_variant[variant]
        assert row.status == "ok" and row.latency_us > 0 and row.ncu_note is None
        assert Path(row.ncu_report) == report and report.parent == Path(row.trace).parent
        assert report.name == Path(row.trace).name.removesuffix(".json.gz") + ".ncu-rep"
        assert row.phases_s["ncu"] >= seconds > 0
        job = child_job(call)
        assert job["cell"]["variant"] == variant and job["cell"]["seed"] == config.seed and job["no_plugins"]
        assert RunSpec(**job["cell"]["spec"]) == next(s for v, s in plan_cells(config, variants(), "cpu")
                                                      if v.name == variant)
        assert call[call.index("--launch-count") + 1] == "16" and "--kernel-name" not in call
        assert call[-4:-1] == [sys.executable, "-m", "attnprof.pipeline.ncu_child"]
    summary = outcome.document.ncu
    assert (summary["passes"], summary["with_counters"], summary["notes"]) == (2, 2, []) and summary["seconds"] > 0
    assert outcome.document.measure["ncu"] is True


def test_one_failing_pass_loses_nothing_else(config, fake, read) -> None:
    fake.behave("child-oom", only="naive")
    outcome, code = run_job(Job("compare", config, "cpu", WITH_NCU, plan_cells(config, variants(), "cpu")))
    assert outcome is not None and code == 0
    naive, math = rows(outcome)["naive"], rows(outcome)["sdpa-math"]
    assert naive.status == math.status == "ok" and naive.latency_us > 0 and naive.speedup_vs_baseline
    assert naive.ncu_report is None and naive.ncu_note.startswith("the cell ran out of memory under Nsight")
    assert math.ncu_note is None and Path(math.ncu_report).is_file()
    assert [variant for variant, _, _ in read] == ["sdpa-math"]
    assert len(fake.passes()) == 2 and outcome.document.ncu["notes"] == [naive.ncu_note]


def test_a_run_wide_refusal_stops_the_passes_after_the_first(config, fake, read) -> None:
    fake.behave("permission")
    outcome, code = run_job(Job("compare", config, "cpu", WITH_NCU, plan_cells(config, variants(), "cpu")))
    assert outcome is not None and code == 0
    notes = {row.ncu_note for row in outcome.document.results}
    assert len(notes) == 1 and "ERR_NVGPUCTRPERM" in notes.pop()
    assert len(fake.passes()) == 1 and read == [] and outcome.document.ncu["passes"] == 1


def test_without_ncu_the_run_is_refused_before_any_cell(config, tmp_path, monkeypatch, read) -> None:
    monkeypatch.setenv("ATTNPROF_NCU", str(tmp_path / "missing-ncu"))
    with pytest.raises(CountersUnavailableError) as refused:
        run_job(Job("compare", config, "cpu", WITH_NCU, plan_cells(config, variants(), "cpu")))
    assert f"--ncu: ATTNPROF_NCU={tmp_path / 'missing-ncu'} is not an executable file" == refused.value.message
    assert refused.value.exit_code == 3 and refused.value.hint.startswith("install Nsight Compute")
    assert not config.output_dir.exists()  # no run folder: nothing ran


def test_on_cpu_the_run_is_refused_before_any_cell(config, fake) -> None:
    with pytest.raises(CountersUnavailableError, match=re.escape(f"--ncu: {CPU_NOTE}")):
        run_job(Job("compare", config, "cpu", WITH_NCU, plan_cells(config, variants(), "cpu")))
    assert fake.calls == [] and not config.output_dir.exists()


def test_a_collector_on_cpu_still_says_why_without_a_pass(config, fake) -> None:
    """What a caller that does not refuse up front (`refuse_counters`) gets: each row says why, no pass runs."""
    results = [CellResult("naive", "built-in", spec) for _, spec in plan_cells(config, variants()[:1], "cpu")]
    results[0].trace_path = config.output_dir / "naive.json.gz"
    collector = collection.CounterCollector()
    collector.collect_cell(results[0], variants()[0], seed=0, ceiling=None)
    assert results[0].ncu_note == CPU_NOTE and collector.summary()["notes"] == [CPU_NOTE] and fake.calls == []


def test_a_resumed_run_keeps_the_reports_of_its_finished_cells(config, fake, read) -> None:
    cells = plan_cells(config, variants(), "cpu")

    def interrupt(*args):
        raise KeyboardInterrupt

    cut_short = [cells[0], (replace(cells[1][0], forward=interrupt), cells[1][1])]
    first, code = run_job(Job("compare", config, "cpu", WITH_NCU, cut_short))
    assert first is not None and code == 130
    kept_report = first.document.results[0].ncu_report
    assert kept_report and len(fake.passes()) == 1
    previous = open_previous(first.folder.dir, "compare")
    measure = inherit_measure(MeasureOptions(min_time_s=0.02), previous)  # --ncu left out: the earlier run's
    assert measure.ncu
    resumed = resume_rows(previous, config, measure, "cpu", cells)
    final, code = run_job(Job("compare", config, "cpu", measure, cells, previous, resumed.rows))
    assert final is not None and code == 0
    reports = [row.ncu_report for row in final.document.results]
    assert reports[0] == kept_report and reports[1] and Path(reports[1]).is_file()
    assert len(fake.passes()) == 2  # only the missing cell ran again


def test_under_torchrun_ncu_is_refused_in_one_line(config, monkeypatch) -> None:
    from attnprof.errors import ConfigError
    from attnprof.pipeline import distributed

    monkeypatch.setattr(distributed, "current", lambda: object())
    with pytest.raises(ConfigError, match="--ncu does not run under torchrun"):
        run_job(Job("compare", config, "cpu", WITH_NCU, plan_cells(config, variants(), "cpu")))


# --------------------------------------------------------------------------- the CLI


def test_compare_says_each_reason_once_and_the_time_added(cli, tmp_path, fake, read) -> None:
    fake.behave("permission")
    result = cli("compare", "--device", "cpu", "--dtype", "fp32", "--variants", "naive,sdpa-math", "--batch", "1",
                 "--heads", "2", "--seq", "32", "--head-dim", "16", "--min-time", "0.02", "-o", str(tmp_path),
                 "--ncu", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    [reason] = document["ncu"]["notes"]
    assert "ERR_NVGPUCTRPERM" in reason and result.stderr.count(f"--ncu: no counters: {reason}") == 1
    assert re.search(r"--ncu: 0 of 2 cell\(s\) got counters; Nsight Compute added \d+\.\d s to the run "
                     r"\(1 pass\(es\)\)", result.stderr)
    assert document["measure"]["ncu_launches"] == 16


SMALL = ("--dtype", "fp32", "--batch", "1", "--heads", "2", "--seq", "32", "--head-dim", "16", "--min-time", "0.02")


@pytest.mark.parametrize("command", [
    ["run", "--variant", "naive", *SMALL],
    ["compare", "--variants", "naive,sdpa-math", *SMALL],
    ["sweep", "--variants", "naive", *SMALL],
    ["check", "EXPECTATIONS", "--variants", "naive", *SMALL],
    ["model", "MODEL", "--attn", "sdpa"],
])
def test_ncu_on_a_cpu_run_is_refused_up_front(cli, tmp_path, model_config, command) -> None:
    """As `--device cuda` is on a CPU-only torch: one line, exit 3, before any cell runs (no run folder, no
    progress). `--device cpu` makes the run a CPU one on any machine, a GPU's included."""
    expectations = tmp_path / "expect.yaml"
    expectations.write_text("naive: {status: ok}\n")
    args = [str(expectations) if a == "EXPECTATIONS" else str(model_config()) if a == "MODEL" else a for a in command]
    out = tmp_path / "runs"
    result = cli(*args, "--device", "cpu", "-o", str(out), "--ncu")
    assert result.exit_code == 3, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert errors[0].startswith(f"error: --ncu: {CPU_NOTE}") and len(errors) == 2
    assert "Traceback" not in result.output and result.stdout == ""
    assert not out.exists() and "[1/" not in result.stderr and "results:" not in result.stderr


@pytest.mark.parametrize("command", [["compare", "--variants", "naive", *SMALL], ["model", "MODEL", "--attn", "sdpa"]])
def test_ncu_without_nsight_compute_is_refused_up_front(cli, tmp_path, model_config, monkeypatch, command) -> None:
    monkeypatch.setattr(collection, "device_problem", lambda device: None)  # as on a GPU
    monkeypatch.setenv("ATTNPROF_NCU", str(tmp_path / "missing-ncu"))
    args = [str(model_config()) if a == "MODEL" else a for a in command]
    result = cli(*args, "--device", "cpu", "-o", str(tmp_path / "runs"), "--ncu")
    assert result.exit_code == 3, result.output
    assert f"error: --ncu: ATTNPROF_NCU={tmp_path / 'missing-ncu'} is not an executable file" in result.stderr
    assert "hint: install Nsight Compute" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_ncu_with_device_cuda_on_a_cpu_only_torch_is_refused_for_the_device(cli, tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    result = cli("compare", "--device", "cuda", "-o", str(tmp_path / "runs"), "--ncu")
    assert result.exit_code == 3 and "error: device 'cuda' requested but this machine has " in result.stderr


def test_progress_names_each_cells_pass(cli, tmp_path, fake, read) -> None:
    result = cli("run", "--variant", "naive", "--device", "cpu", "--dtype", "fp32", "--batch", "1", "--heads", "2",
                 "--seq", "32", "--head-dim", "16", "--min-time", "0.02", "-o", str(tmp_path), "--ncu",
                 "--ncu-launches", "3")
    assert result.exit_code == 0, result.output
    assert "counters 1/1: naive 1x2x32x16" in result.stderr
    assert fake.passes()[0][fake.passes()[0].index("--launch-count") + 1] == "3"
    closing = r"--ncu: 1 of 1 cell\(s\) got counters; Nsight Compute added \d+\.\d s to the run \(1 pass\(es\)\)"
    assert re.search(closing, result.stderr)


def test_a_bad_launch_count_is_one_line(cli) -> None:
    result = cli("compare", "--device", "cpu", "--ncu", "--ncu-launches", "0")
    assert result.exit_code == 2 and "--ncu-launches" in result.output


# --------------------------------------------------------------------------- the child


class Logged(torch.autograd.Function):
    """Identity that logs its forward and backward into `Logged.events`."""

    events: list[str] = []

    @staticmethod
    def forward(ctx, x):
        Logged.events.append("forward")
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        Logged.events.append("backward")
        return grad


def logged_registry() -> Registry:
    def forward(q, k, v, causal, state):
        gqa = q.shape[1] != k.shape[1]
        return Logged.apply(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa))

    registry = Registry()
    registry.register(Variant("logged", "SDPA that logs its calls", forward, devices=("cpu",), source="attnprof-test"))
    return registry


@pytest.fixture
def profiler_marks(monkeypatch):
    """cudaProfilerStart and Stop, recorded among the logged calls."""
    Logged.events = []
    monkeypatch.setattr(ncu_module, "profiler_start", lambda device: Logged.events.append("start"))
    monkeypatch.setattr(ncu_module, "profiler_stop", lambda device: Logged.events.append("stop"))
    return Logged.events


@pytest.mark.parametrize(("mode", "events"), [
    ("fwd", ["forward"] * 3 + ["start", "forward", "stop"]),
    ("bwd", ["forward"] + ["backward"] * 3 + ["start", "backward", "stop"]),  # the forward once, untimed
    ("fwd+bwd", ["forward", "backward"] * 3 + ["start", "forward", "backward", "stop"]),
])
def test_the_child_runs_the_cells_step_between_the_profilers_start_and_stop(profiler_marks, mode, events) -> None:
    registry = logged_registry()
    spec = RunSpec("cpu", "fp32", 1, 2, 16, 8, mode=mode)
    job = json.loads(cell_command(registry.get("logged"), spec, seed=3)[-1])
    assert job["no_plugins"] is False  # a variant from outside the built-ins: the child loads the plugins
    run_cell_again(job["cell"], registry, steps=1)
    assert profiler_marks == events


def test_the_child_runs_a_model_rows_step_between_the_profilers_start_and_stop(profiler_marks, tmp_path) -> None:
    pytest.importorskip("transformers")
    from attnprof.model_config import ModelConfig

    config = ModelConfig(hf="llama", hf_config=TINY_LLAMA, seq=[16], device="cpu", dtype="fp32",
                         implementations=["sdpa", "logged"], output_dir=tmp_path)
    job = json.loads(model_command(config, "cpu", "logged", 16, "fwd", no_plugins=False)[-1])
    run_model_row_again(job["model"], logged_registry(), steps=1)
    start, stop = profiler_marks.index("start"), profiler_marks.index("stop")
    assert profiler_marks[start + 1 : stop] == ["forward"] * TINY_LLAMA["num_hidden_layers"]
    assert profiler_marks[:start] == ["forward"] * (3 * TINY_LLAMA["num_hidden_layers"])


def test_the_child_command_runs_a_cell_in_a_process_of_its_own(config, fake, read) -> None:
    fake.behave("child")
    outcome, code = run_job(Job("compare", config.model_copy(update={"variants": ["naive"], "baseline": None}),
                                "cpu", WITH_NCU, plan_cells(config, variants()[:1], "cpu")))
    assert outcome is not None and code == 0
    row = outcome.document.results[0]
    assert row.ncu_note is None and Path(row.ncu_report).is_file()


def test_a_child_whose_cell_cannot_run_says_why_in_one_line() -> None:
    spec = RunSpec("cpu", "fp32", 1, 2, 16, 8)
    command = cell_command(replace(load_variants(no_plugins=True).registry.get("naive"), name="no-such"), spec, 0)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=collection.child_environment())
    assert done.returncode == ncu_module.CHILD_FAILED
    assert re.search(r"^attnprof-ncu-child: failed: unknown variant 'no-such'", done.stderr, re.MULTILINE)


# --------------------------------------------------------------------------- attnprof model's filter


ATTENTION = [
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_3_64x128x128_4x2x1_cga1x1x1_kernel0_0",
    "flash_fwd_kernel",
    "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
    "flash_fwd_splitkv_combine_kernel",
    "_attn_fwd",
    "_attn_bwd_dkdv",
    "triton_tem_fused_flex_attention_0",
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80",
]
OTHERS = ["nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "triton_poi_fused_add_0", "elementwise_kernel",
          "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
          "vectorized_elementwise_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]


def test_the_model_filter_matches_the_attention_kernels_and_nothing_else() -> None:
    pattern = attention_kernel_regex()
    assert "(?P<" not in pattern  # ncu's regex (ECMAScript) has no named groups
    compiled = re.compile(pattern)
    assert all(compiled.fullmatch(name) for name in ATTENTION)  # whether ncu matches the whole name
    assert all(compiled.search(name) for name in ATTENTION)  # or searches in it
    assert not any(compiled.search(name) for name in OTHERS)


def test_a_model_rows_pass_profiles_only_its_attention_kernels(cli, model_config, fake, read) -> None:
    result = cli("model", str(model_config()), "--attn", "sdpa,naive", "--ncu")
    assert result.exit_code == 0, result.output
    calls = fake.passes()
    assert len(calls) == 2 and all(call[call.index("--launch-count") + 1] == "8" for call in calls)
    assert all(call[call.index("--kernel-name") + 1] == f"regex:{attention_kernel_regex()}" for call in calls)
    jobs = [child_job(call)["model"] for call in calls]
    assert [(j["implementation"], j["seq"], j["mode"], j["device"]) for j in jobs] == [
        ("sdpa", 16, "fwd", "cpu"), ("naive", 16, "fwd", "cpu")]
    assert "counters 1/2: sdpa @ seq 16 fwd" in result.stderr
    document = json.loads((Path(result.stderr.split("results: ")[1].split(" and ")[0])).read_text())
    assert [Path(row["ncu_report"]).suffix for row in document["results"]] == [".ncu-rep", ".ncu-rep"]
    assert document["ncu"]["passes"] == 2


def test_a_model_rows_counters_count_the_flops_of_one_forward_call() -> None:
    from attnprof.model_spec import ModelSpec

    row = ModelSpec("llama", "sdpa", batch=2, seq=256, mode="fwd", dtype="bf16", device="cuda:0", heads=16,
                    kv_heads=4, head_dim=64, causal=True, mask="causal")
    assert row.attention_spec == RunSpec("cuda:0", "bf16", 2, 16, 256, 64, 4, causal=True)
    assert replace(row, kv_heads=16).attention_spec == RunSpec("cuda:0", "bf16", 2, 16, 256, 64, causal=True)
    assert replace(row, mode="fwd+bwd").attention_spec is None  # its layers' kernels are no calls of one shape
    assert replace(row, heads=None).attention_spec is None  # a factory model that does not state them


def test_a_passs_report_is_read_into_its_rows_counters(config, fake, monkeypatch) -> None:
    """The real reader: this machine has no `ncu_report` module, so the report is exported as its raw page (here an
    H200 flash forward's) and read from that; a resumed run keeps the rows' counters as they were."""
    monkeypatch.setattr(collection, "device_problem", lambda device: None)
    monkeypatch.delenv("ATTNPROF_NCU_REPORT_DIR", raising=False)
    cells = plan_cells(config, variants(), "cpu")
    outcome, code = run_job(Job("compare", config, "cpu", WITH_NCU, cells))
    assert outcome is not None and code == 0
    for row in outcome.document.results:
        assert row.ncu_note is None
        report = Path(row.ncu_report)
        assert report.with_name(report.name.removesuffix(".ncu-rep") + ".raw.csv").is_file()
        counters = row.counters
        assert counters is not None and counters.seconds is not None
        assert [k.short_name for k in counters.kernels] == ["flash_fwd_kernel"]
        assert (counters.kernels[0].dram_read_bytes or 0) > 0
        assert counters.report_path == str(report) and 0 < counters.seconds <= row.phases_s["ncu"]
        assert row.ncu_seconds == pytest.approx(counters.seconds, abs=1e-3)
    assert outcome.document.ncu["with_counters"] == 2
    assert [call[0] for call in fake.calls] == ["--profile-from-start", "--import"] * 2

    previous = open_previous(outcome.folder.dir, "compare")
    resumed = resume_rows(previous, config, WITH_NCU, "cpu", cells)
    final, _ = run_job(Job("compare", config, "cpu", WITH_NCU, cells, previous, resumed.rows))
    assert final is not None and len(fake.passes()) == 2  # nothing ran again
    assert [row.counters for row in final.document.results] == [
        row.counters for row in outcome.document.results]


def test_a_model_rows_counters_use_the_ceiling_cached_for_the_reports_gpu(tmp_path, isolated_cache) -> None:
    """`attnprof model` measures no ceiling: its rows' roofline uses the one cached for the report's GPU and
    dtype, as its trace analysis does, and the datasheet only without one."""
    from datetime import datetime, timezone

    from attnprof.model_spec import ModelSpec
    from attnprof.pipeline.counters import attach_counters
    from attnprof.pipeline.measured import CellResult
    from attnprof.profiling.ceiling import Ceiling, cache_path, write_cache

    page = Path(__file__).parent / "data" / "h200" / "ncu" / "sdpa-cudnn-fwd.raw.csv"
    spec = ModelSpec("llama", "sdpa", batch=1, seq=16384, mode="fwd", dtype="bf16", device="cuda:0", heads=64,
                     kv_heads=8, head_dim=128, causal=True, mask="causal")
    row = CellResult("sdpa", "transformers", spec)
    attach_counters(row, page, 1.0, None, Path("ncu"))
    assert row.counters is not None and row.counters.peaks.basis == "datasheet"
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    measured = Ceiling(800.0, 4200.0, "measured", method="matmul", measured_at=now, torch_version="2.11",
                       read_gbps=4500.0, read_method="sum")
    write_cache(cache_path(), {"NVIDIA H200|bf16": measured.to_dict()})
    attach_counters(row, page, 1.0, None, Path("ncu"))
    assert row.counters.peaks.basis == "measured"
    assert (row.counters.peaks.tensor_tflops, row.counters.peaks.read_gbps) == (800.0, 4500.0)
