"""One reference per device for every percentage of a run (`pipeline.references`): a row that beats the
measured read bandwidth or matmul ceiling raises the reference for every row of its device (and dtype, for
the matmul), the rows say from what, and the compare table prints it as a legend under the table."""

from __future__ import annotations

import json

import pytest

from attnprof.pipeline.references import attach_references
from attnprof.report.tables import reference_legend, shape_table
from attnprof.results.schema import Row

#: The decode-cpu table of issue 32: the read probe measured 5.97 GB/s; sdpa read 11.1, sdpa-flash 8.3.
MEASURED_READ = 5.97


def decode_row(variant: str, gbps: float, tflops: float = 0.01, device: str = "cpu", dtype: str = "fp32") -> Row:
    return Row(
        variant=variant,
        shape="4x8/2x1/1024x64",
        batch=4,
        heads=8,
        kv_heads=2,
        seq=1024,
        q_len=1,
        kv_len=1024,
        head_dim=64,
        dtype=dtype,
        device=device,
        causal=True,
        latency_us=100.0,
        flops=tflops * 1e12 * 100e-6,
        tflops=tflops,
        peak_tflops=0.1,
        bytes_moved=gbps * 1e9 * 100e-6,
        achieved_gbps=gbps,
        peak_read_gbps=MEASURED_READ,
        pct_of_read_bandwidth=min(100.0, 100 * gbps / MEASURED_READ),  # as each cell alone had it
    )


def test_a_row_above_the_read_probe_raises_the_reference_of_every_row_of_its_device():
    rows = [decode_row("sdpa", 11.1), decode_row("sdpa-flash", 8.3), decode_row("naive", 3.0)]
    attach_references(rows)
    assert [r.read_reference_gbps for r in rows] == [11.1] * 3
    assert [round(r.pct_of_read_bandwidth, 1) for r in rows] == [100.0, 74.8, 27.0]  # not two at 100%
    assert {r.peak_read_gbps for r in rows} == {MEASURED_READ}  # the measured figure is kept
    note = "% of read BW is of 11.1 GB/s (sdpa at 4x8/2x1/1024x64 fp32 causal fwd), above the read bandwidth " \
           "measured on cpu (5.97 GB/s)"
    assert {r.read_bandwidth_note for r in rows} == {note}
    assert all(r.bound == "memory" for r in rows)  # ridge 0.1 TFLOP/s / 11.1 GB/s = 9 FLOP/byte above 0.9 at most


def test_below_the_probe_the_measured_read_bandwidth_stays_the_reference():
    rows = [decode_row("sdpa", 5.0), decode_row("naive", 3.0)]
    attach_references(rows)
    assert [r.read_reference_gbps for r in rows] == [MEASURED_READ] * 2
    assert rows[0].pct_of_read_bandwidth == pytest.approx(100 * 5.0 / MEASURED_READ)
    assert all(r.read_bandwidth_note is None and r.peak_reference_note is None for r in rows)


def test_each_device_has_its_own_reference_and_the_matmul_one_its_dtype():
    rows = [
        decode_row("sdpa", 11.1, device="cpu"),
        decode_row("sdpa", 4.0, device="cuda:0", tflops=0.2),  # beats cuda:0's matmul ceiling (0.1) in fp32
        decode_row("naive", 2.0, device="cuda:0", tflops=0.05),
        decode_row("naive", 2.0, device="cuda:0", tflops=0.05, dtype="bf16"),
    ]
    attach_references(rows)
    assert [r.read_reference_gbps for r in rows] == [11.1, MEASURED_READ, MEASURED_READ, MEASURED_READ]
    assert [r.peak_reference_tflops for r in rows] == [0.1, 0.2, 0.2, 0.1]
    assert [r.pct_of_peak for r in rows] == [pytest.approx(10.0), 100.0, pytest.approx(25.0), pytest.approx(50.0)]
    assert rows[1].peak_reference_note == rows[2].peak_reference_note == (
        "% of peak is of 0.2 TFLOP/s (sdpa at 4x8/2x1/1024x64 fp32 causal fwd, by latency), above the fp32 matmul "
        "measured on cuda:0 (0.1 TFLOP/s)"
    )
    assert rows[0].peak_reference_note is None and rows[3].peak_reference_note is None


def test_a_row_without_a_measured_ceiling_keeps_its_reason_and_no_percentage():
    row = decode_row("sdpa", 11.1)
    row.peak_tflops, row.peak_read_gbps, row.pct_of_read_bandwidth = None, None, None
    row.pct_of_peak_note = "no meaningful bf16 matmul ceiling on CPU (attention there computes in fp32)"
    attach_references([row])
    assert row.pct_of_peak is None and row.pct_of_read_bandwidth is None and row.read_reference_gbps is None
    assert row.pct_of_peak_note.startswith("no meaningful")


def test_the_compare_table_says_it_in_a_legend_under_the_table():
    rows = [decode_row("sdpa", 11.1), decode_row("sdpa-flash", 8.3), decode_row("naive", 3.0)]
    attach_references(rows)
    for width in (None, 120):
        text = shape_table(rows, "table", width)
        table, _, legend = text.partition("\n\n")
        assert "11.1 (100%)" in table and "8.3 (74.8%)" in table and "(100%)" not in table.replace("11.1 (100%)", "")
        assert " ".join(legend.split()) == reference_legend(rows)[0]  # once, not once per row


def test_a_run_divides_every_row_by_the_best_read_figure(cli, write_config, tmp_path, monkeypatch):
    """A real compare on the CPU with the read probe faked low (every cell beats it): the results file and
    the table share one reference, the best row's figure, and the legend names it."""
    from attnprof.profiling import ceiling

    def slow_probe(device: str, dtype: str) -> ceiling.Ceiling:
        return ceiling.Ceiling(1e3, 1.0, "measured", method="fake", read_gbps=1e-6, read_method="fake")

    monkeypatch.setattr(ceiling, "probe_ceiling", slow_probe)
    result = cli("compare", str(write_config()), "--wide", "--min-time", "0.02", "--refresh-ceiling")
    assert result.exit_code == 0, result.output
    [results] = (tmp_path / "out").glob("*-compare/results.json")
    rows = json.loads(results.read_text())["results"]
    best = max(rows, key=lambda r: r["achieved_gbps"])
    assert {r["read_reference_gbps"] for r in rows} == {best["achieved_gbps"]}
    assert [r["variant"] for r in rows if r["pct_of_read_bandwidth"] == 100.0] == [best["variant"]]
    assert all(r["peak_read_gbps"] == 1e-6 for r in rows)
    [note] = {r["read_bandwidth_note"] for r in rows}
    assert note.startswith(f"% of read BW is of {best['achieved_gbps']:.3g} GB/s ({best['variant']} at ")
    assert note in " ".join(result.stdout.split())
