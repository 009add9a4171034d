"""The HTML report in a real headless browser (Chromium): its sections come in order with the headline
and the plots near the top, its tables have rows, its images decode to a real size, and its screenshot
is not blank. Skipped where no Chromium is installed (CI): there tests/test_html_report.py checks the
same page by parsing it.

Debian: `apt-get install -y chromium`. The report itself has no script; a copy of it gets a one-line
probe that writes each image's natural size and each section heading's distance from the top of the
page into the DOM, which `--dump-dom` prints.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

BROWSER = next(
    (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium here (apt-get install -y chromium)")

RESULTS = Path(__file__).parent / "data" / "results"
PROBE = (
    "<script>window.addEventListener('load', () => { for (const img of document.images) "
    "{ img.setAttribute('data-natural', img.naturalWidth + 'x' + img.naturalHeight); } "
    "for (const h of document.querySelectorAll('h2')) "
    "{ h.setAttribute('data-top', Math.round(h.getBoundingClientRect().top + window.scrollY)); } "
    "document.body.setAttribute('data-probed', 'yes'); });</script>"
)
WIDTH = 1400
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def chromium(*args: str) -> str:
    run = subprocess.run([str(BROWSER), *FLAGS, *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


class Dom(HTMLParser):
    """Rows per table, each image's natural size and each section's top (px) as the probe wrote them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: list[int] = []
        self.images: list[str] = []
        self.tops: dict[str, int] = {}
        self.probed = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "h2":
            self.tops[attributes.get("id") or ""] = int(attributes.get("data-top") or -1)
        if tag == "table":
            self.rows.append(0 if attributes.get("class") != "pairs" else 1)  # a key/value table has no header
        elif tag == "tr":
            self.rows[-1] += 1
        elif tag == "img":
            self.images.append(attributes.get("data-natural") or "")
        elif tag == "body":
            self.probed = attributes.get("data-probed") == "yes"


@pytest.mark.parametrize("results, images", [("cpu-seqs.json", 3), ("h200-traces.json", 2), ("cpu-sweep.jsonl", 3)])
def test_report_renders_in_chromium(cli, tmp_path, results, images):
    report = tmp_path / "report.html"
    assert cli("report", str(RESULTS / results), "-o", str(report)).exit_code == 0
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = Dom(chromium("--virtual-time-budget=5000", f"--window-size={WIDTH},900", "--dump-dom", probe.as_uri()))
    assert dom.probed
    assert len(dom.rows) >= 6 and all(n >= 2 for n in dom.rows)  # every table has a header and a row at least
    assert len(dom.images) == images
    for size in dom.images:
        width, height = (int(v) for v in size.split("x"))
        assert width > 500 and height > 300
    tops = list(dom.tops.values())
    assert tops == sorted(tops) and list(dom.tops)[0] == "headline" and list(dom.tops)[-1] == "environment"
    assert dom.tops["headline"] < 300  # on the first screen
    assert dom.tops["plots"] < 1200  # the plots follow the headline, not 3,000 px of tables

    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", f"--window-size={WIDTH},3000", report.as_uri())
    from PIL import Image, ImageStat

    image = Image.open(shot).convert("L")
    assert image.size == (WIDTH, 3000)
    assert ImageStat.Stat(image).stddev[0] > 20  # text, tables and plots, not a blank page
    assert len(image.getcolors(maxcolors=1 << 16) or []) > 50
