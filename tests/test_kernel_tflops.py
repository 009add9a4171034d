"""TFLOP/s by kernel time (`kernel_tflops`): the step's FLOPs over the attention calls' device time per
step in the trace, beside the latency figure, through the one serializer to tables, JSON and CSV."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from attnprof.analysis import analyze_trace
from attnprof.analysis.instance.ledger import CallFacts
from attnprof.analysis.instance.ledger_summary import AttentionLedger
from attnprof.analysis.roofline import attention_flops, kernel_tflops, step_flops
from attnprof.config import Config, MeasureOptions, Schedule
from attnprof.pipeline import run_cell
from attnprof.pipeline.measured import CellResult, Throughput
from attnprof.pipeline.rows import TFLOPS_CONVENTION, cell_row
from attnprof.plugins import load_variants
from attnprof.profiling.timing import summarize
from attnprof.registry import RunSpec
from attnprof.report.run_tables import run_summary_table
from attnprof.report.tables import compare_report, shape_table
from attnprof.results.files import load_results, to_json, write_csv
from attnprof.results.schema import Row

DATA = Path(__file__).parent / "data" / "h200"
BLOG = RunSpec("cuda:0", "bf16", 8, 16, 1024, 64, causal=True)


def ledger(forward_us: float, backward_us: float | None = None) -> AttentionLedger:
    """A ledger of one forward call of `forward_us` (none when 0) and one backward call of `backward_us`."""
    calls = (
        [CallFacts("aten::scaled_dot_product_attention", "cudnn", "forward", (0,), forward_us)] if forward_us else []
    )
    if backward_us is not None:
        calls.append(CallFacts("aten::_cudnn_attention_backward", "cudnn", "backward", (1,), backward_us))
    total = forward_us + (backward_us or 0.0)
    return AttentionLedger(len(calls) - (backward_us is not None), {}, total, backward_us, None, 0.0, calls=calls)


def test_fwd_divides_the_forward_flops_by_the_forward_calls_time() -> None:
    assert kernel_tflops(BLOG, ledger(100.0)) == pytest.approx(attention_flops(BLOG) / 100e-6 / 1e12)


def test_bwd_divides_the_backward_flops_by_the_backward_calls_time() -> None:
    spec = replace(BLOG, mode="bwd")  # the forward ran outside the region: the ledger holds the backward alone
    assert kernel_tflops(spec, ledger(0.0, 250.0)) == pytest.approx(2.5 * attention_flops(BLOG) / 250e-6 / 1e12)


def test_fwd_bwd_divides_the_step_flops_by_both_phases_counted_once() -> None:
    spec = replace(BLOG, mode="fwd+bwd")
    found = ledger(100.0, 300.0)
    assert found.kernel_time_us == 400.0  # the backward is part of kernel_time_us, not added to it
    assert kernel_tflops(spec, found) == pytest.approx(3.5 * attention_flops(BLOG) / 400e-6 / 1e12)


def test_no_figure_without_device_time_an_attention_call_or_the_backward_of_a_backward_mode() -> None:
    assert kernel_tflops(BLOG, None) is None  # a CPU trace has no ledger
    assert kernel_tflops(BLOG, ledger(0.0)) is None  # no attention call
    assert kernel_tflops(replace(BLOG, mode="fwd+bwd"), ledger(100.0)) is None  # forward time against step FLOPs
    assert kernel_tflops(replace(BLOG, mode="bwd"), ledger(0.0, 0.0)) is None


def h200_row(variant: str) -> Row:
    """The variant's row at the blog shape in the recorded H200 compare (its real latency)."""
    rows = load_results(DATA / "results" / "compare.json").rows
    return next(r for r in rows if r.variant == variant and r.shape == "8x16x1024x64")


@pytest.mark.parametrize(("variant", "at_least"), [("sdpa-cudnn", 1.3), ("triton-flash", 2.5)])
def test_h200_trace_gives_the_kernel_figure_above_the_host_bound_latency_one(variant: str, at_least: float) -> None:
    """On the H200 at 8x16x1024x64 the latency includes the host's launch time: cuDNN's 76.9 µs against
    58.4 µs of kernels, triton-flash's 151.6 µs against 54.5 µs."""
    analysis = analyze_trace(DATA / "8x16x1024x64" / f"{variant}.json.gz", dtype="bf16")
    recorded = h200_row(variant)
    result = CellResult(variant, "built-in", BLOG, analysis=analysis)
    latency_figure = step_flops(BLOG) / (recorded.latency_us * 1e-6) / 1e12
    assert latency_figure == pytest.approx(recorded.tflops, rel=2e-3)  # recorded with S²/2 causal pairs
    assert result.kernel_tflops == pytest.approx(step_flops(BLOG) / (analysis.attention.kernel_time_us * 1e-6) / 1e12)
    assert result.kernel_tflops / latency_figure == pytest.approx(
        recorded.latency_us / analysis.attention.kernel_time_us
    )
    assert result.kernel_tflops > at_least * latency_figure


