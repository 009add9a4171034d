"""The console script's entry point: a Ctrl-C while the CLI is still being imported exits 130 quietly.

It imports nothing at module level, so the interrupt handling is in place before typer, pydantic or
the commands load; once a command runs, `cli.common.handle_errors` takes over.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Import the CLI and run it; Ctrl-C during the import ends with exit 130 and no traceback."""
    try:
        from attnprof.cli.app import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    run_cli()
