"""What a measurement holds while it runs: `CellResult`, one class for both subjects, a cell (one variant
at one `registry.RunSpec`) and a row of `attnprof model` (one attention implementation inside a whole model,
`model_spec.ModelSpec`): status, timing, the trace analysis, memory, clock, speed-up, counters, the judge's
findings, and the checks its subject has. Speed-ups are computed here for both (`attach_speedups`).

`pipeline.rows` makes the one typed `results.schema.Row` of it when the measurement ends. A missing
measurement is None, never 0.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from attnprof.model_spec import ModelSpec
from attnprof.registry import FP8_DTYPES, RunSpec
from attnprof.results.parts import MaskAlternative

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis
    from attnprof.analysis.counters import CellCounters
    from attnprof.analysis.findings import Finding, Verdict
    from attnprof.analysis.findings.registry import Timed
    from attnprof.pipeline.fixes import FixTiming
    from attnprof.profiling.clocks import ClockWindow
    from attnprof.profiling.correctness import Check, LogitsDiff
    from attnprof.profiling.gradcheck import GradCheck
    from attnprof.profiling.timing import Timing

Status = Literal["ok", "skipped", "failed"]


@dataclass(frozen=True)
class Throughput:
    """Achieved rates of one latency against the device's measured ceilings.

    `pct_of_peak` is None when there is no ceiling; `pct_of_peak_note` then says why in one line.
    `pct_of_read_bandwidth` is achieved_gbps over the measured read bandwidth (`peak_read_gbps`); an
    achieved figure above a ceiling takes its place (100%); `bound` compares the arithmetic intensity
    with the ridge point, the matmul ceiling over the read bandwidth. The row made of it divides by the
    references of `pipeline.references` (the best of the ceilings and the achieved figures).
    """

    tflops: float
    pct_of_peak: float | None
    peak_tflops: float | None
    achieved_gbps: float
    bound: str | None  # "compute" or "memory"; None without both ceilings
    pct_of_peak_note: str | None = None
    bytes_moved: float | None = None  # what achieved_gbps divides by (analysis.roofline.bytes_moved)
    pct_of_read_bandwidth: float | None = None  # never above 100; None without a read ceiling
    peak_read_gbps: float | None = None  # the measured read bandwidth (profiling.ceiling), GB/s


@dataclass(frozen=True)
class Placement:
    """Where a cell ran in a torchrun group: its rank, its local rank on the node, the group's size,
    the host, and the GPU (`name #index (uuid)`; None on CPU)."""

    rank: int
    local_rank: int
    world_size: int
    hostname: str
    gpu: str | None


@dataclass
class CellResult:
    """What one measurement holds while it runs, whichever its `subject`: a cell (`RunSpec`: one variant at
    one spec) or a row of `attnprof model` (`ModelSpec`: one attention implementation inside a whole model
    at one seq and mode; `variant` is the implementation as the user named it, `source` where it came from).

    `status` is ok, skipped or failed; `reason` says why not ok. Parts are None when they were not measured:
    `timing` and `memory_mib` with `--no-timing`, `clock` without nvidia-smi, `analysis` when no trace was
    analysed, `counters` without `--ncu` (or when Nsight Compute could not measure it; `ncu_note` then says
    why, `ncu_report` is the report its pass wrote). `speedup_reliable` is False when the speed-up rests on an
    unstable or contended latency, its own or the baseline's. `retimed` counts the samples thrown away because
    they were unstable, `retimed_for_contention` those thrown away because other processes held the CPU
    (`timing` is the last one); `uncalm_wait_s` the seconds waited for a calm CPU that did not come.

    What is checked depends on the subject: a cell's `check` (None when the cell failed before its output
    existed) and `grad_check` (outside the backward modes and when no gradients existed: None), a model
    row's `logits` against the baseline implementation's (None for the baseline itself and when either is
    missing). `throughput` is None without timing or a ceiling (always, for a model row), as are the other
    parts only a cell has (its dense mask, backend, placement, the mask alternatives measured beside it).
    """

    variant: str
    source: str
    subject: RunSpec | ModelSpec
    _: KW_ONLY
    status: Status = "ok"
    reason: str | None = None
    timing: Timing | None = None
    analysis: TraceAnalysis | None = None
    memory_mib: float | None = None
    clock: ClockWindow | None = None
    speedup_vs_baseline: float | None = None
    speedup_reliable: bool | None = None
    speedup_vs_dtype: str | None = None  # the baseline row's dtype where it is not the row's (fp8 against bf16)
    trace_path: Path | None = None
    timing_window: tuple[float, float] | None = None  # wall time (time.time) of the timed calls
    phases_s: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # Python warnings (and library logs) raised, one line each
    native_stderr: list[str] = field(default_factory=list)  # what the profiler's native code printed
    counters: CellCounters | None = None  # hardware counters from Nsight Compute (--ncu); None without
    ncu_report: Path | None = None  # --ncu: the Nsight Compute report of the step, beside its trace
    ncu_note: str | None = None  # --ncu: why there are no counters (one line); None when there are
    retimed: int = 0
    retimed_for_contention: int = 0
    uncalm_wait_s: float = 0.0
    check: Check | None = None
    grad_check: GradCheck | None = None
    logits: LogitsDiff | None = None
    nan_on_fully_masked: bool | None = None
    dense_mask: bool | None = None  # the variant took the mask as a dense tensor (None: not run)
    executed_flops: float | None = None  # what a block-sparse kernel's tiles compute (None: dense, not told)
    executed_convention: str | None = None  # how executed_flops was counted (analysis.roofline)
    throughput: Throughput | None = None
    backend: str | None = None
    key_averages_table: str | None = None
    placement: Placement | None = None  # rank, host and GPU in a torchrun group; None in one process
    mask_alternatives: list[MaskAlternative] = field(default_factory=list)  # measured for its dense-mask finding
    fp8_scaling: str | None = None  # an fp8 cell's variant's `Variant.fp8_scaling`
    output_dtype: str | None = None  # an fp8 cell's output dtype (`Variant.fp8_output`)
    quantize_s: float | None = None  # an fp8 cell's quantization of q, k and v, median (`profiling.fp8`)
    by_design: frozenset[str] = frozenset()  # the finding ids its variant shows on purpose (`Variant.by_design`)
    working_set_bytes: int | None = None  # a CUDA cell's inputs, one copy (`profiling.steps.Step.input_bytes`)
    fixes: FixTiming | None = None  # the fixes its findings propose, timed at its trace's shapes (`pipeline.fixes`)

    @property
    def spec(self) -> RunSpec:
        """The cell's spec; TypeError for a model row (whose subject is a `ModelSpec`, `model`)."""
        if not isinstance(self.subject, RunSpec):
            raise TypeError(f"{self.label} is a model row, not a cell")
        return self.subject

    @property
    def model(self) -> ModelSpec:
        """The model row's subject; TypeError for a cell (whose subject is its `spec`)."""
        if not isinstance(self.subject, ModelSpec):
            raise TypeError(f"{self.variant} at {self.subject.cell_label} is a cell, not a model row")
        return self.subject

    @property
    def label(self) -> str:
        """`sdpa @ seq 2048 fwd` for a model row, `sdpa @ 1x8x1024x64` for a cell: for progress lines."""
        if isinstance(self.subject, ModelSpec):
            return self.subject.label(self.variant)
        return f"{self.variant} @ {self.subject.cell_label}"

    @property
    def ok(self) -> bool:
        """True when it ran to the end (and, for a cell, passed its checks)."""
        return self.status == "ok"

    @property
    def latency_us(self) -> float | None:
        """The median latency outside the profiler, or None when not timed."""
        return self.timing.median_us if self.timing else None

    def verdict(self) -> Verdict:
        """What the judge reads of it (see `row_verdict`), with its variant's `by_design` ids, the unit of its
        mode (a backward or training step's instance is a step) and the dense mask's alternatives measured
        beside it."""
        unit = "step" if self.subject.backward else "forward"
        return row_verdict(self, unit, self.by_design, self.mask_alternatives)

    @property
    def findings(self) -> list[Finding]:
        """Its final findings: what the judge (`analysis.findings.judge`) makes of its `verdict`."""
        from attnprof.analysis.findings import judge

        return judge(self.verdict())

    @property
    def gpu_health_note(self) -> str | None:
        """Why a CUDA timing that was to sample the GPU through NVML has no samples (one line); None otherwise."""
        return self.timing.gpu_health_note if self.timing is not None else None

    @property
    def passed(self) -> bool | None:
        """Whether the output (and, in the backward modes, the gradients) matched float64; None unchecked."""
        checks = [c for c in (self.check, self.grad_check) if c is not None]
        return all(c.passed for c in checks) if checks else None

    @property
    def kernel_tflops(self) -> float | None:
        """A cell's FLOPs (those of `throughput.tflops`) over the attention calls' device time per step
        in the trace, TFLOP/s (`analysis.roofline.kernel_tflops`); None without an analysis, device time
        or attention call, and for a model row. `throughput.tflops` is by latency, which includes host
        launch time."""
        from attnprof.analysis.roofline import kernel_tflops

        if not isinstance(self.subject, RunSpec) or self.analysis is None:
            return None
        return kernel_tflops(self.subject, self.analysis.attention)


