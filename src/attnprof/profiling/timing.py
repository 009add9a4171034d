"""Wall time of one forward: a cold first call, a settling warm-up, then a time-based sample.

How a sample is taken:

* cold: the first call, synchronized and timed on its own (`cold_ms`). It holds compilation,
  autotuning and cuDNN plan building; users pay for it, so it is reported, not hidden.
* warm-up: calls until the last `warmup_reps` call times agree within `SETTLE_TOLERANCE` of
  their median (and at least `warmup_min_s` has passed), or until `warmup_s` runs out.
* repetitions: the warm-up's last call times estimate one call; reps = ceil(min_time_s /
  estimate), clamped to [min_reps, max_reps], so tiny and huge shapes both get a sound sample.
* CUDA: a pair of CUDA events around each call, calls issued back to back, one synchronize at the end. Eager
  event times include any launch gap the CPU leaves (users pay that too); `cuda_graph=True` replays a captured
  graph instead (for a cell, `--cuda-graph` decides, by default for decode: `cuda_graphs.graph_choice`, its
  reason in `graph_note`), and falls back to eager, saying so in `method`, when the variant cannot be captured.
  A captured graph is checked once (`check_graph`): one replay must launch the eager step's kernels, memsets
  and memcpys times the forwards it holds (`profiling.graph_check`), else the cell fails with the reason. One
  graph holds k back-to-back forwards, k chosen so that a replay holds about `GRAPH_TARGET_US` of GPU work (at
  most `GRAPH_MAX_FORWARDS`); a sample is one replay's time divided by k, which spreads the graph's own launch
  over k forwards (on an H200 a one-forward replay of a ~1 µs kernel measures about 17 µs between its events).
  `flush_l2=True` zeroes a buffer of at least 256 MiB (twice the L2, if larger) before each call, outside the
  events, as triton's do_bench; with a graph, each graph then holds one forward (its time includes the graph
  launch). `rotate=True` (`--cold-l2 rotate`) instead gives each call the next of c copies of the step's
  inputs (c chosen by the caller so that they exceed 5x the L2): eager samples cycle through them, and a graph
  holds a multiple of c forwards, forward j over copy j mod c. `l2_state`: warm, flushed or rotated.
* CUDA, `gpu_health`: NVML samples the GPU (SM clock, power, temperature, throttle reasons) on a background
  thread from just before the first timed launch to the synchronize after the last (`profiling.gpu_health`).
* CPU: `time.perf_counter` around each call; no L2 flush and no graphs.
* `agree`: processes that run one forward together (a collective variant under torchrun) must call it the same
  number of times. `agree(n)` returns the largest `n` of all of them: the warm-up goes on until every process
  is done, the repetitions are the most any process asks for, and no CUDA graph is captured.

`cpu_contention`: the share of the machine's CPU that other processes took while the forward was timed,
cold call, warm-up and repetitions (`profiling.contention`; None off Linux or for a window under 50 ms).
`quantized_tick_ms`: the scheduler tick the samples sit on multiples of (`contention.scheduler_tick_ms`),
None when they do not. A timing is `contended` when either says so: it measured the other processes too
(`pipeline.stages` times it again once the CPU is calm, `retime.contention_note` says what became of it).

Statistics (attnprof.stats): median, 25th/75th percentiles (linear interpolation) and IQR. A timing is `unstable`
when IQR / median > `UNSTABLE_IQR_RATIO` (10 %). Its `drift` is how far the median moved between the first and
second half of the sample (call order), as a fraction of the median: an unstable sample is worth taking again
(`retime.worth_retiming`) only when it drifted by more than `RETIME_DRIFT` (5 %); one that did not drift has the spread
of the forward itself (a host-bound launch loop jitters on every call), which a second sample would repeat.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnprof.errors import one_line
from attnprof.profiling.contention import CpuShare, is_contended, scheduler_tick_ms
from attnprof.profiling.cuda_graphs import (
    event_samples,
    event_time_s,
    graph_choice,
    graphed,
    l2_cache_bytes,
    recover_from_failed_capture,
    rotation_note,
)
from attnprof.profiling.gpu_health import GpuHealth, watching
from attnprof.profiling.memory import oom_guard
from attnprof.stats import median, quantile

if TYPE_CHECKING:
    from attnprof.config import MeasureOptions
    from attnprof.registry import RunSpec

UNSTABLE_IQR_RATIO = 0.10
RETIME_DRIFT = 0.05
SETTLE_TOLERANCE = 0.10


@dataclass(frozen=True)
class Timing:
    """One forward's timing sample, in microseconds except `cold_ms`."""

    median_us: float
    iqr_us: float
    p25_us: float
    p75_us: float
    min_us: float
    reps: int
    warmup_reps: int
    cold_ms: float
    unstable: bool
    method: str
    cuda_graph: bool = False
    flush_l2: bool = False
    forwards_per_sample: int = 1
    drift: float = 0.0
    cpu_contention: float | None = None  # the share of the machine's CPU other processes took (profiling.contention)
    l2_state: str | None = None  # "warm", "flushed" or "rotated" (CUDA); None on a CPU
    l2_bytes: int | None = None  # the GPU's L2 cache size; None on a CPU or when the device does not say
    gpu_health: GpuHealth | None = None  # the GPU over the timed calls (NVML, profiling.gpu_health); None: not sampled
    gpu_health_note: str | None = None  # why a CUDA timing asked to sample the GPU has no gpu_health (one line)
    quantized_tick_ms: float | None = None  # the scheduler tick the samples sit on multiples of; None: they do not

    @property
    def contended(self) -> bool:
        """True when other processes took more than `CONTENTION_LIMIT` of the CPU while it was timed, or its
        samples sit on a scheduler tick."""
        return is_contended(self.cpu_contention) or self.quantized_tick_ms is not None

    @property
    def contention_text(self) -> str:
        """`other processes took 70% of the CPU`, `samples on multiples of a 4 ms scheduler tick`, or both
        (joined by `; `); empty when not contended."""
        said = []
        if is_contended(self.cpu_contention):
            said.append(f"other processes took {self.cpu_contention:.0%} of the CPU")
        if self.quantized_tick_ms is not None:
            said.append(f"samples on multiples of a {self.quantized_tick_ms:.3g} ms scheduler tick")
        return "; ".join(said)


