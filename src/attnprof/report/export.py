"""Write results as JSON and CSV files, each created whole and never over an existing one, and as a results
stream (`report.results_file`'s JSONL format) that grows a line as each cell finishes."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import IO, Any

from attnprof.files import create_new


def to_json(document: dict[str, Any]) -> str:
    """The JSON text of a result document (NaN and infinities become null)."""
    return json.dumps(_clean(document), indent=2, default=str)


def to_json_line(document: dict[str, Any]) -> str:
    """The JSON text of a document on one line (NaN and infinities become null)."""
    return json.dumps(_clean(document), default=str)


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


class ResultsStream:
    """A results stream written by one process: created with its header line (`stream_header`), never
    over an existing file (`name-2.jsonl` when taken), then one JSON entry per line, each flushed and
    synced as it is appended, so a process that dies loses only the cell it was running."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        line = to_json_line(header) + "\n"

        def write(temporary: Path) -> None:
            temporary.write_text(line, encoding="utf-8")

        self.path = create_new(path, write, numbered=True)
        self._handle: IO[str] | None = self.path.open("a", encoding="utf-8")

    def append(self, entry: dict[str, Any]) -> None:
        """Add one entry as a line, on disk before this returns."""
        if self._handle is None:
            raise ValueError(f"results stream {self.path} is closed")
        self._handle.write(to_json_line(entry) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Close the file (entries already appended stay)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
