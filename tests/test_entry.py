"""The console script's entry point: Ctrl-C while the CLI imports exits 130 without a traceback."""

from __future__ import annotations

import builtins

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