def row_verdict(
    result: CellResult,
    unit: str,
    by_design: frozenset[str] = frozenset(),
    alternatives: list[MaskAlternative] | None = None,
) -> Verdict:
    """What the judge reads of a row: its trace's findings and kernels, its latency timed without the
    profiler against the device time per instance under it, how that latency was timed (`timed`), its
    counters (`Counted.of`) and the GPU's health over its timed calls (NVML). A model row is judged against the
    shipped table of the best known rates by shape (`analysis.attainable`); a cell against its run's fastest
    variant, after the run (`pipeline.best_known`)."""
    from attnprof.analysis.findings import Counted, Verdict
    from attnprof.analysis.findings.registry import host_device_of

    analysis = result.analysis
    kernels = analysis.kernels if analysis is not None else []
    against: dict[str, Any] = {}
    if analysis is not None and isinstance(result.subject, ModelSpec):
        from attnprof.analysis.attainable import table_reference
        from attnprof.analysis.findings.attainable import attainable_facts

        gpu = analysis.device.get("name") if analysis.device else None
        against = attainable_facts(gpu, analysis.attention, analysis.input_dtype, table_reference)
    return Verdict(
        findings=analysis.findings if analysis is not None else [],
        kernels=kernels,
        by_design=by_design,
        latency_us=result.latency_us,
        gpu_time_us=analysis.gpu_time_us if analysis is not None else None,
        unit=unit,
        alternatives=alternatives or [],
        counters=Counted.of(result.counters, kernels) if result.counters is not None else None,
        gpu_health=result.timing.gpu_health if result.timing is not None else None,
        timed=timed(result),
        host_device=host_device_of(analysis.per_forward) if analysis is not None else None,
        **against,
        timed_fixes=result.fixes.timed if result.fixes is not None else (),
        untimed_fixes=result.fixes.untimed if result.fixes is not None else (),
    )