def is_unstable(median_value: float, iqr_value: float, threshold: float = UNSTABLE_IQR_RATIO) -> bool:
    """True when IQR / median exceeds `threshold` (default 10 %), or the median is not positive."""
    return median_value <= 0 or iqr_value / median_value > threshold


def halves_drift(samples: Sequence[float]) -> float:
    """|median of the first half − median of the second half| / median of all, samples in call order (the
    middle one of an odd count left out); 0.0 for fewer than two samples or a median that is not positive."""
    half = len(samples) // 2
    mid = median(samples) if samples else 0.0
    if half < 1 or mid <= 0:
        return 0.0
    return abs(median(samples[:half]) - median(samples[-half:])) / mid


def choose_reps(estimate_s: float, min_time_s: float, min_reps: int, max_reps: int) -> int:
    """Repetitions that fill `min_time_s` at `estimate_s` a call, clamped to [min_reps, max_reps]."""
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    if estimate_s <= 0:
        return max_reps
    return max(min_reps, min(max_reps, math.ceil(min_time_s / estimate_s)))


def has_settled(times: Sequence[float], window: int, tolerance: float = SETTLE_TOLERANCE) -> bool:
    """True when the last `window` times spread (max - min) by at most `tolerance` of their median."""
    if window < 1 or len(times) < window:
        return False
    last = list(times[-window:])
    mid = median(last)
    return mid > 0 and (max(last) - min(last)) <= tolerance * mid