def test_h200_cudnn_kernel_figure() -> None:
    analysis = analyze_trace(DATA / "8x16x1024x64" / "sdpa-cudnn.json.gz", dtype="bf16")
    result = CellResult("sdpa-cudnn", "built-in", BLOG, analysis=analysis)
    assert analysis.attention.kernel_time_us == pytest.approx(58.432)
    assert result.kernel_tflops == pytest.approx(294.3, abs=0.1)


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_h200_training_traces_count_the_step_of_their_mode(mode: str) -> None:
    analysis = analyze_trace(DATA / "training" / mode / "8x16x1024x64" / "sdpa-flash.json.gz", dtype="bf16")
    attention = analysis.attention
    spec = replace(BLOG, mode=mode)
    assert attention.backward_kernel_time_us is not None
    expected = step_flops(spec) / (attention.kernel_time_us * 1e-6) / 1e12
    assert CellResult("sdpa-flash", "built-in", spec, analysis=analysis).kernel_tflops == pytest.approx(expected)
    if mode == "bwd":
        assert attention.kernel_time_us == attention.backward_kernel_time_us


def cudnn_result(peak: float | None = 989.0) -> CellResult:
    timing = summarize([76.9e-6] * 4, reps=4, warmup_reps=3, cold_s=0.5, method="cuda events")
    result = CellResult("sdpa-cudnn", "built-in", BLOG, timing=timing, backend="cudnn")
    result.analysis = analyze_trace(DATA / "8x16x1024x64" / "sdpa-cudnn.json.gz", dtype="bf16")
    result.throughput = Throughput(
        tflops=223.4,
        pct_of_peak=22.6 if peak else None,
        peak_tflops=peak,
        achieved_gbps=100.0,
        bound="compute" if peak else None,
    )
    return result


def test_the_row_json_and_csv_carry_both_figures_and_say_which_is_which(tmp_path) -> None:
    result = cudnn_result()
    row, entry = cell_row(result), cell_row(result)
    assert row.tflops == 223.4 and row.kernel_tflops == pytest.approx(294.3, abs=0.1)
    assert row.kernel_pct_of_peak == pytest.approx(100 * row.kernel_tflops / 989.0)
    assert row.tflops_convention == TFLOPS_CONVENTION and "latency" in TFLOPS_CONVENTION
    assert entry.kernel_tflops == row.kernel_tflops and entry.pct_of_peak == pytest.approx(100 * 223.4 / 989.0)
    assert json.loads(to_json(entry))["tflops_convention"] == TFLOPS_CONVENTION
    path = write_csv(tmp_path / "r.csv", [row])
    line = next(csv.DictReader(path.open()))
    assert float(line["kernel_tflops"]) == pytest.approx(row.kernel_tflops)
    assert line["tflops_convention"] == TFLOPS_CONVENTION


def test_kernel_percentage_is_none_without_a_ceiling_and_raises_the_reference_above_it() -> None:
    assert cell_row(cudnn_result(peak=None)).kernel_pct_of_peak is None
    beaten = cell_row(cudnn_result(peak=250.0))  # the kernels' 294 TFLOP/s beat it: they are the reference
    assert beaten.kernel_pct_of_peak == 100.0 and beaten.peak_reference_tflops == beaten.kernel_tflops
    assert beaten.pct_of_peak == pytest.approx(100 * 223.4 / beaten.kernel_tflops)
    assert beaten.peak_tflops == 250.0 and "(sdpa-cudnn at 8x16x1024x64 bf16 causal fwd, by kernel time), " \
        "above the bf16 matmul measured on cuda:0 (250 TFLOP/s)" in beaten.peak_reference_note


def test_tables_show_the_kernel_figure_beside_the_latency_one() -> None:
    row = cell_row(cudnn_result())
    text = shape_table([row], "table", width=None)
    header = " ".join(text.splitlines()[0].split())
    assert "TFLOP/s (latency) TFLOP/s (kernels) % peak" in header
    assert "223.4" in text and "294.3" in text
    summary = run_summary_table(row, "table")
    assert "TFLOP/s by latency (% of measured peak)" in summary and "TFLOP/s by kernel time (% of peak)" in summary


