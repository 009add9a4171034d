"""What the commands share: option aliases, the error edge, output streams, config loading."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from attnprof.errors import AttnprofError, ConfigError
from attnprof.interrupts import interrupt_requested, recording_interrupts


class OutputFormat(str, Enum):
    """How results are written to stdout."""

    table = "table"
    markdown = "markdown"
    json = "json"


@dataclass
class GlobalState:
    """Options given before the command name."""

    debug: bool = False
    no_plugins: bool = False


STATE = GlobalState()

FormatOpt = Annotated[
    OutputFormat,
    typer.Option("--format", "-f", help="table, markdown or json (json: stdout holds only the JSON document)."),
]
ConfigArg = Annotated[
    Path | None,
    typer.Argument(help="YAML config (or give it with -c); the built-in default when omitted.", show_default=False),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="YAML config (or give it as the argument); the built-in default when omitted.",
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    str | None, typer.Option(help="auto, cpu, cuda or cuda:N (overrides the config).", show_default=False)
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        help="auto, bf16, fp16, fp32, fp8 (e4m3) or fp8_e5m2 (overrides the config); auto is bf16 on a GPU of "
        "compute capability 8.0 or newer, fp16 on an older GPU, fp32 on CPU; fp8 cells need a GPU.",
        show_default=False,
    ),
]


def config_path(argument: Path | None, option: Path | None) -> Path | None:
    """The config file given as the argument (ConfigArg) or with -c/--config (ConfigOpt); None for the
    built-in default; ConfigError (exit 2) when both are given."""
    if argument is not None and option is not None:
        raise ConfigError(
            f"two configs given ({argument} and -c {option}): give it as the argument or with -c, not both"
        )
    return argument if argument is not None else option


WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide",
        help="Print tables in full: every column, nothing cut (default: fit $COLUMNS, the terminal, "
        "or 120 columns when stdout is not a terminal).",
    ),
]

AllowUnjudgedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unjudged",
        help="Exit 0 instead of 3 when nothing judged failed but a latency could not be judged (timed while "
        "other processes held the CPU, or both timings unstable); the reason is still printed.",
    ),
]

#: The exit codes of a gate (`diff`, `check`): anything judged failed, else something not judged, else passed.
GATE_FAILED, GATE_UNJUDGED, GATE_PASSED = 1, 3, 0


def gate_exit(failed: bool, unjudged: int, allow_unjudged: bool, what: str) -> None:
    """End a gate: exit 1 when anything judged failed (whatever was not judged), else 3 when `unjudged`
    `what` could not be judged (0 with --allow-unjudged, saying so), else 0. Precedence: 1 > 3 > 0."""
    if failed:
        raise typer.Exit(GATE_FAILED)
    if unjudged:
        then = "exit 0 (--allow-unjudged)" if allow_unjudged else "exit 3 (--allow-unjudged makes it 0)"
        note(f"not judged: {unjudged} {what} could not be judged, nothing judged failed; {then}")
        raise typer.Exit(GATE_PASSED if allow_unjudged else GATE_UNJUDGED)
    raise typer.Exit(GATE_PASSED)


#: The width tables fit when stdout is not a terminal and $COLUMNS is unset (a pipe, a file, CI logs).
DEFAULT_WIDTH = 120
#: Tables are never fitted to fewer columns than this; a narrower terminal wraps their lines.
MIN_WIDTH = 60


def table_width(fmt: OutputFormat, wide: bool) -> int | None:
    """The width tables must fit, computed once per command: None (no limit) with --wide or a format
    other than table; else $COLUMNS when set, the terminal's width, or DEFAULT_WIDTH when stdout is
    not a terminal; at least MIN_WIDTH."""
    if wide or fmt is not OutputFormat.table:
        return None
    return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, MIN_WIDTH)


def stderr_console() -> Any:
    """A rich console on stderr, for progress and notes."""
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def terminal_console() -> Iterator[Any]:
    """A rich console on a duplicate of file descriptor 2, for a progress display: it keeps reaching the
    terminal while the profiler's native stderr is captured (descriptor 2 sent to a file)."""
    from rich.console import Console

    try:
        stream = os.fdopen(os.dup(sys.stderr.fileno()), "w")
    except (AttributeError, OSError, ValueError):  # no real stderr (a test runner's): the plain console
        yield stderr_console()
        return
    try:
        yield Console(file=stream)
    finally:
        stream.close()


