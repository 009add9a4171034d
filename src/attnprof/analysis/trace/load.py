"""Parse a Kineto Chrome trace once into compact, typed, columnar tables.

`load_trace(source)` accepts a path (`.json` or `.json.gz`), an already-loaded dict or a
`ParsedTrace` and returns a `ParsedTrace`. A file is read as a stream of bytes (`reader`; two
processes for a large one: `parallel`, which says in `ParsedTrace.read_notes` why, when it fell back
to one) and decoded by msgspec into `decoding.Record`s, holding the fields attnprof reads and nothing
else; a dict is encoded to JSON and read the same way.
`builder.TableBuilder.add`, the one loop from events to tables, reduces each to a few numbers in `array`s.
"""

from __future__ import annotations

import gc
import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from attnprof.analysis.trace import decoding, parallel, reader
from attnprof.analysis.trace.builder import TableBuilder
from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.errors import TraceError


def load_trace(source: str | Path | dict[str, Any] | ParsedTrace, every_concrete_input: bool = False) -> ParsedTrace:
    """Parse a Chrome trace file (`.json`, `.json.gz`) or loaded dict into a `ParsedTrace`.

    `every_concrete_input`: keep every op's `Concrete Inputs` (its scalar inputs), which re-creating the
    recorded ops needs (`analysis.recreate`), not only SDPA's.

    Raises TraceError (one line, naming the file) for a missing or unreadable file, for one that
    is not a torch.profiler Chrome trace, and for a trace with no events.
    """
    if isinstance(source, ParsedTrace):
        return source
    with gc_paused():  # millions of short-lived objects: the cyclic collector only slows them down
        return _load(source, every_concrete_input)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block (as it was after it). Reading and analysing
    a trace builds many containers and keeps them: each collection would only walk them again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(source: str | Path | dict[str, Any], every_concrete_input: bool = False) -> ParsedTrace:
    builder = TableBuilder(every_concrete_input)
    notes: list[str] = []
    if isinstance(source, dict):
        label = "<dict>"
        try:
            data = decoding.encode(source)
        except TypeError as exc:
            raise reader.not_a_trace(label, f"it cannot be written as JSON ({exc})") from None
        saw_events = reader.read_bytes(data, builder, label)
    else:
        path = Path(source)
        label = str(path)
        if not path.exists():
            raise TraceError(f"trace file not found: {path}")
        if path.is_dir():
            raise TraceError(f"trace path is a directory, not a file: {path}")
        try:
            saw_events = parallel.read_path(path, builder, partial(TableBuilder, every_concrete_input), label, notes)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise reader.not_a_trace(label, f"its gzip data is cut short or corrupt ({exc})") from None
        except OSError as exc:
            raise TraceError(f"cannot read trace {path}: {exc}") from None
    if not saw_events:
        raise reader.not_a_trace(label, "it has no 'traceEvents' list")
    if builder.event_count == builder.non_objects:
        if builder.event_count:
            raise reader.not_a_trace(label, "its events are not JSON objects")
        raise TraceError(f"trace {label} has no events")
    return builder.finish(label, tuple(notes))
