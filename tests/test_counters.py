"""Hardware counters from Nsight Compute (`analysis/counters/`), on the raw pages captured on the H200
(tests/data/h200/ncu: the fused forward kernels at 1x64x16384x128/kv8, causal, bf16; ncu 2025.3.1):
parsing with units, the `ncu_report` reader on a fake module built from the same page, the roofline per
kernel, the steps of a report of several kernels, each counter finding firing and not, the row's findings
with counters, and the JSON round trip. The real `.ncu-rep` is read on the GPU machine (marked `gpu`)."""

from __future__ import annotations

import csv
import json
import types
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from attnprof.analysis import analyze_trace
from attnprof.analysis.counters import (
    NCU_METRICS,
    NCU_SECTIONS,
    CellCounters,
    CounterReport,
    CounterReportError,
    KernelCounters,
    counters_for_cell,
    kernel_key,
    load_counters,
)
from attnprof.analysis.counters.metrics import COUNTER_METRICS, STALL_REASONS, stall_metric
from attnprof.analysis.counters.readers import read_ncu_rep
from attnprof.analysis.counters.roofline import steps_of
from attnprof.analysis.counters.units import parse_number, to_base, unit_factor
from attnprof.analysis.findings import Counted, Verdict, judge
from attnprof.nsight import NsightUnavailableError
from attnprof.peaks import measured_peaks
from attnprof.pipeline.measured import CellResult
from attnprof.profiling.ceiling import Ceiling
from attnprof.registry import RunSpec
from attnprof.results.files import to_json
from attnprof.results.parts import CountersRecord
from attnprof.results.records import counters_of, counters_record


def counter_findings(counters):
    """The counter findings the judge makes of a row's counters."""
    return list(Counted.of(counters, []).findings)


DATA = Path(__file__).parent / "data" / "h200"
NCU = DATA / "ncu"
VARIANTS = ("sdpa-cudnn", "sdpa-flash", "triton-flash", "flex")
#: The cell the pages were captured at.
SPEC = RunSpec("cuda", "bf16", 1, 64, 16384, 128, 8, causal=True)
#: The step's useful FLOPs: 4·B·H·D × the S(S+1)/2 pairs causal keeps.
FLOPS = 4.0 * 64 * 128 * 16384 * 16385 / 2
#: Q and O (64 heads), K and V (8 heads), bf16: what a forward must move.
COMPULSORY = 2 * (2 * 64 + 2 * 8) * 16384 * 128


def page(variant: str) -> Path:
    return NCU / f"{variant}-fwd.raw.csv"


def kernel(variant: str) -> KernelCounters:
    (only,) = load_counters(page(variant)).kernels
    return only


def counters(variant: str, ceiling: Ceiling | None = None, spec: RunSpec = SPEC) -> CellCounters:
    peaks = measured_peaks(ceiling)
    return counters_for_cell(load_counters(page(variant)), spec, peaks, seconds=12.0, report_path=str(page(variant)))


def ids(found) -> list[str]:
    return [f.id for f in found]


# --------------------------------------------------------------------------- numbers and units


def test_numbers_as_the_raw_page_writes_them():
    assert parse_number("65,536") == 65536.0
    assert parse_number("150,109,880,320") == 150109880320.0
    assert parse_number("6.588064") == 6.588064
    assert parse_number("1e-05") == 1e-05
    assert parse_number("0") == 0.0
    for text in ("no data", "", "n/a", "(384, 1, 1)", "all", "1,2"):
        assert parse_number(text) is None


@pytest.mark.parametrize(
    ("unit", "factor"),
    [
        ("Mbyte", 1e6),
        ("Gbyte", 1e9),
        ("Kbyte/block", 1e3),
        ("Gbyte/s", 1e9),
        ("Mbyte/s", 1e6),
        ("byte/second", 1.0),
        ("ms", 1e-3),
        ("msecond", 1e-3),
        ("usecond", 1e-6),
        ("ns", 1e-9),
        ("Ghz", 1e9),
        ("%", 1.0),
        ("%/Kbyte", 1e-3),
        ("register/thread", 1.0),
        ("SM", 1.0),
        ("", 1.0),
    ],
)
def test_units_into_base_units(unit, factor):
    assert unit_factor(unit) == pytest.approx(factor)
    assert to_base(2.0, unit) == pytest.approx(2.0 * factor)


# --------------------------------------------------------------------------- the raw page


