"""Reading an Nsight Compute report into `CounterReport`: the `.ncu-rep` file through the `ncu_report`
module the installed Nsight Compute ships (`attnprof.nsight.ncu_report_dir`), or its raw page exported
as CSV (`ncu --import FILE.ncu-rep --csv --page raw > FILE.csv`: a row of metric names, a row of units,
then one row per kernel). `load_counters(path)` picks the reader by the file's suffix.

The module is loaded in a child Python process that imports nothing else (`ncu_dump`, run as a script),
which hands the kernels' metrics back as JSON: on the H200 machine (ncu 2025.3.1, torch 2.11) loading
`_ncu_report` into a process that had imported torch crashed it with a segmentation fault.

Every failure is a `CounterReportError`: one line saying what is wrong with the file, and a hint.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from attnprof.analysis.counters.kernel import CounterReport, Lookup, kernel_counters
from attnprof.analysis.counters.metrics import DEVICE_METRIC
from attnprof.analysis.counters.ncu_dump import report_contents
from attnprof.analysis.counters.units import parse_number
from attnprof.errors import AttnprofError

NAME_COLUMN = "Kernel Name"
EXPORT_HINT = "export a report's raw page with `ncu --import FILE.ncu-rep --csv --page raw > FILE.csv`"
SUFFIXES = (".ncu-rep", ".csv")


class CounterReportError(AttnprofError):
    """An Nsight Compute report that cannot be read: missing, of another kind, or without a kernel."""

    exit_code = 2


def load_counters(path: str | Path) -> CounterReport:
    """The kernels' counters of an Nsight Compute report: `.ncu-rep` (needs Nsight Compute's `ncu_report`
    module on this machine) or the raw page as `.csv`. CounterReportError when it cannot be read or holds
    no kernel; NsightUnavailableError when a `.ncu-rep` needs a module this machine lacks."""
    path = Path(path)
    if not path.is_file():
        raise CounterReportError(f"{path}: no such file", hint="give a .ncu-rep report or its raw page as .csv")
    if path.suffix == ".ncu-rep":
        return read_ncu_rep(path)
    if path.suffix == ".csv":
        return read_raw_csv(path)
    raise CounterReportError(
        f"{path}: not an Nsight Compute report (expected {' or '.join(SUFFIXES)})", hint=EXPORT_HINT
    )


# --------------------------------------------------------------------------- the raw page as CSV


def read_raw_csv(path: Path) -> CounterReport:
    """The raw page of a report as CSV: the row naming `Kernel Name` and the metrics, the units row after
    it, then one row per kernel (lines before the header, such as ncu's `==PROF==` messages, are skipped)."""
    try:
        with path.open(newline="", encoding="utf-8", errors="replace") as handle:
            rows = [row for row in csv.reader(handle) if row]
    except (OSError, csv.Error) as exc:
        raise CounterReportError(f"{path}: cannot be read as CSV ({exc})", hint=EXPORT_HINT) from None
    start = next((i for i, row in enumerate(rows) if NAME_COLUMN in row), None)
    if start is None:
        raise CounterReportError(
            f"{path}: not a raw page of Nsight Compute (no {NAME_COLUMN!r} column)", hint=EXPORT_HINT
        )
    header = rows[start]
    body = rows[start + 1 :]
    units = [""] * len(header)
    if body and parse_number(body[0][0]) is None:  # the units row: its ID cell is empty
        units, body = body[0], body[1:]
    kernels = [row for row in body if len(row) == len(header)]
    if not kernels:
        raise CounterReportError(f"{path}: the report holds no kernel", hint="profile a range that launches kernels")
    column = {name: i for i, name in enumerate(header)}
    result = [
        kernel_counters(row[column[NAME_COLUMN]], index, _csv_lookup(row, units, column))
        for index, row in enumerate(kernels)
    ]
    device = kernels[0][column[DEVICE_METRIC]] if DEVICE_METRIC in column else None
    return CounterReport(str(path), "raw-csv", result, device or None)


def _csv_lookup(row: list[str], units: list[str], column: dict[str, int]) -> Lookup:
    def lookup(metric: str) -> tuple[float | str, str] | None:
        i = column.get(metric)
        if i is None:
            return None
        number = parse_number(row[i])
        if number is None:
            return None
        return number, units[i] if i < len(units) else ""

    return lookup


# --------------------------------------------------------------------------- the .ncu-rep file


CHILD_TIMEOUT_S = 300.0


def read_ncu_rep(path: Path, module: ModuleType | None = None) -> CounterReport:
    """A `.ncu-rep` report, every kernel of every range in order (`ncu_dump.report_contents`): through `module`
    in this process when given (tests), else through the installed `ncu_report` in a child process."""
    contents = report_contents(module, str(path)) if module is not None else _contents_in_child(path)
    if "error" in contents:
        raise CounterReportError(f"{path}: Nsight Compute cannot load it ({contents['error']})")
    return _report(path, [(k["name"], _dict_lookup(k["metrics"])) for k in contents.get("kernels", [])])


def _contents_in_child(path: Path) -> dict[str, Any]:
    """`ncu_dump.py` run as a script by this Python, next to the installed `ncu_report`; its JSON answer."""
    from attnprof.analysis.counters import ncu_dump
    from attnprof.nsight import ncu_report_dir

    folder = ncu_report_dir()
    try:
        done = subprocess.run(
            [sys.executable, ncu_dump.__file__, str(folder), str(path)],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise CounterReportError(
            f"{path}: Nsight Compute's reader took over {CHILD_TIMEOUT_S:.0f} s", EXPORT_HINT
        ) from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise CounterReportError(f"{path}: Nsight Compute's ncu_report failed on it ({last[:200]})", EXPORT_HINT)
    return answer


def _report(path: Path, named: list[tuple[str, Lookup]]) -> CounterReport:
    if not named:
        raise CounterReportError(f"{path}: the report holds no kernel", hint="profile a range that launches kernels")
    kernels = [kernel_counters(name, index, lookup) for index, (name, lookup) in enumerate(named)]
    device = next((str(found[0]) for _, lookup in named if (found := lookup(DEVICE_METRIC)) is not None), None)
    return CounterReport(str(path), "ncu-rep", kernels, device or None)


def _dict_lookup(metrics: dict[str, list[Any]]) -> Lookup:
    def lookup(metric: str) -> tuple[float | str, str] | None:
        found = metrics.get(metric)
        return None if found is None else (found[0], found[1])

    return lookup
