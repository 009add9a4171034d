"""What every run of cells needs: plan the cells (variants, specs, names checked), make the run's own
folder, run a list of cells with the SM clock sampled alongside (`run_cells`), and the outcome; the
engine that runs a whole job through these is `pipeline.engine`.

Each invocation writes into its own folder, `<output_dir>/<YYYYmmdd-HHMMSS>-<command>/` (`-2`, `-3`,
... when a parallel invocation took the name): `results.json`, `results.csv` and `traces/`. Ctrl-C before
any row finished removes the folder again (`RunFolder.discard`): no 0-row results file is left behind.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnprof.config import Config, MeasureOptions
from attnprof.errors import ConfigError, NothingFinishedError, OutputError
from attnprof.files import unique_dir
from attnprof.interrupts import (
    interrupt_requested,
    raise_if_interrupted,
    recording_interrupts,
)
from attnprof.pipeline.cell import ran_out_of_memory, rethroughput, run_cell
from attnprof.pipeline.measured import CellResult, attach_speedups
from attnprof.registry import RunSpec, Variant
from attnprof.results.schema import Document, Row
from attnprof.variant_registry import Registry

if TYPE_CHECKING:
    from attnprof.pipeline.counters import CounterCollector
    from attnprof.pipeline.distributed import Group
    from attnprof.pipeline.mask_alternatives import Alternatives
    from attnprof.profiling.ceiling import Ceiling, RunCeiling

Cell = tuple[Variant, RunSpec]


@dataclass(frozen=True)
class RunFolder:
    """One invocation's own folder and the paths in it."""

    dir: Path

    @property
    def results_json(self) -> Path:
        """The results document."""
        return self.dir / "results.json"

    @property
    def results_csv(self) -> Path:
        """One CSV row per cell."""
        return self.dir / "results.csv"

    @property
    def traces(self) -> Path:
        """The folder of Chrome traces, one per profiled cell."""
        return self.dir / "traces"

    def discard(self) -> NothingFinishedError:
        """Remove the folder (this invocation made it) when Ctrl-C came before any row finished, so no
        0-row results file or empty folder is left for `--resume` or `report` to trip on; the error to raise."""
        shutil.rmtree(self.dir, ignore_errors=True)
        return NothingFinishedError("interrupted before any cell finished: nothing written")

    def to_dict(self) -> dict[str, str]:
        """The paths as the results document's `files` names them."""
        return {
            "dir": str(self.dir),
            "results_json": str(self.results_json),
            "results_csv": str(self.results_csv),
            "traces": str(self.traces),
        }


@dataclass
class RunOutcome:
    """What a run produced: its results (cells, or the rows of `attnprof model`), the JSON document, its
    folder, and whether Ctrl-C cut it short."""

    command: str
    results: list[CellResult]
    document: Document
    folder: RunFolder
    interrupted: bool

    @property
    def files(self) -> tuple[Path, Path]:
        """The JSON and CSV results files."""
        return self.folder.results_json, self.folder.results_csv

    @property
    def traces(self) -> list[Path]:
        """The traces of the document's rows (on several ranks: every rank's)."""
        return [Path(row.trace) for row in self.document.results if row.trace]

    @property
    def exit_code(self) -> int:
        """130 after Ctrl-C, 1 if any row of the document failed, else 0 (a skipped one is not a failure)."""
        return rows_exit_code(self.document.results, self.interrupted)


def rows_exit_code(rows: list[Row], interrupted: bool, out_of_memory_fails: bool = True) -> int:
    """130 after Ctrl-C; 1 when a row failed (with `out_of_memory_fails` False, as in a sweep: for another
    reason than running out of memory); else 0 (a skipped cell is not a failure)."""
    if interrupted:
        return 130
    failed = [row for row in rows if row.status.startswith("failed")]
    if not out_of_memory_fails:
        failed = [row for row in failed if not ran_out_of_memory(row.status, row.reason)]
    return 1 if failed else 0


def resolve_config(config: Config, device: str) -> Config:
    """`config` for the resolved `device`, with `dtype: auto` made concrete (`devices.resolve_dtype`).
    Done once, before cell specs, the ceiling, the tables or the results document see the config."""
    from attnprof.devices import resolve_dtype

    dtype = resolve_dtype(config.dtype, device)
    return config if dtype == config.dtype else config.model_copy(update={"dtype": dtype})


def cell_specs(config: Config, device: str) -> list[RunSpec]:
    """One RunSpec per configured shape and mode (shape-major), on the resolved device, with the
    config's dtype (resolve `dtype: auto` first: `resolve_config`)."""
    return [
        shape.spec(device, config.dtype, config.causal, mode, config.mask, config.score_mod, config.kv_cache)
        for shape in config.shapes
        for mode in config.modes
    ]


