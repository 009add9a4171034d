"""Read a large trace file with two processes (Linux), with the same result as one.

A forked worker reads the second half of the event list (from the first event that starts
after the middle byte) and the rest of the document, while this process reads the first half
and stops exactly where the worker began; then the worker's sink is appended to this one
(`Sink.absorb`). This process checks the cut itself, by decoding complete events right up to
it; if it cannot, or the worker fails, it reads on alone.

`start_early(path)` forks that worker before the caller has loaded what it needs to read the
first half (the CLI does it for `attnprof analyze TRACE` before importing typer and the
analysis): the worker then reads while this process imports, and takes a larger share to match.
`read_path` uses it for the same file (same size and mtime) and ends it otherwise.
"""

from __future__ import annotations

import atexit
import gzip
import os
import pickle
import signal
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnprof.analysis.trace import decoding, reader
from attnprof.errors import TraceError

PARALLEL_MIN_BYTES = 48 << 20  # smaller event lists are read by one process
PLAIN_SPLIT = 0.5  # where the worker starts (measured: 0.44-0.56 differ by less than the noise)
GZIP_SPLIT = 0.55  # the worker also inflates everything before its half: give it less to parse
EARLY_PLAIN_SPLIT = 0.46  # started early, the worker has had a head start: give it more (measured)
EARLY_GZIP_SPLIT = 0.5  # (measured: 0.45 and 0.55 are slower)

_early: dict[tuple[str, int, int], _Worker] = {}  # workers from start_early, by file (path, size, mtime)


def read_path(path: Path, sink: reader.Sink, new_sink: Callable[[], reader.Sink], label: str) -> bool:
    """`read_document` over a file, read by two processes when it is large and forking is safe.

    `new_sink()` makes the worker's sink. Raises TraceError, and OSError/EOFError/zlib.error for
    a file that cannot be read or inflated.
    """
    with reader.open_binary(path) as fp:
        stream = reader.ByteStream(fp, label)
        split = None
        forkable = _can_fork()
        if _early or forkable:  # (an early worker was forked when that was safe)
            size = _inflated_size(path) if isinstance(fp, gzip.GzipFile) else path.stat().st_size
            share = GZIP_SPLIT if isinstance(fp, gzip.GzipFile) else PLAIN_SPLIT

            def split(stream: reader.ByteStream, sink: reader.Sink, is_object: bool) -> bool:
                return _read_split(stream, sink, path, new_sink, size, share, is_object, forkable)

        return reader.read_document(stream, sink, split)


def start_early(path: Path, new_sink: Callable[[], reader.Sink]) -> bool:
    """Fork the reading worker for a large trace file now, ahead of `read_path` (see the module
    docstring); True when one started. Never raises: a file it cannot read is left to `read_path`."""
    try:
        key = _file_key(path)
        with reader.open_binary(path) as fp:
            gzipped = isinstance(fp, gzip.GzipFile)
            head = fp.read(4096).lstrip()
        size = _inflated_size(path) if gzipped else key[1]
        if size < PARALLEL_MIN_BYTES or key in _early or head[:1] not in (b"{", b"[") or not _can_fork():
            return False
        share = EARLY_GZIP_SPLIT if gzipped else EARLY_PLAIN_SPLIT
        worker = _Worker(path, int(size * share), new_sink, str(path), head[:1] == b"{")
    except (OSError, EOFError, ValueError, zlib.error):
        return False
    if not _early:
        atexit.register(_end_early)
    _early[key] = worker
    return True


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _take_early(path: Path, start: int, is_object: bool) -> _Worker | None:
    """The early worker of this file, when it starts past `start` (the event list) in a document of
    the same form; every other early worker is ended."""
    try:
        key = _file_key(path)
    except OSError:
        key = None
    worker = _early.pop(key, None) if key is not None else None
    _end_early()
    if worker is not None and (worker.middle <= start or worker.is_object != is_object):
        worker.close()
        return None
    return worker


def _end_early() -> None:
    while _early:
        _early.popitem()[1].close()


def _can_fork() -> bool:
    """Linux, two usable cores (affinity and cgroup quota), and one thread in this process (so
    forking it is safe)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    try:
        cores = min(len(os.sched_getaffinity(0)), _cgroup_cpus())
        return cores >= 2 and len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float:
    """The CPUs the cgroup's quota allows (v2 `cpu.max`, else v1 CFS); infinite when unlimited
    or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return float("inf")
    try:
        return float("inf") if quota in ("max", "-1") else int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return float("inf")


