"""`report/plots.py` and `attnprof plot` on checked-in results (tests/data/results, see its README):
which plots are drawn or skipped and why, how rows become lines, the files written, and the CLI."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from attnprof.errors import OutputError
from attnprof.report.plot_style import series, shape_label, style_for
from attnprof.report.plots import figures, left_out, svg_bytes, write_figures
from attnprof.report.results_file import load_results

RESULTS = Path(__file__).parent / "data" / "results"
SEQS = RESULTS / "cpu-seqs.json"  # CPU compare: 4 seqs x fwd, fwd+bwd; sdpa-cudnn skipped
COMPARE = RESULTS / "cpu-compare" / "results.json"  # the default config on CPU: one seq
H200 = RESULTS / "h200-traces.json"  # analysis of the H200 traces: kernels, GPU and CPU time, no latency


def rows(path: Path) -> list[dict]:
    return load_results(path).rows


def latency_series(data: list[dict]) -> list:
    return series(data, lambda r: r.get("seq"), lambda r: r.get("latency_us"))


def test_cpu_rows_draw_latency_and_throughput_and_say_why_not_the_rest():
    drawn, skipped = figures(rows(SEQS))
    assert list(drawn) == ["latency", "throughput"]
    assert skipped == {
        "memory": "no ok row has a peak memory (measured on CUDA only)",
        "kernels": "no ok row has a kernel count (GPU runs only)",
        "gpu_vs_cpu": "no ok row has both a GPU and a CPU time (CPU runs have no device time)",
    }


def test_one_line_per_variant_and_mode_in_seq_order_without_skipped_rows():
    found = latency_series(rows(SEQS))
    assert sorted((s.variant, s.mode) for s in found) == sorted(
        (v, m) for v in ("naive", "sdpa-math", "sdpa-flash") for m in ("fwd", "fwd+bwd")
    )
    for item in found:
        assert [x for x, _y, _row in item.points] == [128, 256, 512, 1024]
        assert all(y == row["latency_us"] for _x, y, row in item.points)
    assert "sdpa-cudnn" not in {s.variant for s in found}
    assert left_out(rows(SEQS)) == ["sdpa-cudnn (skipped, 8 cells)"]


def test_rows_of_another_shape_at_the_same_seq_are_another_line():
    data = rows(SEQS)
    wider = [dict(copy.deepcopy(r), head_dim=128, shape=r["shape"].replace("x64", "x128")) for r in data]
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
    elsewhere = [dict(r, device="cuda:0") for r in data]
    style = style_for(data + elsewhere)
    assert "device" in style.varying and "cpu" not in style.common
    assert len(latency_series(data + elsewhere)) == 12


def test_failed_rows_are_left_out_of_the_lines():
    data = copy.deepcopy(rows(SEQS))
    for r in data:
        if r["variant"] == "naive" and r["seq"] == 512:
            r["status"] = "failed: out of memory: tried to allocate"
    naive = [s for s in latency_series(data) if s.variant == "naive"]
    assert all([x for x, _y, _r in s.points] == [128, 256, 1024] for s in naive)
    assert "naive (failed, 2 cells)" in left_out(data)


def test_one_seq_only_skips_every_plot_that_needs_several():
    drawn, skipped = figures(rows(COMPARE))
    assert drawn == {}
    assert skipped["latency"] == "every row with a latency has the same sequence length (256)"
    assert skipped["throughput"] == "every row with a TFLOP/s figure has the same sequence length (256)"


def test_gpu_trace_rows_draw_kernels_and_gpu_against_cpu():
    drawn, skipped = figures(rows(H200))
    assert list(drawn) == ["kernels", "gpu_vs_cpu"]
    assert skipped["latency"] == "no ok row has a latency"
    style = style_for(rows(H200))
    assert style.varying == ("batch", "heads", "kv_heads", "head_dim")  # blog shape and GQA at 8k
    assert style.common == "causal · bf16 · fwd · cuda:0"


def test_memory_plot_draws_with_an_s_squared_guide():
    # Peak memory is measured on CUDA only: give the CPU rows the size of their B·H·S² fp32 scores.
    data = [dict(r, peak_memory_mib=4 * r["batch"] * r["heads"] * r["seq"] ** 2 / 2**20) for r in rows(SEQS)]
    drawn, _ = figures(data, ["memory"])
    legend = drawn["memory"].subfigs[1].legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert "∝ S² guide" in labels and "naive" in labels and "fwd+bwd" in labels


def test_model_rows_without_shape_fields_still_plot():
    keep = ("variant", "seq", "status", "latency_us", "kernels_per_forward", "peak_memory_mib", "findings")
    data = [{k: r.get(k) for k in keep} for r in rows(SEQS) if r["mode"] == "fwd"]
    drawn, skipped = figures(data)
    assert "latency" in drawn and "throughput" in skipped
    assert {s.variant for s in latency_series(data)} == {"naive", "sdpa-math", "sdpa-flash"}


def test_files_are_written_whole_and_never_replaced(tmp_path):
    drawn, _ = figures(rows(SEQS))
    written = write_figures(drawn, tmp_path / "plots", ["png", "svg"])
    names = sorted(p.name for p in written)
    assert names == ["latency.png", "latency.svg", "throughput.png", "throughput.svg"]
    from matplotlib.image import imread

    image = imread(tmp_path / "plots" / "latency.png")
    assert image.shape[0] > 600 and image.shape[1] > 1000 and image.std() > 0.05  # a drawing, not a blank
    root = ET.parse(tmp_path / "plots" / "throughput.svg").getroot()
    assert root.tag.endswith("svg")
    assert not list(tmp_path.glob("plots/.*"))  # no temporary file left behind
    with pytest.raises(OutputError, match="latency.png already exists"):
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
    assert [Path(p).name for p in printed] == ["latency.png", "latency.svg", "throughput.png", "throughput.svg"]
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
    assert first.stdout.split() == [str(tmp_path / "run" / "plots" / n) for n in ("latency.svg", "throughput.svg")]
    assert Path(second.stdout.split()[0]).parent.name == "plots-2"


def test_plot_command_with_nothing_to_draw(cli, tmp_path):
    result = cli("plot", str(COMPARE), "-o", str(tmp_path / "out"))
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
    assert again.exit_code == 5 and "latency.png already exists" in again.stderr


def test_plot_command_without_matplotlib(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = cli("plot", str(SEQS))
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: attnprof plot needs matplotlib: pip install 'attnprof[plot]'"


def test_the_cli_does_not_import_matplotlib_until_it_plots():
    code = "import sys; import attnprof.cli.app; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
