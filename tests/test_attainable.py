"""Attainable references (issue 33, item 1): the table and its lookup (`analysis.attainable`), the judge's
`judge_attainable` (memory-bound and tensor-pipe-underused against the best known at the shape), a run's
best-known fields (`pipeline.best_known`) and the script that writes the table, on CPU; its `--quick` grid
on CUDA (gpu)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from attnprof.analysis import analyze_trace, attainable
from attnprof.analysis.attainable import (
    ATTAINABLE_BAND,
    REGENERATE,
    Attainable,
    AttainableTable,
    NoReference,
    ShapeKey,
    TableEntry,
    TableHeader,
    bucket,
    canonical_mask,
    load_table,
    lookup,
    reference_for,
    shipped_tables,
)
from attnprof.analysis.findings import Finding, Verdict, judge
from attnprof.analysis.findings.attainable import Work
from attnprof.analysis.findings.registry import work_numbers
from attnprof.analysis.hardware import Peaks
from attnprof.errors import ConfigError
from attnprof.pipeline.best_known import attach_best_known, row_key
from attnprof.report.columns import best_known_cell
from attnprof.report.tables import compare_report
from attnprof.results.files import load_results
from attnprof.results.parts import FindingRecord

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "attainable_table.py"
DECODE_RESULTS = ROOT / "tests" / "data" / "h200" / "results" / "decode-kernel-gbps.json"
REPEAT_KV = ROOT / "tests" / "data" / "h200" / "masks" / "decode-efficient-repeat-kv.json.gz"
H200 = "NVIDIA H200"
#: ViT-B/16 at batch 32: 197 tokens, 12 heads of 64, bf16, no mask.
VIT = ShapeKey("fwd", 197, 197, 64, "none", "bf16", 32 * 12)
VIT_BYTES = 4 * 32 * 12 * 197 * 64 * 2  # Q, K, V and O once each


def entry(key: ShapeKey, gbps: float, tflops: float = 100.0, variant: str = "sdpa-cudnn") -> TableEntry:
    return TableEntry.at(key, variant, tflops=tflops, gbps=gbps)


def table(*entries: TableEntry, gpu: str = H200) -> AttainableTable:
    header = TableHeader(gpu=gpu, sm="9.0", matmul_tflops=760.0, read_gbps=4626.0, date="2026-12-01")
    return AttainableTable(header=header, entries=list(entries))


# ---------------------------------------------------------------- the table and its lookup


def test_masks_are_canonicalised_and_lengths_bucketed_in_log_space() -> None:
    assert [canonical_mask(m) for m in ("none", "causal", "sliding_window:256", "documents:4", "prefix:8")] == [
        "none",
        "causal",
        "window",
        "document",
        "other",
    ]
    assert canonical_mask(None, causal=True) == "causal" and canonical_mask(None, causal=False) == "none"
    assert [bucket(n) for n in (1, 197, 300, 4000, 32768)] == [1, 256, 256, 4096, 32768]


def test_lookup_takes_the_nearest_entry_in_log_space_within_2x() -> None:
    short, medium = entry(VIT, 1500.0), entry(ShapeKey("fwd", 512, 512, 64, "none", "bf16", 384), 2500.0)
    ref = table(short, medium)
    assert lookup(ref, ShapeKey("fwd", 256, 256, 64, "none", "bf16", 384)) == short  # 197 is nearer 256 than 512
    assert lookup(ref, ShapeKey("fwd", 1024, 1024, 64, "none", "bf16", 300)) == medium
    far = lookup(ref, ShapeKey("fwd", 4096, 4096, 64, "none", "bf16", 384))
    assert isinstance(far, NoReference) and "within 2x" in far.reason
    occupancy = lookup(ref, ShapeKey("fwd", 197, 197, 64, "none", "bf16", 12))  # 12 (batch, head) pairs: not 384
    assert isinstance(occupancy, NoReference)
    causal = lookup(ref, ShapeKey("fwd", 197, 197, 64, "causal", "bf16", 384))
    assert isinstance(causal, NoReference) and "no fwd causal bf16 entry" in causal.reason
    assert isinstance(lookup(ref, ShapeKey("bwd", 197, 197, 64, "none", "bf16", 384)), NoReference)


def test_a_table_round_trips_and_a_bad_one_fails_in_one_line(tmp_path) -> None:
    path = tmp_path / "attainable-h200.json"
    path.write_bytes(msgspec.json.encode(table(entry(VIT, 1500.0))))
    assert load_table(path) == table(entry(VIT, 1500.0))
    path.write_text('{"format": 1, "header": {}}')
    with pytest.raises(ConfigError, match="attainable table .*gpu") as bad:
        load_table(path)
    assert "\n" not in bad.value.message
    path.write_text('{"format": 99, "header": {"gpu": "x"}}')
    with pytest.raises(ConfigError, match="format 99"):
        load_table(path)


def test_the_tables_shipped_are_real_tables() -> None:
    """No invented numbers: a table shipped with attnprof is one the script wrote (its header names its GPU and
    date, each entry a variant and a rate); without one, a lookup says how to make it."""
    for shipped in shipped_tables():
        assert shipped.header.gpu and shipped.header.date and shipped.entries
        assert all(e.variant and (e.tflops or e.gbps) for e in shipped.entries)
    none = reference_for(VIT, H200, None, tables=[])
    assert isinstance(none, NoReference) and REGENERATE in none.reason


def test_the_own_gpu_s_table_is_used_as_is_and_another_gpu_scales_it() -> None:
    h200 = table(entry(VIT, 1500.0, tflops=200.0))
    own = reference_for(VIT, H200, None, tables=[h200])
    assert own == Attainable(1500.0, 200.0, "sdpa-cudnn", "NVIDIA H200 table 2026-12-01")
    a100 = Peaks(2039.0, 312.0, "datasheet", "datasheet A100 80GB SXM 2039 GB/s")
    scaled = reference_for(VIT, "NVIDIA A100-SXM4-80GB", a100, tables=[h200])
    assert isinstance(scaled, Attainable)
    assert scaled.gbps == pytest.approx(1500.0 * 2039 / 4626) and scaled.tflops == pytest.approx(200.0 * 312 / 760)
    assert "scaled from the NVIDIA H200's by read bandwidth 2,039/4,626 GB/s" in scaled.source
    unscalable = reference_for(VIT, "NVIDIA A100-SXM4-80GB", None, tables=[h200])
    assert isinstance(unscalable, NoReference) and "no ceilings" in unscalable.reason
    assert isinstance(reference_for(VIT, None, a100, tables=[h200]), NoReference)


# ---------------------------------------------------------------- the judge against the attainable


def vit_finding(achieved_gbps: float) -> tuple[Finding, Work]:
    """`memory-bound` on ViT-B/16's fused attention reading at `achieved_gbps` against the 4,800 GB/s roofline."""
    time_us = VIT_BYTES / achieved_gbps / 1e3
    roofline = time_us - VIT_BYTES / 4800.0 / 1e3
    message = f"aten::scaled_dot_product_attention (cudnn) reads at {achieved_gbps:,.0f} GB/s."
    evidence = work_numbers(VIT_BYTES, 0.0, time_us)
    finding = Finding("memory-bound", message, "problem", roofline, 100.0 * roofline / 2 / time_us, evidence)
    return finding, Work("memory-bound", VIT, VIT_BYTES, 0.0, time_us)