def test_the_cudnn_page_reads_exactly():
    report = load_counters(page("sdpa-cudnn"))
    assert report.form == "raw-csv" and report.device == "NVIDIA H200"
    k = report.kernels[0]
    assert k.name.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") and k.index == 0
    assert k.duration_us == pytest.approx(6588.064)  # 6.588064 ms
    assert k.dram_read_bytes == pytest.approx(335_926_272)  # 335.926272 Mbyte
    assert k.dram_write_bytes == pytest.approx(254_465_280)
    assert k.dram_gbps == pytest.approx(89.615333)  # 89.615333 Gbyte/s
    assert k.dram_pct_of_peak == pytest.approx(1.862322)
    assert k.sm_throughput_pct == pytest.approx(73.050159)
    assert k.tensor_pipe_pct == pytest.approx(74.657372) and k.tensor_pipe == "wgmma"
    assert k.gmma_instructions == 67_633_152
    assert k.achieved_occupancy_pct == pytest.approx(14.058894)
    assert k.theoretical_occupancy_pct == pytest.approx(18.75)
    assert k.l2_hit_rate_pct == pytest.approx(98.482799)
    assert k.registers_per_thread == 168
    assert k.shared_memory_bytes == 233_472  # 233.472 Kbyte/block
    assert k.block == (384, 1, 1) and k.grid == (132, 1, 1)
    assert [(s.reason, round(s.per_issue, 6)) for s in k.stalls] == [
        ("barrier", 1.417392),
        ("wait", 1.03914),
        ("long_scoreboard", 0.572797),
    ]


def test_stall_shares_leave_the_issuing_warp_out():
    k = kernel("sdpa-cudnn")
    with page("sdpa-cudnn").open(newline="") as handle:
        names, _units, values = list(csv.reader(handle))
    row = dict(zip(names, values, strict=True))
    stalled = {r: float(row[stall_metric(r)]) for r in STALL_REASONS}
    assert float(row[stall_metric("selected")]) == pytest.approx(1.0, abs=1e-5)  # in the page, not a stall
    assert k.stalls[0].share_pct == pytest.approx(100 * 1.417392 / sum(stalled.values()))
    assert k.stalls[0].share_pct == pytest.approx(33.0, abs=0.1)
    assert k.stalls[0].words.startswith("block-wide syncs")
    assert k.stalls[2].label == "long scoreboard" and "global memory" in k.stalls[2].words


def test_each_page_reads_its_kernel():
    flash, triton, flex = kernel("sdpa-flash"), kernel("triton-flash"), kernel("flex")
    assert flash.short_name == "flash_fwd_kernel" and flash.name.endswith("(Flash_fwd_params)")
    assert flash.gmma_instructions == 0 and flash.tensor_pipe == "mma"  # Ampere's mma on Hopper
    assert flash.registers_per_thread == 255 and flash.grid == (128, 1, 64)
    assert triton.name == "_attn_fwd" and triton.tensor_pipe == "wgmma"
    # triton-flash's page writes its DRAM reads in Gbyte where the others write Mbyte: 2.14 GB, not 2 MB
    assert triton.dram_read_bytes == pytest.approx(2.140049e9)
    assert triton.l2_hit_rate_pct == pytest.approx(88.457763)
    assert flex.name == "triton_tem_fused_flex_attention_0" and flex.tensor_pipe_pct == pytest.approx(45.111906)


def test_a_missing_metric_is_none_never_zero(tmp_path):
    with page("sdpa-cudnn").open(newline="") as handle:
        names, units, values = list(csv.reader(handle))
    gone = {"lts__t_sector_hit_rate.pct", "sm__inst_executed_pipe_tensor_op_gmma.sum", "launch__grid_dim_y"}
    keep = [i for i, name in enumerate(names) if name not in gone]
    values[names.index("dram__bytes_write.sum")] = "no data"
    path = tmp_path / "page.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([[row[i] for i in keep] for row in (names, units, values)])
    k = load_counters(path).kernels[0]
    assert k.l2_hit_rate_pct is None and k.grid is None and k.dram_write_bytes is None and k.dram_bytes is None
    assert k.gmma_instructions is None and k.tensor_pipe == "mma"  # busy, without a wgmma count
    assert k.dram_read_bytes == pytest.approx(335_926_272)


def test_lines_before_the_header_are_skipped(tmp_path):
    text = page("flex").read_text()
    path = tmp_path / "flex.csv"
    path.write_text("==PROF== Connected to process 1061\n==PROF== Disconnected from process 1061\n" + text)
    assert load_counters(path).kernels == load_counters(page("flex")).kernels


def test_every_metric_read_is_collected():
    """What the readers read is either asked for with --metrics or in the pages the sections gave."""
    with page("sdpa-cudnn").open(newline="") as handle:
        names = set(next(csv.reader(handle)))
    read = {metric.names[0] for metric in COUNTER_METRICS} | {stall_metric(r) for r in STALL_REASONS}
    assert read <= names
    assert set(NCU_METRICS) <= names
    assert NCU_SECTIONS == (
        "SpeedOfLight",
        "MemoryWorkloadAnalysis",
        "ComputeWorkloadAnalysis",
        "Occupancy",
        "LaunchStats",
        "WarpStateStats",
    )


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        (None, ".csv", "no such file"),
        ("a,b\n1,2\n", ".txt", "not an Nsight Compute report"),
        ("a,b\n1,2\n", ".csv", "not a raw page of Nsight Compute"),
        ('"ID","Kernel Name"\n"",""\n', ".csv", "the report holds no kernel"),
    ],
)
def test_an_unreadable_report_is_one_line(tmp_path, content, suffix, message):
    path = tmp_path / f"report{suffix}"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CounterReportError, match=message) as raised:
        load_counters(path)
    assert "\n" not in raised.value.message and raised.value.hint and raised.value.exit_code == 2


