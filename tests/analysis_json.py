"""The JSON of `attnprof analyze` for a live analysis, as plain dicts: what the tests read the contract from."""

from __future__ import annotations

from typing import Any

from attnprof.analysis import TraceAnalysis
from attnprof.results.files import to_builtins
from attnprof.results.records import analysis_record


def analysis_json(analysis: TraceAnalysis) -> dict[str, Any]:
    """`attnprof analyze --format json`'s document for `analysis` (`results.records.analysis_record`), decoded."""
    return to_builtins(analysis_record(analysis))