def _inflated_size(path: Path) -> int:
    """The gzip trailer's size of the inflated data (modulo 4 GiB: a hint only)."""
    with path.open("rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


def _read_split(
    stream: reader.ByteStream,
    sink: reader.Sink,
    path: Path,
    new_sink: Callable[[], reader.Sink],
    size: int,
    share: float,
    is_object: bool,
    forkable: bool,
) -> bool:
    """Read the event list (the cursor is just inside it) with a worker: the one `start_early`
    forked for this file, else a new one when forking is safe now (`forkable`); True when the
    worker's half and the rest of the document are in `sink`, False when nothing was split."""
    start = stream.offset
    worker = _take_early(path, start, is_object) if _early else None
    if worker is None:
        if not forkable or size - start < PARALLEL_MIN_BYTES:
            return False
        worker = _Worker(path, start + int((size - start) * share), new_sink, stream.label, is_object)
    try:
        asked = False

        def at_stop() -> bool:  # at the middle: wait for where the worker starts, then stop there
            nonlocal asked
            if asked:
                return False
            asked = True
            begins = worker.event_start()
            stream.stop = begins if begins is not None and begins >= (stream.stop or 0) else None
            return True

        stream.stop, stream.at_stop = worker.middle, at_stop
        if stream.events(sink):
            part = worker.result()
            if part is not None:
                other, top_level = part
                sink.absorb(other)
                for key, value in top_level:
                    sink.top_level(key, value)
                return True
            stream.stop, stream.paused = None, False  # the worker failed: read on alone
            stream.events(sink)
        stream.stop = None
        if is_object:
            reader.object_rest(stream, sink, None)
        return True
    finally:
        worker.close()


class _Worker:
    """A forked process reading the event list from the first event after `middle` to the end
    of the document. It writes that event's offset (a line) and then its sink and the top-level
    pairs after the events (a pickle) to a pipe."""

    def __init__(
        self, path: Path, middle: int, new_sink: Callable[[], reader.Sink], label: str, is_object: bool
    ) -> None:
        self.middle, self.is_object = middle, is_object
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the worker: never returns
            os.close(read_fd)
            _work(write_fd, path, middle, new_sink, label, is_object)
        os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb")

    def event_start(self) -> int | None:
        """Where the worker's first event starts (waits for it); None if it found none."""
        try:
            begins = int(self.pipe.readline())
        except ValueError:
            return None
        return begins if begins >= 0 else None

    def result(self) -> tuple[Any, list[tuple[str, Any]]] | None:
        """The worker's sink and top-level pairs (waits for them); None if it failed."""
        try:
            sink, top_level = pickle.load(self.pipe)
        except (EOFError, OSError, ValueError, TypeError, AttributeError, pickle.UnpicklingError):
            return None  # the worker failed: it wrote nothing, or not all
        return sink, top_level

    def close(self) -> None:
        """End the worker (if it still runs) and reap it."""
        self.pipe.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def _work(
    write_fd: int, path: Path, middle: int, new_sink: Callable[[], reader.Sink], label: str, is_object: bool
) -> None:
    """The worker's whole life. On any failure it exits without writing its result (the parent
    then reads on alone)."""
    try:
        with os.fdopen(write_fd, "wb") as out, reader.open_binary(path) as fp:
            _skip(fp, middle)
            stream = reader.ByteStream(fp, label, base=middle)
            begins = stream.find_event_start()
            out.write(b"%d\n" % (-1 if begins is None else begins))
            out.flush()
            if begins is not None:
                sink, top_level = new_sink(), _TopLevel()
                stream.events(sink)
                if is_object:
                    reader.object_rest(stream, top_level, None)  # type: ignore[arg-type]
                # pickled whole before writing: while the parent still reads its half, not while it waits
                out.write(pickle.dumps((sink, top_level.pairs), protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        os._exit(0)


def _skip(fp: Any, count: int) -> None:
    """Move `count` bytes on: a seek, or for gzip reading in large pieces (its seek reads 8 KiB ones)."""
    if not isinstance(fp, gzip.GzipFile):
        fp.seek(count)
        return
    while count > 0:
        piece = fp.read(min(count, 1 << 22))
        if not piece:
            return
        count -= len(piece)


class _TopLevel:
    """A sink that keeps the top-level pairs that follow the event list, in order."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, Any]] = []

    def top_level(self, key: str, value: Any) -> None:
        """Keep one pair."""
        self.pairs.append((key, value))

    def add(self, records: list[decoding.Record], non_objects: int = 0) -> None:
        """A second event list: rare, so the worker gives up and the parent reads it alone."""
        raise TraceError("a second 'traceEvents' list")