def summarize(
    samples_s: Sequence[float],
    *,
    reps: int,
    warmup_reps: int,
    cold_s: float,
    method: str,
    cuda_graph: bool = False,
    flush_l2: bool = False,
    forwards_per_sample: int = 1,
    unstable_threshold: float = UNSTABLE_IQR_RATIO,
    cpu_contention: float | None = None,
    l2_state: str | None = None,
    l2_bytes: int | None = None,
    gpu_health: GpuHealth | None = None,
    gpu_health_note: str | None = None,
) -> Timing:
    """Build a Timing from per-forward seconds (each sample may average several forwards), in call order."""
    us = [s * 1e6 for s in samples_s]
    p25, mid, p75 = quantile(us, 0.25), quantile(us, 0.5), quantile(us, 0.75)
    return Timing(
        median_us=mid,
        iqr_us=p75 - p25,
        p25_us=p25,
        p75_us=p75,
        min_us=min(us),
        reps=reps,
        warmup_reps=warmup_reps,
        cold_ms=cold_s * 1e3,
        unstable=is_unstable(mid, p75 - p25, unstable_threshold),
        method=method,
        cuda_graph=cuda_graph,
        flush_l2=flush_l2,
        forwards_per_sample=forwards_per_sample,
        drift=halves_drift(us),
        cpu_contention=cpu_contention,
        l2_state=l2_state,
        l2_bytes=l2_bytes,
        gpu_health=gpu_health,
        gpu_health_note=gpu_health_note,
        quantized_tick_ms=scheduler_tick_ms(us),
    )


@dataclass(frozen=True)
class TimingOptions:
    """How a forward is timed (the module docstring): at least `min_time_s` of timed calls, between
    `min_reps` and `max_reps` of them, after a warm-up that settles over its last `warmup_reps` calls (no
    sooner than `warmup_min_s`, no later than `warmup_s`); CUDA graphs (`graph_note`: why, or why not, in a
    few words; `check_graph`: count the graph's device work against the eager step's), the L2 flush or
    rotating input copies on request; a sample is unstable above `unstable_threshold` (IQR / median); with
    `gpu_health`, on CUDA, the GPU's clock, power, temperature and throttle reasons are sampled through NVML
    over the timed calls. Built once per cell from the command's settings (`from_measure`, or a model config's
    `timing`) and passed down."""

    min_time_s: float = 0.25
    min_reps: int = 10
    max_reps: int = 1000
    warmup_s: float = 1.0
    warmup_min_s: float = 0.02
    warmup_reps: int = 3
    cuda_graph: bool = False
    flush_l2: bool = False
    unstable_threshold: float = UNSTABLE_IQR_RATIO
    graph_note: str = ""
    check_graph: bool = True
    rotate: bool = False
    gpu_health: bool = False

    @classmethod
    def from_measure(cls, measure: MeasureOptions, spec: RunSpec) -> TimingOptions:
        """The options of a cell at `spec`: the measurement flags of `run`, `compare` and `sweep`, with
        `--cuda-graph` resolved for it (`cuda_graphs.graph_choice`)."""
        graph, note = graph_choice(measure.cuda_graph, spec.mode, spec.n_queries, spec.device)
        return cls(
            min_time_s=measure.min_time_s,
            cuda_graph=graph,
            graph_note=note,
            flush_l2=measure.cold_l2 == "flush",
            rotate=measure.cold_l2 == "rotate",
            gpu_health=measure.clocks,
        )

    def rep_note(self, reps: int) -> str:
        """How the repetitions were chosen, for `Timing.method`."""
        return f"{reps} reps (time-based: {self.min_time_s:g} s, clamped to [{self.min_reps}, {self.max_reps}])"


