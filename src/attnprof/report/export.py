"""Write results as JSON and CSV files, each created whole and never over an existing one, and as a
stream of JSON lines that grows as cells finish (`ResultsStream`)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import IO, Any

from attnprof.errors import OutputError
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


class ResultsStream:
    """A results stream (`results.jsonl`) being written: the file is created exclusively with its header
    line, and each `append` adds one line, flushed and fsynced, so a crash loses at most a partial last
    line (which `report.results_file.load_results` ignores). OutputError when it cannot be written."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        try:
            self._handle: IO[str] = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w")
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        self.append(header)

    def append(self, entry: dict[str, Any]) -> None:
        """Write `entry` as one JSON line and make it durable before returning."""
        try:
            self._handle.write(json.dumps(_clean(entry), default=str) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Close the file."""
        self._handle.close()
