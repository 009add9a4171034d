"""`report/html.py` and `attnprof report` on checked-in results: the order of the page's sections, the
headline, the comparison tables without their all-n/a columns, a sweep's pivot tables, the findings
grouped by id and ranked by impact, the environment, config and ceiling at the end, embedded images,
kernels and trace links, that it loads nothing from outside, escaping, and the command.
(tests/test_report_browser.py renders the same page in a headless Chromium.)"""

from __future__ import annotations

import base64
import shutil
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import msgspec
import pytest

from attnprof.report.formatting import fmt_number
from attnprof.report.html import PERFETTO, report_html
from attnprof.results.files import ResultsFile, load_results
from attnprof.results.parts import FindingRecord
from attnprof.results.schema import Document, Row

RESULTS = Path(__file__).parent / "data" / "results"
SEQS = RESULTS / "cpu-seqs.json"
COMPARE = RESULTS / "cpu-compare" / "results.json"  # with its traces/ folder
H200 = RESULTS / "h200-traces.json"  # traces: ../h200/<shape>/<variant>.json.gz
SWEEP = RESULTS / "cpu-sweep.jsonl"  # `attnprof sweep configs/sweep-cpu.yaml`: a results stream, no ceiling in it


class Page(HTMLParser):
    """The parts of a page the tests read: tables (rows of cell texts), images, links, tags seen, the
    sections (h2 ids, in order) and the findings entries (rows marked `data-finding`, `data-variant`)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.table_section: list[str] = []  # the h2 id each table is under
        self.images: list[dict[str, str]] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.headings: list[str] = []
        self.sections: list[str] = []
        self.findings: list[tuple[str, str, list[str]]] = []  # (id, variant, its row's cells)
        self.finding_groups: list[tuple[str, bool]] = []  # (id, inside the folded info block)
        self._cell: list[str] | None = None
        self._heading: list[str] | None = None
        self._folded = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attributes = dict(attrs)
        if tag == "h2":
            self.sections.append(attributes.get("id", ""))
        elif tag == "details" and attributes.get("id") == "info-findings":
            self._folded = True
        elif tag == "section" and (attributes.get("id") or "").startswith("finding-"):
            self.finding_groups.append((attributes["id"].removeprefix("finding-"), self._folded))
        if tag == "table":
            self.tables.append([])
            self.table_section.append(self.sections[-1] if self.sections else "")
        elif tag == "tr":
            self.tables[-1].append([])
            if "data-finding" in attributes:
                self.findings.append((attributes["data-finding"], attributes["data-variant"], self.tables[-1][-1]))
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "li" and self._cell:
            self._cell.append("; ")  # list items inside a cell, one after the other
        elif tag == "img":
            self.images.append(attributes)
        elif tag == "a":
            self.links.append(attributes.get("href", ""))
        elif tag in ("h2", "h3"):
            self._heading = []

    def handle_endtag(self, tag):
        if tag == "details":
            self._folded = False
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag in ("h2", "h3") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None

    def handle_data(self, data):
        for part in (self._cell, self._heading):
            if part is not None:
                part.append(data)

    def tables_in(self, section: str) -> list[list[list[str]]]:
        return [t for t, where in zip(self.tables, self.table_section, strict=True) if where == section]


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


def test_sections_lead_with_the_headline_and_end_with_the_environment(tmp_path):
    for path, sections in (
        (COMPARE, ["headline", "plots", "comparison", "findings", "kernels", "not-ok", "traces", "environment"]),
        (H200, ["headline", "plots", "comparison", "findings", "kernels", "traces", "environment"]),
        (SWEEP, ["headline", "plots", "comparison", "findings", "kernels", "traces", "environment"]),
    ):
        page = Page(render(path, tmp_path / "r.html"))
        assert page.sections == sections, path.name
        nav = [href.removeprefix("#") for href in page.links if href.startswith("#") and "finding-" not in href]
        assert nav[: len(sections)] == sections


def test_the_headline_names_the_fastest_of_each_shape_and_mode(tmp_path):
    rows = load_results(SEQS).rows
    page = Page(render(SEQS, tmp_path / "r.html", with_plots=False))
    [headline] = page.tables_in("headline")
    header = headline[0]
    assert header == [
        "shape × mode",
        "fastest",
        "latency µs",
        "TFLOP/s",
        "% of peak",
        "speed-up vs sdpa-math",
        "runner-up and slowest",
        "costliest problem findings",
    ]
    assert len(headline) == 1 + 8  # 4 sequence lengths x fwd, fwd+bwd
    for line in headline[1:]:
        cell = dict(zip(header, line, strict=True))
        shape, _dtype, _masking, mode = cell["shape × mode"].split(" on ")[0].split()
        ran = [r for r in rows if r.shape == shape and r.mode == mode and r.status == "ok"]
        best = min(ran, key=lambda r: r.latency_us)
        assert cell["fastest"] == best.variant
        assert cell["latency µs"] == fmt_number(best.latency_us)
        assert cell["% of peak"] == fmt_number(best.pct_of_peak)
        assert cell["costliest problem findings"] == "sdpa-math: mask-rebuilt; sdpa-math: safe-softmax"


def test_the_headline_without_latency_ranks_by_gpu_time_and_drops_empty_columns(tmp_path):
    text = render(H200, tmp_path / "r.html", with_plots=False)
    [headline] = Page(text).tables_in("headline")
    assert headline[0] == [
        "shape × mode",
        "fastest",
        "GPU µs per forward",
        "speed-up vs sdpa-math",
        "runner-up and slowest",
        "costliest problem findings",
    ]
    assert [line[1:3] for line in headline[1:]] == [["triton-flash", "54.5"], ["sdpa", "3,555"]]
    assert "Left out, n/a in every row: TFLOP/s, % of peak." in text


def test_comparison_tables_drop_the_columns_that_are_na_in_every_row(tmp_path):
    text = render(COMPARE, tmp_path / "report.html")
    page = Page(text)
    assert "1x4x256x64 fp32 causal fwd on cpu, speed-up vs sdpa-math" in page.headings
    [comparison] = page.tables_in("comparison")
    assert comparison[0] == [
        "variant",
        "status",
        "CPU µs",
        "latency µs ± IQR",
        "TFLOP/s (latency)",
        "% peak",
        "GB/s (% read BW)",
        "rel err",
        "speed-up",
        "findings",
    ]
    left_out = "kernels/fwd, GPU µs, TFLOP/s (kernels), kernel GB/s, executed/useful FLOPs, peak MiB, % of best known"
    assert f"Left out, n/a in every row: {left_out}." in text
    assert [row[0] for row in comparison[1:]] == [r.variant for r in load_results(COMPARE).rows]
    math = next(row for row in comparison if row[0] == "sdpa-math")
    assert math[-2:] == ["1.00x", "mask-rebuilt safe-softmax"]
    [not_ok] = page.tables_in("not-ok")
    assert not_ok[0] == ["variant", "cell", "status", "reason"]
    assert {tuple(r) for r in not_ok[1:]} == {
        (v, "1x4x256x64", "skipped", "needs CUDA")
        for v in ("sdpa-efficient", "sdpa-cudnn", "flash-attn", "triton-flash")
    }


def test_gpu_comparison_tables_show_problem_ids_and_count_the_info_ones(tmp_path):
    page = Page(render(H200, tmp_path / "r.html", with_plots=False))
    first = page.tables_in("comparison")[0]
    assert "latency µs ± IQR" not in first[0] and "kernels/fwd" in first[0]
    findings = {row[0]: row[-1] for row in first[1:]}
    assert findings["naive"] == "hidden-memcpy (+3 info)"
    assert findings["sdpa-math"] == "fp32-cuda-cores mask-rebuilt safe-softmax (+2 info)"
    assert findings["sdpa"] == "(+3 info)"


def test_a_sweep_gets_pivot_tables_and_its_points_folded(tmp_path):
    text = render(SWEEP, tmp_path / "r.html", with_plots=False)
    page = Page(text)
    tables = page.tables_in("comparison")
    pivots = [t for t in tables if t[0][1:4] == ["seq 128", "seq 256", "seq 512"]]
    assert len(pivots) == 2  # head_dim 32 and 64
    assert "batch 1, heads 4, head_dim 32, fp32 causal fwd on cpu: latency µs (speed-up vs sdpa-math) by seq" in (
        page.headings
    )
    rows = {(r.variant, r.seq, r.head_dim): r for r in load_results(SWEEP).rows}
    flash = next(line for line in pivots[0] if line[0] == "sdpa-flash")
    assert flash[3] == f"{fmt_number(rows['sdpa-flash', 512, 32].latency_us)} (6.80x)"
    assert len(tables) == 2 + 6  # the pivots, then one folded table per point
    assert "<details><summary>Every point in full (6 tables)</summary>" in text
    assert "<details><summary>Every point in full (8 tables)</summary>" in render(SEQS, tmp_path / "s.html", False)


def test_findings_are_grouped_by_id_once_per_variant_with_the_cells(tmp_path):
    page = Page(render(H200, tmp_path / "r.html", with_plots=False))
    pairs = [(finding_id, variant) for finding_id, variant, _ in page.findings]
    assert len(pairs) == len(set(pairs))  # one entry per (variant, id)
    fired = {(f.id, r.variant) for r in load_results(H200).rows for f in r.findings}
    assert set(pairs) == fired
    entries = {(finding_id, variant): cells for finding_id, variant, cells in page.findings}
    assert entries["hidden-memcpy", "naive"][1] == "8x16x1024x64, 4x32x8192x128/kv8"
    assert entries["hidden-memcpy", "naive"][-1].startswith("Every forward runs 1 device-to-device memcpy")
    assert entries["hidden-memcpy", "naive"][-1].endswith("(at 8x16x1024x64)")  # the messages differ by cell
    assert entries["cpu-bound", "flash-attn"][1] == "8x16x1024x64"
    # these results predate severity: the registry's is used; info findings fold after the problems
    folded = dict(page.finding_groups)
    assert not folded["hidden-memcpy"] and not folded["fp32-cuda-cores"] and not folded["cpu-bound"]
    assert folded["low-occupancy-by-design"] and folded["occupancy-unreported"] and folded["single-fused-kernel"]
    assert [folded[i] for i, _ in page.finding_groups] == sorted(folded[i] for i, _ in page.finding_groups)


def with_impact(path: Path, impacts: dict[tuple[str, str], tuple[float, float]]) -> ResultsFile:
    """The results with `severity`, `impact_us` and `impact_pct` on the findings named (variant, id)."""
    loaded = load_results(path)
    for row in loaded.rows:
        for finding in row.findings:
            if (row.variant, finding.id) in impacts:
                us, pct = impacts[row.variant, finding.id]
                finding.severity, finding.impact_us, finding.impact_pct = "problem", us * row.seq / 1024, pct
    return loaded


def test_findings_and_the_headline_rank_by_impact_then_severity(tmp_path):
    impacts = {("sdpa-math", "mask-rebuilt"): (40.0, 1.5), ("naive", "hidden-memcpy"): (126.6, 11.8)}
    text = report_html(with_impact(H200, impacts), tmp_path / "r.html", [], [])
    page = Page(text)
    order = [finding_id for finding_id, _folded in page.finding_groups]
    assert order[:2] == ["hidden-memcpy", "mask-rebuilt"]  # impact first, largest first
    assert order.index("fp32-cuda-cores") < order.index("low-occupancy-by-design")  # then problems before info
    entries = {(finding_id, variant): cells for finding_id, variant, cells in page.findings}
    memcpy = entries["hidden-memcpy", "naive"]
    assert memcpy[1] == "4x32x8192x128/kv8: 1,013 µs (11.8%); 8x16x1024x64: 126.6 µs (11.8%)"
    assert memcpy[2] == "up to 1,013 µs (11.8%)"
    [headline] = page.tables_in("headline")
    assert headline[1][-1] == (
        "naive: hidden-memcpy 126.6 µs (11.8%); sdpa-math: mask-rebuilt 40 µs (1.5%); "
        "flash-attn: cpu-bound; 6 more below"
    )


def test_the_environment_leaves_out_what_was_not_recorded(tmp_path):
    page = Page(render(COMPARE, tmp_path / "r.html", with_plots=False))
    environment, config, ceiling = page.tables_in("environment")
    keys = [row[0] for row in environment]
    assert "torch" in keys and "gpu_name" not in keys and "driver_version" not in keys
    settings = dict(tuple(row) for row in config)
    assert settings["shapes"] == "batch=1, heads=4, seq=256, head_dim=64"
    assert settings["variants (patterns)"] == "*" and "sdpa-cudnn" in settings["variants in the results"]
    assert dict(tuple(row) for row in ceiling)["matmul ceiling"] == "0.0208 TFLOP/s"
    gpu = Page(render(H200, tmp_path / "g.html", with_plots=False))
    environment = dict(tuple(row) for row in gpu.tables_in("environment")[0])
    assert environment["gpu_name"] == "NVIDIA H200" and environment["torch"] == "2.11.0+cu130"


def test_a_results_stream_shows_its_sweep_axes_and_the_ceiling_from_its_rows(tmp_path):
    text = render(SWEEP, tmp_path / "r.html", with_plots=False)
    environment, config, ceiling = Page(text).tables_in("environment")
    settings = dict(tuple(row) for row in config)
    assert settings["sweep axes"] == "seq: 128, 256, 512; head_dim: 32, 64"
    peak = {r.peak_tflops for r in load_results(SWEEP).rows}
    assert dict(tuple(row) for row in ceiling) == {"matmul ceiling, fp32": f"{fmt_number(peak.pop())} TFLOP/s"}
    assert "the file&#x27;s header does not record it" in text


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
    assert len(page.images) == 3  # bars, latency, throughput (CPU rows: nothing for the other three)
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
        assert len(traces) == len([r for r in load_results(results).rows if r.trace])
        for href in traces:
            assert not Path(href).is_absolute()
            assert (report.parent / unquote(href)).resolve().is_file()
    assert f"<a href='{PERFETTO}'>" in render(COMPARE, tmp_path / "r.html", with_plots=False)


def test_a_trace_that_is_gone_is_named(tmp_path):
    text = render(SEQS, tmp_path / "r.html", with_plots=False)  # its traces are not checked in
    assert "naive_1x4x128x64_fp32_causal_cpu.json.gz <span class='warn'>(not found)</span>" in text


def test_text_is_escaped(tmp_path):
    loaded = load_results(COMPARE)
    loaded.rows[0].variant = "<script>alert(1)</script>"
    loaded.rows[0].findings = [FindingRecord(id="x<y", message="a & b <img src=x>")]
    text = report_html(loaded, tmp_path / "r.html", [], [])
    assert "<script>" not in text and "<img src=x>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "a &amp; b &lt;img src=x&gt;" in text


def test_rows_without_a_shape_get_one_table(tmp_path):
    keep = ("variant", "seq", "status", "latency_us", "kernels_per_forward", "peak_memory_mib", "findings")
    rows = [
        msgspec.convert({k: msgspec.to_builtins(getattr(r, k)) for k in keep} | {"subject": "model"}, Row)
        for r in load_results(SEQS).rows
        if r.mode == "fwd"
    ]
    loaded = ResultsFile(SEQS, Document(command="model"), rows)
    page = Page(report_html(loaded, tmp_path / "r.html", [], []))
    [table] = page.tables_in("comparison")
    # the fields these rows lack (kernels/fwd, peak MiB: a CPU run's) are left out; a typed row always has its
    # mode and its finding ids (a results file always wrote them)
    assert table[0] == ["variant", "seq", "mode", "status", "latency µs", "findings"]
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
