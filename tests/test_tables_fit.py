"""Tables fit the terminal: every line of compare, run, analyze, list and explain output at 80, 100 and
120 columns, from the real H200 traces and realistic rows; --wide and markdown keep every column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tabulate import tabulate

from attnprof.analysis import analyze_trace, explain_kernel
from attnprof.pipeline.measured import CellResult, Throughput, attach_speedups
from attnprof.pipeline.rows import cell_row
from attnprof.profiling.correctness import Check
from attnprof.profiling.timing import summarize
from attnprof.registry import RunSpec
from attnprof.report.analysis_tables import KERNEL_COLUMNS, render_analysis
from attnprof.report.explain_tables import render_explanation
from attnprof.report.layout import Column, bullets, fit_profiler_table, table, wrap
from attnprof.report.run_tables import run_report
from attnprof.report.tables import (
    GLANCE_COLUMNS,
    LIST_COLUMNS,
    compare_report,
    shape_columns,
    variant_list_table,
)
from attnprof.results.schema import Row

DATA = Path(__file__).parent / "data"
H200 = DATA / "h200"
TRACES = sorted(H200.glob("*/*.json.gz"))
KEY_AVERAGES = (DATA / "key_averages_h200.txt").read_text()
SPECS = {"8x16x1024x64": RunSpec("cuda:0", "bf16", 8, 16, 1024, 64),
         "4x32x8192x128-kv8": RunSpec("cuda:0", "bf16", 4, 32, 8192, 128, kv_heads=8)}
WIDTHS = (80, 100, 120)
CUBLAS_NAME = ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
               "execute_kernel__5x_cublas")
LONG_NAME = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
FAILURE = ("forward raised RuntimeError (plugin attnprof-triton-experimental 0.3.0.dev7+g1a2b3c4): CUDA error: an "
           "illegal memory access was encountered; compile with TORCH_USE_CUDA_DSA to enable device-side assertions")


def timing(us: float, spread: float = 0.02):
    """A fake Timing: four samples `spread` around `us` (unstable above 10 %)."""
    samples = [us * (1 - spread), us, us, us * (1 + spread)]
    return summarize([s * 1e-6 for s in samples], reps=400, warmup_reps=3, cold_s=0.07,
                     method="CUDA events per call, eager, back to back; 400 reps (time-based: 0.25 s, "
                            "clamped to [10, 1000]); warm-up 159 calls (settled)")


def cell(trace: Path, variant: str | None = None, source: str = "built-in", spread: float = 0.02) -> CellResult:
    """A measured H200 cell from a real trace, with fake timing, throughput and check."""
    spec = SPECS[trace.parent.name]
    analysis = analyze_trace(trace, dtype="bf16")
    result = CellResult(variant or trace.name.split(".")[0], source, spec, analysis=analysis,
                        timing=timing(analysis.gpu_time_us or 100.0, spread), backend="cudnn",
                        check=Check(rel_error=1.8e-3, passed=True, threshold=1.5e-2),
                        throughput=Throughput(tflops=412.5, pct_of_peak=55.1, peak_tflops=748.0,
                                              achieved_gbps=1234.5, bound="compute"),
                        memory_mib=1024.0, trace_path=Path("/home/someone/projects/attention-study/attnprof-out")
                        / f"{trace.name.split('.')[0]}_{spec.shape_label.replace('/', '-')}_bf16_causal_cuda0_"
                          f"20261130-120825-367779934.json.gz",
                        key_averages_table=KEY_AVERAGES)
    result.retimed = 1 if spread > 0.1 else 0
    return result


@pytest.fixture(scope="module")
def results() -> list[CellResult]:
    """Every H200 trace of two shapes as a cell, one of them unstable, plus a plugin with a long name,
    a failed plugin with a long reason and skipped cells."""
    cells = []
    for shape, spec in SPECS.items():
        for trace in sorted((H200 / shape).glob("*.json.gz")):
            cells.append(cell(trace, spread=0.5 if trace.name.startswith("sdpa-flash") else 0.02))
        cells.append(cell(H200 / shape / "triton-flash.json.gz", "triton-flash-autotuned-experimental",
                          "attnprof-triton-experimental 0.3.0.dev7+g1a2b3c4"))
        cells.append(CellResult("triton-flash-persistent-warp-specialized", "attnprof-triton-experimental 0.3.0",
                                spec, status="failed", reason=FAILURE))
        cells.append(CellResult("sdpa-efficient", "built-in", spec, status="skipped",
                                reason="the efficient backend does not support GQA (kv_heads != heads) here"))
    attach_speedups(cells, "sdpa-math")
    return cells


@pytest.fixture(scope="module")
def entries(results) -> list[Row]:
    return [cell_row(r) for r in results]


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def list_entries() -> list[dict]:
    from attnprof.plugins import load_variants

    entries = [{"name": v.name, "available": v.name.startswith("sdpa"), "reason": None if v.name.startswith("sdpa")
                else "needs CUDA and triton>=3.0 (pip install triton), found neither", "source": v.source,
               "description": v.description} for v in load_variants().registry.all()]
    entries.append({"name": "triton-flash-persistent-warp-specialized", "available": False,
                    "reason": "plugin failed to import: ModuleNotFoundError: No module named 'triton.experimental'",
                    "source": "attnprof-triton-experimental 0.3.0.dev7+g1a2b3c4",
                    "description": "persistent, warp-specialized FlashAttention-3 style forward with TMA loads"})
    return entries


def test_the_rows_are_realistic(results, entries) -> None:
    assert len(TRACES) >= 30 and {e.status.partition(":")[0] for e in entries} == {"ok", "failed", "skipped"}
    assert any(e.speedup_reliable is False for e in entries) and any(e.speedup_reliable for e in entries)
    assert max(len(" ".join(e.finding_ids)) for e in entries) > 40  # ids that must wrap in a narrow column


@pytest.mark.parametrize("width", WIDTHS)
def test_every_line_of_every_command_fits(width, results, entries) -> None:
    outputs = {"compare": compare_report(entries, "table", "sdpa-math", width),
               "list": variant_list_table(list_entries(), "table", width)}
    for result, entry in zip(results, entries, strict=True):
        outputs[f"run {result.variant}"] = run_report(entry, result.key_averages_table, "table", width)
    for trace in TRACES:
        outputs[f"analyze {trace}"] = render_analysis(analyze_trace(trace), "table", width)
    for name in (LONG_NAME, CUBLAS_NAME):
        outputs[f"explain {name}"] = render_explanation(explain_kernel(name), "table", width)
    too_wide = {what: widest(text) for what, text in outputs.items() if widest(text) > width}
    assert not too_wide


@pytest.mark.parametrize("width", WIDTHS)
def test_fitted_compare_has_ids_in_the_tables_and_messages_reasons_below(width, entries) -> None:
    text = compare_report(entries, "table", "sdpa-math", width)
    flat = "".join(text.split())  # wrapping only moves text between lines

    def squeezed(words: str) -> str:
        return "".join(words.split())

    for entry in entries:
        for finding in entry.findings:
            line = squeezed(f"{entry.variant} @ {entry.shape} [{finding.id}]: {finding.message}")
            assert (line in flat) == (finding.severity == "problem")  # info findings: --wide, JSON, report
    info = sum(f.severity == "info" for e in entries for f in e.findings)
    assert info and squeezed(f"{info} info finding(s) not shown") in flat
    assert squeezed(f"triton-flash-persistent-warp-specialized: failed: {FAILURE}") in flat
    assert "leftout:" in flat and "--wideshowseverycolumn" in flat
    header = next(line for line in text.splitlines() if line.startswith("variant"))
    assert "status" in header and "findings" in header and "speed-up" in header


def test_wide_keeps_every_column_and_the_messages_in_the_table(entries) -> None:
    text = compare_report(entries, "table", "sdpa-math", None)
    headers = [line for line in text.splitlines() if line.startswith("variant")]
    assert len(headers) == 3
    for line, columns in zip(headers, (shape_columns(entries), shape_columns(entries), GLANCE_COLUMNS), strict=True):
        assert [c.header for c in columns] == re.split(r"\s{2,}", line.strip())
    assert "left out" not in text and "skipped: the efficient backend" in text
    assert widest(text) > 180


def test_markdown_ignores_the_width_and_is_the_plain_github_table(entries) -> None:
    assert compare_report(entries, "markdown", "sdpa-math", 80) == compare_report(entries, "markdown", "sdpa-math")
    rows = [[str(i), "x " * 50] for i in range(3)]
    columns = (Column("a", drop=1), Column("b", narrow=5, wide=10))
    assert table(columns, rows, "markdown", 40) == tabulate(rows, headers=["a", "b"], tablefmt="github",
                                                            disable_numparse=True)
    analysis = analyze_trace(H200 / "8x16x1024x64" / "sdpa-math.json.gz")
    markdown = render_analysis(analysis, "markdown", 80)
    assert markdown == render_analysis(analysis, "markdown")
    assert all(c.header in markdown for c in KERNEL_COLUMNS)


def test_list_at_full_width_is_todays_table() -> None:
    entries = list_entries()
    rows = [[e["name"], "yes" if e["available"] else "no", e["reason"] or "", e["source"], e["description"]]
            for e in entries]
    assert variant_list_table(entries, "table") == tabulate(rows, headers=[c.header for c in LIST_COLUMNS],
                                                            tablefmt="simple", maxcolwidths=[None, None, 40, None, 60],
                                                            disable_numparse=True)


def test_the_profiler_table_keeps_its_name_and_most_wanted_columns() -> None:
    fitted = fit_profiler_table(KEY_AVERAGES, 100, ("Self CUDA", "CUDA total", "# of Calls", "Self CPU"))
    assert widest(fitted) <= 100
    header = next(line for line in fitted.splitlines() if "Name" in line)
    assert re.split(r"\s{2,}", header.strip()) == ["Name", "Self CPU", "Self CUDA", "CUDA total"]
    assert "aten::_cudnn_attention_forward" in fitted and "Self CUDA time total: 172.672us" in fitted
    assert "left out: Self CPU %, CPU total %" in " ".join(fitted.split())
    assert fit_profiler_table(KEY_AVERAGES, None, ()) == KEY_AVERAGES
    assert fit_profiler_table(KEY_AVERAGES, 400, ()) == KEY_AVERAGES


def test_columns_that_are_na_throughout_go_first_and_are_named() -> None:
    columns = (Column("variant"), Column("GPU µs", drop=9), Column("CPU µs", drop=1), Column("notes", narrow=10))
    rows = [["naive", "n/a", "47,756", "a long note that will have to wrap"], ["sdpa", "n/a", "472.2", "short"]]
    text = table(columns, rows, "table", 40)
    assert widest(text) <= 40 and "GPU µs" not in text.splitlines()[0] and "CPU µs" in text.splitlines()[0]
    assert "left out: GPU µs (n/a throughout)" in text


def test_a_dropped_column_comes_back_when_a_later_drop_made_room() -> None:
    columns = (Column("name"), Column("small", drop=1), Column("big", drop=2), Column("x" * 20))
    rows = [["a", "s", "b" * 30, "y"]]
    text = table(columns, rows, "table", 40)
    assert widest(text) <= 40
    header = text.splitlines()[0]
    assert "small" in header and "big" not in header and "left out: big (no room at 40 columns)" in text


def test_a_header_wraps_between_words_and_keeps_a_lone_symbol_with_the_next() -> None:
    from attnprof.report.layout import _floor

    assert wrap("µs / fwd", 5) == ["µs", "/ fwd"] and wrap("latency µs ± IQR", 12) == ["latency µs", "± IQR"]
    assert _floor(Column("µs / fwd"), ["1.0"], last_resort=True) == len("/ fwd") + 2  # never "/ fw" over "d"
    assert _floor(Column("kernels/fwd"), ["1"], last_resort=True) == len("kernels/") + 2
    assert _floor(Column("TFLOP/s"), ["1"], last_resort=True) == len("TFLOP/s") + 2


def test_wrap_breaks_long_paths_and_names_after_a_separator() -> None:
    path = "/home/someone/projects/attention-study/attnprof-out/naive_1x4x256x64_fp32_causal_cpu.json.gz"
    lines = wrap(path, 40)
    assert "".join(lines) == path and all(len(line) <= 40 for line in lines)
    assert all(line.endswith(("/", "_", "-")) for line in lines[:-1])
    assert wrap("two words", None, "- ") == ["- two words"]
    assert wrap("single-fused-kernel low-occupancy-by-design", 21) == ["single-fused-kernel", "low-occupancy-by-",
                                                                        "design"]
    lines = wrap("[id] " + CUBLAS_NAME, 60)  # a name longer than a line starts where the id ends
    assert lines[0] == "[id] sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_" and "".join(lines) == "[id] " + CUBLAS_NAME
    assert bullets(["one " * 30], 30).splitlines()[1].startswith("  one")


def test_table_width_reads_columns_the_terminal_or_120(monkeypatch) -> None:
    import os

    from attnprof.cli.common import MIN_WIDTH, OutputFormat, table_width

    monkeypatch.setenv("COLUMNS", "97")
    assert table_width(OutputFormat.table, wide=False) == 97
    assert table_width(OutputFormat.table, wide=True) is None
    assert table_width(OutputFormat.markdown, wide=False) is None
    monkeypatch.setenv("COLUMNS", "20")
    assert table_width(OutputFormat.table, wide=False) == MIN_WIDTH
    monkeypatch.delenv("COLUMNS")

    def no_terminal(fd=None):
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert table_width(OutputFormat.table, wide=False) == 120


def test_analyze_fits_columns_unless_wide(cli) -> None:
    trace = str(H200 / "8x16x1024x64" / "sdpa-math.json.gz")
    narrow = cli("analyze", trace, env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert widest(narrow.output) <= 80 and "--wide shows every column" in narrow.output
    wide = cli("analyze", trace, "--wide", env={"COLUMNS": "80"})
    assert wide.exit_code == 0 and widest(wide.output) > 150
    assert all(c.header in wide.output for c in KERNEL_COLUMNS)
    markdown = cli("analyze", trace, "--format", "markdown", env={"COLUMNS": "80"})
    assert markdown.output == cli("analyze", trace, "--format", "markdown", env={"COLUMNS": "300"}).output


def test_list_fits_columns(cli) -> None:
    result = cli("list", env={"COLUMNS": "80"})
    assert result.exit_code == 0 and widest(result.output) <= 80



@pytest.mark.parametrize("fmt, width", [("table", 100), ("table", None), ("markdown", None)])
def test_an_unreliable_speedup_never_reads_as_a_plain_figure(fmt, width, entries) -> None:
    from attnprof.report.columns import speedup_text
    from attnprof.report.tables import UNRELIABLE, shape_table

    rows = [e for e in entries if e.shape == "8x16x1024x64"]
    wobbly = next(e for e in rows if e.variant == "sdpa-flash")
    assert wobbly.speedup_reliable is False and wobbly.unstable and wobbly.retimed == 1
    plain = f"{wobbly.speedup_vs_baseline:.2f}x"
    text = shape_table(rows, fmt, width)
    assert speedup_text(wobbly) in text and plain not in text
    assert " ".join(UNRELIABLE.split()) in " ".join(text.split())
    steady = [e for e in rows if e.speedup_reliable]
    assert all(f"{e.speedup_vs_baseline:.2f}x" in text for e in steady)
    assert UNRELIABLE.split()[0] not in shape_table(steady, fmt, width)


def test_speedup_text() -> None:
    from attnprof.report.columns import speedup_text

    assert speedup_text(Row(speedup_vs_baseline=4.1234, speedup_reliable=True)) == "4.12x"
    assert speedup_text(Row(speedup_vs_baseline=4.1234, speedup_reliable=False)) == "~4.1x?"
    assert speedup_text(Row(speedup_vs_baseline=175.9, speedup_reliable=False)) == "~176x?"
    assert speedup_text(Row(speedup_vs_baseline=None, speedup_reliable=None)) == "n/a"


def test_a_memory_bound_rows_bandwidth_is_the_last_column_to_give_way() -> None:
    """Decode is read by its GB/s: with a memory-bound row the bandwidth column outlasts the TFLOP/s ones."""
    from attnprof.report.columns import BANDWIDTH_HEADER, bandwidth_cell
    from attnprof.report.tables import shape_columns

    def drop_of(rows):
        return next(c.drop for c in shape_columns(rows) if c.header == BANDWIDTH_HEADER)

    decode = Row(mode="fwd", bound="memory", achieved_gbps=4310.0, pct_of_read_bandwidth=93.2)
    prefill = Row(mode="fwd", bound="compute", achieved_gbps=310.0, pct_of_read_bandwidth=6.7)
    flops_drops = [c.drop for c in shape_columns([decode]) if c.header.startswith("TFLOP/s")]
    assert drop_of([prefill]) < min(flops_drops) < max(flops_drops) < drop_of([prefill, decode])
    assert bandwidth_cell(decode) == "4,310 (93.2%)" and bandwidth_cell(Row()) == "n/a"
