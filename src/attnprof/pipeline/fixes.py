"""Time what each finding of a trace proposes, at the trace's shapes, on this machine (`analyze --time-fixes`,
and `attnprof model` by default): the work as traced and each alternative, re-created from the recorded
ops (`analysis.recreate`), timed with attnprof's own timing (`profiling.timing.time_forward`: a cold call,
a settling warm-up, then the median of several calls, CUDA events on a GPU). The judge puts the results
into the findings (`findings.timed_fixes.apply_timed_fixes`): the fastest alternative's saving per instance
becomes the impact, labelled "timed".

Where: a CUDA trace is timed on this machine's GPU, a CPU trace on its CPU; without the trace's device,
every fix says how to get the timed figure. An alternative that fails (out of memory, a backend that
refuses the shape) gives its reason, and the others are still timed. All timings together stay within
`budget_s`: each gets an equal share of it as its timed time (between `MIN_TIME_S` and `MAX_TIME_S`), and
what the budget cannot reach is named as not timed.
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnprof.analysis.findings import FixNotTimed, TimedFix, Verdict, judge
from attnprof.analysis.recreate import FixPlan, RecordedOp, Replay, fix_plans, known_refusal, parse_concrete
from attnprof.errors import AttnprofError, one_line
from attnprof.profiling.contention import CpuShare, is_contended

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis
    from attnprof.analysis.trace.tables import ParsedTrace

#: Seconds all the timings of one trace may take, by default.
DEFAULT_BUDGET_S = 10.0
MIN_TIME_S, MAX_TIME_S = 0.005, 0.1  # the timed time of one timing, at least and at most
MIN_REPS = 5  # never fewer timed calls than this: a median of several, never one run
_TORCH_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::BFloat16": "bfloat16",
    "c10::Half": "float16",
    "bool": "bool",
    "long int": "int64",
    "int": "int32",
    "short int": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
}
#: Where the mask is among the inputs of the ops that take one: it is re-created causal (values are not recorded).
_MASK_AT = {"aten::scaled_dot_product_attention": 3, "aten::_native_multi_head_attention": 9}
_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


class NotReplayable(AttnprofError):
    """An op the trace recorded that cannot be re-created here (one line)."""


@dataclass(frozen=True)
class FixTiming:
    """The fixes of one trace: those timed, those that could not be, and one line saying what was timed on
    which device and how long it took (`note`)."""

    timed: tuple[TimedFix, ...]
    untimed: tuple[FixNotTimed, ...]
    note: str


def trace_device(analysis: TraceAnalysis) -> str:
    """ "cuda" for a trace with device work, else "cpu"."""
    return "cpu" if analysis.gpu_time_us is None else "cuda"


def time_fixes(analysis: TraceAnalysis, trace: ParsedTrace, budget_s: float = DEFAULT_BUDGET_S) -> FixTiming:
    """Time the fixes the analysis' findings propose (see the module docstring). `trace` is the parsed trace
    the analysis read, loaded with `every_concrete_input=True`."""
    device = trace_device(analysis)
    plans = fix_plans(analysis, trace, cuda=device == "cuda")
    if not plans:
        return FixTiming((), (), "no finding proposes a fix to time")
    missing = _missing_device(device, trace.source)
    if missing is not None:
        nowhere = tuple(FixNotTimed(p.finding, "", p.reason or missing) for p in plans)
        return FixTiming((), nowhere, f"fixes not timed: {missing}")
    start = time.perf_counter()
    timer = _Timer(device, budget_s, sum(1 + len(piece.alternatives) for p in plans for piece in p.pieces))
    timed: list[TimedFix] = []
    untimed: list[FixNotTimed] = []
    for plan in plans:
        found, not_found = _time_plan(plan, timer)
        timed += found
        untimed += not_found
    spent = time.perf_counter() - start
    findings = sorted({f.finding for f in timed})
    what = f"timed the fixes of {', '.join(findings)}" if findings else "timed no fix"
    note = f"{what} at the trace's shapes on {device}: {timer.count} timings in {spent:.1f} s (budget {budget_s:g} s)"
    busy = [f.cpu_contention for f in timed if f.contended and f.cpu_contention is not None]
    if busy:
        note += f"; other processes held up to {max(busy):.0%} of the CPU meanwhile: those savings say so"
    return FixTiming(tuple(timed), tuple(untimed), note)


def judged(analysis: TraceAnalysis, fixes: FixTiming) -> None:
    """The analysis' findings judged with the fixes timed (or not), in place."""
    from attnprof.analysis.instance.phases import instance_unit

    verdict = Verdict(
        analysis.findings,
        analysis.kernels,
        gpu_time_us=analysis.gpu_time_us,
        unit=instance_unit(analysis.phases),
        timed_fixes=fixes.timed,
        untimed_fixes=fixes.untimed,
    )
    analysis.findings = judge(verdict)


