"""Results files of earlier schema versions, brought up to `SCHEMA_VERSION` before they are typed.

Version 1 (no `schema_version`): every file attnprof wrote before the row schema existed. Its rows differ
from version 2 in four ways, each mended here:

- no `subject`: a row of a `model` document is a model row, every other one a cell;
- a model row kept its timing as a nested `timing` dict; version 2 has the cell's flat timing fields;
- a finding written before findings had a severity gets its rule's severity from the registry
  ("problem" for an id the registry does not know);
- fields that no longer exist (`finding_ids`, the CSV's id list) are dropped; fields written before they
  existed are None.
"""

from __future__ import annotations

from typing import Any

#: A model row's nested `timing` (version 1) to the row's flat fields.
_MODEL_TIMING = {
    "p25_us": "latency_p25_us",
    "p75_us": "latency_p75_us",
    "reps": "timing_reps",
    "warmup_reps": "warmup_reps",
    "forwards_per_sample": "forwards_per_sample",
}


def upgrade_document(document: dict[str, Any]) -> dict[str, Any]:
    """The document (header and rows, as decoded JSON) at the current schema version."""
    if document.get("schema_version", 1) >= 2:
        return document
    subject = "model" if document.get("command") == "model" else "cell"
    rows = document.get("results")
    upgraded = {**document, "schema_version": 2}
    if isinstance(rows, list):
        upgraded["results"] = [upgrade_row(row, subject) for row in rows if isinstance(row, dict)]
    return upgraded


def upgrade_row(row: dict[str, Any], subject: str) -> dict[str, Any]:
    """One version-1 row at version 2."""
    upgraded = {key: value for key, value in row.items() if key not in ("finding_ids", "timing")}
    upgraded.setdefault("subject", subject)
    timing = row.get("timing")
    if isinstance(timing, dict):
        for old, new in _MODEL_TIMING.items():
            if upgraded.get(new) is None and timing.get(old) is not None:
                upgraded[new] = timing[old]
    upgraded["findings"] = [_finding(f) for f in row.get("findings") or [] if isinstance(f, dict) and f.get("id")]
    return upgraded


def _finding(finding: dict[str, Any]) -> dict[str, Any]:
    if finding.get("severity"):
        return finding
    from attnprof.analysis.findings import FINDINGS

    known = finding["id"] in FINDINGS
    return {**finding, "severity": FINDINGS.get(finding["id"]).severity if known else "problem"}
