"""Read a Chrome trace as a stream of bytes: top-level keys one value at a time, events in batches.

The `traceEvents` array is read `CHUNK_BYTES` at a time, cut between two events and decoded
in one msgspec call into `decoding.Record`s, which go to a `Sink` (the table builder) and are
dropped; memory follows the tables, not the file. Small chunks keep each batch's records in the
CPU cache while the sink reads them. `parallel.read_path` reads a large file with two processes.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import msgspec

from attnprof.analysis.trace import decoding
from attnprof.errors import TraceError

CHUNK_BYTES = 1 << 19  # 512 KiB: measured fastest (4 MiB chunks decode about 1.5x slower)

_SKIP = re.compile(rb"[\s,]*")  # white space and commas
_WS = re.compile(rb"\s*")
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_END = re.compile(rb"\}\s*\]")
_BOUNDARY_WINDOW = 65536  # bytes searched back from the buffer's end for a cut between events
_VALUE_WINDOW = 65536  # bytes decoded first when reading one top-level value
_TAIL = b", \t\r\n"


class Sink(Protocol):
    """What the reader feeds: top-level values, batches of events, and a worker's sink."""

    def top_level(self, key: str, value: Any) -> None:
        """A top-level key other than `traceEvents`."""

    def add(self, records: list[decoding.Record], non_objects: int = 0) -> None:
        """A batch of events in file order, plus the number of entries that were not objects."""

    def absorb(self, other: Any) -> None:
        """Append what another sink read from the events that follow this one's."""


