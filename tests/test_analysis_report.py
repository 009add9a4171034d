"""report/analysis_tables.py (and the parts it renders with, and explain_tables.py): the text and markdown
renderings."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from tracegen import GEMM_FP32, TraceBuilder, build, fused_forward, math_forward, naive_forward

from attnprof.analysis import analyze_trace, explain_kernel
from attnprof.report.analysis_tables import comm_table, instance_unit, render_analysis, summary_table
from attnprof.report.explain_tables import render_explanation
from attnprof.results.files import to_json
from attnprof.results.parts import Analysis
from attnprof.results.records import analysis_record


def test_table_has_summary_kernels_and_findings():
    analysis = analyze_trace(build(fused_forward, backend="cudnn"))
    text = render_analysis(analysis, "table")
    assert "region 'attnprof', 3 forward(s) on NVIDIA H200 (compute capability 9.0)" in text
    assert "kernels / forward" in text and "launch calls / forward" in text
    assert "cuLaunchKernelEx 1, cudaMemsetAsync 1" in text
    assert "unreported" in text  # the cuDNN kernel's 0% occupancy
    assert "12.5% (registers)" in text
    kernel_row = next(line for line in text.splitlines() if line.startswith("cudnn_generated"))
    assert "yes" in kernel_row and "…" in kernel_row  # long names are cut in the table style
    assert "- [single-fused-kernel] Each forward runs exactly one kernel" in text
    assert "|" not in text.split("Findings")[0]


def test_markdown_uses_github_tables():
    text = render_analysis(analyze_trace(build(math_forward)), "markdown")
    assert text.startswith("### Trace analysis")
    assert "| metric" in text and "|---" in text
    assert "- **`fp32-cuda-cores`**" in text
    assert GEMM_FP32 in text


def test_tensor_cores_column_reads_yes_no_and_question_mark():
    b = TraceBuilder()
    with b.step():
        with b.region():
            naive_forward(b)
            b.kernel("some_unknown_kernel", gpu_us=3.0)
    text = render_analysis(analyze_trace(b.to_dict()), "table")
    rows = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith(("-", " "))}
    assert rows["some_unknown_kernel"].split()[-2] == "?"
    assert rows["softmax_warp_forward"].split()[-2] == "no"
    assert rows["ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn"].split()[-2] == "yes"


def test_cpu_only_reads_na_never_zero():
    b = TraceBuilder(device_properties=[])
    with b.step():
        with b.region():
            b.leaf("aten::mul")
    text = render_analysis(analyze_trace(b.to_dict()), "table")
    gpu_line = next(line for line in text.splitlines() if line.startswith("GPU time / forward"))
    assert "n/a" in gpu_line and " 0" not in gpu_line
    assert "No GPU activity" in text and "No findings." in text


def test_the_live_analysis_its_record_and_the_record_read_back_render_the_same():
    analysis = analyze_trace(build(naive_forward))
    record = analysis_record(analysis)
    read_back = msgspec.json.decode(to_json(record), type=Analysis)  # the JSON, as `analyze` writes it
    for fmt in ("table", "markdown"):
        assert render_analysis(analysis, fmt) == render_analysis(record, fmt) == render_analysis(read_back, fmt)


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown table format"):
        render_analysis(analyze_trace(build(naive_forward)), "html")


def test_render_explanation():
    text = render_explanation(explain_kernel("fmha_cutlassF_bf16_aligned_64x64_rf_sm80"), "table")
    facts = {" ".join(line.split()) for line in text.splitlines()}
    assert "family fused-attention" in facts and "tensor cores yes" in facts and "SDPA backend efficient" in facts
    assert "attention implementation mem-efficient" in facts
    assert "rf" in text and "register file" in text
    md = render_explanation(explain_kernel("mystery_kernel"), "markdown")
    assert "| tensor cores | ? (the name does not tell)" in md
    assert "not decoded" in md and "| part" not in md
    assert render_explanation(explain_kernel("Memset (Device)"), "table").count("memset") >= 1


TRAINING = Path(__file__).parent / "data" / "h200" / "training"


def test_phases_show_only_with_backward_work():
    forward_only = render_analysis(analyze_trace(build(fused_forward, backend="flash")), "table")
    assert "Phases per forward" not in forward_only
    text = render_analysis(analyze_trace(TRAINING / "fwd-then-backward/8x16x1024x64/sdpa-flash.json.gz"), "table",
                           width=80)
    assert "3 step(s)" in text.splitlines()[0] and "kernels / step" in text  # an instance with backward work
    section = text.split("Phases per step")[1].split("Kernels per step")[0]
    lines = [line.split() for line in section.splitlines() if line.strip()]
    assert lines[2] == ["forward", "1", "0", "0", "93.7", "93.7"]
    assert lines[3] == ["backward", "(after", "the", "8", "0", "0", "342.9", "401.6"]  # wrapped at 80 columns
    assert lines[4] == ["region)"]
    assert all(len(line) <= 80 for line in text.splitlines())


def test_the_attention_ledger_shows_calls_share_and_overhead():
    path = Path(__file__).parent / "data" / "h200" / "model" / "llama2l-eager.json.gz"
    text = render_analysis(analyze_trace(path, region="model_forward"), "table", 120)
    section = text.split("Attention per forward")[1].split("Kernels per forward")[0]
    assert ("2 attention call(s) per forward (eager:2); their device time 3,190 µs per forward, served by unfused, "
            "55.1% of the GPU") in (
        " ".join(section.split()))
    rows = [line for line in section.splitlines() if line.startswith(("1  ", "2  "))]
    assert len(rows) == 2 and all("aten::matmul → aten::softmax → aten::matmul" in r and "eager" in r for r in rows)
    for kind, count in (("mask-build", "2"), ("kv-repeat", "4"), ("layout-copy", "2")):
        line = next(line for line in section.splitlines() if line.startswith(kind))
        assert line.split()[1] == count
    assert "[host-sync]" in text
    markdown = render_analysis(analyze_trace(path, region="model_forward"), "markdown")
    assert "### Attention per forward" in markdown and "| attention call" in markdown


def test_without_device_events_the_ledger_says_cpu_time_and_the_top_ops_follow():
    b = TraceBuilder()
    for _ in range(2):
        with b.step(), b.region(), b.op("aten::scaled_dot_product_attention"):
            b.advance(5.0)
    text = render_analysis(analyze_trace(b.to_dict()), "table", 120)
    assert "Attention per forward" in text and "their CPU time" in text and "their device time" not in text
    assert "overhead around them" not in text  # not measured on a CPU
    assert "Top 1 ops by self CPU time per forward" in text
    row = next(line for line in text.splitlines() if line.startswith("aten::scaled_dot_product_attention "))
    assert row.split()[1] == "1"  # one call per forward


def test_tables_count_per_step_when_the_instances_run_a_backward():
    comm = {"source": "cpu", "ops_per_forward": 2, "kernels_per_forward": None}
    phases = {"forward": {"kernels": 1}, "backward": {"kernels": 3}}
    step = msgspec.convert({"forwards": 3, "comm": comm, "phases": phases}, Analysis)
    phases = {"forward": {"kernels": 1}, "backward": {"kernels": 0}}
    forward = msgspec.convert({"forwards": 3, "comm": comm, "phases": phases}, Analysis)
    assert (instance_unit(step), instance_unit(forward), instance_unit(Analysis())) == ("step", "forward", "forward")
    assert "communication per step" in comm_table(step, "table") and "per forward" not in comm_table(step, "table")
    assert "communication per forward" in comm_table(forward, "table")
    for data in (step, forward):  # two columns, each row filled, at any width
        for width in (None, 60):
            lines = comm_table(data, "table", width).splitlines()
            assert lines[0].split("  ")[-1].strip() == "median" and "c10d ops" in lines[2]
    assert "kernels / step" in summary_table(step, "table") and "steps" in summary_table(step, "table")
