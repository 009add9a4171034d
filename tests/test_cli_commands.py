"""The CLI's commands are built when used: `attnprof analyze` does not load the run/compare config
models or the table renderer for JSON, and help pages and unknown-command hints stay as they were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from attnprof.cli.app import COMMANDS, SUMMARIES

TRACE = Path(__file__).parent / "data" / "h200" / "8x16x1024x64" / "sdpa-flash.json.gz"


def test_analyze_json_loads_neither_the_config_models_nor_the_tables() -> None:
    code = (
        "import sys; from attnprof.cli.app import app\n"
        f"try:\n    app(['analyze', {str(TRACE)!r}, '--format', 'json'])\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(sorted(m for m in ('attnprof.config', 'attnprof.cli.compare_cmd', 'attnprof.cli.run_cmd',"
        " 'attnprof.report.analysis_tables', 'torch') if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"
    assert json.loads(out.stdout)["forwards"] == 3


def test_help_lists_every_command_in_order(cli) -> None:
    result = cli("--help")
    assert result.exit_code == 0
    commands = result.output[result.output.index("Commands") :]
    positions = [commands.index(f"│ {name} ") for name in COMMANDS]
    assert positions == sorted(positions)


def test_unknown_command_suggests_the_closest(cli) -> None:
    result = cli("analyz")
    assert result.exit_code == 2
    assert "No such command 'analyz'" in result.output and "Did you mean 'analyze'?" in result.output


def test_each_command_has_its_help(cli) -> None:
    for command in COMMANDS:
        result = cli(command, "--help")
        assert result.exit_code == 0, command
        assert f"attnprof {command} [OPTIONS]" in " ".join(result.output.split()), command


def test_help_lists_the_commands_without_importing_them() -> None:
    code = (
        "import sys; from attnprof.cli.app import app\n"
        "try:\n    app(['--help'])\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(sorted(m for m in sys.modules if m.startswith('attnprof.cli.') and m.endswith('_cmd')"
        " or m == 'attnprof.config'), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_the_summaries_are_the_commands_docstrings() -> None:
    import importlib

    for name, (module, function) in COMMANDS.items():
        doc = getattr(importlib.import_module(module), function).__doc__
        assert doc.strip().splitlines()[0] == SUMMARIES[name], name


def test_help_lists_what_the_built_commands_would(cli, monkeypatch) -> None:
    from typer.core import TyperGroup

    from attnprof.cli.app import Group

    listed = cli("--help").output
    monkeypatch.setattr(Group, "format_help", TyperGroup.format_help)  # every command built to be listed
    assert cli("--help").output == listed
