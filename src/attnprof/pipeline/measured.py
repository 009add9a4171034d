"""What a measurement holds while it runs: `Measured`, the parts every row has (status, timing, the trace
analysis, memory, clock, speed-up, counters, the judge's findings), and its two subjects, `CellResult` (one
variant at one `RunSpec`) and `ModelResult` (one attention implementation inside a whole model).

`pipeline.rows` makes the one typed `results.schema.Row` of either when the measurement ends. A missing
measurement is None, never 0.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from attnprof.registry import RunSpec
from attnprof.results.parts import MaskAlternative

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis
    from attnprof.analysis.counters import CellCounters
    from attnprof.analysis.findings import Finding, Verdict
    from attnprof.profiling.clocks import ClockWindow
    from attnprof.profiling.correctness import Check, LogitsDiff
    from attnprof.profiling.gradcheck import GradCheck
    from attnprof.profiling.timing import Timing

Status = Literal["ok", "skipped", "failed"]


@dataclass(frozen=True)
class Throughput:
    """Achieved rates of one latency against the device's measured ceilings.

    `pct_of_peak` is None when there is no ceiling or the latency beat it; `pct_of_peak_note`
    then says why in one line. `pct_of_read_bandwidth` is achieved_gbps over the measured read
    bandwidth (`peak_read_gbps`), or over achieved_gbps itself when that is higher (100, and
    `read_bandwidth_note` says so); `bound` compares the arithmetic intensity with the ridge point,
    the matmul ceiling over the read bandwidth.
    """

    tflops: float
    pct_of_peak: float | None
    peak_tflops: float | None
    achieved_gbps: float
    bound: str | None  # "compute" or "memory"; None without both ceilings or above the matmul ceiling
    pct_of_peak_note: str | None = None
    bytes_moved: float | None = None  # what achieved_gbps divides by (analysis.roofline.bytes_moved)
    pct_of_read_bandwidth: float | None = None  # never above 100; None without a read ceiling
    peak_read_gbps: float | None = None  # the measured read bandwidth (profiling.ceiling), GB/s
    read_bandwidth_note: str | None = None  # set when achieved_gbps beat the measured read bandwidth


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
class Measured:
    """What a cell and a model row both hold. `status` is ok, skipped or failed; `reason` says why not ok.
    Parts are None when they were not measured: `timing` and `memory_mib` with `--no-timing`, `clock` without
    nvidia-smi, `analysis` when no trace was analysed, `counters` without `--ncu` (or when Nsight Compute
    could not measure it; `ncu_note` then says why, `ncu_report` is the report its pass wrote).
    `speedup_reliable` is False when the speed-up rests on an unstable latency, its own or the baseline's."""

    variant: str
    source: str
    _: KW_ONLY
    status: Status = "ok"
    reason: str | None = None
    timing: Timing | None = None
    analysis: TraceAnalysis | None = None
    memory_mib: float | None = None
    clock: ClockWindow | None = None
    speedup_vs_baseline: float | None = None
    speedup_reliable: bool | None = None
    trace_path: Path | None = None
    timing_window: tuple[float, float] | None = None  # wall time (time.time) of the timed calls
    phases_s: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # Python warnings (and library logs) raised, one line each
    native_stderr: list[str] = field(default_factory=list)  # what the profiler's native code printed
    counters: CellCounters | None = None  # hardware counters from Nsight Compute (--ncu); None without
    ncu_report: Path | None = None  # --ncu: the Nsight Compute report of the step, beside its trace
    ncu_note: str | None = None  # --ncu: why there are no counters (one line); None when there are

    @property
    def ok(self) -> bool:
        """True when it ran to the end (and, for a cell, passed its checks)."""
        return self.status == "ok"

    @property
    def latency_us(self) -> float | None:
        """The median latency outside the profiler, or None when not timed."""
        return self.timing.median_us if self.timing else None

    def verdict(self) -> Verdict:
        """What the judge reads of it (`row_verdict`)."""
        raise NotImplementedError

    @property
    def findings(self) -> list[Finding]:
        """Its final findings: what the judge (`analysis.findings.judge`) makes of its `verdict`."""
        from attnprof.analysis.findings import judge

        return judge(self.verdict())


