"""The console script's entry point: a Ctrl-C while the CLI is still being imported exits 130 quietly.

It imports nothing at module level, so the interrupt handling is in place before typer, pydantic or
the commands load; once a command runs, `cli.common.handle_errors` takes over.

For `attnprof analyze TRACE` on a large trace it first starts the process that reads the trace's
second half (`analysis.parallel.start_early`), so that it reads while the CLI loads.
"""

from __future__ import annotations

import sys


def main() -> None:
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
    from attnprof.analysis.builder import TableBuilder
    from attnprof.analysis.parallel import start_early

    return start_early(path, TableBuilder)  # never raises
