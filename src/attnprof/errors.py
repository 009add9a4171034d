"""The project's exceptions. Every message is one line a user can act on.

Only the CLI turns these into printed errors and exit codes.
"""

from __future__ import annotations


class AttnprofError(Exception):
    """Base class: a failure with a one-line message and an optional hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        """Pickle with the hint (rank 0's errors are sent to the other ranks)."""
        return type(self), (self.message, self.hint)


class ConfigError(AttnprofError):
    """The config file is missing, unreadable or invalid."""

    exit_code = 2


class UnknownVariantError(AttnprofError):
    """A variant name that no registered variant has."""

    exit_code = 2


class DuplicateVariantError(AttnprofError):
    """Two variants registered under one name."""


class UnknownFindingError(AttnprofError):
    """A finding id that no registered finding has."""

    exit_code = 2


class DuplicateFindingError(AttnprofError):
    """Two findings registered under one id."""


class VariantUnavailableError(AttnprofError):
    """A variant that cannot run on this device, dtype or shape."""

    exit_code = 3


class DeviceError(AttnprofError):
    """The requested device does not exist on this machine."""

    exit_code = 3


class ContendedCalibrationError(AttnprofError):
    """A calibration ran while other processes held the CPU: it measured them too, so it is neither cached nor
    used (exit 3, as a verdict that could not be judged)."""

    exit_code = 3


class CountersUnavailableError(DeviceError):
    """`--ncu` asked for on a run that cannot have hardware counters: no CUDA device, or no Nsight Compute.
    Refused before any cell runs, with the exit code of a missing device."""


class DistributedError(AttnprofError):
    """A torchrun run that cannot go on: no backend, a failed rendezvous, a rank that left."""

    exit_code = 3


class VariantFailure(AttnprofError):
    """A variant ran but failed: out-of-memory, NaN output, wrong result, crash."""


class TraceError(AttnprofError):
    """A trace that cannot be analysed: unreadable, empty, or without the region."""

    exit_code = 4


class NothingFinishedError(AttnprofError):
    """Ctrl-C before any cell (or model row) finished: the run's folder was removed, nothing is written."""

    exit_code = 130


class OutputError(AttnprofError):
    """The output directory cannot be created or written."""

    exit_code = 5


def one_line(exc: BaseException, *, with_type: bool = True, limit: int = 200) -> str:
    """One line for an exception: `Type: first line of its message` (just the type when the message is
    empty; just the line with `with_type=False`), the line cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    detail = lines[0] if lines else ""
    if len(detail) > limit:
        detail = detail[: limit - 3] + "..."
    if not with_type:
        return detail or type(exc).__name__
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class ResultsFileError(AttnprofError):
    """A results file that cannot be read back: missing, empty, or not written by attnprof."""

    exit_code = 2


class MissingExtraError(AttnprofError):
    """An optional dependency that a command needs is not installed (e.g. matplotlib for `plot`,
    transformers for `model`)."""

    exit_code = 2


class UsageError(AttnprofError):
    """A command-line value that cannot be used (a malformed threshold, options that exclude each other)."""

    exit_code = 2


class ExpectationsError(AttnprofError):
    """An expectations file (`attnprof check`) that is missing, unreadable or invalid."""

    exit_code = 2
