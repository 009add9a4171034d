"""Reading results files back: the one loader that `plot`, `report`, `diff` and `check` share.

Two formats, both written by attnprof:

- a results document (`results.json` of `run`, `compare` and `model`): one JSON object whose `results` list
  holds one entry per cell (`serialize.json_entry`);
- a results stream (`results.jsonl` of `sweep`): the first line is the same document without `results`
  and with `"format": "attnprof-results-jsonl"`; every later line is one entry, written as its cell
  finished. A last line cut short by an interrupted write is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprof.errors import ResultsFileError

#: The `format` value on the first line of a results stream.
JSONL_FORMAT = "attnprof-results-jsonl"


@dataclass
class ResultsFile:
    """A results file read back: its header (everything but the rows) and its rows, in file order."""

    path: Path
    header: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False  # a results stream whose last line was cut short

    @property
    def command(self) -> str | None:
        """The command that wrote it (`compare`, `sweep`, `model`, ...)."""
        return self.header.get("command")

    @property
    def environment(self) -> dict[str, Any]:
        """The environment it was measured in (empty when it was not recorded)."""
        return self.header.get("environment") or {}


def stream_header(document: dict[str, Any]) -> dict[str, Any]:
    """The first line of a results stream: the document without its rows, marked with the stream format."""
    header = {key: value for key, value in document.items() if key != "results"}
    header["format"] = JSONL_FORMAT
    return header


def load_results(path: str | Path) -> ResultsFile:
    """Read a results document or a results stream; a clear `ResultsFileError` on anything else."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"{path}: cannot read it ({exc.__class__.__name__})") from None
    if not text.strip():
        raise ResultsFileError(f"{path}: the file is empty")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return _load_stream(path, text)
    if isinstance(document, dict) and document.get("format") == JSONL_FORMAT:
        return ResultsFile(path, document, [])  # a stream with its header only
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ResultsFileError(
            f"{path}: not an attnprof results file (no `results` list)",
            hint="pass the results.json of run, compare or model, or the results.jsonl of sweep",
        )
    rows = [row for row in document["results"] if isinstance(row, dict)]
    return ResultsFile(path, {k: v for k, v in document.items() if k != "results"}, rows)


def _load_stream(path: Path, text: str) -> ResultsFile:
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        raise ResultsFileError(f"{path}: not JSON and not an attnprof results stream") from None
    if not isinstance(header, dict) or header.get("format") != JSONL_FORMAT:
        raise ResultsFileError(f"{path}: not an attnprof results file (first line has no `format`)")
    rows: list[dict[str, Any]] = []
    truncated = False
    for number, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line of an interrupted write
                truncated = True
                break
            raise ResultsFileError(f"{path}: line {number} is not valid JSON") from None
        if isinstance(row, dict):
            rows.append(row)
    return ResultsFile(path, header, rows, truncated)
