"""Peak extra device memory of one forward, and out-of-memory as a failure row.

CPU has no honest per-call peak (the process RSS mixes the allocator's cache, other
threads and Python), so CPU reports None, shown as "n/a", never a made-up number.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attnprof.errors import VariantFailure, one_line

MIB = 1024 * 1024


def is_oom(exc: BaseException) -> bool:
    """True for torch's OutOfMemoryError, or a RuntimeError whose text says out of memory."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def oom_failure(exc: BaseException) -> VariantFailure:
    """A one-line `VariantFailure("out of memory: ...")` for an OOM exception."""
    detail = (
        re.sub(r"^(cuda\s+)?out of memory[\s.:;,]*", "", one_line(exc, with_type=False), flags=re.IGNORECASE)
        or type(exc).__name__
    )
    return VariantFailure(f"out of memory: {detail}")


def release_cached_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back, so the next cell starts clean."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@contextmanager
def oom_guard() -> Iterator[None]:
    """Turn an out-of-memory error inside the block into a one-line VariantFailure."""
    try:
        yield
    except Exception as exc:
        if not is_oom(exc):
            raise
        failure = oom_failure(exc)
        del exc
        release_cached_memory()
        raise failure from None


def peak_extra_memory_mib(fn: Callable[[], Any], device: str) -> float | None:
    """Peak device memory one call of `fn` allocates above what is already held, in MiB.

    On CUDA: reset the peak counter, note the allocated bytes, run `fn` once, synchronize,
    and return (max_memory_allocated - before) / 2**20. That covers the output, workspaces
    and temporaries (e.g. a materialised score matrix), not the inputs already allocated.
    On CPU: None (no honest measure). OOM raises VariantFailure("out of memory: ...").
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    with oom_guard():
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        del out
    return max(0, peak - before) / MIB
