"""`report/plots.py` and `attnprof plot` on checked-in results (tests/data/results, see its README):
which plots are drawn or skipped and why, how rows become lines and bars, the axes' tick labels, lines
that overlap kept apart, the files written, and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("matplotlib")

from attnprof.errors import OutputError
from attnprof.report.columns import speedup_text
from attnprof.report.formatting import fmt_number
from attnprof.report.plot_style import log_ticks, seq_ticks, series, shape_label, style_for, tick
from attnprof.report.plots import figures, left_out, svg_bytes, write_figures
from attnprof.results.files import load_results
from attnprof.results.schema import Row

RESULTS = Path(__file__).parent / "data" / "results"
SEQS = RESULTS / "cpu-seqs.json"  # CPU compare: 4 seqs x fwd, fwd+bwd; sdpa-cudnn skipped
COMPARE = RESULTS / "cpu-compare" / "results.json"  # the default config on CPU: one seq
H200 = RESULTS / "h200-traces.json"  # analysis of the H200 traces: kernels, GPU and CPU time, no latency
SWEEP = RESULTS / "cpu-sweep.jsonl"  # configs/sweep-cpu.yaml: seq 128-512 x head_dim 32, 64; naive and inplace


def rows(path: Path) -> list[Row]:
    return load_results(path).rows


def latency_series(data: list[Row]) -> list:
    return series(data, lambda r: r.seq, lambda r: r.latency_us)


def changed(row: Row, **fields) -> Row:
    """A copy of the row with these fields replaced."""
    return msgspec.structs.replace(row, **fields)


def test_cpu_rows_draw_latency_and_throughput_and_say_why_not_the_rest():
    drawn, skipped = figures(rows(SEQS))
    assert list(drawn) == ["bars", "latency", "throughput"]
    assert skipped == {
        "memory": "no ok row has a peak memory (measured on CUDA only)",
        "kernels": "no ok row has a kernel count (GPU runs only)",
        "gpu_vs_cpu": "no ok row has both a GPU and a CPU time (CPU runs have no device time)",
        "roofline": "no row has hardware counters (--ncu)",
    }


def test_one_line_per_variant_and_mode_in_seq_order_without_skipped_rows():
    found = latency_series(rows(SEQS))
    assert sorted((s.variant, s.mode) for s in found) == sorted(
        (v, m) for v in ("naive", "sdpa-math", "sdpa-flash") for m in ("fwd", "fwd+bwd")
    )
    for item in found:
        assert [x for x, _y, _row in item.points] == [128, 256, 512, 1024]
        assert all(y == row.latency_us for _x, y, row in item.points)
    assert "sdpa-cudnn" not in {s.variant for s in found}
    assert left_out(rows(SEQS)) == ["sdpa-cudnn (skipped, 8 cells)"]


def test_rows_of_another_shape_at_the_same_seq_are_another_line():
    data = rows(SEQS)
    wider = [changed(r, head_dim=128, shape=r.shape.replace("x64", "x128")) for r in data]
    both = data + wider
    style = style_for(both)
    assert style.varying == ("mode", "head_dim")
    found = latency_series(both)
    assert len(found) == 12  # 3 variants x 2 modes x 2 head dims
    assert {shape_label(style, s.shape) for s in found} == {"d64", "d128"}
    assert len(set(style.markers.values())) == 2
    drawn, _ = figures(both)
    assert "latency" in drawn


def test_several_devices_are_separate_lines_and_named():
    data = rows(SEQS)
    elsewhere = [changed(r, device="cuda:0") for r in data]
    style = style_for(data + elsewhere)
    assert "device" in style.varying and "cpu" not in style.common
    assert len(latency_series(data + elsewhere)) == 12


def test_failed_rows_are_left_out_of_the_lines():
    data = rows(SEQS)
    for r in data:
        if r.variant == "naive" and r.seq == 512:
            r.status = "failed: out of memory: tried to allocate"
    naive = [s for s in latency_series(data) if s.variant == "naive"]
    assert all([x for x, _y, _r in s.points] == [128, 256, 1024] for s in naive)
    assert "naive (failed, 2 cells)" in left_out(data)


def test_one_seq_only_skips_every_plot_that_needs_several():
    drawn, skipped = figures(rows(COMPARE))
    assert list(drawn) == ["bars"]
    assert skipped["latency"] == "every row with a latency has the same sequence length (256)"
    assert skipped["throughput"] == "every row with a TFLOP/s figure has the same sequence length (256)"


def test_gpu_trace_rows_draw_kernels_and_gpu_against_cpu():
    drawn, skipped = figures(rows(H200))
    assert list(drawn) == ["kernels", "gpu_vs_cpu"]
    assert skipped["latency"] == "no ok row has a latency"
    style = style_for(rows(H200))
    assert style.varying == ("batch", "heads", "kv_heads", "head_dim")  # blog shape and GQA at 8k
    assert style.common == "causal · bf16 · fwd · cuda:0"


def test_bars_draw_each_shape_and_mode_fastest_first_and_name_what_did_not_run():
    data = rows(SEQS)
    drawn, _ = figures(data, ["bars"])
    panels = drawn["bars"].axes
    assert len(panels) == 8  # 4 sequence lengths x fwd, fwd+bwd
    first = panels[0]
    assert first.get_title() == "1x4x128x64 fp32 causal fwd"
    ran = sorted(
        (r for r in data if r.shape == "1x4x128x64" and r.mode == "fwd" and r.status == "ok"),
        key=lambda r: r.latency_us,
    )
    labels = [t.get_text() for t in first.get_yticklabels()]
    assert labels == [r.variant for r in ran] + ["not run"]  # fastest at the top, what did not run last
    widths = [bar.get_width() for bar in first.patches]
    assert widths == [r.latency_us for r in ran]
    texts = [t.get_text() for t in first.texts]
    assert f"{fmt_number(ran[0].latency_us)} µs  {speedup_text(ran[0])}" in texts
    assert texts[-1] == "skipped: sdpa-cudnn"
    low, high = first.get_xlim()
    ticks = [tick(v) for v in first.xaxis.get_majorticklocs() if low <= v <= high]
    assert ticks == ["0", "200", "400"]  # linear, in 1-2-5 steps


def test_a_sweep_with_more_cells_than_bar_charts_leaves_them_to_the_lines():
    data = rows(SEQS)
    wider = [changed(r, head_dim=128, shape=r.shape.replace("x64", "x128")) for r in data]
    drawn, skipped = figures(data + wider, ["bars", "latency"])
    assert list(drawn) == ["latency"]
    assert skipped["bars"] == "16 shape × mode cells, more than 8 bar charts; the latency plot draws them"


def test_log_ticks_step_1_2_5_and_stay_readable_on_narrow_and_wide_ranges():
    assert log_ticks(60, 5_000) == [100, 200, 500, 1_000, 2_000, 5_000]
    assert log_ticks(176, 600) == [200, 300, 400, 500]  # 1-2-5 alone gives two: finer steps
    assert log_ticks(30, 300_000) == [100, 1_000, 10_000, 100_000]  # 1-2-5 gives more than ten: decades
    assert log_ticks(101, 102) == []  # matplotlib's own then
    assert seq_ticks([512.0, 8192.0, 2048.0]) == [512, 1024, 2048, 4096, 8192]  # every power of two between
    assert seq_ticks([48.0, 32.0]) == [32, 48]


def tick_labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_the_latency_plot_labels_its_axes_in_powers_of_two_and_1_2_5_steps():
    drawn, _ = figures(rows(SEQS), ["latency"])
    ax = drawn["latency"].subfigs[0].axes[0]
    drawn["latency"].canvas.draw()
    assert tick_labels(ax.xaxis) == ["128", "256", "512", "1,024"]
    assert tick_labels(ax.yaxis) == [
        "200",
        "500",
        "1,000",
        "2,000",
        "5,000",
        "10,000",
        "20,000",
        "50,000",
        "100k",
        "200k",
    ]
    drawn, _ = figures(rows(H200), ["kernels"])
    ax = drawn["kernels"].subfigs[0].axes[0]
    drawn["kernels"].canvas.draw()
    assert tick_labels(ax.xaxis) == ["1,024", "2,048", "4,096", "8,192"]


def test_lines_that_overlap_stay_apart():
    data = rows(SWEEP)
    style = style_for(data)
    assert style.variant_markers == {}  # two head dims: the marker is the shape's
    drawn, _ = figures(data, ["latency"])
    ax = drawn["latency"].subfigs[0].axes[0]
    lines = {matplotlib_colour(line.get_color()): line for line in ax.get_lines() if len(line.get_xdata()) == 3}
    naive = lines[matplotlib_colour(style.colours["naive"])].get_xdata()
    inplace = lines[matplotlib_colour(style.colours["inplace"])].get_xdata()
    for x_naive, x_inplace, seq in zip(naive, inplace, (128, 256, 512), strict=True):
        assert x_naive != x_inplace and abs(x_naive / seq - 1) < 0.04 and abs(x_inplace / seq - 1) < 0.04
    notes = " ".join(t.get_text() for t in drawn["latency"].subfigs[0].texts)
    assert "points are shifted sideways by up to 3.5% of the sequence length" in notes
    one_shape = style_for(rows(SEQS))
    assert len(set(one_shape.variant_markers.values())) == 3  # one shape: a marker per variant


def matplotlib_colour(colour) -> str:
    from matplotlib.colors import to_hex

    return to_hex(colour)


def test_memory_plot_draws_with_an_s_squared_guide():
    # Peak memory is measured on CUDA only: give the CPU rows the size of their B·H·S² fp32 scores.
    data = [changed(r, peak_memory_mib=4 * r.batch * r.heads * r.seq**2 / 2**20) for r in rows(SEQS)]
    drawn, _ = figures(data, ["memory"])
    legend = drawn["memory"].subfigs[1].legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert "∝ S² guide" in labels and "naive" in labels and "fwd+bwd" in labels


def test_model_rows_without_shape_fields_still_plot():
    data = [
        Row(
            subject="model",
            variant=r.variant,
            seq=r.seq,
            status=r.status,
            latency_us=r.latency_us,
            kernels_per_forward=r.kernels_per_forward,
            peak_memory_mib=r.peak_memory_mib,
            findings=r.findings,
        )
        for r in rows(SEQS)
        if r.mode == "fwd"
    ]
    drawn, skipped = figures(data)
    assert "latency" in drawn and "throughput" in skipped
    assert {s.variant for s in latency_series(data)} == {"naive", "sdpa-math", "sdpa-flash"}


def test_files_are_written_whole_and_never_replaced(tmp_path):
    drawn, _ = figures(rows(SEQS))
    written = write_figures(drawn, tmp_path / "plots", ["png", "svg"])
    names = sorted(p.name for p in written)
    assert names == ["bars.png", "bars.svg", "latency.png", "latency.svg", "throughput.png", "throughput.svg"]
    from matplotlib.image import imread

    image = imread(tmp_path / "plots" / "latency.png")
    assert image.shape[0] > 600 and image.shape[1] > 1000 and image.std() > 0.05  # a drawing, not a blank
    root = ET.parse(tmp_path / "plots" / "throughput.svg").getroot()
    assert root.tag.endswith("svg")
    assert not list(tmp_path.glob("plots/.*"))  # no temporary file left behind
    with pytest.raises(OutputError, match="bars.png already exists"):
        write_figures(drawn, tmp_path / "plots", ["png"])
    assert write_figures({}, tmp_path / "none", ["png"]) == [] and not (tmp_path / "none").exists()


def test_svg_is_reproducible():
    drawn, _ = figures(rows(SEQS), ["latency"])
    again, _ = figures(rows(SEQS), ["latency"])
    assert svg_bytes(drawn["latency"]) == svg_bytes(again["latency"])


# --- the command ---


def test_plot_command_writes_and_prints_paths(cli, tmp_path):
    result = cli("plot", str(SEQS), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    printed = result.stdout.split()
    assert [Path(p).name for p in printed] == [
        f"{name}.{fmt}" for name in ("bars", "latency", "throughput") for fmt in ("png", "svg")
    ]
    assert all(Path(p).stat().st_size > 10_000 for p in printed)
    assert "memory: skipped, no ok row has a peak memory (measured on CUDA only)" in result.stderr
    assert "not plotted (not ok): sdpa-cudnn (skipped, 8 cells)" in result.stderr


def test_plot_command_default_folder_beside_the_results(cli, tmp_path):
    results = tmp_path / "run" / "results.json"
    results.parent.mkdir()
    shutil.copy(SEQS, results)
    first = cli("plot", str(results), "--format", "svg")
    second = cli("plot", str(results), "--format", "svg")
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    names = ("bars.svg", "latency.svg", "throughput.svg")
    assert first.stdout.split() == [str(tmp_path / "run" / "plots" / n) for n in names]
    assert Path(second.stdout.split()[0]).parent.name == "plots-2"


def test_plot_command_with_nothing_to_draw(cli, tmp_path):
    document = json.loads(COMPARE.read_text())
    for row in document["results"]:
        row["status"] = "skipped: needs CUDA"
    none_ran = tmp_path / "results.json"
    none_ran.write_text(json.dumps(document))
    result = cli("plot", str(none_ran), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and "no plot had anything to show" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--format", "jpg"], 2, "error: --format 'jpg': expected png or svg, comma-separated"),
        (["--format", ","], 2, "error: --format ',': expected png or svg"),
    ],
)
def test_plot_command_bad_format(cli, tmp_path, args, code, message):
    result = cli("plot", str(SEQS), "-o", str(tmp_path), *args)
    assert result.exit_code == code and message in result.stderr
    assert "Traceback" not in result.output


def test_plot_command_bad_files(cli, tmp_path):
    missing = cli("plot", str(tmp_path / "nope.json"))
    assert missing.exit_code == 2 and "no such results file" in missing.stderr
    (tmp_path / "x.json").write_text("[1]")
    wrong = cli("plot", str(tmp_path / "x.json"))
    assert wrong.exit_code == 2 and "not an attnprof results file" in wrong.stderr


def test_plot_command_never_replaces_plots(cli, tmp_path):
    assert cli("plot", str(SEQS), "-o", str(tmp_path)).exit_code == 0
    again = cli("plot", str(SEQS), "-o", str(tmp_path))
    assert again.exit_code == 5 and "bars.png already exists" in again.stderr


def test_plot_command_without_matplotlib(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = cli("plot", str(SEQS))
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: attnprof plot needs matplotlib: pip install 'attnprof[plot]'"


def test_the_cli_does_not_import_matplotlib_until_it_plots():
    code = "import sys; import attnprof.cli.app; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