def plan_cells(config: Config, variants: list[Variant], device: str) -> list[Cell]:
    """Every shape × mode × variant, spec-major so each comparison table fills in turn. ConfigError for
    a config that declares sweep axes: those are `attnprof sweep`'s (`pipeline.sweep.plan_sweep`)."""
    if config.sweep is not None and config.sweep.axes():
        raise ConfigError(
            f"the config declares sweep axes ({', '.join(config.sweep.axes())})",
            hint="run it with `attnprof sweep`",
        )
    return [(variant, spec) for spec in cell_specs(config, device) for variant in variants]


def check_baseline(config: Config, registry: Registry) -> None:
    """UnknownVariantError, with the registry's close-match hint, for a baseline no variant has. (A
    registered baseline that the selection leaves out is the caller's to mention.)"""
    if config.baseline is not None:
        registry.get(config.baseline, role="baseline")


def check_names(config: Config, registry: Registry) -> None:
    """Every name the config gives must be registered: include patterns, exclude patterns (for every
    device) and the baseline; otherwise UnknownVariantError with the registry's close-match hint."""
    registry.check_patterns(config.variants + [p for entry in config.exclude for p in entry.variants])
    check_baseline(config, registry)


def select_variants(config: Config, registry: Registry, device: str) -> list[Variant]:
    """The config's include patterns minus the exclude entries in force on the resolved `device`,
    after `check_names`."""
    check_names(config, registry)
    return registry.select(config.variants, [p for entry in config.exclusions(device) for p in entry.variants])


def without_collective(config: Config, variants: list[Variant], grouped: bool) -> list[Variant]:
    """Outside a torchrun group, the collective variants (`Variant.collective`) that only a wildcard chose
    are left out: they need every rank of a group, so a single-process run stays as it was. A variant
    named in full stays (its row says why it is skipped), and so do they all when nothing else is left."""
    if grouped:
        return variants
    named = {p for p in config.variants if not any(ch in p for ch in "*?[")}
    kept = [v for v in variants if not v.collective or v.name in named]
    return kept or variants


def without_unrunnable_wildcards(config: Config, variants: list[Variant]) -> list[Variant]:
    """The variants a wildcard chose that no cell of the config can run are left out: varlen-only variants
    (`Variant.varlen_only`) in a config without packed shapes (`seq_lens`), and variants of none of the config's
    dtypes (fp8-only ones in a bf16 config, say). A variant named in full stays (its row says why), and so do
    they all when nothing else is left."""
    packed = any(shape.seq_lens is not None for shape in config.shapes)
    axes = config.sweep.axes() if config.sweep else {}
    dtypes = set(axes.get("dtype", [config.dtype]))
    named = {p for p in config.variants if not any(ch in p for ch in "*?[")}

    def runs_a_cell(v: Variant) -> bool:
        return (packed or not v.varlen_only) and ("auto" in dtypes or bool(dtypes & set(v.dtypes)))

    kept = [v for v in variants if v.name in named or runs_a_cell(v)]
    return kept or variants


def config_exclusions(config: Config, registry: Registry, device: str) -> list[tuple[list[str], str | None]]:
    """What the exclude entries in force on `device` left out of the include patterns' variants: the
    names, in registration order, and the reason of each entry that left out any (a variant is named
    under the first entry that excludes it)."""
    included = registry.matching(config.variants)
    taken: set[str] = set()
    found = []
    for entry in config.exclusions(device):
        names = [n for n in registry.matching(entry.variants) if n in included and n not in taken]
        taken.update(names)
        if names:
            found.append((names, entry.reason))
    return found


