"""The metric-column registry (`report.columns`) drives compare's shape table, run's summary, the model table
and the HTML report's comparison tables: an entry added there shows in each view it places itself in, where it
says; `kernel_gbps` lands in three src files (its schema field, its computation, its registry entry)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from attnprof.report import columns
from attnprof.report.columns import METRIC_COLUMNS, MetricColumn, Place, placed
from attnprof.report.html_sections import comparison_section
from attnprof.report.layout import Column
from attnprof.report.model_tables import model_table
from attnprof.report.run_tables import run_summary_table
from attnprof.report.tables import compare_report, shape_columns, shape_table
from attnprof.results.files import load_results
from attnprof.results.schema import Row

ROOT = Path(__file__).parents[1]
DECODE = ROOT / "tests" / "data" / "h200" / "results" / "decode-kernel-gbps.json"  # kernel_gbps on every row


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return load_results(DECODE).rows


def as_model(rows: list[Row]) -> list[Row]:
    return [msgspec.structs.replace(r, subject="model", model="llama") for r in rows]


def headers(text: str) -> list[str]:
    """The headers of a wide table's first header line."""
    return re.split(r"\s{2,}", next(line for line in text.splitlines() if line.startswith(("variant", "impl"))).strip())


FAKE = MetricColumn(
    lambda r: f"<{r.variant}>",
    compare=Place("kernel GB/s", Column("fake/s", drop=-2)),
    run=Place("GB/s by kernel time", Column("fake per second")),
    model=Place("seq", Column("fake/s", drop=-2)),
)


def test_an_entry_added_to_the_registry_shows_in_every_view_where_it_says(monkeypatch, rows) -> None:
    monkeypatch.setattr(columns, "METRIC_COLUMNS", [*METRIC_COLUMNS, FAKE])
    compare = compare_report(rows, "table", "sdpa-cudnn", None)
    shown = headers(compare)
    assert shown[shown.index("kernel GB/s") + 1] == "fake/s"
    assert all(f"<{r.variant}>" in compare for r in rows)
    summary = run_summary_table(rows[0], "table").splitlines()
    at = next(i for i, line in enumerate(summary) if line.startswith("GB/s by kernel time"))
    assert summary[at + 1].split() == ["fake", "per", "second", "<sdpa-cudnn>"]
    model = model_table(as_model(rows), "table", "sdpa-cudnn", None)
    assert headers(model)[:3] == ["implementation", "seq", "fake/s"] and "<flex>" in model
    html = comparison_section(rows, "sdpa-cudnn")
    assert "<th>fake/s</th>" in html and "&lt;sdpa-flash&gt;" in html
    fitted = compare_report(rows, "table", "sdpa-cudnn", 120)  # drop=-2: the first to give way
    assert "<sdpa-cudnn>" not in fitted and "fake/s" in fitted.split("left out:")[1]


def test_an_entry_in_one_view_only_leaves_the_others_alone(monkeypatch, rows) -> None:
    before = (run_summary_table(rows[0], "table"), model_table(as_model(rows), "table", "sdpa-cudnn", None))
    monkeypatch.setattr(columns, "METRIC_COLUMNS", [*METRIC_COLUMNS, MetricColumn(FAKE.cell, compare=FAKE.compare)])
    assert "fake/s" in headers(shape_table(rows, "table"))
    assert (run_summary_table(rows[0], "table"), model_table(as_model(rows), "table", "sdpa-cudnn", None)) == before


def test_the_last_entry_after_a_column_stands_nearest_it_and_a_missing_column_is_an_error(monkeypatch) -> None:
    second = MetricColumn(lambda r: "2", compare=Place("kernel GB/s", Column("second")))
    monkeypatch.setattr(columns, "METRIC_COLUMNS", [*METRIC_COLUMNS, FAKE, second])
    names = [c.header for c in shape_columns([])]
    assert names[names.index("kernel GB/s") :][:4] == ["kernel GB/s", "second", "fake/s", "executed/useful FLOPs"]
    lost = MetricColumn(lambda r: "?", model=Place("no such column", Column("lost")))
    monkeypatch.setattr(columns, "METRIC_COLUMNS", [*METRIC_COLUMNS, lost])
    with pytest.raises(ValueError, match="no such column"):
        placed("model", [])


def test_the_views_metric_columns_are_the_registry_s() -> None:
    """Between compare's own columns (variant, status ... findings) stand exactly the registry's compare columns."""
    registry = {m.compare.column.header for m in METRIC_COLUMNS if m.compare is not None}
    names = [c.header for c in shape_columns([])]
    assert names[:2] == ["variant", "status"] and names[-1] == "findings"
    assert set(names[2:-1]) == registry and len(names[2:-1]) == len(registry)


def test_kernel_gbps_renders_in_each_view_under_its_header(rows) -> None:
    cudnn = rows[0]
    assert cudnn.kernel_gbps == pytest.approx(3622.5, abs=0.1)
    compare = compare_report(rows, "table", "sdpa-cudnn", None)
    shown = headers(compare)
    assert shown[shown.index("GB/s (% read BW)") + 1] == "kernel GB/s"
    line = next(line for line in compare.splitlines() if line.startswith("sdpa-cudnn"))
    assert re.split(r"\s{2,}", line)[shown.index("kernel GB/s")] == "3,622"
    assert "GB/s by kernel time                           3,622" in run_summary_table(cudnn, "table")
    model = model_table(as_model(rows), "table", "sdpa-cudnn", None).splitlines()
    assert model[2][model[0].index("kernel GB/s") :].startswith("3,622")


def test_kernel_gbps_lands_in_three_src_files() -> None:
    """A metric is its schema field, its computation and its registry entry: nothing else under src/ names it
    (the trace analysis computes the ledger's own `achieved_gbps`, not this) but the one reader of the best
    row's rate, `pipeline/best_known.py` (the attainable GB/s a cell's findings are judged against)."""
    named = {str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py") if "kernel_gbps" in p.read_text()}
    assert named == {
        "src/attnprof/results/schema.py",
        "src/attnprof/pipeline/rows.py",
        "src/attnprof/report/columns.py",
        "src/attnprof/pipeline/best_known.py",
    }