def by_table(*entries: TableEntry):
    ref = table(*entries)
    return lambda key: reference_for(key, H200, None, tables=[ref])


def test_a_short_sequence_at_32_percent_of_bandwidth_is_info_when_it_matches_the_best_known() -> None:
    """cuDNN at 197 tokens reads at 32% of the read bandwidth (1,536 GB/s); the best known there is 1,600 GB/s:
    96% of it, inside the band, so the 203-us-style impact against the roofline goes."""
    finding, work = vit_finding(0.32 * 4800)
    judged = judge(Verdict([finding], reference=by_table(entry(VIT, 1600.0)), work=[work]))[0]
    assert judged.severity == "info" and judged.impact_us is None and judged.impact_pct is None
    assert judged.evidence["pct_of_attainable"] == pytest.approx(96.0)
    assert judged.evidence["attainable_gbps"] == 1600.0 and judged.evidence["attainable_variant"] == "sdpa-cudnn"
    assert "at 96% of the best known at this shape (sdpa-cudnn, NVIDIA H200 table 2026-12-01)" in judged.message


def test_a_call_at_half_the_best_known_stays_a_problem_with_its_impact_against_it() -> None:
    finding, work = vit_finding(800.0)
    judged = judge(Verdict([finding], reference=by_table(entry(VIT, 1600.0)), work=[work], gpu_time_us=100.0))[0]
    assert judged.severity == "problem"
    assert judged.impact_us == pytest.approx(work.time_us - VIT_BYTES / 1600.0 / 1e3)  # half its time
    assert judged.impact_us < finding.impact_us  # less than against the roofline
    assert judged.evidence["pct_of_attainable"] == pytest.approx(50.0)
    assert judged.evidence["impact_basis"] == "attainable"
    assert f"at 50% of the best known at this shape (sdpa-cudnn, {H200} table 2026-12-01)" in judged.message