def _missing_device(device: str, source: str) -> str | None:
    """Why this machine cannot time a trace of `device` (None: it can)."""
    if device != "cuda":
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"the trace ran on a CUDA GPU and this machine has none: run `attnprof analyze {source} --time-fixes` "
        "on a machine with a CUDA GPU"
    )


def _time_plan(plan: FixPlan, timer: _Timer) -> tuple[list[TimedFix], list[FixNotTimed]]:
    """A plan's alternatives, each summed over its pieces (count x time per instance); an alternative that
    could not run on some piece is not timed, with that piece's reason."""
    if plan.reason is not None:
        return [], [FixNotTimed(plan.finding, "", plan.reason)]
    before, shares = 0.0, []
    for piece in plan.pieces:
        took = timer.time(piece.before)
        if isinstance(took, str):
            return [], [FixNotTimed(plan.finding, "", f"the traced work ({piece.what}) was not timed: {took}")]
        before += piece.count * took
        shares.append(timer.share(piece.before))
    names = list(dict.fromkeys(name for piece in plan.pieces for name, _ in piece.alternatives))
    timed, untimed = [], []
    for name in names:
        after, reason, seen = 0.0, None, list(shares)
        for piece in plan.pieces:
            replay = dict(piece.alternatives).get(name)
            took = timer.time(replay) if replay is not None else f"not an alternative for {piece.what}"
            if isinstance(took, str):
                reason = took
                break
            after += piece.count * took
            seen.append(timer.share(replay))
        if reason is None:
            known = [s for s in seen if s is not None]
            worst = max(known) if known else None
            timed.append(TimedFix(plan.finding, name, before, after, worst, is_contended(worst)))
        else:
            untimed.append(FixNotTimed(plan.finding, name, reason))
    return timed, untimed


class _Timer:
    """Times replays on one device within one budget; the same replay is timed once (its median µs, or
    the reason it could not be timed)."""

    def __init__(self, device: str, budget_s: float, planned: int) -> None:
        self.device, self.budget_s = device, budget_s
        self.share_s = min(MAX_TIME_S, max(MIN_TIME_S, budget_s / max(planned, 1) / 3))
        self.start = time.perf_counter()
        self.seen: dict[Replay, float | str] = {}
        self.shares: dict[Replay, float | None] = {}
        self.count = 0

    def share(self, replay: Replay | None) -> float | None:
        """The share of the CPU other processes took while `replay` was timed (None: not timed or unknown)."""
        return self.shares.get(replay) if replay is not None else None

    def time(self, replay: Replay) -> float | str:
        if replay not in self.seen:
            if time.perf_counter() - self.start > self.budget_s:
                return f"the --time-fixes-budget of {self.budget_s:g} s ran out before it was timed"
            self.seen[replay] = self._timed(replay)
        return self.seen[replay]

    def _timed(self, replay: Replay) -> float | str:
        refusal = known_refusal(replay, self.device.startswith("cuda"))
        if refusal is not None:
            return refusal
        import torch

        from attnprof.profiling.timing import TimingOptions, time_forward

        options = TimingOptions(
            min_time_s=self.share_s,
            min_reps=MIN_REPS,
            max_reps=200,
            warmup_s=2 * self.share_s,
            warmup_min_s=min(0.01, self.share_s),
        )
        self.count += 1
        with warnings.catch_warnings(record=True) as said:  # torch's reasons go into the refusal, not stderr
            warnings.simplefilter("always")
            try:
                with torch.no_grad():
                    call = replay_call(replay, self.device)
                    window = CpuShare.start()
                    median = time_forward(call, self.device, options).median_us
                    self.shares[replay] = window.others()
                    return median
            except AttnprofError as exc:
                return exc.message
            except Exception as exc:  # a backend refusing the shape, an op torch cannot run here
                return with_torch_reasons(one_line(exc), [str(w.message) for w in said])


#: The tail torch adds to a warning raised in its C++ code.
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")