@dataclass
class CellResult(Measured):
    """The outcome of one variant at one spec (see `Measured` for what every row holds).

    `check` is None when the cell failed before its output existed, `grad_check` outside the backward modes
    (`spec.mode` bwd and fwd+bwd) and when no gradients existed, `throughput` without timing or a ceiling.
    `retimed` counts the samples thrown away because they were unstable (`timing` is the last one).
    """

    spec: RunSpec
    _: KW_ONLY
    check: Check | None = None
    grad_check: GradCheck | None = None
    nan_on_fully_masked: bool | None = None
    dense_mask: bool | None = None  # the variant took the mask as a dense tensor (None: not run)
    executed_flops: float | None = None  # what a block-sparse kernel's tiles compute (None: dense, not told)
    throughput: Throughput | None = None
    backend: str | None = None
    retimed: int = 0
    key_averages_table: str | None = None
    placement: Placement | None = None  # rank, host and GPU in a torchrun group; None in one process
    mask_alternatives: list[MaskAlternative] = field(default_factory=list)  # measured for its dense-mask finding
    by_design: frozenset[str] = frozenset()  # the finding ids its variant shows on purpose (`Variant.by_design`)

    def verdict(self) -> Verdict:
        """What the judge reads of the cell (see `row_verdict`), with its variant's `by_design` ids, the unit
        of its mode and the dense mask's alternatives measured beside it."""
        unit = "step" if self.spec.backward else "forward"
        return row_verdict(self, unit, self.by_design, self.mask_alternatives)

    @property
    def passed(self) -> bool | None:
        """Whether the output (and, in the backward modes, the gradients) matched float64; None unchecked."""
        checks = [c for c in (self.check, self.grad_check) if c is not None]
        return all(c.passed for c in checks) if checks else None

    @property
    def kernel_tflops(self) -> float | None:
        """The step's FLOPs (those of `throughput.tflops`) over the attention calls' device time per step
        in the trace, TFLOP/s (`analysis.roofline.kernel_tflops`); None without an analysis, device time
        or attention call. `throughput.tflops` is by latency, which includes host launch time."""
        from attnprof.analysis.roofline import kernel_tflops

        return kernel_tflops(self.spec, self.analysis.attention) if self.analysis is not None else None

    @property
    def kernel_pct_of_peak(self) -> float | None:
        """`kernel_tflops` in percent of the ceiling `throughput` used; None without either, and, as for
        `throughput.pct_of_peak`, when the kernels beat the ceiling (over 100% is impossible)."""
        rate, peak = self.kernel_tflops, self.throughput.peak_tflops if self.throughput else None
        return None if rate is None or not peak or rate > peak else 100.0 * rate / peak


def row_verdict(
    result: Measured,
    unit: str,
    by_design: frozenset[str] = frozenset(),
    alternatives: list[MaskAlternative] | None = None,
) -> Verdict:
    """What the judge reads of a row: its trace's findings and kernels, its latency timed without the
    profiler against the device time per instance under it, and its counters (`Counted.of`)."""
    from attnprof.analysis.findings import Counted, Verdict

    analysis = result.analysis
    kernels = analysis.kernels if analysis is not None else []
    return Verdict(
        findings=analysis.findings if analysis is not None else [],
        kernels=kernels,
        by_design=by_design,
        latency_us=result.latency_us,
        gpu_time_us=analysis.gpu_time_us if analysis is not None else None,
        unit=unit,
        alternatives=alternatives or [],
        counters=Counted.of(result.counters, kernels) if result.counters is not None else None,
    )


SPEED_KEYS = ("latency_us", "gpu_time_us", "cpu_time_us")


@dataclass(frozen=True)
class SpeedCell:
    """What a speed-up needs of one row: its variant, cell (`RunSpec.cell_key`), whether it is ok,
    its times by `SPEED_KEYS` name (positive or None) and whether its latency is unstable."""

    variant: str
    key: tuple[Any, ...]
    ok: bool
    times: dict[str, float | None]
    unstable: bool


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


def unstable(result: Measured) -> bool:
    """True when the result's latency was timed and its sample is unstable (IQR over 10% of the median)."""
    return result.timing is not None and result.timing.unstable