def test_a_shape_without_reference_stays_as_the_trace_gave_it_and_says_why() -> None:
    finding, work = vit_finding(800.0)
    judged = judge(Verdict([finding], reference=by_table(), work=[work]))[0]
    assert (judged.severity, judged.impact_us, judged.message) == ("problem", finding.impact_us, finding.message)
    assert "no attainable reference" in str(judged.evidence["attainable_note"])
    assert judge(Verdict([finding], work=[work]))[0] == finding  # no reference at all: untouched


def test_tensor_pipe_underused_is_judged_by_tflops_from_its_evidence() -> None:
    time_us = 100.0
    flops = 200e12 * time_us * 1e-6  # 200 TFLOP/s
    finding = Finding(
        "tensor-pipe-underused",
        "fa's tensor pipe was active 30%.",
        "problem",
        40.0,
        20.0,
        work_numbers(0.0, flops, time_us) | {"kernels": 1},
    )
    reference = by_table(entry(VIT, 1600.0, tflops=400.0))
    judged = judge(Verdict([finding], reference=reference, shape_key=VIT))[0]
    assert judged.evidence["pct_of_attainable"] == pytest.approx(50.0)
    assert judged.impact_us == pytest.approx(50.0) and judged.evidence["attainable_tflops"] == 400.0
    inside = judge(Verdict([finding], reference=by_table(entry(VIT, 1600.0, tflops=210.0)), shape_key=VIT))[0]
    assert inside.severity == "info" and 100 * ATTAINABLE_BAND <= inside.evidence["pct_of_attainable"] < 100


def test_analyze_judges_a_trace_s_memory_bound_call_against_the_table_at_its_shape() -> None:
    """The H200 decode trace with K/V repeated (1 query, 8,192 keys, head dim 128, 512 (batch, head) pairs):
    its call reads at 55% of the read bandwidth; against a best known twice as fast it loses half its time,
    against one it matches it is info."""
    plain = analyze_trace(REPEAT_KV).finding("memory-bound")
    assert plain is not None
    key = ShapeKey("fwd", 1, 8192, 128, "none", "bf16", 512)
    achieved, time_us = float(plain.evidence["achieved_gbps"]), float(plain.evidence["time_us"])

    def lookup_for(gbps: float):
        return lambda gpu, peaks: lambda k: reference_for(k, gpu, peaks, tables=[table(entry(key, gbps))])

    slow = analyze_trace(REPEAT_KV, attainable=lookup_for(2 * achieved)).finding("memory-bound")
    assert slow is not None and slow.severity == "problem"
    assert slow.impact_us == pytest.approx(time_us / 2, rel=1e-3)
    assert slow.evidence["pct_of_attainable"] == pytest.approx(50.0, abs=0.1)
    matched = analyze_trace(REPEAT_KV, attainable=lookup_for(achieved)).finding("memory-bound")
    assert matched is not None and matched.severity == "info" and matched.impact_us is None


# ---------------------------------------------------------------- a run's best known at each cell


