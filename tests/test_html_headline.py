"""The HTML report's headline answers "why are the others slower" (issue 33): for each shape × mode with 2 or
more timed variants, the runner-up's line and (with 3 or more) the slowest's, each with its time over the
fastest's and its costliest problem finding, parsed from the rendered page and checked against the rows."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from attnprof.report.html import report_html
from attnprof.report.html_sections import headline_section
from attnprof.results.files import load_results
from attnprof.results.schema import Row

DATA = Path(__file__).parent / "data"
H200_COMPARE = DATA / "h200" / "results" / "compare.json"  # latencies of 11 variants at 3 shapes on an H200
SEQS = DATA / "results" / "cpu-seqs.json"  # CPU latencies, some unstable
H200_GPU_TIME = DATA / "results" / "h200-traces.json"  # GPU time only, no latency


class Lines(HTMLParser):
    """The headline's runner-up and slowest lines by the title of their row (`shape × mode`): each line's
    text and the finding ids it links to."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.lines: dict[str, dict[str, tuple[str, list[str]]]] = {}
        self._in_headline = False
        self._title: list[str] | None = None
        self._row_title = ""
        self._cells = 0
        self._line: tuple[str, list[str], list[str]] | None = None  # role, text parts, linked ids
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table":
            self._in_headline = attributes.get("class") == "headline"
        elif not self._in_headline:
            return
        elif tag == "tr":
            self._cells = 0
        elif tag == "td":
            self._cells += 1
            if self._cells == 1:
                self._title = []
        elif tag == "li" and attributes.get("class") in ("runner-up", "slowest"):
            self._line = (attributes["class"], [], [])
        elif tag == "a" and self._line is not None:
            self._line[2].append(attributes["href"].removeprefix("#finding-"))

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_headline = False
        elif tag == "td" and self._title is not None:
            self._row_title, self._title = "".join(self._title), None
        elif tag == "li" and self._line is not None:
            role, parts, ids = self._line
            self.lines.setdefault(self._row_title, {})[role] = ("".join(parts), ids)
            self._line = None

    def handle_data(self, data):
        for part in (self._title, self._line[1] if self._line else None):
            if part is not None:
                part.append(data)


def timed_order(rows: list[Row], shape: str, mode: str, time: str = "latency_us") -> list[Row]:
    """The ok rows of one shape and mode with a time, fastest first (written here, apart from the report)."""
    ran = [r for r in rows if r.shape == shape and r.mode == mode and r.status == "ok" and getattr(r, time)]
    return sorted(ran, key=lambda r: getattr(r, time))


def expected_ratio(row: Row, best: Row, time: str = "latency_us") -> str:
    ratio = getattr(row, time) / getattr(best, time)
    shaky = time == "latency_us" and any(r.unstable or r.contended for r in (row, best))
    return f"~{ratio:.2g}x?" if shaky else f"{ratio:.2f}x"


def split_title(title: str) -> tuple[str, str]:
    """`8x16x1024x64 bf16 causal fwd on cuda:0` -> (`8x16x1024x64`, `fwd`)."""
    words = title.split(" on ")[0].split()
    return words[0], words[-1]


