"""The console script's entry point: a Ctrl-C while the CLI is still being imported exits 130 quietly.

It imports nothing at module level, so the interrupt handling is in place before typer, pydantic or
the commands load; once a command runs, `cli.common.handle_errors` takes over. When the command is
done, `exit_now` ends the process without tearing down every module and object one by one.

For `attnprof analyze TRACE` on a large trace it first starts the process that reads the trace's
second half (`analysis.parallel.start_early`), so that it reads while the CLI loads.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def main() -> NoReturn:
    """Run the CLI (`run`), then end the process with its exit status (`exit_now`)."""
    try:
        run()
    except SystemExit as stop:
        exit_now(stop.code)
    exit_now(0)


def run() -> None:
    """Import the CLI and run it; Ctrl-C during the import ends with exit 130 and no traceback."""
    try:
        read_ahead(sys.argv[1:])
        from attnprof.cli.app import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    run_cli()


def read_ahead(args: list[str]) -> bool:
    """When the command is `analyze`, start reading its trace (the first argument after it that names
    a file) ahead; True when a reader started. Anything unexpected is left to the command itself."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command != "analyze" or "--help" in args or "-h" in args:
        return False
    from pathlib import Path

    rest = args[args.index("analyze") + 1 :]
    path = next((Path(a) for a in rest if not a.startswith("-") and Path(a).is_file()), None)
    if path is None:
        return False
    from attnprof.analysis.trace.builder import TableBuilder
    from attnprof.analysis.trace.parallel import start_early

    return start_early(path, TableBuilder)  # never raises


def exit_now(code: str | int | None) -> NoReturn:
    """End the process as `sys.exit(code)` would, but where it is safe (one thread, torch not loaded)
    without the interpreter's teardown, which frees every module and object one by one: after a large
    analysis that is tens of milliseconds. The atexit handlers run first and the standard streams are
    flushed; output files are closed by the commands that wrote them."""
    threading = sys.modules.get("threading")
    if "torch" in sys.modules or (threading is not None and threading.active_count() > 1):
        sys.exit(code)  # torch's own teardown, or threads that Python would wait for
    import atexit

    atexit._run_exitfuncs()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # a message, as sys.exit prints it
        sys.stderr.write(f"{code}\n")
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stream: as the interpreter reports that
        status = status or 120
    os._exit(status)