def not_a_trace(label: str, reason: str) -> TraceError:
    """The error for a file that is not a torch.profiler Chrome trace."""
    return TraceError(f"trace {label} is not a torch.profiler Chrome trace: {reason}")


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, inflated when it is gzip (by its magic number, not its name)."""
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return path.open("rb")


class ByteStream:
    """A refillable byte buffer over a file, decoding one JSON value or one batch of events at a time.

    `stop` (an absolute offset) pauses reading there: `at_stop()` is called on reaching it and
    either moves or lifts `stop` (True) or leaves it (False: `paused`, no more data for now).
    """

    __slots__ = ("at_stop", "base", "buf", "decode", "eof", "fp", "label", "paused", "pos", "stop")

    def __init__(self, fp: BinaryIO, label: str, base: int = 0) -> None:
        self.fp, self.buf, self.pos, self.base, self.eof, self.label = fp, b"", 0, base, False, label
        self.stop: int | None = None
        self.at_stop: Callable[[], bool] = lambda: False
        self.paused = False
        self.decode = json.JSONDecoder().raw_decode

    @property
    def offset(self) -> int:
        """The absolute offset of the cursor."""
        return self.base + self.pos

    def refill(self, past_stop: bool = False) -> bool:
        """Read the next chunk; False at the end of the file, or at `stop` unless `past_stop`."""
        want = CHUNK_BYTES
        while self.stop is not None:
            left = self.stop - (self.base + len(self.buf))
            if left > 0:
                want = min(want, left)
                break
            if past_stop:
                self.stop = None
            elif not self.at_stop():
                self.paused = True
                return False
        self.paused = False
        if self.eof:
            return False
        chunk = self.fp.read(want)
        if not chunk:
            self.eof = True
            return False
        self.base += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-space character (skipping commas too), or '' when there is no more data."""
        while True:
            self.pos = _run_end(_SKIP, self.buf, self.pos)
            if self.pos < len(self.buf):
                return chr(self.buf[self.pos])
            if not self.refill():
                return ""

    def expect(self, char: str) -> None:
        """Step over `char` (after white space), or raise TraceError."""
        while True:
            self.pos = _run_end(_WS, self.buf, self.pos)
            if self.pos < len(self.buf):
                break
            if not self.refill(past_stop=True):
                raise not_a_trace(self.label, "its JSON ends early (truncated file?)")
        found = chr(self.buf[self.pos])
        if found != char:
            raise not_a_trace(self.label, f"expected {char!r} at byte {self.offset}, found {found!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode the JSON value at the cursor, reading more bytes (past `stop` too) until it is complete."""
        window = _VALUE_WINDOW  # decode a window first: top-level values are small, the buffer is not
        while True:
            self.pos = _run_end(_WS, self.buf, self.pos)
            if self.pos >= len(self.buf) and self.refill(past_stop=True):
                continue
            whole = self.pos + window >= len(self.buf)
            # surrogateescape maps each undecodable byte to one character and back, so the
            # value's length in bytes is exact.
            text = self.buf[self.pos : self.pos + window].decode("utf-8", "surrogateescape")
            try:
                obj, end = self.decode(text)
            except json.JSONDecodeError as exc:
                if not whole:
                    window *= 16
                    continue
                if self.refill(past_stop=True):
                    continue
                raise not_a_trace(self.label, f"its JSON is not valid ({exc.msg}; truncated file?)") from None
            # A value that ends exactly at the text's end may be cut (a number): read on.
            if end >= len(text):
                if not whole:
                    window *= 16
                    continue
                if not self.eof and self.refill(past_stop=True):
                    continue
            raw = text[:end].encode("utf-8", "surrogateescape")
            self.pos += len(raw)
            try:
                text[:end].encode("utf-8")
            except UnicodeEncodeError:  # bytes that are not UTF-8: replace them, as a text reader would
                obj = self.decode(raw.decode("utf-8", "replace"))[0]
            return obj

    def events(self, sink: Sink) -> bool:
        """Feed the events from the cursor (inside the list) to `sink` up to the closing ']'
        (False) or up to `stop` (True: paused between two events)."""
        while True:
            char = self.peek()
            if char == "]":
                self.pos += 1
                return False
            if char == "":
                if self.paused:
                    return True
                raise not_a_trace(self.label, "its event list is not closed (truncated file?)")
            sink.add(*self._batch())

    def _batch(self) -> tuple[list[decoding.Record], int]:
        """The next events: up to the last `}, {` in the buffer, decoded in one call.

        The last events are cut before the list's `]`. JSON's strictness makes a wrong cut (say,
        inside a string) fail rather than mislead; then an earlier cut is tried, more bytes are
        read, and at last one event is decoded on its own.
        """
        while True:
            buf, pos = self.buf, self.pos
            cuts = [m.start() + 1 for m in _BOUNDARY.finditer(buf, max(pos, len(buf) - _BOUNDARY_WINDOW))]
            if len(cuts) < 2:
                cuts = [m.start() + 1 for m in _BOUNDARY.finditer(buf, pos)]
            final = self.paused  # everything up to `stop` is here and must be whole events
            if final:
                cuts.append(len(buf.rstrip(_TAIL)))
            elif not cuts:  # the last event: cut before the `]` that closes the list (first first)
                cuts = [m.start() + 1 for m in _END.finditer(buf, pos)][2::-1]
            for cut in reversed(cuts[-3:]):
                if cut <= pos:
                    break
                payload = b"".join((b"[", memoryview(buf)[pos:cut], b"]"))  # one copy of the events, not three
                try:
                    batch = _records(payload)
                except ValueError:  # not JSON: a wrong cut
                    continue
                self.pos = cut
                return batch
            if self.refill() or (self.paused and not final):  # read more, or try the cut at `stop`
                continue
            record = decoding.record_from_object(self.value())
            return ([], 1) if record is None else ([record], 0)

    def find_event_start(self) -> int | None:
        """The absolute offset of the first event after a `}, {` at or after the cursor: an
        object, followed by ',' or ']', within `_VALUE_WINDOW` bytes. None when there is none."""
        while True:
            match = _BOUNDARY.search(self.buf, self.pos)
            if match is None:
                self.pos = max(self.pos, len(self.buf) - _BOUNDARY_WINDOW)
                if not self.refill():
                    return None
                continue
            self.pos = match.end() - 1
            while len(self.buf) - self.pos < _VALUE_WINDOW and self.refill():
                pass
            text = self.buf[self.pos : self.pos + _VALUE_WINDOW].decode("utf-8", "surrogateescape")
            try:
                event, end = self.decode(text)
            except json.JSONDecodeError:
                event, end = None, 0
            if isinstance(event, dict) and text[end : end + 64].lstrip()[:1] in (",", "]"):
                return self.offset
            self.pos += 1


def _run_end(pattern: re.Pattern[bytes], buf: bytes, pos: int) -> int:
    """Where the run of `pattern` (which also matches nothing) that starts at `pos` ends."""
    match = pattern.match(buf, pos)
    return match.end() if match else pos


def _records(payload: bytes) -> tuple[list[decoding.Record], int]:
    """A batch's Records and its count of non-object entries; ValueError when it is not JSON."""
    try:
        return decoding.decode_records(payload), 0
    except msgspec.ValidationError:  # JSON, but some event does not fit the schema
        records = [decoding.record_from_object(event) for event in decoding.decode_any(payload)]
        kept = [r for r in records if r is not None]
        return kept, len(records) - len(kept)


# --------------------------------------------------------------------------- documents


def read_document(
    stream: ByteStream, sink: Sink, split: Callable[[ByteStream, Sink, bool], bool] | None = None
) -> bool:
    """Read a whole Chrome trace (`{"traceEvents": [...], ...}` or a bare event list) into `sink`.

    `split(stream, sink, is_object)`, at the start of the event list, may hand its second half
    and the rest of the document to a worker (True: all read). Returns whether an event list
    was found. Raises TraceError for anything that is not a Chrome trace.
    """
    first = stream.peek()
    if first == "":
        raise not_a_trace(stream.label, "the file is empty")
    if first == "[":  # the bare-array form of the Chrome trace format
        stream.expect("[")
        if not (split and split(stream, sink, False)):
            stream.events(sink)
        return True
    if first != "{":
        raise not_a_trace(stream.label, f"it is not a JSON object or list (it starts with {first!r})")
    stream.expect("{")
    return object_rest(stream, sink, split)


def object_rest(stream: ByteStream, sink: Sink, split: Callable[[ByteStream, Sink, bool], bool] | None) -> bool:
    """Read the rest of the top-level object (the cursor is inside it) into `sink`: whether it
    held an event list. `split` as in `read_document`."""
    saw_events = False
    while True:
        char = stream.peek()
        if char == "}":
            stream.pos += 1
            return saw_events
        if char == "":
            raise not_a_trace(stream.label, "its JSON ends early (truncated file?)")
        key = stream.value()
        if not isinstance(key, str):
            raise not_a_trace(stream.label, "a top-level key is not a string")
        stream.expect(":")
        if key != "traceEvents":
            sink.top_level(key, stream.value())
            continue
        if stream.peek() != "[":
            raise not_a_trace(stream.label, "'traceEvents' is not a list")
        stream.expect("[")
        saw_events = True
        if split is not None and split(stream, sink, True):
            return True
        split = None  # one split a document
        stream.events(sink)


def read_bytes(data: bytes, sink: Sink, label: str) -> bool:
    """`read_document` over bytes in memory (one process)."""
    return read_document(ByteStream(io.BytesIO(data), label), sink)
