"""Results on disk: the one writer (a JSON document, its CSV, a JSON-lines stream that grows as cells
finish) and the one reader, which types every row on read and upgrades files of earlier versions.

Formats, all written here:

- a results document (`results.json` of `run`, `compare` and `model`): one JSON object, a `Document`;
- its CSV (`results.csv`): the rows' scalar columns (`schema.columns`), findings as their ids;
- a results stream (`results.jsonl` of `sweep`, and each rank's stream): the first line is the document
  without `results` and with `format` `STREAM_FORMAT`; every later line is one row, written as its cell
  finished. A last line cut short by an interrupted write is ignored on read.

Files are created whole and never overwritten (`attnprof.files.create_new`); NaN and infinities are null.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from attnprof.errors import OutputError, ResultsFileError
from attnprof.files import create_new
from attnprof.results.schema import SCHEMA_VERSION, Document, Row, columns
from attnprof.results.upgrade import upgrade_document, upgrade_row

#: The `format` value on the first line of a results stream.
STREAM_FORMAT = "attnprof-results-jsonl"

_ENCODER = msgspec.json.Encoder(enc_hook=str)


def to_json(value: Any) -> str:
    """JSON text of a document, a row or any structure of them: two-space indent, non-ASCII escaped, NaN and
    infinities null (the text attnprof has always printed)."""
    return json.dumps(_finite(to_builtins(value)), indent=2)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def to_builtins(value: Any) -> Any:
    """A document, row or part as plain dicts and lists (what its JSON decodes to)."""
    return msgspec.to_builtins(value, enc_hook=str)


def write_json(path: Path, document: Document) -> Path:
    """Create `path` holding `document` as JSON, atomically; OutputError if it exists or cannot be written."""
    text = to_json(document) + "\n"

    def write(temporary: Path) -> None:
        temporary.write_text(text)

    return create_new(path, write)


def csv_values(row: Row) -> dict[str, Any]:
    """The row's CSV columns: its scalar fields by name, findings as their ids ("" for None)."""
    values = {}
    for name in columns(row.subject):
        value = " ".join(row.finding_ids) if name == "findings" else getattr(row, name)
        values[name] = "" if value is None else value
    return values


def write_csv(path: Path, rows: list[Row], subject: str = "cell") -> Path:
    """Create `path` holding the rows' CSV columns, atomically, never replacing a file."""

    def write(temporary: Path) -> None:
        with temporary.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(columns(subject)))  # type: ignore[arg-type]
            writer.writeheader()
            for row in rows:
                writer.writerow(csv_values(row))

    return create_new(path, write)


def stream_header(document: Document) -> Document:
    """The first line of a results stream: the document without its rows, marked with the stream format."""
    return msgspec.structs.replace(document, results=[], format=STREAM_FORMAT)


class ResultsStream:
    """A results stream (`results.jsonl`) being written: the file is created exclusively with its header
    line, and each `append` adds one row, flushed and fsynced, so a crash loses at most a partial last line
    (which `load_results` ignores). OutputError when it cannot be written."""

    def __init__(self, path: Path, header: Document) -> None:
        self.path = path
        try:
            self._handle: IO[bytes] = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        header_fields = msgspec.structs.asdict(header)
        del header_fields["results"]
        self._write(header_fields)

    def append(self, row: Row) -> None:
        """Write `row` as one JSON line and make it durable before returning."""
        self._write(row)

    def _write(self, value: Any) -> None:
        try:
            self._handle.write(_ENCODER.encode(value) + b"\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Close the file."""
        self._handle.close()


@dataclass
class ResultsFile:
    """A results file read back: its header (the document without rows) and its typed rows, in file order."""

    path: Path
    header: Document
    rows: list[Row] = field(default_factory=list)
    truncated: bool = False  # a results stream whose last line was cut short

    @property
    def command(self) -> str | None:
        """The command that wrote it (`compare`, `sweep`, `model`, ...)."""
        return self.header.command

    @property
    def environment(self) -> dict[str, Any]:
        """The environment it was measured in (empty when it was not recorded)."""
        return self.header.environment

    @property
    def is_stream(self) -> bool:
        """True for a results stream (`results.jsonl`)."""
        return self.header.format == STREAM_FORMAT


def load_results(path: str | Path) -> ResultsFile:
    """Read a results document or a results stream, any schema version, into typed rows; a clear
    `ResultsFileError` on anything else."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such results file") from None
    except OSError as exc:
        raise ResultsFileError(f"{path}: cannot read it ({exc.__class__.__name__})") from None
    if not data.strip():
        raise ResultsFileError(f"{path}: the file is empty")
    try:
        document = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return _load_stream(path, data)
    if isinstance(document, dict) and document.get("format") == STREAM_FORMAT:
        return ResultsFile(path, _header(path, document))  # a stream with its header only
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ResultsFileError(
            f"{path}: not an attnprof results file (no `results` list)",
            hint="pass the results.json of run, compare or model, or the results.jsonl of sweep",
        )
    typed = _typed(path, upgrade_document(document), Document, "")
    rows, typed.results = typed.results, []
    return ResultsFile(path, typed, rows)


def _load_stream(path: Path, data: bytes) -> ResultsFile:
    lines = [line for line in data.splitlines() if line.strip()]
    try:
        first = msgspec.json.decode(lines[0])
    except msgspec.DecodeError:
        raise ResultsFileError(f"{path}: not JSON and not an attnprof results stream") from None
    if not isinstance(first, dict) or first.get("format") != STREAM_FORMAT:
        raise ResultsFileError(f"{path}: not an attnprof results file (first line has no `format`)")
    header = _header(path, first)
    old = first.get("schema_version", 1) < SCHEMA_VERSION
    rows: list[Row] = []
    truncated = False
    for number, line in enumerate(lines[1:], start=2):
        try:
            raw = msgspec.json.decode(line)
        except msgspec.DecodeError:
            if number == len(lines):  # the last line of an interrupted write
                truncated = True
                break
            raise ResultsFileError(f"{path}: line {number} is not valid JSON") from None
        if isinstance(raw, dict):
            raw = upgrade_row(raw, header.subject) if old else raw
            rows.append(_typed(path, raw, Row, f" line {number}"))
    return ResultsFile(path, header, rows, truncated)


def _header(path: Path, first: dict[str, Any]) -> Document:
    header = {**upgrade_document({**first, "results": []}), "results": []}
    return _typed(path, header, Document, " (its header)")


def _typed(path: Path, value: dict[str, Any], kind: type[Any], where: str) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise ResultsFileError(f"{path}{where}: not a results file attnprof can read: {exc}") from None
