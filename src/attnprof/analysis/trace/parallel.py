"""Read a large trace file with two processes (Linux), with the same result as one.

A forked worker reads the second half of the event list (from the first event that starts
after the middle byte) and the rest of the document, while this process reads the first half
and stops exactly where the worker began; then the worker's sink is appended to this one
(`Sink.absorb`). This process checks the cut itself, by decoding complete events right up to
it; if it cannot, or the worker fails, it reads on alone and says why in `notes` (a worker that
fails sends its exception and traceback instead of its result).

What it saves, measured on benchmarks/scaletrace.py's 1M-event plain-JSON trace (306 MB), `attnprof
analyze --format json` in 12 paired whole-process runs on two idle cores: 2.52 s against 3.20 s read
by one process (medians; 0.78x, a fifth of the command's time). With no core to spare it saves
nothing (paired runs while other work kept both cores busy: 1.03x).
"""

from __future__ import annotations

import gzip
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from attnprof.analysis.trace import decoding, reader
from attnprof.errors import TraceError

PARALLEL_MIN_BYTES = 48 << 20  # smaller event lists are read by one process
PLAIN_SPLIT = 0.5  # where the worker starts (measured: 0.44-0.56 differ by less than the noise)
GZIP_SPLIT = 0.55  # the worker also inflates everything before its half: give it less to parse


def read_path(path: Path, sink: reader.Sink, new_sink: Callable[[], reader.Sink], label: str, notes: list[str]) -> bool:
    """`read_document` over a file, read by two processes when it is large and forking is safe.

    `new_sink()` makes the worker's sink. When the two-process read falls back to one process, the
    reason (with the worker's traceback, if it failed) is appended to `notes`. Raises TraceError,
    and OSError/EOFError/zlib.error for a file that cannot be read or inflated.
    """
    with reader.open_binary(path) as fp:
        stream = reader.ByteStream(fp, label)
        if not _can_fork():
            return reader.read_document(stream, sink)
        gzipped = isinstance(fp, gzip.GzipFile)
        size = _inflated_size(path) if gzipped else path.stat().st_size
        share = GZIP_SPLIT if gzipped else PLAIN_SPLIT

        def split(stream: reader.ByteStream, sink: reader.Sink, is_object: bool) -> bool:
            start = stream.offset
            if size - start < PARALLEL_MIN_BYTES:
                return False
            middle = start + int((size - start) * share)
            return _read_split(stream, sink, _Job(path, middle, new_sink, stream.label, is_object), notes)

        return reader.read_document(stream, sink, split)


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


def _read_split(stream: reader.ByteStream, sink: reader.Sink, job: _Job, notes: list[str]) -> bool:
    """Read the event list (the cursor is just inside it) and the rest of the document into `sink`
    with a worker doing `job`: True when done, False when no worker could be started (nothing read).
    When the worker cannot help, this process reads on alone and says why in `notes`."""
    try:
        worker = _Worker(job)
    except OSError as exc:  # no pipe or no fork (out of memory, process limit)
        notes.append(f"the trace was read by one process: the second reading process could not be started ({exc})")
        return False
    try:
        note = _read_halves(stream, sink, worker, job.is_object)
    finally:
        worker.close()
    if note is not None:
        notes.append(note)
    return True


def _read_halves(stream: reader.ByteStream, sink: reader.Sink, worker: _Worker, is_object: bool) -> str | None:
    """Read the event list up to where `worker` began, then take the worker's half and the rest of
    the document into `sink`. When the worker cannot help, read on alone; then the reason is
    returned (None when the worker's part was used)."""
    begins: int | None = None
    asked = False

    def at_stop() -> bool:  # at the middle: wait for where the worker starts, then stop there
        nonlocal asked, begins
        if asked:
            return False
        asked = True
        begins = worker.event_start()
        stream.stop = begins if begins is not None and begins >= (stream.stop or 0) else None
        return True

    stream.stop, stream.at_stop = worker.middle, at_stop
    if stream.events(sink):  # paused where the worker began
        part = worker.result()
        if part is not None:
            other, top_level = part
            sink.absorb(other)
            for key, value in top_level:
                sink.top_level(key, value)
            return None
        stream.stop, stream.paused = None, False  # the worker failed: read on alone
        stream.events(sink)
    stream.stop = None
    if is_object:
        reader.object_rest(stream, sink, None)
    return _why_alone(worker, asked, begins)


