"""`attnprof sweep`'s terminal output (`report/sweep_tables.py`): one pivot table per point of the other
axes (variants down, the swept length across), the reasons rows did not run, and each finding once per
variant; `--per-point` gives compare's tables. On checked-in results and one real CPU sweep."""

from __future__ import annotations

import re
from pathlib import Path

from msgspec.structs import replace

from attnprof.report.columns import speedup_text
from attnprof.report.formatting import fmt_number
from attnprof.report.sweep_tables import pivot_field, sweep_groups, sweep_report
from attnprof.report.tables import compare_report
from attnprof.results.files import load_results

RESULTS = Path(__file__).parent / "data" / "results"
SWEEP = RESULTS / "cpu-sweep.jsonl"  # configs/sweep-cpu.yaml: seq 128, 256, 512 x head_dim 32, 64
SEQS = RESULTS / "cpu-seqs.json"  # seq 128-1024 x fwd, fwd+bwd; sdpa-cudnn skipped
H200 = RESULTS / "h200-traces.json"  # two shapes, GPU time but no latency; severities from the registry


def table_lines(text: str, title: str) -> list[str]:
    """The lines of the table under the heading that contains `title`, up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line) + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_one_pivot_table_per_point_of_the_other_axes():
    rows = load_results(SWEEP).rows
    text = sweep_report(rows, "table", "sdpa-math", 120)
    titles = [line for line in text.splitlines() if line.startswith("== ")]
    assert titles == [
        "== batch 1, heads 4, head_dim 32, fp32 causal fwd on cpu: latency µs (speed-up vs sdpa-math) by seq",
        "== batch 1, heads 4, head_dim 64, fp32 causal fwd on cpu: latency µs (speed-up vs sdpa-math) by seq",
        "== findings, each once per variant",
    ]
    table = table_lines(text, "head_dim 64")
    assert table[0].split() == ["variant", "seq", "128", "seq", "256", "seq", "512", "findings"]
    by_cell = {(r.variant, r.seq): r for r in rows if r.head_dim == 64}
    for line in table[2:]:
        variant = line.split()[0]
        for seq in (128, 256, 512):
            row = by_cell[variant, seq]
            assert f"{fmt_number(row.latency_us)} ({speedup_text(row)})" in line
    assert "1x4x128x32" not in text.split("== findings")[0]  # no table per point


def test_each_finding_once_per_variant():
    text = sweep_report(load_results(SWEEP).rows, "table", "sdpa-math", 120)
    findings = text.split("== findings, each once per variant")[1]
    assert findings.count("[mask-rebuilt]") == 1 and findings.count("[safe-softmax]") == 1
    assert "- sdpa-math [mask-rebuilt] at every point (6): Every forward builds the attention mask again" in findings
    assert text.count("mask-rebuilt") == 3  # the two tables' findings column, and its one bullet


def test_reasons_and_unreliable_speedups_follow_the_tables():
    text = sweep_report(load_results(SEQS).rows, "table", "sdpa-math", 120)
    assert "- sdpa-cudnn (every point): skipped: needs CUDA" in text
    assert "~x? marks an unreliable speed-up" in text
    assert [line.split()[:5] for line in table_lines(text, "fwd+bwd on cpu") if "sdpa-cudnn" in line] == [
        ["sdpa-cudnn", "skipped", "skipped", "skipped", "skipped"]
    ]


def test_info_findings_are_named_in_the_fitted_output_and_given_in_full_with_wide():
    rows = load_results(H200).rows
    fitted = sweep_report(rows, "table", "sdpa-math", 120)
    assert "[low-occupancy-by-design]" not in fitted
    named = " ".join(fitted.split("info, facts with nothing to fix")[1].split())
    assert "low-occupancy-by-design (11 variants)" in named and "bwd" not in named
    assert "- naive [hidden-memcpy] at every point (2)" in fitted
    assert "(at 8x16x1024x64)" in fitted  # its messages differ by cell: the one shown is named
    wide = sweep_report(rows, "table", "sdpa-math", None)
    assert wide.count("[low-occupancy-by-design]") == 11  # once per variant


def test_without_a_latency_the_cells_hold_the_time_speedups_use():
    rows = [replace(r, latency_us=None) for r in load_results(SWEEP).rows]
    text = sweep_report(rows, "table", "sdpa-math", 120)
    assert "latency µs" not in text
    assert "fp32 causal fwd on cpu: CPU µs per forward (speed-up vs sdpa-math) by seq" in text
    row = next(r for r in rows if r.variant == "naive" and r.seq == 128 and r.head_dim == 32)
    assert f"{fmt_number(row.cpu_time_us)} ({speedup_text(row)})" in text


def test_the_pivot_is_the_length_that_varies():
    rows = load_results(SWEEP).rows
    assert pivot_field(rows) == "seq"
    decode = [replace(r, q_len=1, kv_len=r.seq * 8, seq=r.seq * 8) for r in rows]
    assert pivot_field(decode) == "seq"  # seq moves with kv_len: one axis, not two
    assert len(sweep_groups(decode)[1]) == 2
    fixed_seq = [replace(r, seq=None, kv_len=r.seq * 8) for r in rows]
    assert pivot_field(fixed_seq) == "kv_len"
    modes = [replace(r, mode=m) for r in rows if r.seq == 128 and r.head_dim == 32 for m in ("fwd", "bwd")]
    assert pivot_field(modes) == "mode"
    one_point = [r for r in rows if r.seq == 128 and r.head_dim == 32]
    assert pivot_field(one_point) is None
    assert sweep_report(one_point, "table", "sdpa-math", 120) == compare_report(one_point, "table", "sdpa-math", 120)


def test_markdown_pivot_tables():
    text = sweep_report(load_results(SWEEP).rows, "markdown", "sdpa-math")
    assert text.count("| variant    | seq 128") == 2
    assert "### findings, each once per variant" in text


def test_the_sweep_command_prints_the_pivot_and_per_point_prints_every_table(cli, write_config):
    config = write_config(sweep={"seq": [32, 48]}, variants=["naive", "sdpa-math"])
    result = cli("sweep", str(config), "--no-timing")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "== batch 1, heads 2, head_dim 16, fp32 causal fwd on cpu: CPU µs per forward" in out
    assert re.search(r"variant +seq 32 +seq 48 +findings", out)
    assert out.count("== ") == 2 and out.count("[mask-rebuilt]") == 1
    per_point = cli("sweep", str(config), "--no-timing", "--per-point")
    assert per_point.exit_code == 0, per_point.output
    assert "== 1x2x32x16 fp32 causal fwd on cpu, speed-up vs sdpa-math" in per_point.stdout
    assert "== 1x2x48x16 fp32 causal fwd on cpu, speed-up vs sdpa-math" in per_point.stdout


def test_a_dtype_sweeps_tables_leave_out_the_variants_of_the_other_dtype() -> None:
    from attnprof.report.sweep_tables import pivot_cells
    from attnprof.results.schema import Row

    def row(variant: str, seq: int, status: str = "ok") -> Row:
        return Row(variant=variant, dtype="fp8", device="cuda:0", batch=1, heads=8, seq=seq, head_dim=128,
                   causal=True, mode="fwd", shape=f"1x8x{seq}x128", status=status,
                   latency_us=100.0 if status == "ok" else None)

    other = "skipped: needs dtype bf16/fp16/fp32 (got fp8)"
    group = [row("sdpa-cudnn", 1024, other), row("cudnn-fe-fp8", 1024), row("sdpa-cudnn", 2048, other),
             row("cudnn-fe-fp8", 2048), row("sdpa-cuda", 1024, "skipped: needs CUDA")]
    _headers, body = pivot_cells(group, "seq")
    assert [line[0] for line in body] == ["cudnn-fe-fp8", "sdpa-cuda"]  # a skip for another reason stays
    only_other = [r for r in group if r.variant == "sdpa-cudnn"]
    assert [line[0] for line in pivot_cells(only_other, "seq")[1]] == ["sdpa-cudnn"]  # never an empty table
