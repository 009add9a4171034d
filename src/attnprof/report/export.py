"""Write results as JSON and CSV files, each created whole and never over an existing one."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from attnprof.files import create_new


def to_json(document: dict[str, Any]) -> str:
    """The JSON text of a result document (NaN and infinities become null)."""
    return json.dumps(_clean(document), indent=2, default=str)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, document: dict[str, Any]) -> Path:
    """Create `path` holding `document` as JSON, atomically; OutputError if it exists or cannot be written."""
    text = to_json(document) + "\n"

    def write(temporary: Path) -> None:
        temporary.write_text(text)

    return create_new(path, write)


def write_csv(path: Path, rows: list[dict[str, Any]], fields: tuple[str, ...]) -> Path:
    """Create `path` holding flat rows as CSV in the given column order, atomically, never replacing a file."""

    def write(temporary: Path) -> None:
        with temporary.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(fields), extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})

    return create_new(path, write)