def emit(text: str) -> None:
    """Write a result to stdout."""
    typer.echo(text)


def note(text: str) -> None:
    """Write a note to stderr, never mixing with results on stdout."""
    typer.echo(text, err=True)


def warn_contended(rows: Any, fmt: OutputFormat, width: int | None) -> None:
    """The warning line of a run whose rows were timed while other processes held the CPU
    (`report.contended.warning`), at the top of its output: on stdout before the tables, on stderr with
    `--format json` (stdout holds only the JSON); nothing when no row is contended."""
    from attnprof.report.contended import warning
    from attnprof.report.layout import wrap

    text = warning(rows)
    if text is None:
        return
    if fmt is OutputFormat.json:
        note(text)
    else:
        emit("\n".join(wrap(text, width, rest="  ")))


def fail(message: str, hint: str | None = None, code: int = 1, as_json: bool = False) -> None:
    """Print a one-line error (and an optional hint) and exit with `code`."""
    if as_json:
        typer.echo(json.dumps({"error": message, "hint": hint}))
    first, *rest = message.splitlines() or [""]
    typer.echo(f"error: {first}", err=True)
    for line in rest:
        typer.echo(line, err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


def reader_gone() -> None:
    """Stop quietly with exit 0 because the reader of our output closed its pipe (`attnprof list | head -1`):
    what it read is all it wanted. stdout and stderr go to /dev/null, so that the interpreter's last flush
    of what is still buffered cannot complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        raise typer.Exit(0) from None
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (AttributeError, OSError, ValueError):  # no real descriptor (a test runner's stream)
            pass
    os.close(devnull)
    raise typer.Exit(0)


def handle_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn attnprof errors into one-line messages; anything else too, unless --debug. Ctrl-C at any
    moment of the command ends it with exit 130, even when something swallowed the KeyboardInterrupt.
    A closed output pipe ends it quietly with exit 0 (`reader_gone`)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = getattr(kwargs.get("fmt"), "value", None) == "json"
        try:
            with recording_interrupts():  # Ctrl-C is remembered even where torch or CPython swallows it
                try:
                    result = command(*args, **kwargs)
                except typer.Exit as done:
                    if interrupt_requested() and done.exit_code != 130:
                        raise KeyboardInterrupt from None
                    raise
                if interrupt_requested():
                    raise KeyboardInterrupt
                return result
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            reader_gone()
        except AttnprofError as exc:
            if STATE.debug:
                raise
            fail(exc.message, exc.hint, exc.exit_code, as_json)
        except KeyboardInterrupt:
            try:
                fail("interrupted", code=130, as_json=as_json)
            except BrokenPipeError:
                raise typer.Exit(130) from None
        except Exception as exc:
            if STATE.debug:
                raise
            text = str(exc).strip().splitlines()
            detail = f": {text[0]}" if text else ""
            fail(f"unexpected {type(exc).__name__}{detail}", "run with --debug for the traceback", 1, as_json)

    return wrapper


def load_variants_for_cli() -> Any:
    """The registry, honouring --no-plugins and ATTNPROF_PLUGINS."""
    from attnprof.plugins import load_variants

    return load_variants(no_plugins=STATE.no_plugins)


def plugin_notes(loaded: Any) -> list[str]:
    """One line per plugin that failed to load or register."""
    return [f"plugin {p.package} ({p.entry_point}): {p.error}" for p in loaded.problems]