def test_a_cpu_cell_has_no_kernel_figure(tmp_path) -> None:
    shape = {"batch": 1, "heads": 2, "seq": 32, "head_dim": 16}
    config = Config(
        device="cpu",
        dtype="fp32",
        shapes=[shape],
        variants=["naive"],
        schedule=Schedule(wait=0, warmup=1, active=2),
        output_dir=tmp_path,
    )
    variant = load_variants(no_plugins=True).registry.get("naive")
    result = run_cell(variant, RunSpec("cpu", "fp32", **shape), config, MeasureOptions(min_time_s=0.02))
    assert result.ok and result.analysis is not None
    assert result.kernel_tflops is None
    row = cell_row(result)
    assert row.kernel_tflops is None and row.kernel_pct_of_peak is None
    assert row.tflops_convention is None  # no ceiling: no latency figure either


def test_tables_show_the_kernel_gbps_after_the_achieved_bandwidth() -> None:
    """`kernel GB/s` (the attention calls' bytes over their device time) follows `GB/s (% read BW)` (bytes over
    the latency) in the full table, n/a where the row has none, and in run's summary after the achieved line."""
    row = msgspec.structs.replace(cell_row(cudnn_result()), kernel_gbps=1234.5)
    header = " ".join(shape_table([row], "table", width=None).splitlines()[0].split())
    assert "GB/s (% read BW) kernel GB/s executed/useful FLOPs" in header
    assert "1,234" in shape_table([row], "table", width=None)
    none = msgspec.structs.replace(row, kernel_gbps=None)
    cells = shape_table([none], "markdown").splitlines()[2].split("|")
    headers = [c.strip() for c in shape_table([none], "markdown").splitlines()[0].split("|")]
    assert cells[headers.index("kernel GB/s")].strip() == "n/a"
    lines = run_summary_table(row, "table").splitlines()
    achieved = next(i for i, line in enumerate(lines) if line.startswith("achieved GB/s"))
    assert lines[achieved + 1].split() == ["GB/s", "by", "kernel", "time", "1,234"]
    assert "GB/s by kernel time                           n/a" in run_summary_table(none, "table")


def test_kernel_gbps_gives_way_first_so_a_fitted_compare_is_as_before() -> None:
    """At 120 columns the H200 compare has no room for `kernel GB/s`: its tables are those without the
    column, and the note names it; --wide shows it."""
    rows = load_results(DATA / "results" / "compare.json").rows
    filled = [msgspec.structs.replace(r, kernel_gbps=4321.0 if r.ok else None) for r in rows]
    without = compare_report(rows, "table", "sdpa-math", 120)
    with_column = compare_report(filled, "table", "sdpa-math", 120)
    assert " ".join(with_column.split()) == " ".join(without.split()).replace(
        "TFLOP/s (kernels), kernel GB/s, executed/useful FLOPs, % of best known (n/a throughout)",
        "TFLOP/s (kernels), executed/useful FLOPs, % of best known (n/a throughout)",
    ).replace("peak MiB (no room at 120 columns)", "kernel GB/s, peak MiB (no room at 120 columns)")
    assert "kernel GB/s" not in with_column.splitlines()[3] and "4,321" not in with_column
    assert "4,321" in compare_report(filled, "table", "sdpa-math", None)


def test_a_cell_whose_ledger_has_no_bytes_divides_its_own_bytes_by_the_kernel_time() -> None:
    """The H200 trace at the blog shape has no recorded shapes, so its ledger has no bytes (as a Triton kernel
    under its own op has none): the row's `kernel_gbps` is then the cell's bytes, those its latency figure
    divides, over the attention calls' device time, beside `kernel_tflops` over the same time."""
    from attnprof.analysis.roofline import bytes_moved

    result = cudnn_result()
    assert result.analysis.attention.achieved_gbps is None
    nbytes = bytes_moved(BLOG)
    result.throughput = replace(result.throughput, bytes_moved=nbytes, peak_read_gbps=4626.0)
    row = cell_row(result)
    assert row.kernel_gbps == pytest.approx(nbytes / 58.432e-6 / 1e9)
    assert row.kernel_pct_of_read_bandwidth == pytest.approx(100 * row.kernel_gbps / 4626.0, abs=1e-3)
    assert row.kernel_gbps / (nbytes / 76.9e-6 / 1e9) == pytest.approx(76.9 / 58.432)  # latency against kernels
    result.throughput = replace(result.throughput, bytes_moved=None)
    assert cell_row(result).kernel_gbps is None  # no bytes: no figure
    result.throughput = replace(result.throughput, bytes_moved=nbytes, peak_read_gbps=None)
    assert cell_row(result).kernel_pct_of_read_bandwidth is None and cell_row(result).kernel_gbps is not None