def _why_alone(worker: _Worker, asked: bool, begins: int | None) -> str:
    """Why this process read the worker's half too."""
    why = "the trace was read by one process"
    if not asked:
        return f"{why}: its event list ends before byte {worker.middle}, where the second reading process began"
    if worker.failure is not None:
        return f"{why}: the second reading process failed: {worker.failure}"
    if begins is None:
        return f"{why}: the second reading process found no event after byte {worker.middle}"
    return f"{why}: byte {begins}, where the second reading process began, is not between two events"


@dataclass(frozen=True)
class _Failure:
    """What a worker that failed sends instead of its next message: the exception and its traceback."""

    error: str
    traceback: str

    def __str__(self) -> str:
        return f"{self.error}\n{self.traceback.rstrip()}"


@dataclass(frozen=True)
class _Job:
    """A worker's part: the event list from the first event after byte `middle` of `path` to the end of
    the document (an object when `is_object`, else a bare event list), read into `new_sink()`."""

    path: Path
    middle: int
    new_sink: Callable[[], reader.Sink]
    label: str
    is_object: bool


class _Worker:
    """A forked process doing a `_Job`. It sends two pickles down a pipe: where its first event
    starts (None when it found none), then its sink and the top-level pairs after the events; or,
    in place of either, a `_Failure`. `failure` says why the worker could not help, once known."""

    def __init__(self, job: _Job) -> None:
        self.middle = job.middle
        self.failure: str | None = None
        self.status: int | None = None  # the wait status, once reaped
        read_fd, write_fd = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if self.pid == 0:  # the worker: never returns
            os.close(read_fd)
            _work(write_fd, job)
        os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb")

    def event_start(self) -> int | None:
        """Where the worker's first event starts (waits for it); None if it found none or failed."""
        begins = self._receive()
        return begins if isinstance(begins, int) else None

    def result(self) -> tuple[Any, list[tuple[str, Any]]] | None:
        """The worker's sink and top-level pairs (waits for them); None if it failed."""
        part = self._receive()
        return part if isinstance(part, tuple) else None

    def _receive(self) -> Any:
        """The worker's next message; None (with `failure` set) when it failed or ended without one."""
        try:
            message = pickle.load(self.pipe)
        except EOFError:  # it closed the pipe: it has ended, or is ending
            self.failure = f"it ended without sending its part ({self._ended()})"
            return None
        except (OSError, ValueError, TypeError, AttributeError, pickle.UnpicklingError) as exc:
            self.failure = f"its message could not be read ({type(exc).__name__}: {exc})"
            return None
        if isinstance(message, _Failure):
            self.failure = str(message)
            return None
        return message

    def _ended(self) -> str:
        """How the worker ended (waits for it: its pipe is closed)."""
        self.status = os.waitpid(self.pid, 0)[1]
        if os.WIFSIGNALED(self.status):
            return f"killed by signal {os.WTERMSIG(self.status)}"
        return f"exit status {os.waitstatus_to_exitcode(self.status)}"

    def close(self) -> None:
        """End the worker (if it still runs) and reap it."""
        self.pipe.close()
        if self.status is not None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.status = os.waitpid(self.pid, 0)[1]


def _work(write_fd: int, job: _Job) -> NoReturn:
    """The worker's whole life: do `job` and send its part, or send why it could not (`_Failure`);
    then end at once (`os._exit`, never returning into the caller's code)."""
    status = 0
    try:
        with os.fdopen(write_fd, "wb") as out:
            try:
                _read_part(out, job)
            except BaseException as exc:  # whatever it is (KeyboardInterrupt too), the parent hears of it
                status = 1
                failure = _Failure(f"{type(exc).__name__}: {exc}", traceback.format_exc())
                out.write(pickle.dumps(failure, protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        os._exit(status)


def _read_part(out: Any, job: _Job) -> None:
    """Send where the job's first event starts, then read on to the end of the document and send the
    sink and the top-level pairs after the events."""
    with reader.open_binary(job.path) as fp:
        _skip(fp, job.middle)
        stream = reader.ByteStream(fp, job.label, base=job.middle)
        begins = stream.find_event_start()
        out.write(pickle.dumps(begins, protocol=pickle.HIGHEST_PROTOCOL))
        out.flush()
        if begins is None:
            return
        sink, top_level = job.new_sink(), _TopLevel()
        stream.events(sink)
        if job.is_object:
            reader.object_rest(stream, top_level, None)  # type: ignore[arg-type]
        # pickled whole before writing: while the parent still reads its half, not while it waits
        out.write(pickle.dumps((sink, top_level.pairs), protocol=pickle.HIGHEST_PROTOCOL))


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
