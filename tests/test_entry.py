"""The console script's entry point: Ctrl-C while the CLI imports exits 130 without a traceback; what start-up
imports (`--help`: neither torch nor the analysis; `explain`: the kernel names only)."""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys

import pytest

from attnprof import entry


def test_ctrl_c_while_the_cli_imports_exits_130(monkeypatch, capsys) -> None:
    real_import = builtins.__import__

    def interrupted_import(name, *args, **kwargs):
        if name == "attnprof.cli.app":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    with pytest.raises(SystemExit) as exit_info:
        entry.main()
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert err == "error: interrupted\n" and "Traceback" not in err


def test_the_entry_point_runs_the_cli(monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["attnprof", "--version"])
    with pytest.raises(SystemExit) as exit_info:
        entry.main()
    assert exit_info.value.code == 0


def test_python_dash_m_attnprof_exits_with_the_commands_status(tmp_path) -> None:
    def attnprof(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "attnprof", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    version, missing = attnprof("--version"), attnprof("analyze", str(tmp_path / "none.json"))
    assert (version.returncode, version.stdout.startswith("attnprof ")) == (0, True)
    assert missing.returncode == 4 and missing.stderr.startswith("error: trace file not found")


def _loaded_after(args: list[str], wanted: str) -> list[str]:
    """The modules that `wanted` (an expression over a module name `m`) picks among those loaded once
    `attnprof ARGS` has run in a fresh interpreter."""
    code = (
        "import sys\n"
        f"sys.argv = ['attnprof', *{args!r}]\n"
        "from attnprof.entry import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        f"print(sorted(m for m in sys.modules if {wanted}), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return ast.literal_eval(out.stderr.strip().splitlines()[-1])


def test_help_imports_neither_torch_nor_the_analysis() -> None:
    assert _loaded_after(["--help"], "m == 'torch' or m.startswith('attnprof.analysis')") == []


def test_explain_loads_the_kernel_names_and_not_the_whole_analysis() -> None:
    wanted = "m in ('attnprof.analysis.analyze', 'attnprof.analysis.trace.load', 'msgspec', 'torch')"
    assert _loaded_after(["explain", "flash_fwd_kernel"], wanted) == []
    assert "attnprof.analysis.names" in _loaded_after(["explain", "flash_fwd_kernel"], "m.startswith('attnprof')")
