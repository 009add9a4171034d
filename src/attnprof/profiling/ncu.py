"""One Nsight Compute pass: a child process that runs one cell's step again, under `ncu`, writing a `.ncu-rep`.

`ncu_command` builds the command line: `--profile-from-start off` (only the kernels launched between the
child's `cudaProfilerStart` and `cudaProfilerStop` are profiled; an NVTX range would miss the backward,
whose kernels autograd launches from its own thread), `--clock-control none` (the GPU's clocks are left
as they are), the sections and metrics the reader needs, at most `launch_count` kernel launches, and, for
a whole model, only the kernels whose names match `kernel_regex`. `run_ncu` runs it with a time limit,
the report created whole and never over an existing file (`files.create_new`), and turns each known
failure into one line:

* run-wide, `NsightUnavailableError` (no later pass would do better): the GPU's counters are restricted
  to administrators (ERR_NVGPUCTRPERM), or the profiler cannot start here (`LibraryNotLoaded`, as in
  gVisor sandboxes);
* this pass only, `NcuPassFailed`: the cell failed or ran out of memory in the child, the child crashed
  or was killed, ncu reported an error, profiled no kernel, wrote no report, or ran past `timeout_s`.

In the child, `profiled_steps` warms the step up (`WARMUP_STEPS` calls, so Triton's autotuning and
torch.compile happen before the profiler starts), then runs `steps` calls, each between
`cudaProfilerStart` and `cudaProfilerStop` (process-wide, so the backward's kernels are inside).

It measures only: it reads nothing of the report (the pipeline hands it to the reader).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprof.errors import AttnprofError
from attnprof.files import create_new
from attnprof.nsight import NsightUnavailableError

#: What the child prints on stderr when its cell cannot run: `attnprof-ncu-child: failed: REASON`
#: (or `skipped:`), so the parent can tell the cell's own failure from Nsight Compute's.
CHILD_MARK = "attnprof-ncu-child:"
#: Exit status of a child whose cell failed (its reason follows CHILD_MARK).
CHILD_FAILED = 3
OOM_REASON = "out of memory"  # how the reason of a cell that ran out of memory begins (`profiling.memory`)
PERMISSION_URL = "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
DEFAULT_TIMEOUT_S = 600.0
WARMUP_STEPS = 3


class NcuPassFailed(AttnprofError):
    """One cell's Nsight Compute pass failed; the run goes on, and the next cell's pass may succeed."""


@dataclass(frozen=True)
class NcuRequest:
    """One pass: the child's command, where its report goes, what to collect and how much."""

    child: Sequence[str]
    report: Path  # `.ncu-rep`; a numbered name (`-2`) when taken
    sections: Sequence[str]
    metrics: Sequence[str] = ()
    launch_count: int = 16
    kernel_regex: str | None = None  # only kernels whose (function) name matches; None: every kernel
    timeout_s: float = DEFAULT_TIMEOUT_S
    env: dict[str, str] | None = None  # the child's environment (None: this process's)


@dataclass(frozen=True)
class NcuRun:
    """A pass that wrote its report: the report's path and the seconds the pass took."""

    report: Path
    seconds: float


def ncu_command(ncu: Path, request: NcuRequest, output: Path) -> list[str]:
    """The `ncu` command line of `request`, writing its report to `output` (replaced: a file of ours)."""
    command = [str(ncu), "--profile-from-start", "off", "--clock-control", "none"]
    for section in request.sections:
        command += ["--section", section]
    if request.metrics:
        command += ["--metrics", ",".join(request.metrics)]
    command += ["--launch-count", str(request.launch_count)]
    if request.kernel_regex is not None:
        command += ["--kernel-name", f"regex:{request.kernel_regex}"]
    return [*command, "-f", "-o", str(output), *request.child]


def run_ncu(ncu: Path, request: NcuRequest) -> NcuRun:
    """Run the pass (see the module docstring); the report written, or `NsightUnavailableError` (run-wide)
    or `NcuPassFailed` (this pass) with one line. Ctrl-C stops the child at once and passes on."""
    started = time.perf_counter()

    def write(output: Path) -> None:
        lines, code = _run(ncu_command(ncu, request, output), request.timeout_s, request.env)
        problem = pass_problem(lines, code, request.kernel_regex is not None)
        if problem is not None:
            raise problem
        if output.stat().st_size == 0:
            raise NcuPassFailed("Nsight Compute wrote no report" + _tail(lines))

    request.report.parent.mkdir(parents=True, exist_ok=True)
    report = create_new(request.report, write, numbered=True)
    return NcuRun(report, time.perf_counter() - started)