def timed(result: CellResult) -> Timed | None:
    """How the result's latency was timed, as far as the machine's load goes (None: not timed)."""
    from attnprof.analysis.findings.registry import Timed
    from attnprof.profiling.contention import CONTENTION_LIMIT

    timing = result.timing
    if timing is None:
        return None
    return Timed(
        timing.cpu_contention,
        CONTENTION_LIMIT,
        timing.quantized_tick_ms,
        timing.contended,
        result.retimed_for_contention,
        result.uncalm_wait_s,
    )


SPEED_KEYS = ("latency_us", "gpu_time_us", "cpu_time_us")


@dataclass(frozen=True)
class SpeedCell:
    """What a speed-up needs of one row: its variant, what it is matched by (`speed_key`), whether it is ok,
    its times by `SPEED_KEYS` name (positive or None) and whether its latency is unreliable (`unstable`:
    unstable, or timed while other processes held the CPU)."""

    variant: str
    key: tuple[Any, ...]
    ok: bool
    times: dict[str, float | None]
    unstable: bool
    dtype: str | None = None  # a cell's (its key's second field); None for a model row


def speed_time(result: CellResult, key: str) -> float | None:
    """The result's `latency_us`, `gpu_time_us` or `cpu_time_us`, when known and positive."""
    if key == "latency_us":
        value = result.latency_us
    else:
        value = getattr(result.analysis, key, None) if result.analysis else None
    return float(value) if value is not None and value > 0 else None


