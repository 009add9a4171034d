"""Reading an Nsight Compute report into `CounterReport`: the `.ncu-rep` file through the `ncu_report`
module the installed Nsight Compute ships (`attnprof.nsight.import_ncu_report`), or its raw page exported
as CSV (`ncu --import FILE.ncu-rep --csv --page raw > FILE.csv`: a row of metric names, a row of units,
then one row per kernel). `load_counters(path)` picks the reader by the file's suffix.

Every failure is a `CounterReportError`: one line saying what is wrong with the file, and a hint.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType
from typing import Any

from attnprof.analysis.counters.kernel import CounterReport, KernelCounters, Lookup, kernel_counters
from attnprof.analysis.counters.metrics import DEVICE_METRIC
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


def read_ncu_rep(path: Path, module: ModuleType | None = None) -> CounterReport:
    """A `.ncu-rep` report through `module`, Nsight Compute's `ncu_report` (default: the installed one,
    `attnprof.nsight.import_ncu_report`): every kernel of every range, in order."""
    if module is None:
        from attnprof.nsight import import_ncu_report

        module = import_ncu_report()
    try:
        context = module.load_report(str(path))
    except Exception as exc:  # the native loader raises its own kinds
        raise CounterReportError(f"{path}: Nsight Compute cannot load it ({type(exc).__name__}: {exc})") from None
    demangled = module.IAction.NameBase_DEMANGLED
    kernel_type = getattr(module.IAction, "WorkloadType_KERNEL", None)
    kernels: list[KernelCounters] = []
    device: str | None = None
    for r in range(context.num_ranges()):
        found = context.range_by_idx(r)
        for a in range(found.num_actions()):
            action = found.action_by_idx(a)
            if kernel_type is not None and hasattr(action, "workload_type") and action.workload_type() != kernel_type:
                continue
            lookup = _action_lookup(action)
            kernels.append(kernel_counters(action.name(demangled), len(kernels), lookup))
            if device is None and (named := lookup(DEVICE_METRIC)) is not None:
                device = str(named[0]) or None
    if not kernels:
        raise CounterReportError(f"{path}: the report holds no kernel", hint="profile a range that launches kernels")
    return CounterReport(str(path), "ncu-rep", kernels, device)


def _action_lookup(action: Any) -> Lookup:
    def lookup(metric: str) -> tuple[float | str, str] | None:
        found = action.metric_by_name(metric)
        if found is None or not found.has_value():
            return None
        kind = found.kind()
        if kind == found.ValueKind_STRING:
            value: float | str | None = found.as_string()
        elif kind in (found.ValueKind_UINT32, found.ValueKind_UINT64):
            value = float(found.as_uint64())
        else:
            value = found.as_double()
        return None if value is None else (value, found.unit() or "")

    return lookup
