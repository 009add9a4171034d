"""`--ncu`: after a cell's (or a model row's) measurement, its step run again under Nsight Compute, and the
hardware counters of its kernels attached to its row.

A `CounterCollector` belongs to one run. For each ok cell it starts a child process
(`pipeline.ncu_child`) under `ncu` (`profiling.ncu`), the report written beside the cell's trace
(`traces/NAME.ncu-rep`), then reads it through `attach_counters`, the one place that reads a report
(`analysis.counters`). The cell's own figures are taken before, so `--ncu` changes none of them; the pass
runs in its own process, after the parent handed its cached GPU memory back.

A run that cannot have counters at all (not on a CUDA device, or no `ncu` to be found) is refused before any
cell runs (`refuse_counters`, exit 3 as a missing device is). Past that, nothing here fails a cell or the run:
a pass that fails leaves the row without counters and with a note (`ncu_note`, one line). A reason that holds
for the whole run (counters restricted to administrators, a profiler that cannot start in a sandbox; no CUDA
device or no `ncu`, when a caller did not refuse them) is found once, and no further pass is tried; each
distinct reason is in `notes`, in order, for the command to say once. The seconds
every pass took (`seconds`; each row's `phases_s["ncu"]`) are what `--ncu` added to the run.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.config import NCU_LAUNCHES
from attnprof.errors import AttnprofError, CountersUnavailableError, OutputError, one_line
from attnprof.nsight import NsightUnavailableError
from attnprof.pipeline.measured import CellResult
from attnprof.profiling.ncu import DEFAULT_TIMEOUT_S
from attnprof.registry import RunSpec

if TYPE_CHECKING:
    from attnprof.model_config import ModelConfig
    from attnprof.models.implementations import Implementation
    from attnprof.profiling.ceiling import Ceiling
    from attnprof.registry import Variant

REPORT_SUFFIX = ".ncu-rep"


def ncu_collection() -> tuple[Sequence[str], Sequence[str]]:
    """The sections and metrics a pass asks `ncu` for: those the reader (`analysis.counters`) reads."""
    from attnprof.analysis.counters import NCU_METRICS, NCU_SECTIONS

    return NCU_SECTIONS, NCU_METRICS


def attach_counters(result: CellResult, report: Path, seconds: float, ceiling: Ceiling | None, ncu: Path) -> None:
    """Read `report` and set `result.counters` (`analysis.counters.counters_for_cell`: each kernel's counters,
    placed against `ceiling`, the run's, else the ceiling cached for the report's GPU, as `attnprof model`'s
    analysis uses it, else the datasheet). A `.ncu-rep` this machine's `ncu_report` module cannot read (missing, or its
    reader failed) is exported as its raw page (`profiling.ncu.export_raw_page`, through the `ncu` that
    wrote it) and read from that. The one place that reads a report; any failure is an AttnprofError with
    one line."""
    from attnprof.analysis.counters import CounterReportError, counters_for_cell, load_counters
    from attnprof.profiling.ncu import export_raw_page

    try:
        loaded = load_counters(report)
    except (NsightUnavailableError, CounterReportError):
        loaded = load_counters(export_raw_page(ncu, report))
    from attnprof.peaks import cached_peaks, measured_peaks

    subject = result.subject
    spec = subject if isinstance(subject, RunSpec) else subject.attention_spec
    peaks = measured_peaks(ceiling) or cached_peaks(loaded.device, subject.dtype)
    result.counters = counters_for_cell(loaded, spec, peaks, seconds=seconds, report_path=str(report))


def attention_kernel_regex() -> str:
    """A regular expression for `ncu --kernel-name regex:` matching the kernels attnprof decodes as fused
    attention (the `fused-attention` rules of `analysis/kernel_names.yaml`), written for ncu's (ECMAScript)
    regex: named groups made plain, and wrapped in `.*` so that it holds whether ncu matches the whole name
    or searches in it."""
    from attnprof.analysis.names import rules

    patterns = [re.sub(r"\(\?P<\w+>", "(", rule.regex.pattern) for rule in rules() if rule.family == "fused-attention"]
    return ".*(?:" + "|".join(f"(?:{pattern})" for pattern in patterns) + ").*"


#: The child entry point (`python -m`).
CHILD_MODULE = "attnprof.pipeline.ncu_child"


def cell_command(variant: Variant, spec: RunSpec, seed: int, steps: int = 1) -> list[str]:
    """The child's command line for one cell."""
    fields = asdict(spec) | {"mask": spec.mask.text}  # the child's RunSpec(**fields) parses it back
    job = {"cell": {"variant": variant.name, "spec": fields, "seed": seed}}
    return _command(job | {"no_plugins": variant.source == "built-in", "steps": steps})


def model_command(
    config: ModelConfig, device: str, implementation: str, seq: int | None, mode: str, no_plugins: bool, steps: int = 1
) -> list[str]:
    """The child's command line for one row of `attnprof model`."""
    row = {"config": config.model_dump(mode="json"), "device": device, "implementation": implementation}
    return _command({"model": row | {"seq": seq, "mode": mode}, "no_plugins": no_plugins, "steps": steps})


