"""Write results as JSON and CSV files."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from attnprof.errors import OutputError


def to_json(document: dict[str, Any]) -> str:
    """The JSON text of a result document (NaN and infinities become null)."""
    return json.dumps(_clean(document), indent=2, default=str)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, document: dict[str, Any]) -> Path:
    """Write `document` as JSON at `path`."""
    try:
        path.write_text(to_json(document) + "\n")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def write_csv(path: Path, rows: list[dict[str, Any]], fields: tuple[str, ...]) -> Path:
    """Write flat rows as CSV with the given column order."""
    try:
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(fields), extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