def test_a_ncu_rep_without_nsight_compute_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("ATTNPROF_NCU_REPORT_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNPROF_NCU", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr("attnprof.nsight.CUDA_ROOTS", (str(tmp_path),))
    monkeypatch.setattr("attnprof.nsight.INSTALL_ROOTS", ())
    with pytest.raises(NsightUnavailableError, match="ncu_report module was not found") as raised:
        load_counters(NCU / "sdpa-cudnn-fwd.ncu-rep")
    assert "--page raw" in raised.value.hint


# --------------------------------------------------------------------------- the ncu_report module


class FakeMetric:
    """An `IMetric`: a value in the metric's base unit, as the report file keeps it."""

    ValueKind_STRING, ValueKind_DOUBLE, ValueKind_UINT32, ValueKind_UINT64 = 1, 2, 3, 4

    def __init__(self, value: float | str, unit: str) -> None:
        self.value, self.units = value, unit

    def has_value(self) -> bool:
        return True

    def kind(self) -> int:
        if isinstance(self.value, str):
            return self.ValueKind_STRING
        return self.ValueKind_UINT64 if float(self.value).is_integer() else self.ValueKind_DOUBLE

    def as_double(self) -> float:
        return float(self.value)

    def as_uint64(self) -> int:
        return int(self.value)

    def as_string(self) -> str:
        return str(self.value)

    def unit(self) -> str:
        return self.units


def _report_unit(value: float, unit: str) -> tuple[float, str]:
    """The page's scaled value as the report keeps it: bytes in byte, times in ns, rates per second."""
    numerator, _, denominator = unit.partition("/")
    if numerator in ("ms", "us", "ns", "s", "msecond", "usecond", "nsecond", "second"):
        return to_base(value, numerator) * 1e9, "ns"
    base = numerator[1:] if len(numerator) > 1 and numerator[0] in "KMGT" else numerator
    if denominator in ("s", "second"):
        return to_base(value, unit), f"{base}/second"
    return to_base(value, numerator), base + (f"/{denominator}" if denominator else "")


def fake_ncu_report(pages: list[Path]) -> types.ModuleType:
    """A stand-in for Nsight Compute's `ncu_report` with one range holding each page's kernel: the API
    attnprof uses (load_report, num_ranges, range_by_idx, num_actions, action_by_idx, name(base),
    metric_names, metric_by_name, and on a metric has_value, kind, as_double, as_uint64, as_string, unit)."""
    module = types.ModuleType("ncu_report")
    module.IAction = types.SimpleNamespace(NameBase_FUNCTION=0, NameBase_DEMANGLED=1, WorkloadType_KERNEL=0)
    actions = []
    for path in pages:
        with path.open(newline="") as handle:
            names, units, values = list(csv.reader(handle))
        metrics = {}
        for name, unit, text in zip(names, units, values, strict=True):
            number = parse_number(text)
            if number is not None:
                metrics[name] = FakeMetric(*_report_unit(number, unit))
            elif name == "device__attribute_display_name":
                metrics[name] = FakeMetric(text, "")
        demangled = values[names.index("Kernel Name")]
        action = types.SimpleNamespace(
            name=lambda base=0, full=demangled: full if base == 1 else full.split("<")[0].split("(")[0],
            metric_names=lambda m=metrics: tuple(m),
            metric_by_name=lambda name, m=metrics: m.get(name),
            workload_type=lambda: 0,
        )
        actions.append(action)
    found = types.SimpleNamespace(num_actions=lambda: len(actions), action_by_idx=lambda i: actions[i])
    context = types.SimpleNamespace(num_ranges=lambda: 1, range_by_idx=lambda i: found)
    module.load_report = lambda path: context
    return module


def test_the_module_reader_reads_what_the_page_says():
    module = fake_ncu_report([page(v) for v in VARIANTS])
    report = read_ncu_rep(Path("fake.ncu-rep"), module)
    assert report.form == "ncu-rep" and report.device == "NVIDIA H200"
    assert [k.index for k in report.kernels] == [0, 1, 2, 3]
    for got, variant in zip(report.kernels, VARIANTS, strict=True):
        want = replace(kernel(variant), index=got.index)
        assert got.name == want.name
        for metric in COUNTER_METRICS:
            assert getattr(got, metric.field) == pytest.approx(getattr(want, metric.field), rel=1e-9), metric.field
        assert (got.block, got.grid, got.tensor_pipe) == (want.block, want.grid, want.tensor_pipe)
        assert [(s.reason, s.share_pct) for s in got.stalls] == [
            (s.reason, pytest.approx(s.share_pct)) for s in want.stalls
        ]


def test_a_report_the_module_cannot_load_is_one_line():
    module = fake_ncu_report([page("flex")])

    def refuse(path):
        raise RuntimeError("Failed to load report: unsupported version")

    module.load_report = refuse
    with pytest.raises(CounterReportError, match="Nsight Compute cannot load it .RuntimeError: Failed to load"):
        read_ncu_rep(Path("old.ncu-rep"), module)


def test_a_report_without_kernels_is_an_error():
    module = fake_ncu_report([])
    with pytest.raises(CounterReportError, match="holds no kernel"):
        read_ncu_rep(Path("empty.ncu-rep"), module)


@pytest.mark.gpu
def test_the_real_ncu_rep_reads_as_its_raw_page():
    """Read in a child process beside this one, which has imported torch (loading `_ncu_report` next to torch
    crashed attnprof on the H200)."""
    from attnprof.nsight import ncu_report_dir

    try:
        ncu_report_dir()
    except NsightUnavailableError as exc:
        pytest.skip(f"no Nsight Compute report module here: {exc.message}")
    rep, page_read = load_counters(NCU / "sdpa-cudnn-fwd.ncu-rep"), load_counters(page("sdpa-cudnn"))
    assert rep.form == "ncu-rep" and rep.device == page_read.device == "NVIDIA H200"
    (got,), (want,) = rep.kernels, page_read.kernels
    assert got.name == want.name
    for metric in COUNTER_METRICS:  # the page rounds to 6 decimals of its scaled unit
        assert getattr(got, metric.field) == pytest.approx(getattr(want, metric.field), rel=1e-5), metric.field
    assert (got.block, got.grid) == (want.block, want.grid)
    assert [s.reason for s in got.stalls] == [s.reason for s in want.stalls]


# --------------------------------------------------------------------------- the roofline


def test_a_forward_kernel_takes_the_steps_flops_and_is_placed_against_the_datasheet():
    found = counters("sdpa-cudnn")
    assert found.flops_per_step == FLOPS and found.compulsory_bytes == COMPULSORY
    assert found.peaks is not None and found.peaks.basis == "datasheet" and found.peaks.tensor_tflops == 989.0
    (placement,) = found.placements
    assert placement.flops == FLOPS and placement.flops_share_pct == 100.0
    assert placement.intensity == pytest.approx(FLOPS / (335_926_272 + 254_465_280))
    assert placement.tflops == pytest.approx(FLOPS / 6588.064e-6 / 1e12)
    assert placement.bound == "compute"
    assert placement.pct_of_ceiling == pytest.approx(100 * placement.tflops / 989.0)
    assert (
        placement.text
        == f"compute-bound at {placement.pct_of_ceiling:.0f}% of the matmul ceiling"
        == ("compute-bound at 68% of the matmul ceiling")
    )


def test_a_measured_ceiling_replaces_the_datasheet():
    ceiling = Ceiling(760.0, 3900.0, "cached", measured_at="2026-12-02T10:00:00", read_gbps=4300.0)
    found = counters("triton-flash", ceiling)
    assert found.peaks is not None and found.peaks.basis == "measured"
    assert (found.peaks.tensor_tflops, found.peaks.read_gbps) == (760.0, 4300.0)
    assert found.placements[0].pct_of_ceiling == pytest.approx(100 * FLOPS / 8237.856e-6 / 1e12 / 760.0)
    assert "measured on this machine (2026-12-02)" in counters_record(found, []).peaks.text
    unknown = replace(load_counters(page("triton-flash")), device="a GPU nobody knows")
    assert counters_for_cell(unknown, SPEC, None, seconds=None, report_path=None).peaks is None


def test_memory_bound_words_and_no_ceiling():
    slow = replace(kernel("sdpa-cudnn"), dram_read_bytes=2.0e12)  # far below the ridge
    report = CounterReport("x.csv", "raw-csv", [slow], "NVIDIA H200")
    (placement,) = counters_for_cell(report, SPEC, None, seconds=None, report_path=None).placements
    assert placement.bound == "memory" and placement.text.startswith("memory-bound at ")
    assert placement.text.endswith("% of read bandwidth")
    unknown = counters_for_cell(
        replace(report, device="a GPU nobody knows"), SPEC, None, seconds=None, report_path=None
    )
    assert unknown.peaks is None and unknown.placements[0].bound is None
    assert unknown.placements[0].text == "not placed: no ceiling for this GPU"
    spec_less = counters_for_cell(report, None, None, seconds=None, report_path=None)
    assert spec_less.placements[0].text == "not placed: its share of the step's FLOPs is unknown"


def backward_report(steps: int = 2) -> CounterReport:
    """Real kernels renamed into a backward step of three: a preprocess without tensor work, dK/dV, dQ."""
    pre = replace(
        kernel("sdpa-flash"),
        name="void flash_bwd_dot_do_o_kernel<true>(Flash_bwd_params)",
        tensor_pipe_pct=0.0,
        gmma_instructions=0.0,
        duration_us=400.0,
    )
    dkdv = replace(kernel("sdpa-cudnn"), name="_attn_bwd_dkdv")
    dq = replace(kernel("triton-flash"), name="_attn_bwd_dq")
    kernels = []
    for n in range(steps):
        slower = 1.0 + 0.1 * n  # the second step a little slower: the first is the median
        for k in (pre, dkdv, dq):
            kernels.append(replace(k, index=len(kernels), duration_us=(k.duration_us or 0.0) * slower))
    return CounterReport("bwd.csv", "raw-csv", kernels, "NVIDIA H200")


def test_several_kernels_per_step_split_the_flops_by_tensor_pipe_time():
    spec = replace(SPEC, mode="bwd")
    found = counters_for_cell(backward_report(), spec, None, seconds=30.0, report_path="bwd.csv")
    assert (found.kernels_per_step, found.steps, found.counted) == (3, 2, [0, 1, 2, 3, 4, 5])
    assert found.flops_per_step == 2.5 * FLOPS and found.unit == "step"
    pre, dkdv, dq = found.placements[:3]
    assert pre.flops == 0.0 and pre.bound == "memory"
    assert pre.text.startswith("no matmul work on the tensor pipe, no share of the FLOPs: memory-bound at")
    active = {k.name: k.tensor_pipe_pct / 100 * k.duration_us for k in found.kernels[:3]}
    total = sum(active.values())
    assert dkdv.flops == pytest.approx(2.5 * FLOPS * active["_attn_bwd_dkdv"] / total)
    assert dq.flops_share_pct == pytest.approx(100 * active["_attn_bwd_dq"] / total)
    assert dkdv.flops + dq.flops == pytest.approx(2.5 * FLOPS)
    assert [p.step for p in found.placements] == [0, 0, 0, 1, 1, 1]
    assert found.shown_step == 0 and [k.index for k in found.shown.kernels] == [0, 1, 2]
    assert any("holds 2 steps of 3 kernel(s)" in note for note in found.notes)


def test_steps_are_the_shortest_whole_repetition():
    def named(*names: str) -> list[KernelCounters]:
        return [KernelCounters(name, i) for i, name in enumerate(names)]

    assert steps_of(named("a", "a", "a")) == 1
    assert steps_of(named("p", "d", "q", "p", "d", "q")) == 3
    assert steps_of(named("a", "b", "a")) == 3  # not whole steps of two: one step
    assert steps_of(named("p", "d", "q", "p", "d")) == 5  # one whole step and a part: one step
    assert steps_of(named("p", "d", "q", "p", "d", "q", "p")) == 3  # two whole steps, then a part


def test_a_step_cut_short_at_the_reports_end_is_not_placed():
    report = backward_report(steps=2)
    report.kernels.append(replace(report.kernels[0], index=6))
    found = counters_for_cell(report, replace(SPEC, mode="bwd"), None, seconds=None, report_path=None)
    assert found.counted == [0, 1, 2, 3, 4, 5] and found.steps == 2
    assert found.placements[6].text == "not placed: the report ends inside a step"
    assert "the report ends 1 kernel(s) into a step: they are not placed" in found.notes


def test_kernel_names_compare_across_nsight_compute_and_the_trace():
    ncu = kernel("sdpa-flash").name
    kineto = (
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, "
        "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
    )
    assert kernel_key(ncu) == kernel_key(kineto)
    assert kernel_key("void f<true>(int)") != kernel_key("void f<false>(int)")
    assert kernel_key("_attn_fwd") == "_attn_fwd"


# --------------------------------------------------------------------------- the findings


def test_the_real_forward_kernels_raise_what_their_counters_show():
    raised = {variant: ids(counter_findings(counters(variant))) for variant in VARIANTS}
    assert raised == {
        "sdpa-cudnn": [],
        "sdpa-flash": ["stall-dominated"],
        "triton-flash": ["l2-thrash"],
        "flex": ["tensor-pipe-underused"],
    }


def test_tensor_pipe_underused_fires_on_a_compute_bound_kernel_below_half():
    (finding,) = counter_findings(counters("flex"))
    assert finding.severity == "problem"
    assert "triton_tem_fused_flex_attention_0's tensor pipe (wgmma) was active 45.1%" in finding.message
    assert "compute-bound at 43% of the matmul ceiling" in finding.message
    assert "wait 29%, barrier 24%, mio throttle 12%" in finding.message
    assert finding.impact_us == pytest.approx(10344.096 - FLOPS / 989e12 * 1e6, abs=1e-3)
    assert finding.impact_pct == pytest.approx(100 * finding.impact_us / 10344.096, abs=0.01)


def test_tensor_pipe_underused_needs_compute_bound():
    busy = replace(kernel("sdpa-cudnn"), tensor_pipe_pct=55.0)
    assert "tensor-pipe-underused" not in ids(counter_findings(_counted(busy)))
    memory = replace(kernel("flex"), dram_read_bytes=2.0e12)  # below the ridge: its bytes bound it
    assert "tensor-pipe-underused" not in ids(counter_findings(_counted(memory)))


def _counted(*kernels: KernelCounters, spec: RunSpec = SPEC) -> CellCounters:
    report = CounterReport("x.csv", "raw-csv", [replace(k, index=i) for i, k in enumerate(kernels)], "NVIDIA H200")
    return counters_for_cell(report, spec, None, seconds=None, report_path=None)


def test_dram_bound_fires_at_high_dram_throughput_with_the_traffic_above_the_compulsory():
    hot = replace(kernel("triton-flash"), dram_pct_of_peak=72.0, dram_gbps=3450.0)
    found = _counted(hot)
    finding = next(f for f in counter_findings(found) if f.id == "dram-bound")
    assert "_attn_fwd moves 2,392 MB at 3,450 GB/s, 72% of peak DRAM throughput" in finding.message
    assert "the forward moves 2,392 MB through DRAM against the 604 MB it must (4.0x)" in finding.message
    excess = 1 - COMPULSORY / (2.140049e9 + 252_116_224)
    assert finding.impact_us == pytest.approx(8237.856 * excess, abs=1e-3)


def test_dram_bound_fires_on_a_memory_bound_kernel_and_not_on_a_small_helper():
    pre = replace(
        kernel("sdpa-flash"),
        name="prep",
        tensor_pipe_pct=0.0,
        duration_us=2000.0,
        dram_gbps=315.4,
        dram_pct_of_peak=6.6,
    )
    main = kernel("sdpa-cudnn")
    found = _counted(pre, main)
    finding = next(f for f in counter_findings(found) if f.id == "dram-bound")
    assert finding.message.startswith(
        "prep moves 631 MB at 315 GB/s, 7% of peak DRAM throughput, no matmul work on the tensor pipe, no share of "
        "the FLOPs: memory-bound at 7% of read bandwidth; the forward moves 1,221 MB through DRAM against the 604 MB"
    )
    tiny = replace(pre, duration_us=100.0)  # under 5% of the step's time
    assert "dram-bound" not in ids(counter_findings(_counted(tiny, main)))
    assert "dram-bound" not in ids(counter_findings(counters("sdpa-cudnn")))


def test_l2_thrash_fires_on_a_low_hit_rate_with_traffic_well_above_the_compulsory():
    (finding,) = counter_findings(counters("triton-flash"))
    assert finding.message == (
        "_attn_fwd hit L2 on 88.5% of its sector lookups and read 2,140 MB from DRAM (wrote 252 MB); "
        "compute-bound, it hides most of that traffic under its math; the forward moves 2,392 MB through DRAM "
        "against the 604 MB it must (4.0x)."
    )
    assert finding.impact_us is None and finding.no_impact_reason == "compute-bound"  # not measured


def test_l2_thrash_needs_both_a_low_hit_rate_and_the_extra_traffic():
    triton = kernel("triton-flash")
    assert "l2-thrash" not in ids(counter_findings(_counted(replace(triton, dram_read_bytes=336e6))))
    assert "l2-thrash" not in ids(counter_findings(_counted(replace(triton, l2_hit_rate_pct=95.0))))
    memory = replace(triton, dram_read_bytes=2.0e12)
    finding = next(f for f in counter_findings(_counted(memory)) if f.id == "l2-thrash")
    assert finding.impact_us == pytest.approx(8237.856 * (1 - COMPULSORY / (2.0e12 + 252_116_224)), abs=1e-3)


def test_stall_dominated_names_the_reason_in_plain_words():
    (finding,) = counter_findings(counters("sdpa-flash"))
    assert finding.severity == "info" and finding.impact_us is None
    assert finding.message == (
        "flash_fwd_kernel: 40% of its warp stalls are wait, fixed-latency dependencies (the fixed wait after an "
        "instruction); then math pipe throttle 21%, not selected 14%."
    )
    assert "stall-dominated" not in ids(counter_findings(counters("sdpa-cudnn")))  # barrier 33%


def test_counters_resolve_occupancy_unreported():
    analysis = analyze_trace(DATA / "4x32x8192x128-kv8" / "sdpa-cudnn.json.gz")
    assert "occupancy-unreported" in ids(analysis.findings)
    found = counters("sdpa-cudnn")
    resolved = judge(Verdict(analysis.findings, analysis.kernels, counters=Counted.of(found, analysis.kernels)))
    assert "occupancy-unreported" not in ids(resolved)
    other = replace(kernel("flex"), index=0)  # a report that measured another kernel: the finding stays
    counted = Counted.of(_counted(other), analysis.kernels)
    kept = judge(Verdict(analysis.findings, analysis.kernels, counters=counted))
    assert "occupancy-unreported" in ids(kept)


def test_a_row_with_counters_carries_both_kinds_of_findings():
    result = CellResult("sdpa-flash", "built-in", SPEC)
    result.analysis = analyze_trace(DATA / "4x32x8192x128-kv8" / "sdpa-flash.json.gz")
    trace_ids = ids(result.findings)
    result.counters = counters("sdpa-flash")
    assert ids(result.findings) == [i for i in trace_ids if i != "occupancy-unreported"] + ["stall-dominated"]


# --------------------------------------------------------------------------- JSON


def test_counters_round_trip_through_json():
    for found in (
        counters("sdpa-cudnn", spec=SPEC),
        counters_for_cell(backward_report(), replace(SPEC, mode="bwd"), None, seconds=1.5, report_path="bwd.csv"),
    ):
        data = json.loads(to_json(counters_record(found, [])))
        again = counters_of(msgspec.convert(data, CountersRecord))
        assert json.loads(to_json(counters_record(again, []))) == data
        assert [k.name for k in again.kernels] == [k.name for k in found.kernels]
        assert again.shown.kernels == counters_of(counters_record(again, [])).shown.kernels
        assert again.peaks == found.peaks and again.match == found.match
        assert ids(counter_findings(again)) == ids(counter_findings(found))


def test_the_results_entry_holds_the_counters_and_the_findings():
    from attnprof.pipeline.rows import cell_row
    from attnprof.results.files import to_json

    result = CellResult("triton-flash", "plugin", SPEC)
    result.analysis = analyze_trace(DATA / "4x32x8192x128-kv8" / "triton-flash.json.gz")
    result.counters = counters("triton-flash")
    row = cell_row(result)
    entry = json.loads(to_json(row))
    assert "l2-thrash" in row.finding_ids and "l2-thrash" in [f["id"] for f in entry["findings"]]
    assert (
        json.loads(to_json(counters_record(result.counters, entry["counters"]["occupancy_measured"])))
        == (entry["counters"])
    )
    assert entry["counters"]["occupancy_measured"] == [
        "_attn_fwd: achieved occupancy 12.5% measured by Nsight Compute (the trace reported none)"
    ]
    assert row.ncu_seconds == 12.0 and (row.ncu_report or "").endswith("triton-flash-fwd.raw.csv")
    result.counters = None
    row = cell_row(result)
    assert row.counters is None and row.ncu_seconds is None


def test_resume_keeps_the_counters_of_a_finished_row(tmp_path):
    from attnprof.config import parse_config
    from attnprof.pipeline.resume import kept_rows
    from attnprof.pipeline.rows import cell_row, results_document
    from attnprof.results.files import load_results, write_json

    result = CellResult("sdpa-cudnn", "built-in", SPEC)
    result.counters = counters("sdpa-cudnn")
    config = parse_config(
        {
            "device": "cuda",
            "dtype": "bf16",
            "shapes": [{"batch": 1, "heads": 64, "seq": 16384, "head_dim": 128, "kv_heads": 8}],
        }
    )
    path = write_json(
        tmp_path / "results.json", results_document("compare", config, {}, None, [cell_row(result)], False)
    )
    (row,) = kept_rows(load_results(path))
    assert row.counters == counters_record(result.counters, [])
    assert row.findings == []  # cuDNN's forward raises no counter finding (see above)


# --------------------------------------------------------------------------- the backward pages


def backward(name: str) -> CellCounters:
    path = NCU / f"{name}.raw.csv"
    return counters_for_cell(load_counters(path), replace(SPEC, mode="bwd"), None, seconds=None, report_path=None)


def test_a_backward_step_gives_its_flops_to_its_matmul_kernels_only():
    found = backward("sdpa-cudnn-bwd")
    assert (found.kernels_per_step, found.steps, found.flops_per_step) == (5, 1, 2.5 * FLOPS)
    assert [k.short_name for k in found.kernels] == [
        "compute_dot_do_o_specialized",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0",
        "convert_dq_to_16bits",
        "fmha_reduce_head",
        "fmha_reduce_head",
    ]
    assert [p.flops_share_pct for p in found.placements] == [0.0, 100.0, 0.0, 0.0, 0.0]
    assert found.placements[1].text == "compute-bound at 61% of the matmul ceiling"
    assert found.placements[3].text.startswith("no matmul work on the tensor pipe, no share of the FLOPs: memory-bound")
    assert found.kernels[3].tensor_pipe_pct == pytest.approx(0.186973)  # conversions on the shared pipe
    assert found.compulsory_bytes == 2 * COMPULSORY  # q, k, v, out, dout read; dq, dk, dv written
    assert counter_findings(found) == []


def test_flash_attentions_backward_copies_get_no_flops():
    found = backward("sdpa-flash-bwd")
    shares = {k.short_name: p.flops_share_pct for k, p in zip(found.kernels, found.placements, strict=True)}
    assert shares["flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"] == 100.0
    assert shares["elementwise_kernel<direct_copy_kernel_cuda>"] == 0.0  # 3.8% of its cycles on the pipe
    assert found.placements[3].text == "compute-bound at 33% of the matmul ceiling"


def test_triton_flash_backward_before_and_after_in_counters():
    before, after = backward("triton-flash-bwd-before"), backward("triton-flash-bwd")
    assert ids(counter_findings(before)) == ["tensor-pipe-underused", "stall-dominated"]
    underused = counter_findings(before)[0].message
    assert "_attn_bwd_dkdv's tensor pipe (wgmma) was active 37.7%" in underused
    assert "_attn_bwd_dq's tensor pipe (wgmma) was active 41.4%" in underused
    assert counter_findings(before)[1].message.startswith(
        "_attn_bwd_dq: 40% of its warp stalls are barrier, block-wide syncs"
    )
    assert [p.flops_share_pct for p in after.placements] == [
        0.0,
        pytest.approx(56.95, abs=0.01),
        pytest.approx(43.05, abs=0.01),
    ]
    assert [p.text for p in after.placements[1:]] == [
        "compute-bound at 37% of the matmul ceiling",
        "compute-bound at 49% of the matmul ceiling",
    ]
    (thrash,) = counter_findings(after)
    assert thrash.id == "l2-thrash" and thrash.message.startswith(
        "_attn_bwd_dkdv hit L2 on 67.2% of its sector lookups and read 8,353 MB from DRAM (wrote 297 MB)"
    )
    assert "the step moves 10,076 MB through DRAM against the 1,208 MB it must (8.3x)" in thrash.message


# --------------------------------------------------------------------------- the .ncu-rep read in a child process

FILE_FAKE = r'''
"""A stand-in ncu_report.py on disk: load_report reads the given file as a raw page (CSV)."""
import csv, os, types
IAction = types.SimpleNamespace(NameBase_FUNCTION=0, NameBase_DEMANGLED=1, WorkloadType_KERNEL=0)
class Metric:
    ValueKind_STRING, ValueKind_UINT32, ValueKind_UINT64, ValueKind_DOUBLE = 1, 2, 3, 4
    def __init__(self, value, unit): self.value, self.u = value, unit
    def has_value(self): return True
    def kind(self): return self.ValueKind_STRING if isinstance(self.value, str) else self.ValueKind_DOUBLE
    def as_string(self): return self.value
    def as_double(self): return float(self.value)
    def unit(self): return self.u
def load_report(path):
    if os.environ.get("FAKE_NCU_CRASH"):
        os.kill(os.getpid(), 11)
    names, units, *rows = [r for r in csv.reader(open(path, newline="")) if r]
    actions = []
    for row in rows:
        metrics = {}
        for n, u, t in zip(names, units, row):
            try:
                metrics[n] = Metric(float(t.replace(",", "")), u)
            except ValueError:
                metrics[n] = Metric(t, u)
        full = row[names.index("Kernel Name")]
        actions.append(types.SimpleNamespace(
            name=lambda base=0, full=full: full, metric_names=lambda m=metrics: list(m),
            metric_by_name=lambda n, m=metrics: m.get(n), workload_type=lambda: 0))
    found = types.SimpleNamespace(num_actions=lambda: len(actions), action_by_idx=lambda i: actions[i])
    return types.SimpleNamespace(num_ranges=lambda: 1, range_by_idx=lambda i: found)
'''


@pytest.fixture
def file_fake_ncu_report(tmp_path, monkeypatch):
    folder = tmp_path / "extras" / "python"
    folder.mkdir(parents=True)
    (folder / "ncu_report.py").write_text(FILE_FAKE)
    monkeypatch.setenv("ATTNPROF_NCU_REPORT_DIR", str(folder))
    return tmp_path


def test_a_ncu_rep_is_read_by_the_installed_module_in_a_child_process(file_fake_ncu_report):
    """The module never loads beside torch (its native part crashed attnprof on the H200): a child reads
    the report and hands back every metric with its unit, which read the same as the raw page."""
    report = file_fake_ncu_report / "cudnn.ncu-rep"
    report.write_bytes(page("sdpa-cudnn").read_bytes())
    got, want = load_counters(report), load_counters(page("sdpa-cudnn"))
    assert got.form == "ncu-rep" and got.device == want.device == "NVIDIA H200"
    (a,), (b,) = got.kernels, want.kernels
    assert a.name == b.name
    for metric in COUNTER_METRICS:
        assert getattr(a, metric.field) == pytest.approx(getattr(b, metric.field), rel=1e-9), metric.field
    assert [s.reason for s in a.stalls] == [s.reason for s in b.stalls]


def test_a_reader_that_crashes_is_one_line(file_fake_ncu_report, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_CRASH", "1")
    report = file_fake_ncu_report / "cudnn.ncu-rep"
    report.write_bytes(page("sdpa-cudnn").read_bytes())
    with pytest.raises(CounterReportError, match=r"cudnn\.ncu-rep: Nsight Compute's ncu_report failed on it \(exit"):
        load_counters(report)
