"""`report/html.py` and `attnprof report` on checked-in results: the page's tables, embedded images,
findings, kernels and trace links, that it loads nothing from outside, escaping, and the command.
(tests/test_report_browser.py renders the same page in a headless Chromium.)"""

from __future__ import annotations

import base64
import copy
import shutil
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from attnprof.report.html import PERFETTO, report_html
from attnprof.report.results_file import ResultsFile, load_results

RESULTS = Path(__file__).parent / "data" / "results"
SEQS = RESULTS / "cpu-seqs.json"
COMPARE = RESULTS / "cpu-compare" / "results.json"  # with its traces/ folder
H200 = RESULTS / "h200-traces.json"  # traces: ../h200/<shape>/<variant>.json.gz


class Page(HTMLParser):
    """The parts of a page the tests read: tables (rows of cell texts), images, links, tags seen."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images: list[dict[str, str]] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.headings: list[str] = []
        self._cell: list[str] | None = None
        self._heading: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attributes = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(attributes)
        elif tag == "a":
            self.links.append(attributes.get("href", ""))
        elif tag in ("h2", "h3"):
            self._heading = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag in ("h2", "h3") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None

    def handle_data(self, data):
        for part in (self._cell, self._heading):
            if part is not None:
                part.append(data)


def render(path: Path, report: Path, with_plots: bool = True) -> str:
    from attnprof.report.html import PlotImage
    from attnprof.report.plots import PLOTS, figures, svg_bytes

    loaded = load_results(path)
    images = []
    if with_plots:
        pytest.importorskip("matplotlib")
        drawn, _ = figures(loaded.rows)
        images = [PlotImage(name, PLOTS[name], svg_bytes(fig)) for name, fig in drawn.items()]
    return report_html(loaded, report, images, [])


def test_compare_report_tables(tmp_path):
    page = Page(render(COMPARE, tmp_path / "report.html"))
    assert "1x4x256x64 fp32 causal fwd on cpu, speed-up vs sdpa-math" in page.headings
    comparison = page.tables[3]  # after environment, config, ceiling
    assert comparison[0][:3] == ["variant", "status", "kernels/fwd"]
    assert [row[0] for row in comparison[1:]] == [r["variant"] for r in load_results(COMPARE).rows]
    math = next(row for row in comparison if row[0] == "sdpa-math")
    assert math[-2:] == ["1.00x", "mask-rebuilt safe-softmax"]
    glance = page.tables[4]
    assert glance[0] == ["variant", "shape", "kernels/fwd", "GPU µs/fwd", "CPU µs/fwd", "findings"]
    not_ok = page.tables[5]
    assert not_ok[0] == ["variant", "cell", "status", "reason"]
    assert {tuple(r) for r in not_ok[1:]} == {
        (v, "1x4x256x64", "skipped", "needs CUDA")
        for v in ("sdpa-efficient", "sdpa-cudnn", "flash-attn", "triton-flash")
    }


def test_environment_and_findings_with_messages(tmp_path):
    text = render(H200, tmp_path / "r.html", with_plots=False)
    page = Page(text)
    environment = dict(tuple(row) for row in page.tables[0])
    assert environment["gpu_name"] == "NVIDIA H200" and environment["torch"] == "2.11.0+cu130"
    assert "hidden-memcpy" in text and "Every forward runs 1 device-to-device memcpy (Memcpy DtoD, 126.6 us)" in text
    findings = text[text.index("id='findings'") : text.index("id='plots'")]
    assert findings.count("<h3>") == 11  # every variant has findings at these shapes


def test_top_kernels_with_decoded_names_and_occupancy(tmp_path):
    page = Page(render(H200, tmp_path / "r.html", with_plots=False))
    kernel_tables = [t for t in page.tables if t[0][0] == "kernel"]
    assert len(kernel_tables) == 21  # 11 variants at the blog shape, 10 at GQA (no sdpa-efficient there)
    flash = next(t for t in kernel_tables if t[1][0] == "flash_fwd_kernel")
    header = flash[0]
    row = dict(zip(header, flash[1], strict=True))
    assert row["achieved occ."] == "13%" and row["theoretical occ."] == "12.5% (registers)"
    assert row["library"] == "FlashAttention-2" and row["µs / fwd"] == "94.4"
    nvjet = next(r for t in kernel_tables for r in t[1:] if r[0].startswith("nvjet_sm90_tst_256x128"))
    assert "exceed the 48 KB default per-block limit" in nvjet[-1]  # the occupancy note


def test_embedded_plots_decode(tmp_path):
    page = Page(render(SEQS, tmp_path / "r.html"))
    assert len(page.images) == 2  # latency, throughput (CPU rows: nothing for the other three)
    for image in page.images:
        prefix = "data:image/svg+xml;base64,"
        assert image["src"].startswith(prefix) and image["alt"]
        svg = base64.b64decode(image["src"][len(prefix) :], validate=True)
        assert ET.fromstring(svg).tag.endswith("svg")


def test_nothing_is_loaded_from_outside(tmp_path):
    for path in (SEQS, COMPARE, H200):
        text = render(path, tmp_path / "r.html")
        page = Page(text)
        assert not page.tags & {"script", "link", "iframe", "object", "embed"}
        assert all(image["src"].startswith("data:") for image in page.images)
        for href in page.links:
            assert href.startswith("#") or href == PERFETTO or "://" not in href, href
        assert "@import" not in text and "url(" not in text


def test_trace_links_are_relative_to_the_report(tmp_path):
    for results, report in ((COMPARE, tmp_path / "deep" / "er" / "r.html"), (H200, tmp_path / "r.html")):
        report.parent.mkdir(parents=True, exist_ok=True)
        page = Page(render(results, report, with_plots=False))
        traces = [href for href in page.links if href.endswith(".json.gz")]
        assert len(traces) == len([r for r in load_results(results).rows if r.get("trace")])
        for href in traces:
            assert not Path(href).is_absolute()
            assert (report.parent / unquote(href)).resolve().is_file()
    assert f"<a href='{PERFETTO}'>" in render(COMPARE, tmp_path / "r.html", with_plots=False)


def test_a_trace_that_is_gone_is_named(tmp_path):
    text = render(SEQS, tmp_path / "r.html", with_plots=False)  # its traces are not checked in
    assert "naive_1x4x128x64_fp32_causal_cpu.json.gz <span class='warn'>(not found)</span>" in text


def test_text_is_escaped(tmp_path):
    loaded = load_results(COMPARE)
    rows = copy.deepcopy(loaded.rows)
    rows[0]["variant"] = "<script>alert(1)</script>"
    rows[0]["findings"] = [{"id": "x<y", "message": "a & b <img src=x>"}]
    text = report_html(ResultsFile(loaded.path, loaded.header, rows), tmp_path / "r.html", [], [])
    assert "<script>" not in text and "<img src=x>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "a &amp; b &lt;img src=x&gt;" in text


def test_rows_without_a_shape_get_one_table(tmp_path):
    keep = ("variant", "seq", "status", "latency_us", "kernels_per_forward", "peak_memory_mib", "findings")
    rows = [{k: r.get(k) for k in keep} for r in load_results(SEQS).rows if r["mode"] == "fwd"]
    loaded = ResultsFile(SEQS, {"command": "model"}, rows)
    page = Page(report_html(loaded, tmp_path / "r.html", [], []))
    table = page.tables[0]
    assert table[0] == ["variant", "seq", "status", "latency µs"]
    assert len(table) == 1 + len(rows)


# --- the command ---


def test_report_command_default_location_and_numbering(cli, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(COMPARE.parent, folder)
    first = cli("report", str(folder / "results.json"))
    second = cli("report", str(folder / "results.json"))
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    assert first.stdout.strip() == str(folder / "report.html")
    assert second.stdout.strip() == str(folder / "report-2.html")
    page = Page((folder / "report.html").read_text())
    assert "traces/naive_1x4x256x64_fp32_causal_cpu.json.gz" in page.links


def test_report_command_never_replaces_a_file(cli, tmp_path):
    target = tmp_path / "report.html"
    target.write_text("mine")
    result = cli("report", str(SEQS), "-o", str(target))
    assert result.exit_code == 5 and "already exists" in result.stderr
    assert target.read_text() == "mine"


def test_report_command_without_matplotlib_writes_the_rest(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = cli("report", str(SEQS), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 0, result.output
    assert "no plots: matplotlib is not installed (pip install 'attnprof[plot]')" in result.stderr
    page = Page((tmp_path / "r.html").read_text())
    assert page.images == [] and len(page.tables) > 5


def test_report_command_bad_file(cli, tmp_path):
    result = cli("report", str(tmp_path / "none.json"))
    assert result.exit_code == 2 and "no such results file" in result.stderr and "Traceback" not in result.output
