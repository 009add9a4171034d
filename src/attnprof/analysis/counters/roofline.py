"""A roofline per counted kernel, and the steps a report's kernels form.

A report holds one or more steps (a forward, a backward, or both) of the same kernels: `steps_of` finds
how many kernels a step has, the shortest run of names whose repetition makes the whole report
(`kernel_key` compares the names; a last step cut short is left unplaced). Each step's analytic FLOPs
(`analysis.roofline.step_flops`, as every attnprof row counts them) are split across its kernels in
proportion to the time their tensor pipe was active (utilisation × duration); a kernel whose tensor pipe
was busy less than `TENSOR_FLOOR` of the busiest kernel's time gets none (a copy or a reduction: its
conversions run on the pipe the tensor cores share, 0.2-3.8% busy in the H200's backward helpers). Its
arithmetic intensity is those FLOPs over the DRAM bytes Nsight Compute measured (read and written), and
it is placed against the ceilings with `analysis.roofline.achieved`: compute-bound (at or above the
ridge, the matmul ceiling over the read bandwidth) at X% of the matmul ceiling, or memory-bound at Y% of
the read bandwidth. The ceilings are those measured on the machine when the caller has them, else the
GPU's datasheet (`Peaks.basis`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnprof.analysis.counters.kernel import KernelCounters
from attnprof.analysis.hardware import Peaks
from attnprof.analysis.roofline import achieved

#: A kernel whose tensor-pipe time is under this share of the step's busiest kernel's does no matmul work.
TENSOR_FLOOR = 0.01
_NAMESPACE = re.compile(r"\(anonymous namespace\)::|\b[A-Za-z_]\w*::")
_BOOLS = {"true": "1", "false": "0"}
_BOOL = re.compile(r"\b(true|false)\b")
_SPACE = re.compile(r"\s+")


def kernel_key(name: str) -> str:
    """A kernel's name as both Nsight Compute and the profiler trace can be compared on: without `void`,
    the parameter list, namespaces and spaces, `true`/`false` as 1/0 (ncu writes `flash_fwd_kernel<...,
    bfloat16_t, ...>, 0, 1>`, Kineto `pytorch_flash::flash_fwd_kernel<..., cutlass::bfloat16_t, ...>,
    false, true>`)."""
    text = name.strip().removeprefix("void ").strip()
    text = _strip_parameters(text)
    text = _NAMESPACE.sub("", text)
    text = _BOOL.sub(lambda m: _BOOLS[m.group(1)], text)
    return _SPACE.sub("", text)


def _strip_parameters(text: str) -> str:
    """`f<...>(int, float)` -> `f<...>`: the trailing parenthesised parameter list cut off."""
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return text[:i] if i > 0 else text
    return text


def steps_of(kernels: list[KernelCounters]) -> int:
    """How many kernels one step has: the shortest run of names that, repeated, makes the whole list,
    every step whole, or with a last step cut short after two whole ones (a collection that stopped at a
    kernel count); the whole list when none does."""
    keys = [kernel_key(k.name) for k in kernels]
    n = len(keys)
    for period in range(1, n + 1):
        whole = n % period == 0 or n // period >= 2
        if whole and all(keys[i] == keys[i % period] for i in range(n)):
            return period
    return n


@dataclass(frozen=True)
class KernelPlacement:
    """One kernel on the roofline: `index` its report index, `step` the step it belongs to; `flops` its share
    of the step's FLOPs (`flops_share_pct` of them; None when the step's FLOPs are unknown or could not be
    split), `intensity` FLOPs per DRAM byte, `tflops` its FLOPs over its duration, `bound` `compute` or
    `memory` (None without ceilings), `pct_of_ceiling` its % of the matmul ceiling (compute) or of the read
    bandwidth (memory, DRAM bytes read and written over its time), and `text` the same in words."""

    index: int
    step: int
    flops: float | None
    flops_share_pct: float | None
    intensity: float | None
    tflops: float | None
    bound: str | None
    pct_of_ceiling: float | None
    text: str


def placement_text(bound: str | None, pct: float | None, flops: float | None, peaks: Peaks | None) -> str:
    """`compute-bound at 58% of the matmul ceiling`, `memory-bound at 71% of read bandwidth`, or why not."""
    if flops is None:
        return "not placed: its share of the step's FLOPs is unknown"
    lead = "" if flops else "no matmul work on the tensor pipe, no share of the FLOPs: "
    if bound is None or pct is None:
        return lead + ("not placed: no ceiling for this GPU" if peaks is None else "not placed: no DRAM bytes or time")
    if bound == "compute":
        return f"{lead}compute-bound at {pct:.0f}% of the matmul ceiling"
    return f"{lead}memory-bound at {pct:.0f}% of read bandwidth"


def place_kernels(
    kernels: list[KernelCounters], per_step: int, flops_per_step: float | None, peaks: Peaks | None
) -> tuple[list[KernelPlacement], list[str]]:
    """Each kernel's placement (see the module docstring), steps of `per_step` kernels each, and the notes
    on what could not be placed."""
    placements: list[KernelPlacement] = []
    notes: list[str] = []
    for start in range(0, len(kernels), per_step):
        step = kernels[start : start + per_step]
        shares = _flops_shares(step)
        if shares is None and flops_per_step is not None and start == 0:
            notes.append(
                "the tensor pipe's activity was not measured for every kernel of the step: its FLOPs are not split"
            )
        each: list[float | None] = list(shares) if shares is not None else [None] * len(step)
        for kernel, share in zip(step, each, strict=True):
            flops = None if share is None or flops_per_step is None else share * flops_per_step
            placements.append(_place(kernel, start // per_step, flops, share, peaks))
    if flops_per_step is not None and all(p.flops == 0 for p in placements):
        notes.append("no kernel used the tensor pipe: the step's FLOPs are placed on none")
    return placements, notes


def _flops_shares(step: list[KernelCounters]) -> list[float] | None:
    """Each kernel's share of the step's tensor-pipe time, 0 for one under `TENSOR_FLOOR` of the busiest
    kernel's; None when a kernel's is unknown (a step of one kernel then takes it all)."""
    known = [k.tensor_active_us for k in step]
    if any(a is None for a in known):
        return [1.0] if len(step) == 1 else None
    active = [a or 0.0 for a in known]
    floor = TENSOR_FLOOR * max(active, default=0.0)
    matmul = [a if a > 0 and a >= floor else 0.0 for a in active]
    total = sum(matmul)
    if not total > 0:
        return [0.0] * len(step)
    return [a / total for a in matmul]


def _place(
    kernel: KernelCounters, step: int, flops: float | None, share: float | None, peaks: Peaks | None
) -> KernelPlacement:
    seconds = kernel.duration_us * 1e-6 if kernel.duration_us else None
    nbytes = kernel.dram_bytes
    if flops is None or seconds is None or nbytes is None:
        return KernelPlacement(
            kernel.index, step, flops, _pct(share), None, None, None, None, placement_text(None, None, flops, peaks)
        )
    rates = achieved(
        flops,
        nbytes,
        seconds,
        peaks.tensor_tflops * 1e12 if peaks else None,
        peaks.read_gbps * 1e9 if peaks else None,
    )
    bound = rates["bound"]
    pct = rates["pct_of_peak"] if bound == "compute" else rates["pct_of_read_bandwidth"] if bound == "memory" else None
    intensity = rates["intensity"] if nbytes > 0 else None
    return KernelPlacement(
        kernel.index,
        step,
        flops,
        _pct(share),
        intensity,
        rates["tflops"],
        bound,
        pct,
        placement_text(bound, pct, flops, peaks),
    )


def _pct(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


@dataclass(frozen=True)
class StepCounters:
    """One step's counted kernels, in launch order, with their placements (the same order): what the
    counter findings read. `compulsory_bytes` is what the step must move at least (Q, K, V, O and, in a
    backward, their gradients, once each: `analysis.roofline.bytes_moved`), None when unknown; `unit` what a
    step is called ("forward" or "step")."""

    kernels: list[KernelCounters]
    placements: list[KernelPlacement]
    compulsory_bytes: float | None
    peaks: Peaks | None
    unit: str = "forward"

    @property
    def time_us(self) -> float:
        """The step's kernels' time under Nsight Compute, µs."""
        return sum(k.duration_us or 0.0 for k in self.kernels)

    @property
    def dram_bytes(self) -> float | None:
        """DRAM bytes read and written by the step's kernels; None when a kernel's are unknown."""
        each = [k.dram_bytes for k in self.kernels]
        return None if any(b is None for b in each) else sum(b for b in each if b is not None)

    @property
    def traffic_ratio(self) -> float | None:
        """The step's DRAM bytes over its compulsory bytes; None when either is unknown."""
        nbytes = self.dram_bytes
        return nbytes / self.compulsory_bytes if nbytes is not None and self.compulsory_bytes else None

    def pairs(self) -> list[tuple[KernelCounters, KernelPlacement]]:
        """Each kernel with its placement."""
        return list(zip(self.kernels, self.placements, strict=True))
