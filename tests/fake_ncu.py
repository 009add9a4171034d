"""A stand-in for Nsight Compute's `ncu`, for the --ncu tests on a machine without it.

`install(tmp_path, monkeypatch)` writes an executable `ncu` into tmp_path and points ATTNPROF_NCU at it. Each
call appends its argv, as one JSON line, to the log `FakeNcu.calls` reads. What it does is set by
environment variables (`FakeNcu.behave`):

* FAKE_NCU_MODE: `report` (default: write a report at `-o`), `child` (run the child command for real,
  then write the report), or a failure: `permission` (ERR_NVGPUCTRPERM), `library` (LibraryNotLoaded),
  `no-kernels`, `child-oom` and `child-failed` (the child's own line), `crash` (killed by SIGKILL),
  `error` (an `==ERROR==` line, status 1), `empty` (status 0, no report), `hang` (sleeps: a timeout);
* FAKE_NCU_FAIL_FOR: fail only for the cell of this variant (else succeed);
* FAKE_NCU_CSV: what `ncu --import REPORT --csv --page raw` prints (an H200 raw page).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

SCRIPT = r'''
import json, os, signal, subprocess, sys, time

args = sys.argv[1:]
with open(os.environ["FAKE_NCU_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if "--import" in args:
    sys.stdout.write(open(os.environ["FAKE_NCU_CSV"]).read())
    sys.exit(0)
output = args[args.index("-o") + 1]
child = args[args.index("-o") + 2:]
mode = os.environ.get("FAKE_NCU_MODE", "report")
only = os.environ.get("FAKE_NCU_FAIL_FOR")
if only and json.loads(child[-1]).get("cell", {}).get("variant") != only:
    mode = "report"
print("==PROF== Connected to process 4242 (python3)")
if mode == "permission":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
          "Counters on the target device 0.")
    sys.exit(0)
if mode == "library":
    print("==ERROR== Failed to initialize the profiler: LibraryNotLoaded")
    sys.exit(1)
if mode == "no-kernels":
    print("==WARNING== No kernels were profiled.")
    sys.exit(0)
if mode == "child-oom":
    print("attnprof-ncu-child: failed: out of memory: CUDA out of memory. Tried to allocate 2.00 GiB",
          file=sys.stderr)
    sys.exit(3)
if mode == "child-failed":
    print("attnprof-ncu-child: failed: forward raised RuntimeError: boom", file=sys.stderr)
    sys.exit(3)
if mode == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "error":
    print("==ERROR== The application returned an error code (1).")
    sys.exit(1)
if mode == "hang":
    time.sleep(60)
if mode == "child":
    code = subprocess.call(child)
    if code:
        sys.exit(code)
if mode != "empty":
    with open(output, "wb") as report:
        report.write(b"NVIDIA Nsight Compute report (fake)")
print("==PROF== Report: " + output)
'''


class FakeNcu:
    """The fake `ncu` of one test: its path, its log, and how it behaves."""

    def __init__(self, folder: Path, monkeypatch) -> None:
        self.path = folder / "ncu"
        self.log = folder / "ncu-calls.jsonl"
        self.path.write_text(f"#!{sys.executable}\n{SCRIPT}")
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("ATTNPROF_NCU", str(self.path))
        monkeypatch.setenv("FAKE_NCU_LOG", str(self.log))
        csv = Path(__file__).parent / "data" / "h200" / "ncu" / "sdpa-flash-fwd.raw.csv"
        monkeypatch.setenv("FAKE_NCU_CSV", str(csv))
        monkeypatch.delenv("FAKE_NCU_MODE", raising=False)
        monkeypatch.delenv("FAKE_NCU_FAIL_FOR", raising=False)

    def behave(self, mode: str, only: str | None = None) -> None:
        """Set FAKE_NCU_MODE (and FAKE_NCU_FAIL_FOR)."""
        self.monkeypatch.setenv("FAKE_NCU_MODE", mode)
        if only is not None:
            self.monkeypatch.setenv("FAKE_NCU_FAIL_FOR", only)

    @property
    def calls(self) -> list[list[str]]:
        """The argv of every call so far."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def passes(self) -> list[list[str]]:
        """The calls that profiled (not `--import` exports)."""
        return [call for call in self.calls if "--import" not in call]


def child_job(call: list[str]) -> dict:
    """The JSON job a pass gave its child (the last argument)."""
    return json.loads(call[-1])


def install(folder: Path, monkeypatch) -> FakeNcu:
    """A fake `ncu` in `folder`, found through ATTNPROF_NCU."""
    return FakeNcu(folder, monkeypatch)
