"""Output files that never overwrite each other: a folder of one's own, and files created whole or not at all.

`unique_dir` makes a new folder with an exclusive mkdir, adding `-2`, `-3`, ... when the name is
taken (by a parallel invocation in the same second, say). `create_new` writes a file under a
temporary name in the same folder and then hard-links it into place, which fails instead of
replacing a file that exists: a reader sees the whole file or none, and nothing is overwritten.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from attnprof.errors import OutputError

MAX_SUFFIX = 1000


def _split(path: Path) -> tuple[str, str]:
    """`name.json.gz` -> (`name`, `.json.gz`); `name.csv` -> (`name`, `.csv`)."""
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    return path.name[: len(path.name) - len(suffix)], suffix


def _candidates(path: Path, numbered: bool) -> Iterator[Path]:
    """`path`, then (when `numbered`) `stem-2.ext`, `stem-3.ext`, ..."""
    yield path
    if numbered:
        stem, suffix = _split(path)
        for n in range(2, MAX_SUFFIX + 1):
            yield path.with_name(f"{stem}-{n}{suffix}")


def _fail(path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {exc.strerror or exc}")


def unique_dir(parent: Path, name: str) -> Path:
    """Create `parent/name` (or `name-2`, `name-3`, ... when taken) exclusively and return it."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for candidate in _candidates(parent / name, numbered=True):
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate
    except OSError as exc:
        raise _fail(parent / name, exc) from None
    raise OutputError(f"cannot create a folder in {parent}: {name} and {MAX_SUFFIX - 1} numbered names are taken")


def create_new(path: Path, write: Callable[[Path], None], *, numbered: bool = False) -> Path:
    """Create `path` with `write(temporary_path)` atomically, never replacing a file; return the path made.

    When `path` exists: OutputError, or with `numbered` the first free `stem-N.ext`. `write` gets a
    path in the same folder with the same extension (torch's exporter gzips by the name).
    """
    stem, suffix = _split(path)
    temporary = path.with_name(f".{stem}.{os.getpid()}-{secrets.token_hex(4)}.partial{suffix}")
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as to any file
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        write(temporary)
        for candidate in _candidates(path, numbered):
            if _link(temporary, candidate):
                return candidate
    except OSError as exc:
        raise _fail(path, exc) from None
    finally:
        temporary.unlink(missing_ok=True)
    raise OutputError(f"cannot write {path}: it already exists" + (" (and its numbered names)" if numbered else ""))


def _link(source: Path, target: Path) -> bool:
    """Give `source`'s content the name `target` unless `target` exists; False when it does."""
    try:
        os.link(source, target)
        return True
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: exclusive create and copy (whole, but not atomic)
        pass
    try:
        handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(handle, "wb") as out, source.open("rb") as src:
        shutil.copyfileobj(src, out)
    return True
