"""Issue 32, part 3: decode timed the way it is served. The --cuda-graph choice (auto/on/off), the check that
a graph holds the eager step's kernels (with fake profiler events), --cold-l2 rotate's copies, the rows' L2
state, and the tables' figures by kernel time for graph-timed and host-bound rows. GPU-only paths:
tests/test_gpu_graph_timing.py."""

from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
import torch
from typer.testing import CliRunner

from attnprof.cli.app import app
from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.errors import ConfigError, VariantFailure
from attnprof.pipeline.cell import run_cell
from attnprof.pipeline.resume import check_resumable, inherit_measure, recorded_measure
from attnprof.pipeline.rows import cell_row
from attnprof.plugins import load_variants
from attnprof.profiling import cuda_graphs, graph_check, timing
from attnprof.profiling.cuda_graphs import forwards_per_graph, graph_choice, rotation_copies
from attnprof.profiling.graph_check import DeviceWork, count_device_work, graph_mismatch
from attnprof.profiling.steps import cell_step
from attnprof.profiling.timing import TimingOptions, time_forward
from attnprof.registry import RunSpec
from attnprof.report.columns import KERNEL_LEGEND, bandwidth_cell, by_kernel_time, l2_text, peak_pct_cell
from attnprof.report.tables import shape_table
from attnprof.results.files import ResultsFile, load_results
from attnprof.results.schema import Document, Row

DATA = Path(__file__).parent / "data" / "h200" / "results"
MiB = 2**20
DECODE = RunSpec("cuda:0", "bf16", 1, 32, 32768, 128, kv_heads=8, causal=True, q_len=1)
PREFILL = RunSpec("cuda:0", "bf16", 8, 16, 1024, 64, causal=True)


# ------------------------------------------------------------------ the choice


def test_auto_graphs_decode_forward_cells_on_cuda_only():
    assert graph_choice("auto", "fwd", 1, "cuda:0") == (True, "auto: q_len 1 <= 16")
    assert graph_choice("auto", "fwd", 16, "cuda") == (True, "auto: q_len 16 <= 16")
    assert graph_choice("auto", "fwd", 17, "cuda") == (False, "auto: q_len 17 > 16")
    assert graph_choice("auto", "bwd", 1, "cuda") == (False, "auto: bwd is timed eagerly")
    assert graph_choice("auto", "fwd+bwd", 1, "cuda") == (False, "auto: fwd+bwd is timed eagerly")
    assert graph_choice("auto", "fwd", 1, "cpu") == (False, "")  # nothing to say on a CPU
    assert graph_choice("on", "fwd", 4096, "cuda") == (True, "")
    assert graph_choice("off", "fwd", 1, "cuda") == (False, "--no-cuda-graph")


def test_timing_options_resolve_the_choice_per_cell():
    auto = MeasureOptions()
    decode = TimingOptions.from_measure(auto, DECODE)
    assert decode.cuda_graph and decode.graph_note == "auto: q_len 1 <= 16" and not decode.rotate
    assert not TimingOptions.from_measure(auto, PREFILL).cuda_graph
    assert not TimingOptions.from_measure(auto, replace(DECODE, mode="bwd")).cuda_graph
    assert not TimingOptions.from_measure(MeasureOptions(cuda_graph="off"), DECODE).cuda_graph
    rotated = TimingOptions.from_measure(MeasureOptions(cold_l2="rotate"), DECODE)
    assert rotated.rotate and not rotated.flush_l2
    assert TimingOptions.from_measure(MeasureOptions(flush_l2=True), DECODE).flush_l2


def test_measure_options_read_old_booleans_and_keep_flush_and_cold_l2_as_one():
    assert MeasureOptions().cuda_graph == "auto" and MeasureOptions().cold_l2 == "off"
    assert MeasureOptions(cuda_graph=True).cuda_graph == "on"  # a results file of before "auto"
    assert MeasureOptions(cuda_graph=False).cuda_graph == "off"
    assert MeasureOptions(flush_l2=True).cold_l2 == "flush"
    assert MeasureOptions(cold_l2="flush").flush_l2 is True
    assert MeasureOptions(cold_l2="rotate").flush_l2 is False
    with pytest.raises(ValueError, match="contradict"):
        MeasureOptions(flush_l2=True, cold_l2="rotate")