def decode_rows():
    """The H200 decode compare (sdpa-cudnn, sdpa-flash, flex at 1x32x1/32768x128 kv8), flex's memory-bound
    finding with its work by name as this attnprof writes it."""
    rows = load_results(DECODE_RESULTS).rows
    flex = rows[2].finding("memory-bound")
    assert flex is not None
    nbytes, time_us = float(flex.evidence["bytes"]), float(flex.evidence["time_us"])
    written = msgspec.structs.replace(flex, evidence=flex.evidence | work_numbers(nbytes, 0.0, time_us))
    rows[2].findings = [written if f.id == "memory-bound" else f for f in rows[2].findings]
    return rows


def test_compare_rows_get_the_fastest_variant_at_their_cell_and_flex_is_judged_against_it() -> None:
    rows = decode_rows()
    attach_best_known(rows)
    cudnn, flash, flex = rows
    assert {r.best_known_variant for r in rows} == {"sdpa-cudnn"} and {r.best_known_source for r in rows} == {
        "this run"
    }
    assert {r.best_known_basis for r in rows} == {"kernel time"}
    assert cudnn.pct_of_best_known == 100.0 and cudnn.best_known_latency_us == cudnn.latency_us
    assert flex.pct_of_best_known == pytest.approx(100 * 10.5652 / 14.4881, abs=0.01)  # its kernel TFLOP/s' share
    found = flex.finding("memory-bound")
    assert found is not None and found.evidence["attainable_gbps"] == pytest.approx(3622.466, abs=1e-3)
    assert found.evidence["pct_of_attainable"] == pytest.approx(flex.pct_of_best_known, abs=0.1)
    assert found.impact_us == pytest.approx(found.evidence["time_us"] * (1 - flex.pct_of_best_known / 100), rel=1e-3)
    assert "(sdpa-cudnn, this run)" in found.message
    assert [best_known_cell(r) for r in rows] == ["best", "81.5% of sdpa-cudnn", "72.9% of sdpa-cudnn"]
    text = compare_report(rows, "table", None, None)
    assert "% of best known" in text and "72.9% of sdpa-cudnn" in text


def test_a_run_of_slow_variants_only_is_weighed_against_the_table_entry_of_its_very_shape(monkeypatch) -> None:
    """The best known is the best known: a compare of flash and flex alone at a shape the GPU's table measured
    cuDNN at is weighed against cuDNN's entry, not against flash; an entry of a neighbouring shape is not used."""
    rows = decode_rows()[1:]  # sdpa-flash and flex, without sdpa-cudnn
    key = row_key(rows[0])
    assert key is not None
    monkeypatch.setattr(attainable, "shipped_tables", lambda: [table(entry(key, 3622.5, 14.4881))])
    attach_best_known(rows)
    flash, flex = rows
    assert {r.best_known_variant for r in rows} == {"sdpa-cudnn"}
    assert {r.best_known_source for r in rows} == {"NVIDIA H200 table 2026-12-01"}
    assert flash.best_known_latency_us is None and flash.pct_of_best_known == pytest.approx(81.5, abs=0.1)
    assert best_known_cell(flex) == "72.9% of sdpa-cudnn"
    found = flex.finding("memory-bound")
    assert found is not None and found.evidence["attainable_gbps"] == pytest.approx(3622.5)
    neighbour = ShapeKey(key.phase, key.q_len, 2 * key.kv_len, key.head_dim, key.mask, key.dtype, key.batch_heads)
    monkeypatch.setattr(attainable, "shipped_tables", lambda: [table(entry(neighbour, 3622.5, 14.4881))])
    again = decode_rows()[1:]
    attach_best_known(again)
    assert {r.best_known_variant for r in again} == {"sdpa-flash"} and again[0].pct_of_best_known == 100.0