def with_torch_reasons(message: str, warned: list[str], limit: int = 2) -> str:
    """`message` with the distinct reasons torch warned while refusing (its backend checks say why a kernel was
    not used), first lines only, at most `limit`; `message` alone when it warned nothing."""
    lines = [_TRIGGERED.sub("", w.strip().splitlines()[0]) for w in warned if w.strip()]
    reasons = list(dict.fromkeys(line for line in lines if not line.endswith(":")))  # not "... not used because:"
    if not reasons:
        return message
    more = f"; and {len(reasons) - limit} more" if len(reasons) > limit else ""
    return f"{message} (torch: {'; '.join(reasons[:limit])}{more})"


def replay_call(replay: Replay, device: str) -> Callable[[], Any]:
    """A call that runs the replay's ops once, each on inputs made here (outside the call); raises
    NotReplayable for an op that cannot be re-created."""
    if replay.flex:
        return _flex_call(replay.ops[0], device)
    import torch

    calls = [(packet, *_bound(packet, op, _arguments(op, device))) for op in replay.ops for packet in [_aten(op)]]
    pinned = _pinned(replay.backend)

    def run() -> None:
        with pinned():
            for fn, args, kwargs in calls:
                fn(*args, **kwargs)

    run()  # a backend that refuses the shape raises here, before the timing
    if device == "cuda":
        torch.cuda.synchronize()
    return run


def _pinned(backend: str | None) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    if backend is None:
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, _BACKENDS[backend])
    return lambda: sdpa_kernel(chosen)


def _aten(op: RecordedOp) -> Any:
    import torch

    if not op.name.startswith("aten::"):
        raise NotReplayable(f"{op.name} is not an ATen op")
    try:
        return getattr(torch.ops.aten, op.name.removeprefix("aten::"))
    except AttributeError:
        raise NotReplayable(f"{op.name} is not an op of this torch") from None


def _bound(packet: Any, op: RecordedOp, args: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """The recorded inputs as the op takes them: positional, then keyword-only by name (SDPA's scale and
    enable_gqa), after the schema of its first overload with as many arguments (and no `out`)."""
    for name in packet.overloads():
        arguments = getattr(packet, name)._schema.arguments
        if len(arguments) == len(args) and all(a.name != "out" for a in arguments):
            positional = [value for a, value in zip(arguments, args, strict=True) if not a.kwarg_only]
            keywords = {a.name: value for a, value in zip(arguments, args, strict=True) if a.kwarg_only}
            return positional, keywords
    raise NotReplayable(f"{op.name} takes no {len(args)} inputs in this torch")


def _arguments(op: RecordedOp, device: str) -> list[Any]:
    """The op's inputs made anew: a tensor of each recorded dims and dtype (a mask causal), each scalar as
    recorded."""
    mask_at = _MASK_AT.get(op.name)
    args = []
    for at, (dims, type_, value) in enumerate(zip(op.dims, op.types, op.concrete, strict=True)):
        if type_ in _TORCH_DTYPES:
            args.append(_tensor(dims, type_, device, causal=at == mask_at))
        elif type_ in ("Scalar", "ScalarList", ""):
            args.append(parse_concrete(value))
        else:
            raise NotReplayable(f"{op.name} takes a {type_} input, which cannot be re-created")
    return args


def _tensor(dims: tuple[int, ...], type_: str, device: str, causal: bool) -> Any:
    """A tensor of `dims` and `type_` on `device`: random normal (floats), zeros (integers), or, for a mask
    (`causal`, or any bool tensor of two dims or more), a causal one: True / 0 on and below the diagonal."""
    import torch

    dtype = getattr(torch, _TORCH_DTYPES[type_])
    if (causal or dtype is torch.bool) and len(dims) >= 2:
        keep = torch.ones(dims[-2:], dtype=torch.bool, device=device).tril().expand(dims).contiguous()
        if dtype is torch.bool:
            return keep
        return torch.zeros(dims, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
    if dtype.is_floating_point:
        return torch.randn(dims, dtype=dtype, device=device)
    return torch.zeros(dims, dtype=dtype, device=device)


def _flex_call(op: RecordedOp, device: str) -> Callable[[], Any]:
    """FlexAttention over the SDPA op's q, k, v with a causal BlockMask built once (compiled, as flex runs
    fast)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = (_tensor(op.dims[i], op.types[i], device, causal=False) for i in range(3))

    def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx >= kv_idx

    block_mask = create_block_mask(causal, None, None, q.shape[-2], k.shape[-2], device=device)
    compiled = torch.compile(flex_attention)
    gqa = q.shape[1] != k.shape[1]

    def run() -> Any:
        return compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa)

    run()
    return run