@dataclass(frozen=True)
class _Step:
    """What one timing times: `fn`, with `setup` before each call (`prepared` when the caller gave one),
    read by `clock`, with the call counts agreed by `agree` (see `time_forward`); `calls`: `fn` and the step
    over each other copy of its inputs (rotation; `fn` alone without)."""

    fn: Callable[[], Any]
    setup: Callable[[], Any]
    prepared: bool
    clock: Callable[[], float]
    agree: Callable[[int], int] | None
    calls: tuple[Callable[[], Any], ...]

    def cycling(self) -> Callable[[], Any]:
        """A call that runs the step over the next copy of its inputs each time (`fn` without copies)."""
        if len(self.calls) == 1:
            return self.fn
        turn = [0]

        def next_copy() -> Any:
            call = self.calls[turn[0] % len(self.calls)]
            turn[0] += 1
            return call()

        return next_copy


def time_forward(
    fn: Callable[[], Any],
    device: str,
    options: TimingOptions = TimingOptions(),
    *,
    clock: Callable[[], float] | None = None,
    prepare: Callable[[], Any] | None = None,
    agree: Callable[[int], int] | None = None,
    copies: Sequence[Callable[[], Any]] = (),
) -> Timing:
    """Time `fn()` (one forward, no arguments) on `device` with `options`, as the module docstring describes.

    `prepare`, when given, runs before every call of `fn` (cold, warm-up and timed), outside the clock
    and the CUDA events; a step with one cannot be captured in a CUDA graph, so it is timed eagerly.
    `copies`: with `options.rotate`, the step over each other copy of its inputs (none: one copy holds more
    than the rotation needs). `clock` replaces `time.perf_counter` (CPU call times and all wall budgets), for tests.
    Out-of-memory anywhere inside raises VariantFailure("out of memory: ..."); a graph that does not hold the
    step (`options.check_graph`) VariantFailure with the reason.
    """
    import torch

    calls = (fn, *copies) if options.rotate else (fn,)
    step = _Step(fn, prepare or _nothing, prepare is not None, clock or time.perf_counter, agree, calls)
    dev = torch.device(device)
    with oom_guard():
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                return _time_cuda(step, dev, options)
        return _time_cpu(step, options)


def _warm_up(call_s: Callable[[], float], step: _Step, options: TimingOptions) -> tuple[list[float], bool]:
    """Call until settled or out of budget (with `step.agree`: until every process is); return the call
    times and whether they settled here."""
    times: list[float] = []
    window = max(1, options.warmup_reps)
    start = step.clock()
    while True:
        times.append(call_s())
        elapsed = step.clock() - start
        settled = len(times) >= window and elapsed >= options.warmup_min_s and has_settled(times, window)
        done = settled or elapsed >= options.warmup_s
        if step.agree is not None:
            done = not step.agree(int(not done))
        if done:
            return times, settled


def _reps(warm: Sequence[float], step: _Step, options: TimingOptions) -> int:
    """The repetitions the warm-up's last call times ask for (with `step.agree`: the most any process asks)."""
    estimate = median(list(warm[-max(1, options.warmup_reps) :]))
    reps = choose_reps(estimate, options.min_time_s, options.min_reps, options.max_reps)
    return reps if step.agree is None else step.agree(reps)


def _warm_note(n: int, settled: bool) -> str:
    return f"warm-up {n} calls ({'settled' if settled else 'time budget'})"


def _nothing() -> None:
    return None


def _time_cpu(step: _Step, options: TimingOptions) -> Timing:
    def call_s() -> float:
        step.setup()
        t0 = step.clock()
        step.fn()
        return step.clock() - t0

    share = CpuShare.start()
    cold = call_s()
    warm, settled = _warm_up(call_s, step, options)
    reps = _reps(warm, step, options)
    samples = [call_s() for _ in range(reps)]
    contention = share.others()
    notes = [
        "time.perf_counter per call" + (", each after an untimed forward" if step.prepared else ""),
        options.rep_note(reps),
        _warm_note(len(warm), settled),
    ]
    if options.cuda_graph:
        notes.append("cuda-graph n/a on CPU")
    if options.flush_l2:
        notes.append("flush-l2 n/a on CPU")
    if options.rotate:
        notes.append("cold-l2 rotate n/a on CPU")
    return summarize(
        samples,
        reps=reps,
        warmup_reps=len(warm),
        cold_s=cold,
        method="; ".join(notes),
        unstable_threshold=options.unstable_threshold,
        cpu_contention=contention,
    )