def test_a_cpu_run_is_compared_by_latency_and_a_lone_gpu_row_without_table_keeps_its_findings(monkeypatch) -> None:
    rows = decode_rows()
    cpu = [msgspec.structs.replace(r, device="cpu", kernel_tflops=None, kernel_gbps=None) for r in rows[:2]]
    attach_best_known(cpu)
    assert [r.best_known_basis for r in cpu] == ["latency", "latency"]
    assert cpu[1].pct_of_best_known == pytest.approx(100 * rows[0].latency_us / rows[1].latency_us, abs=1e-3)
    monkeypatch.setattr(attainable, "shipped_tables", lambda: [])
    lone = [rows[2]]
    attach_best_known(lone)
    assert lone[0].pct_of_best_known is None and best_known_cell(lone[0]) == "n/a"
    kept = lone[0].finding("memory-bound")
    assert isinstance(kept, FindingRecord) and kept.severity == "problem"
    assert "no attainable table is shipped" in str(kept.evidence["attainable_note"])
    assert row_key(rows[2]) == ShapeKey("fwd", 1, 32768, 128, "causal", "bf16", 32)


# ---------------------------------------------------------------- the script that writes the table


def _script():
    spec = importlib.util.spec_from_file_location("attainable_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_script_writes_a_table_on_cpu(tmp_path) -> None:
    out = tmp_path / "attainable-cpu.json"
    assert (
        _script().main(["--device", "cpu", "--variants", "sdpa-math,naive", "--min-time", "0.02", "--out", str(out)])
        == 0
    )
    written = load_table(out)
    assert written.header.gpu == "cpu" and written.header.torch and written.header.date and written.header.note is None
    assert written.header.read_gbps and written.header.matmul_tflops
    assert [(e.q_len, e.kv_len, e.head_dim, e.batch_heads) for e in written.entries] == [
        (32, 32, 16, 2),
        (1, 64, 16, 2),
    ]
    assert all(
        e.basis == "latency" and e.variants == 2 and e.variant in ("sdpa-math", "naive") for e in written.entries
    )
    assert all(e.tflops and e.gbps and e.latency_us and e.dtype == "fp32" for e in written.entries)
    found = lookup(written, ShapeKey("fwd", 32, 32, 16, "none", "fp32", 2))
    assert found == written.entries[0]


H200_GRID = ROOT / "tests" / "data" / "h200-grid"


def test_from_runs_builds_the_shapes_of_the_checked_in_h200_runs(tmp_path) -> None:
    """`--from` alone: the fused implementations' best at each shape of attnprof's own H200 results and traces in
    tests/data/h200, the header from the run that measured both ceilings."""
    out = tmp_path / "from-runs.json"
    assert _script().main(["--out", str(out), "--from", str(ROOT / "tests" / "data" / "h200")]) == 0
    built = load_table(out)
    assert built.header.gpu == "NVIDIA H200" and len(built.entries) == 8
    assert built.header.read_gbps == pytest.approx(4623.04, abs=0.01)
    assert built.header.matmul_tflops == pytest.approx(804.19, abs=0.01)
    assert "not a grid run" in (built.header.note or "")
    assert not any(e.variant in ("naive", "inplace", "sdpa-math", "unfused", "math") for e in built.entries)
    decode = lookup(built, ShapeKey("fwd", 1, 32768, 128, "causal", "bf16", 32))
    assert not isinstance(decode, NoReference)
    assert decode.variant == "sdpa-cudnn" and decode.gbps == pytest.approx(3622.5, abs=0.1)


def test_the_shipped_h200_table_is_rebuilt_from_checked_in_files_by_one_command(tmp_path, monkeypatch) -> None:
    """The shipped table is the H200 grid runs' tables (tests/data/h200-grid) added to what the checked-in runs
    give (`--from tests/data/h200 --add ...`, the command of the script's docstring): the same entries and header."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "attainable-h200.json"
    grid = ["tests/data/h200-grid/attainable-bwd.json", "tests/data/h200-grid/attainable-fwd.json"]
    assert _script().main(["--out", str(out), "--from", "tests/data/h200", "--add", *grid]) == 0
    built = load_table(out)
    shipped = load_table(ROOT / "src" / "attnprof" / "data" / "attainable-h200.json")
    assert built == shipped
    assert shipped.header.note and shipped.header.note.startswith(
        "merged, the faster entry where two share a shape: 16 shapes"
    )


def test_the_shipped_h200_table_holds_the_grid_and_the_runs_shapes() -> None:
    """Every grid shape (ViT and BERT lengths at 12 and 384 (batch, head) pairs, 2k and 8k with and without a
    causal mask, decode at 4k and 32k keys; head dims 64 and 128), the backward's too, and the runs' shapes the grid
    lacks; each forward entry with its kernel GB/s, no GB/s above the measured read ceiling by more than 2%."""
    shipped = load_table(ROOT / "src" / "attnprof" / "data" / "attainable-h200.json")
    grid = [load_table(H200_GRID / f"attainable-{phase}.json") for phase in ("fwd", "bwd")]
    assert [len(t.entries) for t in grid] == [20, 16] and all(t.header.note is None for t in grid)  # ran whole
    keys = {e.key for e in shipped.entries}
    assert {e.key for t in grid for e in t.entries} <= keys and len(keys) == len(shipped.entries) == 43
    assert not any(e.variant in ("naive", "inplace", "sdpa-math", "unfused", "math") for e in shipped.entries)
    forward = [e for e in shipped.entries if e.phase == "fwd"]
    assert all(e.tflops and e.gbps for e in forward)
    assert max(e.gbps or 0.0 for e in shipped.entries) <= 1.02 * (shipped.header.read_gbps or 0.0)
    vit = lookup(shipped, ShapeKey("fwd", 197, 197, 64, "none", "bf16", 12))
    assert not isinstance(vit, NoReference) and vit.key == ShapeKey("fwd", 197, 197, 64, "none", "bf16", 12)
    decode = lookup(shipped, ShapeKey("fwd", 1, 32768, 128, "causal", "bf16", 32))  # from the runs: not in the grid
    assert not isinstance(decode, NoReference) and decode.gbps == pytest.approx(3622.5, abs=0.1)


def test_added_tables_keep_the_faster_entry_at_a_shared_shape_and_say_where_each_part_came_from() -> None:
    key, other = ShapeKey("fwd", 512, 512, 64, "none", "bf16", 12), ShapeKey("fwd", 1, 4096, 64, "none", "bf16", 256)
    base = AttainableTable(
        header=TableHeader(gpu="G", date="2026-12-01", note="built from 1 results file(s) and 0 trace(s) here"),
        entries=[TableEntry.at(key, "old", tflops=1.0), TableEntry.at(other, "kept", tflops=2.0)],
    )
    slower = AttainableTable(
        header=TableHeader(gpu="G", date="2026-12-02", commit="def5678"),
        entries=[TableEntry.at(other, "slower", tflops=1.5)],
    )
    grid = AttainableTable(
        header=TableHeader(gpu="G", date="2026-12-03", commit="abc1234", seconds=12.0, read_gbps=9.0),
        entries=[TableEntry.at(key, "new", tflops=3.0)],
    )
    merged = _script().add_tables(base, [slower, grid])
    assert [e.variant for e in merged.entries] == ["kept", "new"]
    assert merged.header.read_gbps == 9.0 and merged.header.seconds is None and merged.header.date == "2026-12-03"
    assert merged.header.note == (
        "merged, the faster entry where two share a shape: 1 shapes from a fwd grid run on 2026-12-02 at def5678; "
        "1 shapes from a fwd grid run on 2026-12-03 at abc1234, 12 s; "
        "2 shapes built from 1 results file(s) and 0 trace(s) here"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_script_s_quick_grid_writes_a_kernel_table_on_cuda(tmp_path) -> None:
    out = tmp_path / "attainable-quick.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = load_table(out)
    assert written.header.sm and written.header.cudnn and written.header.read_gbps and written.header.matmul_tflops
    assert len(written.entries) == 3 and all(e.basis == "kernel" for e in written.entries)
    assert all(e.tflops and e.gbps and e.variants >= 2 and e.dtype == "bf16" for e in written.entries)
    decode = next(e for e in written.entries if e.q_len == 1)
    assert decode.gbps is not None and decode.gbps > 0.3 * written.header.read_gbps  # a fused decode reads fast
    assert "best at fwd" in done.stderr
