"""`attnprof analyze --format json` on every trace in tests/data (`*.json.gz`), byte for byte against
what the analysis wrote when the file was made (tests/data/analyze_golden.json.gz: trace path -> the
JSON document, or "error: MESSAGE"). A change that only makes the analysis faster must not move a
single character.

A change meant to change the output regenerates the file, and its review reads the diff:

    PYTHONPATH=src python tests/test_analyze_golden.py --update
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from attnprof.analysis import analyze_trace
from attnprof.errors import AttnprofError

ROOT = Path(__file__).parent
GOLDEN = ROOT / "data" / "analyze_golden.json.gz"
TRACES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "data").rglob("*.json.gz") if p != GOLDEN)


def document(trace: str) -> str:
    """What `attnprof analyze TRACE --format json` prints (no --region), or "error: MESSAGE"."""
    try:
        return json.dumps(analyze_trace(ROOT / trace).to_dict(), indent=2)
    except AttnprofError as exc:
        return f"error: {exc.message}"


def golden() -> dict[str, str]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def test_every_trace_has_a_golden_document():
    assert sorted(golden()) == TRACES


@pytest.mark.parametrize("trace", TRACES)
def test_analysis_is_unchanged(trace: str):
    expected = golden().get(trace)
    assert expected is not None, f"no golden document for {trace}: regenerate {GOLDEN.name} (see the docstring)"
    assert document(trace) == expected


def test_cli_prints_the_golden_document(cli):
    trace = "data/h200/training/fwd+bwd/8x16x1024x64/sdpa-flash.json.gz"
    result = cli("analyze", str(ROOT / trace), "--format", "json")
    assert result.exit_code == 0, result.output
    assert result.stdout == golden()[trace] + "\n"


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    text = json.dumps({trace: document(trace) for trace in TRACES}, indent=0, sort_keys=True)
    GOLDEN.write_bytes(gzip.compress(text.encode("utf-8"), 9, mtime=0))
    print(f"wrote {GOLDEN} ({len(TRACES)} traces)")
