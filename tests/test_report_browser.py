"""The HTML report in a real headless browser (Chromium): its tables have rows, its images decode to a
real size, and its screenshot is not blank. Skipped where no Chromium is installed (CI): there
tests/test_html_report.py checks the same page by parsing it.

Debian: `apt-get install -y chromium`. The report itself has no script; for the image sizes a copy of
it gets a one-line probe that writes each image's natural size into the DOM, which `--dump-dom` prints.
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
    "document.body.setAttribute('data-probed', 'yes'); });</script>"
)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def chromium(*args: str) -> str:
    run = subprocess.run([str(BROWSER), *FLAGS, *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


class Dom(HTMLParser):
    """Rows per table, and each image's natural size as the probe wrote it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: list[int] = []
        self.images: list[str] = []
        self.probed = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table":
            self.rows.append(0)
        elif tag == "tr":
            self.rows[-1] += 1
        elif tag == "img":
            self.images.append(attributes.get("data-natural") or "")
        elif tag == "body":
            self.probed = attributes.get("data-probed") == "yes"


@pytest.mark.parametrize("results", ["cpu-seqs.json", "h200-traces.json"])
def test_report_renders_in_chromium(cli, tmp_path, results):
    report = tmp_path / "report.html"
    assert cli("report", str(RESULTS / results), "-o", str(report)).exit_code == 0
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = Dom(chromium("--virtual-time-budget=5000", "--dump-dom", probe.as_uri()))
    assert dom.probed
    assert len(dom.rows) >= 6 and all(n >= 2 for n in dom.rows)  # every table has a header and a row at least
    assert len(dom.images) == 2
    for size in dom.images:
        width, height = (int(v) for v in size.split("x"))
        assert width > 500 and height > 300

    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,3000", report.as_uri())
    from PIL import Image, ImageStat

    image = Image.open(shot).convert("L")
    assert image.size == (1400, 3000)
    assert ImageStat.Stat(image).stddev[0] > 20  # text, tables and plots, not a blank page
    assert len(image.getcolors(maxcolors=1 << 16) or []) > 50