def ensure_output_dir(path: Path) -> Path:
    """Create the output directory and prove it is writable, or raise OutputError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".attnprof-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write to output directory {path}: {exc.strerror or exc}") from None
    return path


def open_run_folder(output_dir: Path, command: str) -> RunFolder:
    """Create this invocation's folder, `<output_dir>/<YYYYmmdd-HHMMSS>-<command>` with `traces/` in it,
    exclusively: a name another invocation took gets `-2`, `-3`, ... OutputError when not writable."""
    ensure_output_dir(output_dir)
    folder = RunFolder(unique_dir(output_dir, f"{time.strftime('%Y%m%d-%H%M%S')}-{command}"))
    try:
        folder.traces.mkdir()
    except OSError as exc:
        raise OutputError(f"cannot write to output directory {folder.dir}: {exc.strerror or exc}") from None
    return folder


def run_cells(
    cells: list[Cell],
    config: Config,
    measure: MeasureOptions,
    ceiling: RunCeiling | None = None,
    on_start: Callable[[int, int, Variant, RunSpec], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
    trace_dir: Path | None = None,
    skip: Callable[[Variant, RunSpec], str | None] | None = None,
    group: Group | None = None,
    alternatives: Alternatives | None = None,
    counters: CounterCollector | None = None,
    on_counters: Callable[[int, int, Variant, RunSpec], None] | None = None,
) -> tuple[list[CellResult], bool]:
    """Run every cell in order; returns the results and whether Ctrl-C cut the run short.

    Ctrl-C stops at once: the cell it lands in is dropped, even when torch swallowed the interrupt
    and the cell ended some other way; the finished cells are kept. On CUDA with timing and
    clocks on, nvidia-smi samples the SM clock throughout, and each timed result gets the clock
    of its own timing window (from the samples written by then before `on_done`, from all of them
    at the end). Speed-ups against the config's baseline are set on the results at the end; so is
    every throughput again when a cell had the ceiling measured again, so all cells share one
    ceiling. Traces go into `trace_dir` (default: the config's output directory). A cell for which
    `skip` gives a reason is not run: its result is `skipped` with that reason. Under torchrun
    (`group`), a collective variant's cell starts when every rank is there, runs only when every
    rank can run it (and none skips it), and its timing's call counts are agreed by the ranks.
    A cell whose trace shows `dense-mask` has the alternatives that `alternatives` (the plan) lacks
    timed right after it, before `on_done` (`pipeline.mask_alternatives`). With `counters` (--ncu), each
    ok cell's step then runs again under Nsight Compute (`pipeline.counters`; `on_counters` is told as
    the pass starts), its counters attached before `on_done`.
    """
    results: list[CellResult] = []
    interrupted = False
    sampler = _clock_sampler(cells, measure)
    try:
        with recording_interrupts():
            try:
                for index, (variant, spec) in enumerate(cells):
                    raise_if_interrupted()  # also one recorded before the cells, and swallowed since
                    if on_start:
                        on_start(index, len(cells), variant, spec)
                    reason = skip(variant, spec) if skip else None
                    if variant.collective and group is not None:
                        result = _collective_cell(variant, spec, config, measure, ceiling, trace_dir, group, reason)
                    elif reason:
                        result = CellResult(variant.name, variant.source, spec, status="skipped", reason=reason)
                    else:
                        result = run_cell(variant, spec, config, measure, ceiling, trace_dir)
                        if alternatives is not None:
                            alternatives.measure(result, config, measure)
                        if counters is not None:
                            told = partial(on_counters, index, len(cells), variant, spec) if on_counters else None
                            counters.collect_cell(result, variant, config.seed, _current(ceiling), told)
                    if interrupt_requested():
                        raise KeyboardInterrupt
                    results.append(result)
                    if sampler is not None and result.timing_window is not None:
                        attach_clocks([result], sampler.device, sampler.samples_so_far())
                    if on_done:
                        on_done(result)
            except KeyboardInterrupt:
                interrupted = True
    finally:
        if sampler is not None:
            attach_clocks(results, sampler.device, sampler.stop())
    if ceiling is not None and ceiling.replaced is not None:
        rethroughput(results, ceiling.current)
    attach_speedups(results, config.baseline)
    return results, interrupted


def _current(ceiling: RunCeiling | None) -> Ceiling | None:
    return ceiling.current if ceiling is not None else None


def _collective_cell(
    variant: Variant,
    spec: RunSpec,
    config: Config,
    measure: MeasureOptions,
    ceiling: RunCeiling | None,
    trace_dir: Path | None,
    group: Group,
    skip_reason: str | None = None,
) -> CellResult:
    """One cell that every rank runs together: after a barrier, and only when no rank refuses it (cannot
    run it, or skips it: `skip_reason`)."""
    group.barrier()
    refused = skip_reason or variant.unavailable_reason(spec)
    if group.agree_max(int(refused is not None)):
        reason = refused or "another rank cannot run it or skips it"
        return CellResult(variant.name, variant.source, spec, status="skipped", reason=reason)
    return run_cell(variant, spec, config, measure, ceiling, trace_dir, agree=group.agree_max)


def _clock_sampler(cells: list[Cell], measure: MeasureOptions) -> Any:
    """A started ClockSampler for the first CUDA device among the cells, or None."""
    return clock_sampler(next((spec.device for _, spec in cells if spec.device_type == "cuda"), None), measure)


def clock_sampler(device: str | None, measure: MeasureOptions) -> Any:
    """A started ClockSampler on a CUDA `device` while rows are timed (not with --no-timing or --no-clocks),
    else None."""
    if device is None or not device.startswith("cuda") or not (measure.timing and measure.clocks):
        return None
    from attnprof.profiling.clocks import ClockSampler

    return ClockSampler(device).start()


def attach_clocks(results: list[CellResult], device: str, samples: list[Any]) -> None:
    """Set each timed result's `clock` on `device` from the samples inside its timing window."""
    from attnprof.profiling.clocks import clock_window

    for result in results:
        if result.timing_window is not None and result.subject.device == device:
            result.clock = clock_window(samples, [result.timing_window])