def test_the_runner_up_and_the_slowest_with_their_ratio_and_costliest_finding(tmp_path):
    loaded = load_results(H200_COMPARE)
    for row in loaded.rows:
        for finding in row.findings:
            # sdpa-math's first problem costs less than its second: the costliest is picked by impact, not order
            cost = {"fp32-cuda-cores": (20.0, 0.1), "mask-rebuilt": (900.0, 4.5)}.get(finding.id)
            if row.variant == "sdpa-math" and cost:
                finding.severity, (finding.impact_us, finding.impact_pct) = "problem", cost
    page = Lines(report_html(loaded, tmp_path / "r.html", [], []))
    assert len(page.lines) == 3  # the three shapes, fwd
    for title, lines in page.lines.items():
        order = timed_order(loaded.rows, *split_title(title))
        best, runner_up, slowest = order[0], order[1], order[-1]
        assert len(order) >= 9 and set(lines) == {"runner-up", "slowest"}
        text, ids = lines["runner-up"]
        head = f"runner-up: {runner_up.variant}, {expected_ratio(runner_up, best)} the winner's latency; "
        problems = [f.id for f in runner_up.findings if f.severity == "problem"]
        if problems:  # cpu-bound, without an impact: its first problem
            assert (text, ids) == (head + f"costliest finding: {problems[0]}", problems[:1])
        else:
            assert (text, ids) == (head + "no problem finding", [])
        assert slowest.variant == "sdpa-math"
        text, ids = lines["slowest"]
        ratio = expected_ratio(slowest, best)
        assert (
            text == f"slowest: sdpa-math, {ratio} the winner's latency; costliest finding: mask-rebuilt, 900 µs (4.5%)"
        )
        assert ids == ["mask-rebuilt"]
        assert float(ratio.removesuffix("x")) > 40  # sdpa-math's fp32 matmuls: over 40x the winner at every shape
    assert page.lines["8x16x1024x64 bf16 causal fwd on cuda:0"]["runner-up"][0].startswith(
        "runner-up: sdpa-cudnn, 1.28x"
    )


def test_an_unstable_ratio_is_marked_as_the_tables_mark_it(tmp_path):
    rows = load_results(SEQS).rows
    text = headline_section(rows, "sdpa-math")
    page = Lines(text)
    assert len(page.lines) == 8
    shaky = 0
    for title, lines in page.lines.items():
        order = timed_order(rows, *split_title(title))
        assert len(order) == 3  # sdpa-cudnn was skipped on the CPU
        for role, row in (("runner-up", order[1]), ("slowest", order[2])):
            ratio = expected_ratio(row, order[0])
            assert lines[role][0].startswith(f"{role}: {row.variant}, {ratio} the winner's latency; ")
            shaky += ratio.startswith("~")
    assert shaky > 0
    assert "~x? marks a ratio from a latency (the variant&#x27;s or the fastest&#x27;s) that was still unstable" in text


def test_without_latency_the_ratio_is_of_gpu_time():
    rows = load_results(H200_GPU_TIME).rows
    page = Lines(headline_section(rows, "sdpa-math"))
    for title, lines in page.lines.items():
        order = timed_order(rows, *split_title(title), time="gpu_time_us")
        runner_up = order[1]
        ratio = expected_ratio(runner_up, order[0], time="gpu_time_us")
        assert lines["runner-up"][0].startswith(f"runner-up: {runner_up.variant}, {ratio} the winner's GPU time; ")


def test_two_timed_variants_have_no_slowest_line_and_one_has_no_column():
    rows = [r for r in load_results(H200_COMPARE).rows if r.shape == "4x16x8192x128"]
    two = [r for r in rows if r.variant in ("sdpa", "sdpa-flash", "flash-attn")]  # flash-attn was skipped
    page = Lines(headline_section(two, None))
    [lines] = page.lines.values()
    assert set(lines) == {"runner-up"}
    assert (
        lines["runner-up"][0]
        == f"runner-up: sdpa-flash, {expected_ratio(two[1], two[0])} the winner's latency; no problem finding"
    )
    alone = headline_section([r for r in rows if r.variant == "sdpa"], None)
    assert "runner-up" not in alone and "slowest" not in alone


def test_the_lines_are_escaped():
    rows = [r for r in load_results(H200_COMPARE).rows if r.shape == "4x16x8192x128"]
    slowest = max((r for r in rows if r.latency_us), key=lambda r: r.latency_us)
    slowest.variant = "<script>x</script>"
    text = headline_section(rows, None)
    assert "<script>" not in text
    assert re.search(r"<li class='slowest'>slowest: &lt;script&gt;x&lt;/script&gt;, \d", text)
