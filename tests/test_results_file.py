"""The shared results loader: documents, streams, a cut-short last line, and clear errors."""

import json

import msgspec
import pytest

from attnprof.errors import ResultsFileError
from attnprof.results.files import STREAM_FORMAT, load_results, stream_header, to_builtins
from attnprof.results.schema import SCHEMA_VERSION, Document, Row


def _document():
    return {"command": "compare", "environment": {"device": "cpu"}, "results": [{"variant": "a"}, {"variant": "b"}]}


def _header(document):
    return to_builtins(stream_header(msgspec.convert(document, Document)))


def test_document(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_document()))
    loaded = load_results(path)
    assert loaded.command == "compare"
    assert loaded.environment == {"device": "cpu"}
    assert [r.variant for r in loaded.rows] == ["a", "b"]
    assert all(isinstance(r, Row) for r in loaded.rows) and loaded.header.results == []
    assert loaded.header.schema_version == SCHEMA_VERSION  # a version-1 file, upgraded on read


def test_stream_with_cut_short_last_line(tmp_path):
    doc = _document()
    header = _header(doc)
    assert header["format"] == STREAM_FORMAT and header["results"] == []
    lines = [json.dumps(header)] + [json.dumps(r) for r in doc["results"]] + ['{"variant": "c", "lat']
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines))
    loaded = load_results(path)
    assert [r.variant for r in loaded.rows] == ["a", "b"]
    assert loaded.truncated


def test_stream_header_only(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(_header(_document())) + "\n")
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
    path.write_text("\n".join([json.dumps(_header(_document())), "{bad", json.dumps({"variant": "a"})]))
    with pytest.raises(ResultsFileError, match="line 2"):
        load_results(path)


def test_a_field_of_the_wrong_type_is_one_line_naming_it(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"command": "compare", "results": [{"variant": "a", "latency_us": "fast"}]}))
    with pytest.raises(ResultsFileError, match=r"latency_us"):
        load_results(path)


def test_version_1_rows_are_upgraded(tmp_path):
    """A version-1 model row keeps its timing nested and no subject; a version-1 finding may lack its severity."""
    old = {
        "command": "model",
        "results": [
            {
                "variant": "sdpa",
                "finding_ids": "cpu-bound",
                "findings": [{"id": "cpu-bound", "message": "m"}, {"id": "no-such-finding", "message": "n"}],
                "timing": {"p25_us": 1.0, "p75_us": 3.0, "reps": 7, "warmup_reps": 2, "forwards_per_sample": 1},
            }
        ],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old))
    [row] = load_results(path).rows
    assert row.subject == "model"
    assert (row.latency_p25_us, row.latency_p75_us, row.timing_reps) == (1.0, 3.0, 7)
    assert [(f.id, f.severity) for f in row.findings] == [("cpu-bound", "problem"), ("no-such-finding", "problem")]
