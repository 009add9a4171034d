"""The shared results loader: documents, streams, a cut-short last line, and clear errors."""

import json

import pytest

from attnprof.errors import ResultsFileError
from attnprof.report.results_file import JSONL_FORMAT, load_results, stream_header


def _document():
    return {"command": "compare", "environment": {"device": "cpu"}, "results": [{"variant": "a"}, {"variant": "b"}]}


def test_document(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_document()))
    loaded = load_results(path)
    assert loaded.command == "compare"
    assert loaded.environment == {"device": "cpu"}
    assert [r["variant"] for r in loaded.rows] == ["a", "b"]
    assert "results" not in loaded.header


def test_stream_with_cut_short_last_line(tmp_path):
    doc = _document()
    header = stream_header(doc)
    assert header["format"] == JSONL_FORMAT and "results" not in header
    lines = [json.dumps(header)] + [json.dumps(r) for r in doc["results"]] + ['{"variant": "c", "lat']
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines))
    loaded = load_results(path)
    assert [r["variant"] for r in loaded.rows] == ["a", "b"]
    assert loaded.truncated


def test_stream_header_only(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(stream_header(_document())) + "\n")
    assert load_results(path).rows == []


@pytest.mark.parametrize(
    "text, message",
    [("", "empty"), ("[1, 2]", "not an attnprof results file"), ("hello\nworld", "not JSON")],
)
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(ResultsFileError, match=message):
        load_results(path)


def test_missing_file(tmp_path):
    with pytest.raises(ResultsFileError, match="no such results file"):
        load_results(tmp_path / "nope.json")


def test_broken_middle_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(stream_header(_document())), "{bad", json.dumps({"variant": "a"})]))
    with pytest.raises(ResultsFileError, match="line 2"):
        load_results(path)