def _speed_cell(result: CellResult) -> SpeedCell:
    times = {key: speed_time(result, key) for key in SPEED_KEYS}
    return SpeedCell(result.variant, result.spec.cell_key, result.ok, times, unstable(result))


def speedups(cells: list[SpeedCell], baseline: str | None) -> list[tuple[float, bool] | None]:
    """For each cell, (baseline time / its time, reliable) against the ok baseline row of the same
    cell, or None. The time is the baseline's basis (latency, else GPU time, else CPU time);
    `reliable` is False when it is computed from latencies and either one is unstable (the
    baseline's own 1.00x is exact)."""
    found: list[tuple[float, bool] | None] = [None] * len(cells)
    if not baseline:
        return found
    for base in cells:
        basis = _basis(base) if base.variant == baseline and base.ok else None
        if basis is None:
            continue
        key, base_time = basis
        for i, cell in enumerate(cells):
            mine = cell.times.get(key) if cell.key == base.key and cell.ok else None
            if mine is not None:
                shaky = key == "latency_us" and cell is not base and (base.unstable or cell.unstable)
                found[i] = (base_time / mine, not shaky)
    return found


def attach_speedups(results: list[CellResult], baseline: str | None) -> None:
    """Set `speedup_vs_baseline` and `speedup_reliable` on the results (see `speedups`); cells are
    matched by `RunSpec.cell_key`, so results of one cell on two ranks' GPUs compare."""
    for result, found in zip(results, speedups([_speed_cell(r) for r in results], baseline), strict=True):
        if found is not None:
            result.speedup_vs_baseline, result.speedup_reliable = found


@dataclass
class ModelResult(Measured):
    """One row of `attnprof model`: one attention implementation inside a whole model, at one seq and mode
    (see `Measured` for what every row holds).

    `variant` is the implementation as the user named it, `implementation` what the model was given
    (`attnprof:NAME` for an attnprof variant; None for a model profiled as built). `seq` is None for a
    factory model whose inputs the factory chose; `heads`, `kv_heads` and `head_dim` are None where the
    model does not state them. `logits` compares the logits with the baseline implementation's (None
    for the baseline itself and when either is missing).
    """

    implementation: str | None
    model: str
    batch: int
    seq: int | None
    mode: str
    dtype: str
    device: str
    _: KW_ONLY
    params: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    causal: bool | None = None
    mask: str | None = None  # the mask every attention implementation ran (None: the model's own, unknown)
    score_mod: str | None = None
    logits: LogitsDiff | None = None

    def verdict(self) -> Verdict:
        """What the judge reads of the row (see `row_verdict`); a training step's instance is a step."""
        return row_verdict(self, "forward" if self.mode == "fwd" else "step")

    @property
    def shape(self) -> str | None:
        """The attention shape as `compare` labels it, `BxHxSxD` (`/kvN` with GQA, then a sized mask and a score
        mod: `... sw64 softcap30`), when the model states its heads; `BxS` otherwise; None for a factory model
        whose inputs the factory chose."""
        if self.seq is None:
            return None
        if self.heads is None or self.head_dim is None:
            return f"{self.batch}x{self.seq}"
        spec = RunSpec(
            "cpu",
            self.dtype,
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            self.kv_heads,
            causal=self.causal is not False,
            mask=self.mask,
            score_mod=self.score_mod,
        )
        return spec.shape_label

    @property
    def label(self) -> str:
        """`sdpa @ seq 2048 fwd`: the implementation, the seq (when known) and the mode, for progress lines."""
        seq = f" @ seq {self.seq}" if self.seq is not None else ""
        return f"{self.variant}{seq} {self.mode}"


def attach_model_speedups(results: list[ModelResult], baseline: str) -> None:
    """Set `speedup_vs_baseline` = the baseline's latency / the row's, between ok rows of the same seq and
    mode, and `speedup_reliable` (False when either latency is unstable; the baseline's own 1.00x is exact)."""
    for base in results:
        if base.variant != baseline or not base.ok or not base.latency_us:
            continue
        for result in results:
            if result.ok and result.latency_us and (result.seq, result.mode) == (base.seq, base.mode):
                result.speedup_vs_baseline = base.latency_us / result.latency_us
                shaky = result is not base and (unstable(base) or unstable(result))
                result.speedup_reliable = not shaky