def _time_cuda(step: _Step, dev: Any, options: TimingOptions) -> Timing:
    import torch

    share = CpuShare.start()
    step.setup()
    torch.cuda.synchronize(dev)
    t0 = step.clock()
    step.fn()
    torch.cuda.synchronize(dev)
    cold = step.clock() - t0
    cycled = step.cycling()

    def warm_call() -> float:
        step.setup()
        return event_time_s(cycled)

    warm, settled = _warm_up(warm_call, step, options)
    warm_n = len(warm)
    launch, per_sample, graph_warm, notes = _launcher(step, cycled, dev, options)
    reps = _reps(graph_warm or warm, step, options)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with watching(index if options.gpu_health else None) as watch:
        samples = event_samples(launch, step.setup, dev, reps, options.flush_l2)
    contention = share.others()
    graph_used = launch is not cycled
    why = f" ({options.graph_note})" if options.graph_note else ""
    if graph_used:
        head = (
            f"cuda-graph replay of {per_sample} back-to-back forward{'s' if per_sample > 1 else ''}, "
            f"CUDA events per replay" + (f", divided by {per_sample}" if per_sample > 1 else "") + why
        )
    else:
        eager = "eager" + ("" if options.cuda_graph else why)
        tail = "each after an untimed forward" if step.prepared else "back to back"
        head = f"CUDA events per call, {eager}, {tail}"
    notes = [head, options.rep_note(reps), _warm_note(warm_n, settled)] + notes
    if options.flush_l2:
        notes.append("L2 flushed before each call (outside the events)")
    l2_bytes = l2_cache_bytes(dev)
    if options.rotate:
        notes.append(rotation_note(len(step.calls), l2_bytes))
    return summarize(
        [sample / per_sample for sample in samples],
        reps=reps,
        warmup_reps=warm_n,
        cold_s=cold,
        method="; ".join(notes),
        cuda_graph=graph_used,
        flush_l2=options.flush_l2,
        forwards_per_sample=per_sample,
        unstable_threshold=options.unstable_threshold,
        cpu_contention=contention,
        l2_state="rotated" if options.rotate else "flushed" if options.flush_l2 else "warm",
        l2_bytes=l2_bytes,
        gpu_health=watch.health,
        gpu_health_note=watch.note,
    )


def _launcher(
    step: _Step, cycled: Callable[[], Any], dev: Any, options: TimingOptions
) -> tuple[Callable[[], Any], int, list[float], list[str]]:
    """What each timed sample launches: a captured graph's replay when `options.cuda_graph` and the step
    allows one (checked to hold the step, `options.check_graph`), else `cycled`, the step cycling through its
    input copies. Returns it, the forwards per sample, the graph's own warm-up call times (empty without a
    graph) and notes on why no graph was used."""
    if not options.cuda_graph:
        return cycled, 1, [], []
    if step.prepared:
        return cycled, 1, [], ["cuda-graph n/a: an untimed forward precedes each backward"]
    if step.agree is not None:
        return cycled, 1, [], ["cuda-graph not used: every rank runs this forward together"]
    try:
        graph, per_sample, warm = graphed(step.calls, options.warmup_reps, single=options.flush_l2)
    except Exception as exc:  # capture is best effort: fall back to eager and say why
        recover_from_failed_capture(dev)
        why = f" ({options.graph_note})" if options.graph_note else ""
        return cycled, 1, [], [f"cuda-graph{why} capture failed ({one_line(exc, limit=160)}), fell back to eager"]
    if options.check_graph:
        from attnprof.profiling.graph_check import check_graph

        check_graph(step.fn, graph.replay, per_sample)
    return graph.replay, per_sample, warm, []