def export_raw_page(ncu: Path, report: Path, timeout_s: float = 120.0) -> Path:
    """The report's raw page as CSV (`ncu --import REPORT --csv --page raw`), written beside it as
    `NAME.raw.csv`: what a machine whose `ncu_report` module does not load can still read."""

    def write(output: Path) -> None:
        with output.open("wb") as out:
            try:
                done = subprocess.run(
                    [str(ncu), "--import", str(report), "--csv", "--page", "raw"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.PIPE,
                    timeout=timeout_s,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise NcuPassFailed(f"Nsight Compute could not export {report.name}: {exc}") from None
        if done.returncode != 0:
            lines = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
            status = f"status {done.returncode}"
            raise NcuPassFailed(f"Nsight Compute could not export {report.name} ({status}){_tail(lines)}")

    stem = report.name.removesuffix(".ncu-rep")
    return create_new(report.with_name(f"{stem}.raw.csv"), write, numbered=True)


def _run(command: list[str], timeout_s: float, env: dict[str, str] | None) -> tuple[list[str], int]:
    """Run `command` in a session of its own, its stdout and stderr together into a file; (its lines, its
    exit status). Past `timeout_s`, or on Ctrl-C, its whole process group is killed."""
    with tempfile.TemporaryFile() as log:
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as exc:
            raise NsightUnavailableError(
                f"Nsight Compute's `ncu` ({command[0]}) could not be started: {exc.strerror or exc}"
            ) from None
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process)
            raise NcuPassFailed(
                f"Nsight Compute ran past its {timeout_s:.0f} s limit and was stopped",
            ) from None
        finally:
            if process.poll() is None:  # Ctrl-C (or any other exception) while it ran
                _kill(process)
        log.seek(0)
        text = log.read().decode(errors="replace")
    return [line.rstrip() for line in text.splitlines() if line.strip()], code


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill the process group the pass started (ncu and the child), and reap ncu."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def pass_problem(lines: list[str], code: int, filtered: bool = False) -> AttnprofError | None:
    """The failure the output of a pass (`lines`, exit status `code`) shows, as one line; None when it
    profiled at least one kernel. `filtered`: the pass kept only kernels matching a name pattern."""
    text = "\n".join(lines)
    if "ERR_NVGPUCTRPERM" in text:
        return NsightUnavailableError(
            "Nsight Compute may not read this GPU's performance counters (ERR_NVGPUCTRPERM: they are "
            "restricted to administrators)",
            "run as root, or let every user read them (the NVIDIA driver's option "
            f"NVreg_RestrictProfilingToAdminUsers=0); see {PERMISSION_URL}",
        )
    if "LibraryNotLoaded" in text or "Failed to initialize the profiler" in text:
        return NsightUnavailableError(
            "Nsight Compute could not start its profiler here (Failed to initialize the profiler: "
            "LibraryNotLoaded), as in sandboxes such as gVisor",
            "collect counters on the GPU machine itself, outside the sandbox",
        )
    child = next((line.split(CHILD_MARK, 1)[1].strip() for line in lines if CHILD_MARK in line), None)
    if child is not None:
        status, _, reason = child.partition(": ")
        if reason.startswith(OOM_REASON):
            return NcuPassFailed(f"the cell ran out of memory under Nsight Compute{reason[len(OOM_REASON) :]}")
        return NcuPassFailed(f"the cell {status} under Nsight Compute: {reason}")
    if code != 0:
        return NcuPassFailed(_exit_text(code) + _first_error(lines, _tail(lines)))
    if any("No kernels were profiled" in line for line in lines):
        what = "no attention kernel (none matched the attention kernels' names)" if filtered else "no kernel"
        return NcuPassFailed(f"Nsight Compute profiled {what} between the profiler's start and stop")
    return None


def _exit_text(code: int) -> str:
    """`the process under Nsight Compute was killed by SIGKILL ...` or `Nsight Compute exited with status N`."""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        hint = " (the system may have run out of memory)" if -code == signal.SIGKILL else ""
        return f"the process under Nsight Compute was killed by {name}{hint}"
    return f"Nsight Compute exited with status {code}"


def _first_error(lines: list[str], otherwise: str) -> str:
    """`: ==ERROR== ...` for the first error line ncu printed, else `otherwise`."""
    error = next((line for line in lines if line.startswith("==ERROR==")), None)
    return f": {error}" if error is not None else otherwise


def _tail(lines: list[str]) -> str:
    """`: LAST LINE` of the output (ncu's `==PROF==` lines left out when others exist), or ""."""
    own = [line for line in lines if not line.startswith("==PROF==")] or lines
    return f": {own[-1][:200]}" if own else ""


def profiled_steps(
    call: Callable[[], Any],
    device: str,
    prepare: Callable[[], Any] | None = None,
    steps: int = 1,
    warmup: int = WARMUP_STEPS,
) -> None:
    """`warmup` calls, then `steps` calls each between the profiler's start and stop (`prepare`, the step's
    untimed forward, before each call and outside the range), synchronized so every kernel of a call is
    launched and done before the stop."""
    for _ in range(warmup):
        if prepare is not None:
            prepare()
        call()
    synchronize(device)
    for _ in range(steps):
        if prepare is not None:
            prepare()
            synchronize(device)
        profiler_start(device)
        try:
            call()
            synchronize(device)
        finally:
            profiler_stop(device)


def synchronize(device: str) -> None:
    """Wait for the device's work (CUDA); nothing on CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def profiler_start(device: str) -> None:
    """`cudaProfilerStart`: Nsight Compute (`--profile-from-start off`) profiles the kernels launched from
    here, by any thread of the process. Nothing on CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.profiler.start()


def profiler_stop(device: str) -> None:
    """`cudaProfilerStop`: the end of what Nsight Compute profiles. Nothing on CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.profiler.stop()