def _command(job: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", CHILD_MODULE, json.dumps(job, separators=(",", ":"))]


def device_problem(device: str) -> str | None:
    """Why a pass cannot run on `device` (counters need a CUDA GPU), or None."""
    if device.startswith("cuda"):
        return None
    return f"hardware counters need a CUDA GPU (this run is on {device})"


def refuse_counters(device: str) -> None:
    """Refuse `--ncu` up front, before any cell runs, when no pass could give counters: CountersUnavailableError
    (exit 3, one line) when `device` is not a CUDA GPU (`device_problem`; saying why the machine has none), or
    when Nsight Compute's `ncu` is not found (`nsight.find_ncu`)."""
    from attnprof.devices import cuda_absence
    from attnprof.nsight import find_ncu

    problem = device_problem(device)
    if problem is not None:
        lacking = cuda_absence()
        raise CountersUnavailableError(
            f"--ncu: {problem}" + (f", and this machine has {lacking}" if lacking else ""),
            hint="run without --ncu: hardware counters need an NVIDIA GPU and Nsight Compute"
            if lacking
            else "use --device cuda with --ncu",
        )
    try:
        find_ncu()
    except NsightUnavailableError as exc:
        raise CountersUnavailableError(f"--ncu: {exc.message}", exc.hint) from None


@dataclass
class CounterCollector:
    """The Nsight Compute passes of one run (see the module docstring)."""

    launches: int = NCU_LAUNCHES
    timeout_s: float = DEFAULT_TIMEOUT_S
    ncu: Path | None = None  # found before the first pass (`nsight.find_ncu`) unless given
    refused: str | None = None  # a reason that holds for the whole run: no pass is tried
    seconds: float = 0.0
    passes: int = 0
    attached: int = 0
    notes: list[str] = field(default_factory=list)

    def collect_cell(
        self,
        result: CellResult,
        variant: Variant,
        seed: int,
        ceiling: Ceiling | None,
        started: Callable[[], None] | None = None,
    ) -> None:
        """The counters of an ok cell (`started` is told when its pass begins)."""
        if result.ok and result.trace_path is not None:
            report = report_path(result.trace_path)
            self._collect(result, cell_command(variant, result.spec, seed), report, None, ceiling, started)

    def collect_model_row(
        self,
        result: CellResult,
        config: ModelConfig,
        implementations: list[Implementation],
        started: Callable[[], None] | None = None,
    ) -> None:
        """The counters of the attention kernels of an ok model row (`started` is told when its pass begins)."""
        if not result.ok or result.trace_path is None:
            return
        no_plugins = all(i.variant is None or i.variant.source == "built-in" for i in implementations)
        spec = result.model
        command = model_command(config, spec.device, result.variant, spec.seq, spec.mode, no_plugins)
        self._collect(result, command, report_path(result.trace_path), attention_kernel_regex(), None, started)

    def _collect(
        self,
        result: CellResult,
        child: list[str],
        report: Path,
        kernel_regex: str | None,
        ceiling: Ceiling | None,
        started: Callable[[], None] | None,
    ) -> None:
        from attnprof.profiling.memory import release_cached_memory
        from attnprof.profiling.ncu import NcuPassFailed, NcuRequest, run_ncu

        self.refused = self.refused or device_problem(result.subject.device)
        if self.refused is None and self.ncu is None:
            self.ncu = self._find_ncu()
        if self.refused is not None or self.ncu is None:
            self._note(result, str(self.refused))
            return
        if started is not None:
            started()
        begun = time.perf_counter()
        try:
            release_cached_memory()  # the child needs the memory this process's allocator keeps
            sections, metrics = ncu_collection()
            request = NcuRequest(
                child,
                report,
                sections,
                metrics,
                self.launches,
                kernel_regex,
                self.timeout_s,
                child_environment(),
            )
            self.passes += 1
            run = run_ncu(self.ncu, request)
            result.ncu_report = run.report
            self._read(result, run.report, run.seconds, ceiling, self.ncu)
        except NsightUnavailableError as exc:
            self.refused = _line(exc)
            self._note(result, self.refused)
        except (NcuPassFailed, OutputError) as exc:
            self._note(result, _line(exc))
        finally:
            taken = time.perf_counter() - begun
            self.seconds += taken
            result.phases_s["ncu"] = taken

    def _read(self, result: CellResult, report: Path, seconds: float, ceiling: Ceiling | None, ncu: Path) -> None:
        """Attach the report's counters; a report that cannot be read is a note (the report stays)."""
        try:
            attach_counters(result, report, seconds, ceiling, ncu)
        except AttnprofError as exc:
            self._note(result, f"the report could not be read: {_line(exc)}")
        except Exception as exc:  # a reader's bug must not cost the run its other rows
            self._note(result, f"the report could not be read: {one_line(exc)}")
        else:
            self.attached += 1

    def _find_ncu(self) -> Path | None:
        from attnprof.nsight import find_ncu

        try:
            return find_ncu()
        except NsightUnavailableError as exc:
            self.refused = _line(exc)
            return None

    def _note(self, result: CellResult, reason: str) -> None:
        result.ncu_note = reason
        if reason not in self.notes:
            self.notes.append(reason)

    def summary(self) -> dict[str, Any]:
        """What `--ncu` did, for the results document: the passes started, the rows with counters, the seconds
        it added, and each distinct reason a row has none."""
        return {
            "passes": self.passes,
            "with_counters": self.attached,
            "seconds": round(self.seconds, 1),
            "notes": list(self.notes),
        }


def _line(exc: AttnprofError) -> str:
    """The error's message and its hint, as one line."""
    return exc.message + (f"; {exc.hint}" if exc.hint else "")


def report_path(trace: Path) -> Path:
    """`traces/NAME.ncu-rep` beside the cell's trace `traces/NAME.json.gz`."""
    return trace.with_name(trace.name.removesuffix(".gz").removesuffix(".json") + REPORT_SUFFIX)


def child_environment() -> dict[str, str]:
    """This process's environment, with the folder this attnprof is imported from first on PYTHONPATH, so the
    child runs the same code."""
    import attnprof

    root = str(Path(attnprof.__file__).resolve().parents[1])
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return dict(os.environ) | {"PYTHONPATH": os.pathsep.join(paths)}
