"""The console script's entry point: Ctrl-C while the CLI imports exits 130 without a traceback."""

from __future__ import annotations

import builtins
import subprocess
import sys
import threading
import types

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
        entry.run()
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    assert err == "error: interrupted\n" and "Traceback" not in err


def test_the_entry_point_runs_the_cli(monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["attnprof", "--version"])
    with pytest.raises(SystemExit) as exit_info:
        entry.run()
    assert exit_info.value.code == 0


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [("None", 0, ""), ("3", 3, ""), ("'error: stopped'", 1, "error: stopped\n")],
)
def test_exit_now_ends_as_sys_exit_would_after_the_atexit_handlers(code, status, stderr) -> None:
    done = _python(
        "import atexit\n"
        "from attnprof.entry import exit_now\n"
        "atexit.register(print, 'handler ran')\n"
        "print('output', end=' ')\n"  # still buffered: a pipe is block-buffered
        f"exit_now({code})\n"
    )
    assert (done.returncode, done.stdout, done.stderr) == (status, "output handler ran\n", stderr)


def test_exit_now_skips_the_teardown_of_objects() -> None:
    done = _python(
        "from attnprof.entry import exit_now\n"
        "class Loud:\n"
        "    def __del__(self):\n"
        "        print('torn down')\n"
        "kept = Loud()\n"
        "exit_now(0)\n"
    )
    assert (done.returncode, done.stdout) == (0, "")


def test_exit_now_leaves_the_teardown_to_python_once_torch_is_loaded(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    with pytest.raises(SystemExit) as exit_info:
        entry.exit_now(2)
    assert exit_info.value.code == 2


def test_exit_now_leaves_the_teardown_to_python_while_a_thread_runs() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(SystemExit) as exit_info:
            entry.exit_now(None)
        assert exit_info.value.code is None
    finally:
        release.set()
        worker.join()


def test_python_dash_m_attnprof_exits_with_the_commands_status(tmp_path) -> None:
    def attnprof(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "attnprof", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    version, missing = attnprof("--version"), attnprof("analyze", str(tmp_path / "none.json"))
    assert (version.returncode, version.stdout.startswith("attnprof ")) == (0, True)
    assert missing.returncode == 4 and missing.stderr.startswith("error: trace file not found")
