"""On a CUDA GPU: `attnprof compare` at several sequence lengths, then `attnprof plot` draws all six
plots (peak memory, kernels and GPU time exist only on a GPU) and `attnprof report` embeds them after its
headline, with the top kernels and their occupancy. Run on the device with
`python -m pytest -m gpu tests/test_gpu_plot.py`; with ATTNPROF_PLOT_OUT=DIR the plots and the report are
also copied there to look at.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SEQS = (512, 1024, 2048, 4096)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bf16 causal compare of naive, sdpa-math and sdpa-flash at four sequence lengths."""
    import yaml
    from typer.testing import CliRunner

    from attnprof.cli.app import app

    folder = tmp_path_factory.mktemp("gpu-plot")
    config = {
        "device": "cuda",
        "dtype": "bf16",
        "shapes": [{"batch": 4, "heads": 16, "seq": seq, "head_dim": 64} for seq in SEQS],
        "causal": True,
        "variants": ["naive", "sdpa-math", "sdpa-flash"],
        "baseline": "sdpa-math",
        "schedule": {"wait": 1, "warmup": 1, "active": 3},
        "output_dir": str(folder / "out"),
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    run = CliRunner().invoke(app, ["compare", str(folder / "config.yaml"), "--format", "json"])
    assert run.exit_code == 0, run.output
    return Path(json.loads(run.stdout)["files"]["results_json"])


def keep(paths: list[Path]) -> None:
    target = os.environ.get("ATTNPROF_PLOT_OUT")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copy(path, Path(target) / path.name)


def test_every_plot_is_drawn_from_a_gpu_compare(cli, results, tmp_path):
    out = cli("plot", str(results), "-o", str(tmp_path / "plots"))
    assert out.exit_code == 0, out.output
    written = [Path(p) for p in out.stdout.split()]
    names = {p.stem for p in written}
    assert names == {"bars", "latency", "throughput", "memory", "kernels", "gpu_vs_cpu"}, out.stderr
    # the roofline places kernels by their hardware counters, which only a compare with --ncu has
    skipped = [line for line in out.stderr.splitlines() if "skipped" in line]
    assert skipped == ["roofline: skipped, no row has hardware counters (--ncu)"], out.stderr
    keep(written)


def test_naive_memory_grows_quadratically(results):
    from attnprof.results.files import load_results

    naive = {r.seq: r.peak_memory_mib for r in load_results(results).rows if r.variant == "naive"}
    assert naive[4096] > 3 * naive[2048] > 9 * naive[1024]  # the B·H·S² scores dominate


def test_report_has_plots_kernels_and_traces(cli, results, tmp_path):
    report = tmp_path / "report.html"
    out = cli("report", str(results), "-o", str(report))
    assert out.exit_code == 0, out.output
    text = report.read_text()
    assert text.count("data:image/svg+xml;base64,") == 6
    assert "flash_fwd_kernel" in text and "achieved occ." in text and "theoretical occ." in text
    assert text.count(".json.gz'>") == 3 * len(SEQS) and "(not found)" not in text
    keep([report])


def test_report_leads_with_the_fastest_and_drops_no_gpu_column(cli, results, tmp_path):
    """The headline names a fused kernel as the fastest at the longest sequence, the comparison tables keep
    the GPU columns (measured here), and the environment names the GPU."""
    from test_html_report import Page

    report = tmp_path / "report.html"
    assert cli("report", str(results), "-o", str(report)).exit_code == 0
    page = Page(report.read_text())
    assert page.sections[:4] == ["headline", "plots", "comparison", "findings"]
    assert page.sections[-1] == "environment"
    [headline] = page.tables_in("headline")
    longest = next(line for line in headline[1:] if line[0].startswith(f"4x16x{SEQS[-1]}x64"))
    assert longest[1] == "sdpa-flash", headline
    # the lengths form a sweep: a pivot by seq comes first, then each point's full table, which keeps the GPU columns
    full = [table for table in page.tables_in("comparison") if "latency µs ± IQR" in table[0]]
    assert len(full) == len(SEQS)
    for table in full:
        assert {"kernels/fwd", "GPU µs", "peak MiB"} <= set(table[0]), table[0]
    environment = dict(tuple(row) for row in page.tables_in("environment")[0])
    assert environment["gpu_name"] and environment["driver_version"]
    keep([report])
