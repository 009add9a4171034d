"""The JSON of `attnprof analyze` for a live analysis, as plain dicts: what the tests read the contract from."""

from __future__ import annotations

from typing import Any

from attnprof.analysis import TraceAnalysis
from attnprof.results.files import to_builtins
from attnprof.results.records import analysis_record


def analysis_json(analysis: TraceAnalysis) -> dict[str, Any]:
    """`attnprof analyze --format json`'s document for `analysis` (`results.records.analysis_record`), decoded."""
    return to_builtins(analysis_record(analysis))


def ledger_json(ledger: Any) -> dict[str, Any]:
    """The attention ledger's JSON (`results.parts.AttentionRecord`), decoded."""
    from attnprof.results.records import attention_record

    return to_builtins(attention_record(ledger))


def comm_json(comm: Any) -> dict[str, Any]:
    """The communication's JSON (`results.parts.CommRecord`), decoded."""
    from attnprof.results.parts import CommRecord
    from attnprof.results.records import record

    return to_builtins(record(comm, CommRecord))
