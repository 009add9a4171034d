"""Ctrl-C: remember that it happened, so that no code in between can swallow it.

torch's profiler can swallow a KeyboardInterrupt that lands while it starts (an import inside its
`prepare_trace`) and then fail with an unrelated exception from its `__exit__`; CPython itself
drops one that lands in a callback of the import machinery. With `recording_interrupts()` active
(the CLI holds it for a whole command), SIGINT sets a flag before raising KeyboardInterrupt; the
pipeline's `guard` and cell loop ask `interrupt_requested()` and raise KeyboardInterrupt again
instead of recording a failure or going on to the next stage or cell.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class _Flag:
    """Whether SIGINT arrived inside the current `recording_interrupts` block."""

    raised = False


def interrupt_requested() -> bool:
    """True once SIGINT has arrived inside a `recording_interrupts()` block that is still active."""
    return _Flag.raised


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _Flag.raised = True
    raise KeyboardInterrupt


@contextmanager
def recording_interrupts() -> Iterator[None]:
    """Install a SIGINT handler that records the interrupt and raises KeyboardInterrupt; restore the old
    one afterwards. Inside an active block it changes nothing (the outer block's record stands);
    nor off the main thread, where SIGINT is ignored (a background job), or where a handler not set
    from Python would be lost."""
    current = signal.getsignal(signal.SIGINT)
    if (
        threading.current_thread() is not threading.main_thread()
        or current is None
        or current is signal.SIG_IGN
        or current is _on_sigint
    ):
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    _Flag.raised = False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _Flag.raised = False


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt when SIGINT arrived inside the active `recording_interrupts()` block."""
    if _Flag.raised:
        raise KeyboardInterrupt


def caused_by_interrupt(exc: BaseException) -> bool:
    """True when SIGINT was recorded, or when `exc` was raised while a KeyboardInterrupt was handled
    (its `__context__` chain holds one): such an exception is the interrupt in disguise."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__context__
    return interrupt_requested()