def speed_basis(result: CellResult) -> tuple[str, float] | None:
    """The time a speed-up is computed from: clean latency, else profiler GPU time, else CPU time."""
    return _basis(_speed_cell(result))


def _basis(cell: SpeedCell) -> tuple[str, float] | None:
    for key in SPEED_KEYS:
        value = cell.times.get(key)
        if value is not None:
            return key, value
    return None


def unstable(result: CellResult) -> bool:
    """True when the result's latency was timed and its sample is unstable (IQR over 10% of the median) or
    contended (`Timing.contended`): a speed-up from it is unreliable."""
    return result.timing is not None and (result.timing.unstable or result.timing.contended)


def speed_key(subject: RunSpec | ModelSpec) -> tuple[Any, ...]:
    """What a row's speed-up matches against the baseline's: a cell by `RunSpec.cell_key` (so results of one
    cell on two ranks' GPUs compare), a model row by its seq and mode (`ModelSpec.speed_key`)."""
    return subject.speed_key if isinstance(subject, ModelSpec) else subject.cell_key


def _speed_cell(result: CellResult) -> SpeedCell:
    times = {key: speed_time(result, key) for key in SPEED_KEYS}
    dtype = result.subject.dtype if isinstance(result.subject, RunSpec) else None
    return SpeedCell(result.variant, speed_key(result.subject), result.ok, times, unstable(result), dtype)


def speedups(cells: list[SpeedCell], baseline: str | None) -> list[tuple[float, bool, str | None] | None]:
    """For each cell, (baseline time / its time, reliable, the baseline's dtype where it is not the cell's) against
    the ok baseline row of the same cell, or None. An fp8 cell without one (a baseline that runs no fp8) is
    compared with the baseline's row at the same point in its other dtype (bf16, say): what FP8 buys over it.
    The time is the baseline's basis (latency, else GPU time, else CPU time); `reliable` is False when it is
    computed from latencies and either one is unstable or contended (the baseline's own 1.00x is exact)."""
    found: list[tuple[float, bool, str | None] | None] = [None] * len(cells)
    if not baseline:
        return found
    bases = [base for base in cells if base.variant == baseline and base.ok and _basis(base) is not None]
    for base in bases:
        for i, cell in enumerate(cells):
            if cell.key == base.key and (speedup := _against(base, cell)) is not None:
                found[i] = speedup
    for i, cell in enumerate(cells):
        if found[i] is None and cell.dtype in FP8_DTYPES:
            other = [b for b in bases if b.dtype not in FP8_DTYPES and _without_dtype(b) == _without_dtype(cell)]
            found[i] = _against(other[0], cell, other[0].dtype) if other else None
    return found


def _without_dtype(cell: SpeedCell) -> tuple[Any, ...]:
    return cell.key[:1] + cell.key[2:]


def _against(base: SpeedCell, cell: SpeedCell, dtype: str | None = None) -> tuple[float, bool, str | None] | None:
    """`cell`'s speed-up over `base` on the baseline's basis; None where `cell` has no time of that kind."""
    basis = _basis(base)
    assert basis is not None
    key, base_time = basis
    mine = cell.times.get(key) if cell.ok else None
    if mine is None:
        return None
    shaky = key == "latency_us" and cell is not base and (base.unstable or cell.unstable)
    return base_time / mine, not shaky, dtype


def attach_speedups(results: list[CellResult], baseline: str | None) -> None:
    """Set `speedup_vs_baseline` and `speedup_reliable` on the results, cells or model rows (see `speedups`),
    each matched with the baseline's row by `speed_key`."""
    for result, found in zip(results, speedups([_speed_cell(r) for r in results], baseline), strict=True):
        if found is not None:
            result.speedup_vs_baseline, result.speedup_reliable, result.speedup_vs_dtype = found