def test_cli_refuses_contradicting_l2_options_in_one_line():
    runner = CliRunner()
    both = runner.invoke(app, ["run", "-v", "sdpa", "--device", "cpu", "--flush-l2", "--cold-l2", "rotate"])
    assert both.exit_code == 2
    assert both.output.strip() == "error: --flush-l2 and --cold-l2 rotate contradict each other: give one"
    bogus = runner.invoke(app, ["run", "-v", "sdpa", "--device", "cpu", "--cold-l2", "cold"])
    assert bogus.exit_code == 2 and len(bogus.output.strip().splitlines()) == 1 and "--cold-l2" in bogus.output


CONFIG = Config(shapes=[{"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}], device="cpu")


def _previous(measure: dict) -> ResultsFile:
    header = Document(
        command="sweep", measure=measure, config=CONFIG.model_dump(mode="json"), environment={"device": "cpu"}
    )
    return ResultsFile(Path("old/results.jsonl"), header, [], False)


def test_resume_reads_an_old_run_that_recorded_booleans():
    """A run of before "auto" recorded `cuda_graph: false` (eager) and no `cold_l2`."""
    old = _previous({"timing": True, "min_time_s": 0.25, "cuda_graph": False, "flush_l2": True, "check_masking": False})
    assert recorded_measure(old) == {
        "timing": True,
        "min_time_s": 0.25,
        "cuda_graph": "off",
        "flush_l2": True,
        "cold_l2": "flush",
        "check_masking": False,
    }
    inherited = inherit_measure(MeasureOptions(), old)  # nothing given: the old run's options
    assert (inherited.cuda_graph, inherited.cold_l2, inherited.flush_l2) == ("off", "flush", True)
    check_resumable(old, CONFIG, inherited, "cpu")  # the same options: no error
    with pytest.raises(ConfigError, match=r"cuda_graph off \(now auto\)"):
        check_resumable(old, CONFIG, MeasureOptions(cold_l2="flush"), "cpu")
    with pytest.raises(ConfigError, match=r"cold_l2 flush \(now rotate\)"):
        check_resumable(old, CONFIG, inherit_measure(MeasureOptions(cold_l2="rotate"), old), "cpu")


# ------------------------------------------------------------------ graph sizes and rotation


def test_rotation_copies_exceed_five_times_the_l2():
    l2 = 60 * MiB
    copies = rotation_copies(128 * MiB, l2)
    assert copies == 3 and copies * 128 * MiB > 5 * l2 and (copies - 1) * 128 * MiB <= 5 * l2
    assert rotation_copies(1 * MiB, l2) == 301
    assert rotation_copies(100 * MiB, l2) == 4  # 3 x 100 MiB = 300 MiB is not over 5 x 60 MiB
    assert rotation_copies(300 * MiB, l2) == 1  # one copy alone is 5x the L2
    assert rotation_copies(299 * MiB, l2) == 2  # at least two when one is not enough
    with pytest.raises(ValueError):
        rotation_copies(0, l2)


def test_a_rotating_graph_holds_a_multiple_of_its_copies():
    assert forwards_per_graph(40.0) == 25  # as before: about 1 ms of work
    assert forwards_per_graph(3 * 40.0, cycle=3) == 24  # 8 cycles of 3 copies
    assert forwards_per_graph(2000.0, cycle=3) == 3  # at least one cycle
    assert forwards_per_graph(10.0, cycle=5) == 60  # at most 64 forwards: 12 cycles of 5
    assert forwards_per_graph(10.0, cycle=100) == 100  # one cycle, though over 64


# ------------------------------------------------------------------ the graph's kernels


def _kernel(name: str, correlation: int, cat: str = "kernel") -> dict:
    return {"cat": cat, "name": name, "args": {"correlation": correlation}}


def _runtime(name: str, correlation: int) -> dict:
    return {"cat": "cuda_runtime", "name": name, "args": {"correlation": correlation}}


EAGER = [
    _runtime("cudaLaunchKernel", 1),
    _kernel("flash_fwd_splitkv_kernel", 1),
    _runtime("cudaLaunchKernel", 2),
    _kernel("flash_fwd_splitkv_combine_kernel", 2),
    _runtime("cudaMemsetAsync", 3),
    _kernel("Memset (Device)", 3, cat="gpu_memset"),
    {"cat": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention", "args": {}},
]


def _replay(forwards: int, drop: int = 0) -> list[dict]:
    """One replay of a graph of `forwards` eager steps (less `drop` kernels), beside torch's own fill kernels."""
    work = [_kernel("flash_fwd_splitkv_kernel", 9), _kernel("flash_fwd_splitkv_combine_kernel", 9)] * forwards
    memsets = [_kernel("Memset (Device)", 9, cat="gpu_memset")] * forwards
    prologue = [_runtime("cudaLaunchKernel", 7), _kernel("FillFunctor<long>", 7), _kernel("FillFunctor<long>", 7)]
    return prologue + [_runtime("cudaGraphLaunch", 9)] + work[drop:] + memsets


def test_device_work_is_counted_by_kind_and_a_replay_only_by_its_graph_launch():
    assert count_device_work(EAGER) == DeviceWork(kernels=2, memsets=1)
    assert count_device_work(_replay(3), graph_only=True) == DeviceWork(kernels=6, memsets=3)
    assert count_device_work(_replay(3)) == DeviceWork(kernels=8, memsets=3)  # the prologue's fills are not its
    assert count_device_work(_replay(1), graph_only=True).text == "2 kernels, 1 memset"


def test_a_graph_that_holds_the_step_matches():
    assert graph_mismatch(count_device_work(EAGER), count_device_work(_replay(4), graph_only=True), 4) is None


def test_a_graph_that_missed_a_kernel_fails_with_the_reason():
    replay = count_device_work(_replay(4, drop=1), graph_only=True)
    why = graph_mismatch(count_device_work(EAGER), replay, 4)
    assert why == (
        "its CUDA graph does not hold the step: one replay (4 forwards) launched 7 kernels, 4 memsets, the eager "
        "step 2 kernels, 1 memset (8 kernels, 4 memsets for 4); time it with --no-cuda-graph"
    )
    empty = graph_mismatch(count_device_work(EAGER), DeviceWork(), 1)  # nothing captured at all
    assert empty is not None and "launched no device work, the eager step 2 kernels, 1 memset" in empty
    assert "cannot be checked" in (graph_mismatch(DeviceWork(), DeviceWork(), 1) or "")


def test_check_graph_profiles_the_step_and_one_replay(monkeypatch):
    profiled = iter([EAGER, _replay(2, drop=1)])
    monkeypatch.setattr(graph_check, "trace_events", lambda run: (run(), next(profiled))[1])
    calls = []
    with pytest.raises(VariantFailure, match="one replay \\(2 forwards\\) launched 3 kernels"):
        graph_check.check_graph(lambda: calls.append("step"), lambda: calls.append("replay"), 2)
    assert calls == ["step", "replay"]


class _FakeGraph:
    def replay(self) -> None:
        return None


def test_timing_fails_the_cell_when_its_graph_misses_a_kernel(monkeypatch):
    """`_launcher`, the code that chooses what each sample launches, with a captured graph faked: a mismatch
    raises the VariantFailure that `pipeline.stages.measured` makes a failed row of; a match replays."""
    monkeypatch.setattr(timing, "graphed", lambda calls, reps, single: (_FakeGraph(), 2, [1e-4]))
    monkeypatch.setattr(graph_check, "trace_events", lambda run: EAGER if run.__name__ == "step" else _replay(2, 1))

    def step() -> None:
        return None

    fake = timing._Step(step, timing._nothing, False, lambda: 0.0, None, (step,))
    options = TimingOptions(cuda_graph=True, graph_note="auto: q_len 1 <= 16")
    with pytest.raises(VariantFailure, match="does not hold the step"):
        timing._launcher(fake, step, "cuda:0", options)
    launch, per_sample, _, notes = timing._launcher(fake, step, "cuda:0", replace(options, check_graph=False))
    assert per_sample == 2 and notes == [] and launch.__self__.__class__ is _FakeGraph
    monkeypatch.setattr(graph_check, "trace_events", lambda run: EAGER if run.__name__ == "step" else _replay(2))
    launch, per_sample, _, _ = timing._launcher(fake, step, "cuda:0", options)
    assert per_sample == 2 and launch.__self__.__class__ is _FakeGraph


def test_a_failed_graph_check_is_a_failed_row_and_the_run_goes_on(tmp_path, monkeypatch):
    """The cell whose graph check fails (faked: this machine has no GPU) is a failed row with the reason;
    the next cell of the run is measured as usual."""
    from attnprof.pipeline import stages

    why = graph_mismatch(count_device_work(EAGER), DeviceWork(kernels=1), 1)
    real = timing.time_forward

    def checked(fn, device, options, **kwargs):
        if options.min_time_s == 0.011:  # the cell whose graph misses a kernel
            raise VariantFailure(why or "")
        return real(fn, device, options, **kwargs)

    monkeypatch.setattr(timing, "time_forward", checked)
    assert stages.RETIMES == 1
    config = Config(
        shapes=[{"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}],
        device="cpu",
        schedule=Schedule(wait=0, warmup=1, active=1),
        output_dir=tmp_path,
    )
    spec = RunSpec("cpu", "fp32", 1, 2, 32, 16, causal=True)
    sdpa = load_variants(no_plugins=True).registry.get("sdpa")
    failed = run_cell(sdpa, spec, config, MeasureOptions(min_time_s=0.011))
    assert failed.status == "failed" and failed.reason == why
    assert cell_row(failed).status.startswith("failed: its CUDA graph does not hold the step")
    assert run_cell(sdpa, spec, config, MeasureOptions(min_time_s=0.02)).ok


# ------------------------------------------------------------------ inputs, copies and the CPU


def test_a_cells_step_knows_its_input_bytes_and_makes_copies():
    spec = RunSpec("cpu", "fp32", 2, 4, 64, 16, kv_heads=2, causal=True, q_len=1, kv_len=64)
    sdpa = load_variants(no_plugins=True).registry.get("sdpa")
    from contextlib import nullcontext

    with cell_step(sdpa, spec, 0, lambda what: nullcontext()) as step:
        q, k, v = step.inputs
        assert step.input_bytes == 4 * (2 * 4 * 1 * 16 + 2 * 2 * 2 * 64 * 16)
        copy = step.replica()
        assert copy.input_bytes == step.input_bytes
        pairs = zip(copy.inputs, step.inputs, strict=True)
        assert all(a.data_ptr() != b.data_ptr() and torch.equal(a, b) for a, b in pairs)
        assert torch.equal(copy.call(), step.call())


def test_cpu_timing_cycles_nothing_and_says_what_does_not_apply():
    calls = []
    options = TimingOptions(min_time_s=0.002, min_reps=2, warmup_s=0.01, rotate=True)
    t = time_forward(lambda: calls.append(0), "cpu", options, copies=[lambda: calls.append(1)])
    assert "cold-l2 rotate n/a on CPU" in t.method and set(calls) == {0}
    assert t.l2_state is None and t.l2_bytes is None
    auto = time_forward(lambda: None, "cpu", TimingOptions(min_time_s=0.002, min_reps=2, warmup_s=0.01))
    assert "cuda-graph" not in auto.method  # auto says nothing on a CPU


def test_the_step_cycles_through_its_copies_in_order():
    seen = []
    step = timing._Step(lambda: seen.append("a"), timing._nothing, False, lambda: 0.0, None, ())
    step = replace(step, calls=(step.fn, lambda: seen.append("b"), lambda: seen.append("c")))
    cycled = step.cycling()
    for _ in range(7):
        cycled()
    assert seen == ["a", "b", "c", "a", "b", "c", "a"]


def test_rotation_is_refused_when_the_copies_do_not_fit(monkeypatch):
    from attnprof.pipeline import cell

    class Step:
        prepare = None
        input_bytes = 40 * 2**30

        def replica(self):
            raise AssertionError("no copy is made when they do not fit")

    monkeypatch.setattr(cuda_graphs, "l2_cache_bytes", lambda dev: 60 * MiB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (50 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 0)
    Step.input_bytes = 100 * MiB  # 4 copies: 3 more, 300 MiB
    made = []
    Step.replica = lambda self: made.append(1) or "copy"  # type: ignore[method-assign]
    assert cell.rotation_replicas(Step(), DECODE) == ["copy"] * 3
    Step.input_bytes = 20 * 2**30  # one copy alone exceeds 5x the L2: no more
    assert cell.rotation_replicas(Step(), DECODE) == []
    Step.input_bytes = 299 * MiB  # 2 copies: 299 MiB more
    assert len(cell.rotation_replicas(Step(), DECODE)) == 1
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (320 * MiB, 141 * 2**30))  # 90%: 288 MiB
    with pytest.raises(VariantFailure) as refused:
        cell.rotation_replicas(Step(), DECODE)
    assert str(refused.value) == (
        "--cold-l2 rotate: 1 more copy of the inputs (1 x 0.29 GiB, to exceed 5x the 60 MiB L2) do not fit in "
        "the 0.31 GiB free on cuda:0"
    )
    Step.prepare = lambda self: None  # type: ignore[assignment]
    with pytest.raises(VariantFailure, match="untimed forward before each call"):
        cell.rotation_replicas(Step(), DECODE)


# ------------------------------------------------------------------ rows and tables


def _decode_rows() -> list[Row]:
    return load_results(DATA / "decode-kernel-gbps.json").rows


def test_a_graph_timed_row_shows_its_figures_by_kernel_time_marked():
    cudnn = _decode_rows()[0]
    assert by_kernel_time(cudnn)  # cpu-bound stands as a problem: host-bound
    graph = msgspec.structs.replace(cudnn, cuda_graph=True, findings=[], kernel_pct_of_read_bandwidth=78.36)
    assert by_kernel_time(graph)
    assert bandwidth_cell(graph) == "3,622 (78.4%) [k]" and peak_pct_cell(graph).endswith(" [k]")
    eager = msgspec.structs.replace(graph, cuda_graph=False)
    assert not by_kernel_time(eager)
    assert bandwidth_cell(eager) == "1,715 (37.1%)" and "[k]" not in peak_pct_cell(eager)
    table = shape_table([graph, eager], "table", width=None)
    assert "3,622 (78.4%) [k]" in table and " ".join(KERNEL_LEGEND.split()) in " ".join(table.split())
    assert KERNEL_LEGEND.split()[0] not in shape_table([eager], "table", width=None)


def test_a_settled_cpu_bound_is_not_host_bound():
    """flex's cpu-bound is info: its latency timed without the profiler shows the GPU setting the pace."""
    flex = _decode_rows()[2]
    assert flex.finding("cpu-bound") is not None and not by_kernel_time(flex)
    assert "[k]" not in bandwidth_cell(flex)


def test_rows_state_their_l2():
    row = Row(l2_state="rotated", l2_bytes=60 * MiB, working_set_bytes=128 * MiB + 4096)
    assert l2_text(row) == "rotated; working set 128.0 MiB = 2.1x the 60 MiB L2"
    assert l2_text(Row(l2_state="warm", l2_bytes=60 * MiB)) == "warm; 60 MiB L2"
    assert l2_text(Row()) == "n/a"
    t = timing.summarize([1e-5] * 3, reps=3, warmup_reps=1, cold_s=0.0, method="m", l2_state="flushed", l2_bytes=7)
    from attnprof.pipeline.measured import CellResult

    result = CellResult("sdpa", "built-in", DECODE, timing=t, working_set_bytes=1234)
    made = cell_row(result)
    assert (made.l2_state, made.l2_bytes, made.working_set_bytes, made.cuda_graph) == ("flushed", 7, 1234, False)


def test_old_rows_read_without_the_new_fields():
    rows = _decode_rows()
    assert all(r.l2_state is None and r.cuda_graph is None and r.kernel_pct_of_read_bandwidth is None for r in rows)
