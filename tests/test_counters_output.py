"""Hardware counters on the way out: `attnprof analyze TRACE --ncu-report FILE` (the report's kernels met
with the trace's launches by name and order), the "Kernel counters" tables of analyze, run and compare,
the results document, the HTML report's section and the roofline plot. The counters are the real raw
pages captured on the H200 (tests/data/h200/ncu); the traces are real H200 ones, and one synthetic trace
(built with tracegen) whose attention call recorded the captured cell's shapes."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from test_html_report import Page
from tracegen import BF16, TraceBuilder

from attnprof.analysis.counters import counters_for_cell, load_counters
from attnprof.analysis.roofline import attention_flops
from attnprof.config import parse_config
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import cell_row, results_document
from attnprof.registry import RunSpec
from attnprof.report.counters_tables import Counted, counted, counters_report
from attnprof.report.run_tables import run_report
from attnprof.report.tables import compare_report
from attnprof.results.files import to_json
from attnprof.results.schema import Document

DATA = Path(__file__).parent / "data" / "h200"
NCU = DATA / "ncu"
CUDNN_TRACE = DATA / "4x32x8192x128-kv8" / "sdpa-cudnn.json.gz"
SPEC = RunSpec("cuda", "bf16", 1, 64, 16384, 128, 8, causal=True)
VARIANTS = ("sdpa-cudnn", "sdpa-flash", "triton-flash", "flex")


def page(variant: str) -> Path:
    return NCU / f"{variant}-fwd.raw.csv"


def cudnn_kernel_name() -> str:
    return load_counters(page("sdpa-cudnn")).kernels[0].name


def synthetic_cudnn_trace(path: Path, steps: int = 3, is_causal_recorded: bool = True) -> Path:
    """SYNTHETIC (tracegen): SDPA on cuDNN at the captured cell, 1x64x16384x128 with 8 KV heads, is_causal=True
    (the measured kernel's), its shapes and (`is_causal_recorded`) its `Concrete Inputs` recorded as torch
    2.11 writes them, launching the very kernel the cuDNN page measured, once per step."""
    b = TraceBuilder()
    for _ in range(steps):
        with b.step(), b.region():
            types = [BF16, BF16, BF16, "", "Scalar", "Scalar", "", "Scalar"]
            with b.op("aten::scaled_dot_product_attention", types) as op:
                op["args"]["Input Dims"] = [[1, 64, 16384, 128], [1, 8, 16384, 128], [1, 8, 16384, 128]] + [[]] * 5
                if is_causal_recorded:
                    op["args"]["Concrete Inputs"] = ["", "", "", "", "0.", "True", "", "True"]
                with b.op("aten::_scaled_dot_product_cudnn_attention", [BF16, BF16, BF16]):
                    b.kernel(
                        cudnn_kernel_name(),
                        gpu_us=3948.0,
                        api="cuLaunchKernelEx",
                        regs=168,
                        smem=232448,
                        block=(384, 1, 1),
                        grid=(132, 1, 1),
                        occupancy=0,
                    )
    return b.write(path)


def counted_rows(variants: tuple[str, ...] = VARIANTS) -> list[CellResult]:
    """Rows of the captured cell, each with its variant's counters (no trace, no timing: what counters add)."""
    rows = []
    for variant in variants:
        result = CellResult(variant, "built-in", SPEC)
        result.counters = counters_for_cell(
            load_counters(page(variant)), SPEC, None, seconds=11.5, report_path=str(page(variant))
        )
        rows.append(result)
    return rows


def document(rows: list[CellResult]) -> Document:
    """The compare document of these cells as its file holds it: JSON text decoded back into typed rows."""
    config = parse_config(
        {
            "device": "cuda",
            "dtype": "bf16",
            "causal": True,
            "baseline": "sdpa-cudnn",
            "shapes": [{"batch": 1, "heads": 64, "seq": 16384, "head_dim": 128, "kv_heads": 8}],
        }
    )
    written = results_document("compare", config, {"gpu_name": "NVIDIA H200"}, None, [cell_row(r) for r in rows], False)
    return msgspec.json.decode(to_json(written), type=Document)


# --------------------------------------------------------------------------- analyze --ncu-report


def test_analyze_attaches_the_report_to_the_traces_kernel(cli):
    result = cli("analyze", str(CUDNN_TRACE), "--ncu-report", str(page("sdpa-cudnn")), "--wide")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Kernel counters (Nsight Compute)" in out
    assert "1 of 1 report kernel(s) matched the trace's launches by name and order, 1 of them in attention" in out
    assert "74.7% wgmma" in out and "14.1% / 18.8%" in out and "barrier 33%, wait 24%, long scoreboard 13%" in out
    assert "achieved occupancy 14.1% measured by Nsight Compute (the trace reported none)" in out
    assert "[occupancy-unreported]" not in out  # measured now
    assert "shapes were not recorded (profile with record_shapes=True)" in out  # no FLOPs: not placed
    assert "1 of 1 report kernel(s) matched" in result.stderr


def test_analyze_json_has_the_counters_and_places_the_kernel_with_the_traces_flops(cli, tmp_path):
    trace = synthetic_cudnn_trace(tmp_path / "synthetic-cudnn.json")
    result = cli("analyze", str(trace), "--ncu-report", str(page("sdpa-cudnn")), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    counters = data["counters"]
    assert counters["match"] == {
        "matched": 1,
        "total": 1,
        "attention": 1,
        "unmatched": [],
        "text": "1 of 1 report kernel(s) matched the trace's launches by name and order, 1 of them in attention calls",
    }
    causal_flops = 4 * 128 * 64 * 16384 * 16385 // 2  # the causal pairs the recorded is_causal=True keeps
    assert causal_flops == attention_flops(SPEC)  # attnprof's own convention for the cell
    assert counters["flops_per_step"] == causal_flops
    assert "is_causal not recorded" not in counters["flops_source"]
    (placement,) = counters["placements"]
    assert placement["bound"] == "compute" and placement["flops"] == causal_flops
    assert placement["tflops"] == pytest.approx(causal_flops / 6588.064e-6 / 1e12, rel=1e-4)
    assert counters["kernels"][0]["achieved_occupancy_pct"] == pytest.approx(14.0589)
    assert "occupancy-unreported" not in [f["id"] for f in data["findings"]]
    assert counters["peaks"]["basis"] == "datasheet"


def test_analyze_counts_every_pair_and_says_so_where_is_causal_was_not_recorded(cli, tmp_path):
    trace = synthetic_cudnn_trace(tmp_path / "synthetic-cudnn.json", is_causal_recorded=False)
    result = cli("analyze", str(trace), "--ncu-report", str(page("sdpa-cudnn")), "--format", "json")
    assert result.exit_code == 0, result.output
    counters = json.loads(result.stdout)["counters"]
    assert counters["flops_per_step"] == 2 * (128 + 128) * 64 * 16384 * 16384
    assert counters["flops_source"].endswith("; every pair of 1 forward call(s): is_causal not recorded")


def test_analyze_names_the_report_kernels_it_could_not_match(cli):
    result = cli("analyze", str(CUDNN_TRACE), "--ncu-report", str(page("flex")), "--format", "json")
    assert result.exit_code == 0, result.output
    match = json.loads(result.stdout)["counters"]["match"]
    assert (match["matched"], match["attention"], match["unmatched"]) == (0, 0, ["triton_tem_fused_flex_attention_0"])


def test_more_report_kernels_than_launches_are_unmatched(cli, tmp_path):
    trace = synthetic_cudnn_trace(tmp_path / "one-step.json", steps=1)
    text = page("sdpa-cudnn").read_text().splitlines()
    report = tmp_path / "two.csv"
    report.write_text("\n".join([*text, text[-1].replace('"0"', '"1"', 1)]) + "\n")
    result = cli("analyze", str(trace), "--ncu-report", str(report), "--format", "json")
    match = json.loads(result.stdout)["counters"]["match"]
    assert (match["matched"], match["total"]) == (1, 2) and len(match["unmatched"]) == 1


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("report.txt", "x", "not an Nsight Compute report (expected .ncu-rep or .csv)"),
        ("report.csv", "a,b\n", "not a raw page of Nsight Compute"),
        ("missing.csv", None, "no such file"),
    ],
)
def test_a_bad_report_is_one_line_and_exit_2(cli, tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    result = cli("analyze", str(CUDNN_TRACE), "--ncu-report", str(path))
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


# --------------------------------------------------------------------------- the tables


def test_the_counters_table_fits_120_columns_and_wide_shows_every_column():
    items = [counted(r.variant, cell_row(r).counters) for r in counted_rows()]  # the rows' typed records
    assert all(isinstance(item, Counted) for item in items)
    fitted = counters_report([item for item in items if item is not None], "table", 120)
    assert max(len(line) for line in fitted.splitlines()) <= 120
    assert "compute 68%" in fitted and "2,140 / 252" in fitted and "88.5%" in fitted and "barrier 35%" in fitted
    assert "left out:" in fitted and "--wide shows" in fitted
    assert fitted.count("NVIDIA H200") == 4 and fitted.count("Ceilings: matmul 989 TFLOP/s") == 1
    wide = counters_report([Counted(r.variant, r.counters) for r in counted_rows()], "table", None)  # the live ones
    assert "compute-bound at 68% of the matmul ceiling" in wide and "384x1x1 / 132x1x1" in wide
    assert "168 / 228.0 KB" in wide and "wait 40%, math pipe throttle 21%, not selected 14%" in wide
    assert "left out" not in wide


def test_compare_and_run_print_the_counters_and_the_counter_findings():
    entries = document(counted_rows()).results
    text = compare_report(entries, "table", "sdpa-cudnn", 120)
    assert "Kernel counters (Nsight Compute)" in text
    assert all(line == line.rstrip() and len(line) <= 120 for line in text.splitlines())
    assert "triton-flash  _attn_fwd" in text
    assert "[l2-thrash]" in text and "[tensor-pipe-underused]" in text
    run = run_report(entries[2], None, "table", 120)
    assert "Kernel counters (Nsight Compute)" in run and "_attn_fwd" in run and "left out" in run
    assert "Kernel counters" not in compare_report(
        document([CellResult("sdpa", "built-in", SPEC)]).results, "table", None, 120
    )


def test_markdown_has_the_full_table():
    entries = document(counted_rows(("flex",))).results
    text = compare_report(entries, "markdown", None, 120)
    assert "### Kernel counters (Nsight Compute)" in text
    assert "| triton_tem_fused_flex_attention_0 |" in text
    assert "compute-bound at 43% of the matmul ceiling" in text


# --------------------------------------------------------------------------- the HTML report and the plot


def test_the_html_report_has_the_counters_section(cli, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.json"
    path.write_text(to_json(document(counted_rows())))
    result = cli("report", str(path), "-o", str(tmp_path / "report.html"))
    assert result.exit_code == 0, result.output
    page_ = Page((tmp_path / "report.html").read_text())
    assert "counters" in page_.sections
    assert page_.sections.index("counters") > page_.sections.index("findings")
    (table,) = [t for t, section in zip(page_.tables, page_.table_section, strict=True) if section == "counters"]
    header, *rows = table
    assert header[:3] == ["variant · cell", "kernel", "µs"] and header[-1] == "roofline"
    by_variant = {row[0].split(" · ")[0]: row for row in rows}
    assert list(by_variant) == list(VARIANTS)
    assert by_variant["triton-flash"][1:4] == ["_attn_fwd", "8,238", "2,140 / 252"]
    assert by_variant["sdpa-cudnn"][-1] == "compute-bound at 68% of the matmul ceiling"
    assert by_variant["flex"][header.index("tensor pipe")] == "45.1% wgmma"
    assert "#finding-l2-thrash" in page_.links and "#plot-roofline" in page_.links
    assert any(image.get("alt") == "Attention kernels on the roofline (Nsight Compute)" for image in page_.images)


def test_no_counters_no_section():
    from attnprof.report.html import counters_section

    assert counters_section(document([CellResult("sdpa", "built-in", SPEC)]).results) == ""


def test_the_roofline_plot_places_every_counted_kernel():
    pytest.importorskip("matplotlib")
    from attnprof.report.plots import figures

    drawn, skipped = figures(document(counted_rows()).results, ["roofline"])
    assert list(drawn) == ["roofline"] and not skipped
    (ax,) = [ax for ax in drawn["roofline"].axes if ax.get_xlabel()]
    # one kernel per cell: colour and marker name it, so the points go unlabelled
    assert [text.get_text() for text in ax.texts] == ["ridge 206"]
    points = {
        (round(x), round(y))
        for line in ax.lines
        if line.get_linestyle() == "None"
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)
    }
    flops = 4.0 * 64 * 128 * 16384 * 16385 / 2
    assert (round(flops / (2.140049e9 + 252_116_224)), round(flops / 8237.856e-6 / 1e12)) in points
    _, skipped = figures(document([CellResult("sdpa", "built-in", SPEC)]).results, ["roofline"])
    assert skipped == {"roofline": "no row has hardware counters (--ncu)"}


def test_the_roofline_names_the_kernels_of_a_cell_that_runs_several():
    """triton-flash's backward places two kernels of one cell (dK/dV and dQ), which share a colour and a marker,
    so each is named."""
    pytest.importorskip("matplotlib")
    from dataclasses import replace

    from attnprof.report.plots import figures

    spec = replace(SPEC, mode="bwd")
    result = CellResult("triton-flash", "built-in", spec)
    report = NCU / "triton-flash-bwd.raw.csv"
    result.counters = counters_for_cell(load_counters(report), spec, None, seconds=19.0, report_path=str(report))
    drawn, _ = figures(document([result]).results, ["roofline"])
    (ax,) = [ax for ax in drawn["roofline"].axes if ax.get_xlabel()]
    labels = [text.get_text() for text in ax.texts]
    assert sorted(labels) == ["_attn_bwd_dkdv", "_attn_bwd_dq", "ridge 206"], labels
