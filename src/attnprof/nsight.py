"""Where Nsight Compute is on this machine: the `ncu` command and the folder of the `ncu_report` module it ships.

attnprof never vendors Nsight Compute. `find_ncu()` looks for `ncu` on PATH, then under CUDA_HOME and
/usr/local/cuda; `ncu_report_dirs(ncu)` lists the folders that may hold `ncu_report.py`: beside the
real `ncu` (the CUDA toolkit's `bin/ncu` is often a link or a small script that starts the one in
the Nsight Compute folder), in folders the script names, and under /opt/nvidia/nsight-compute.
`ncu_report_dir()` is the first folder that has it; attnprof loads the module only in a child process
(`analysis.counters.readers`), never beside torch. ATTNPROF_NCU (a path to
`ncu`) and ATTNPROF_NCU_REPORT_DIR (the folder holding `ncu_report.py`) override the search.

Every failure is an `NsightUnavailableError` with one line on why and how to fix it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from attnprof.errors import AttnprofError

NCU_ENV = "ATTNPROF_NCU"
REPORT_DIR_ENV = "ATTNPROF_NCU_REPORT_DIR"
INSTALL_ROOTS = (Path("/opt/nvidia/nsight-compute"),)
CUDA_ROOTS = ("/usr/local/cuda",)
INSTALL_HINT = "install Nsight Compute (it comes with the CUDA toolkit) and put its `ncu` on PATH, or set ATTNPROF_NCU"


class NsightUnavailableError(AttnprofError):
    """Nsight Compute cannot be used here: not installed, its report module missing, or refused."""

    exit_code = 2


def find_ncu() -> Path:
    """The `ncu` command: ATTNPROF_NCU, else PATH, else CUDA_HOME/bin or /usr/local/cuda/bin."""
    configured = os.environ.get(NCU_ENV)
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise NsightUnavailableError(f"{NCU_ENV}={configured} is not an executable file", INSTALL_HINT)
        return path
    found = shutil.which("ncu")
    if found:
        return Path(found)
    roots = [os.environ["CUDA_HOME"]] if os.environ.get("CUDA_HOME") else []
    for root in (*roots, *CUDA_ROOTS):
        candidate = Path(root) / "bin" / "ncu"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NsightUnavailableError(
        "Nsight Compute's `ncu` was not found (not on PATH, nor under CUDA_HOME)", INSTALL_HINT
    )


def ncu_report_dirs(ncu: Path | None) -> list[Path]:
    """Folders that may hold `ncu_report.py`, most likely first, each listed once."""
    dirs: list[Path] = []
    configured = os.environ.get(REPORT_DIR_ENV)
    if configured:
        dirs.append(Path(configured))
    if ncu is not None:
        real = ncu.resolve()
        for base in (real.parent, real.parent.parent):
            dirs.append(base / "extras" / "python")
        dirs.extend(_folders_named_in(real))
    for root in INSTALL_ROOTS:
        if root.is_dir():
            dirs.extend(sorted(root.glob("*/extras/python"), reverse=True))  # newest version first
    unique: list[Path] = []
    for folder in dirs:
        if folder not in unique:
            unique.append(folder)
    return unique


def ncu_report_dir(ncu: Path | None = None) -> Path:
    """The folder holding the installed Nsight Compute's `ncu_report.py` (`ncu`: where to start looking;
    default `find_ncu()` when it finds one), without importing it."""
    if ncu is None:
        try:
            ncu = find_ncu()
        except NsightUnavailableError:
            ncu = None
    for folder in ncu_report_dirs(ncu):
        if (folder / "ncu_report.py").is_file():
            return folder
    where = f" (looked beside {ncu})" if ncu is not None else ""
    raise NsightUnavailableError(
        f"Nsight Compute's ncu_report module was not found{where}",
        f"set {REPORT_DIR_ENV} to the folder holding ncu_report.py, or export the report with "
        "`ncu --import FILE.ncu-rep --csv --page raw > FILE.csv` and pass the CSV",
    )


def _folders_named_in(script: Path) -> list[Path]:
    """Nsight Compute folders that a small wrapper script (the toolkit's `bin/ncu`) names."""
    try:
        if script.stat().st_size > 64 * 1024:
            return []
        text = script.read_text(errors="ignore")
    except OSError:
        return []
    found = []
    for match in re.finditer(r"(/[\w.+-]+(?:/[\w.+-]+)*nsight-compute[\w.+-]*)", text):
        found.append(Path(match.group(1)) / "extras" / "python")
    return found
