"""The attention ledger over the instances (`summarize`): `AttentionLedger`.

Over the instances' ledgers (`ledger.ForwardLedger`): counts are low medians, times medians; the
calls listed are those of the first instance that has the median number of calls, each with the
median time of its position over the instances that ran the same calls.

Its JSON is `results.parts.AttentionRecord` (`results.records.attention_record`), the `attention` of a row
and of `attnprof analyze`:

    time_base              what the times measure: "device" (the calls' device work), or "cpu" in a
                           CPU-only trace (the calls' ops on the CPU: a single op's duration, else
                           from the first op's start to the last op's end; a backward call the total
                           of its autograd ops)
    calls_per_forward      forward attention calls per instance
    backends               the listed forward calls by backend, e.g. {"cudnn": 2}; on the CPU also
                           "native-mha" and "encoder-layer" (see `calls`)
    attention_impl         the implementations that served the listed calls, forward calls first, each
                           once, joined by ", " (e.g. "cuDNN 9.10.2 native-sdpa knob 7"); null when no
                           call's kernels tell (a CPU-only trace has no kernels). Read from kernel names
                           (`names.attention_impl`, the same decoding as `attnprof explain`): FA2, FA3 or FA4
                           (behind SDPA's flash backend, or the flash-attn package), "cuDNN VERSION
                           native-sdpa knob N" (the version from the trace's `cudnn_version` metadata, which
                           attnprof's profiler writes; left out without it), "mem-efficient", "flex Triton",
                           "flex FLASH (FA4)", "Triton" (a Triton attention kernel such as triton-flash's),
                           "unfused" (matmul, softmax, matmul: eager or SDPA's math backend)
    kernel_time_us         device time of the calls' work (kernels, and memcpys/memsets launched
                           inside them), forward and backward phase together; with time_base "cpu",
                           the calls' CPU time
    backward_kernel_time_us  the backward phase's part of it (null without backward work)
    gpu_time_pct           the calls' busy time (their work's intervals merged: kernels that overlap,
                           e.g. in a CUDA graph, count once) over the instance's GPU time (first
                           device event to last); never above 100; null on the CPU
    cpu_time_pct           time_base "cpu": the calls' CPU time over the instance's CPU time (its
                           region's wall time); null with device time
    overhead_us            the overhead items' time together (null on the CPU: not measured there)
    bytes_per_forward      the bytes the forward calls must move (Q, K, V, O and a dense mask, from
                           the recorded shapes: see `bandwidth`); null when a call's shapes are unknown
    achieved_gbps          bytes_per_forward over the forward calls' time (device, or CPU), GB/s
    pct_of_read_bandwidth  achieved_gbps in percent of the read bandwidth (null without one, and on
                           the CPU); never above 100
    read_bandwidth_gbps    the read bandwidth the percentages use, GB/s (null without one)
    read_bandwidth_basis   where it comes from: "datasheet" (of the GPU the trace names), "measured"
                           (on this machine: the read ceiling of `profiling.ceiling`), or "achieved"
                           (a call beat the datasheet's or measured figure, so the highest achieved
                           figure is the reference); null without one
    read_bandwidth_source  the same in words: "datasheet H200 4800 GB/s", "read bandwidth measured on
                           this machine 4512 GB/s (2026-05-01)", "achieved 4901 GB/s, above the ..."
    calls                  [{op, backend, attention_impl, phase, kernels, time_us, bytes, achieved_gbps,
                           pct_of_read_bandwidth, forward_call}]: phase "forward" or "backward";
                           kernels [] on the CPU; forward_call is a backward call's forward call (its
                           index in calls), null when no forward call links to it; bytes (and its
                           rates) null for backward calls, calls without recorded shapes and the
                           fused modules' calls (their inputs are hidden states, not Q, K and V)
    overhead               [{kind, ops, count_per_forward, time_us}]: ops are the op chains that
                           launched its work, commonest first
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from attnprof.analysis.hardware import Peaks
from attnprof.analysis.instance.ledger import CallFacts, ForwardLedger, gbps
from attnprof.analysis.instance.overhead import OVERHEAD_KINDS
from attnprof.stats import median, median_count


@dataclass
class AttentionLedger:
    """The ledger over all instances (see the module docstring)."""

    calls_per_forward: int
    backends: dict[str, int]
    kernel_time_us: float
    backward_kernel_time_us: float | None
    gpu_time_pct: float | None
    overhead_us: float  # in the JSON null with time_base "cpu" (not measured there)
    calls: list[CallFacts] = field(default_factory=list)
    overhead: list[dict[str, Any]] = field(default_factory=list)
    #: The read bandwidth the percentages use (GB/s), its basis and what it is (`read_bandwidth`); None: unknown.
    read_bandwidth_gbps: float | None = None
    read_bandwidth_basis: str | None = None
    read_bandwidth_source: str | None = None
    peaks: Peaks | None = None  # the peaks compared against (datasheet or measured), when known
    time_base: str = "device"  # "cpu": a CPU-only trace's ledger, its times CPU time
    cpu_time_pct: float | None = None  # time_base "cpu": the calls' share of the instance's CPU time
    cudnn_version: str | None = None  # "9.10.2": the trace's, for cuDNN's implementation (None: unknown)

    def call_impl(self, call: CallFacts) -> str | None:
        """The implementation that served `call` (see the module docstring)."""
        return call.attention_impl(self.cudnn_version)

    @property
    def attention_impl(self) -> str | None:
        """The implementations of the listed calls, forward ones first, each once (see the module docstring)."""
        ordered = sorted(self.calls, key=lambda c: c.phase != "forward")
        impls = dict.fromkeys(i for c in ordered if (i := self.call_impl(c)) is not None)
        return ", ".join(impls) or None

    @property
    def forward_calls(self) -> list[CallFacts]:
        """The listed forward calls."""
        return [c for c in self.calls if c.phase == "forward"]

    @property
    def bytes_per_forward(self) -> int | None:
        """The bytes the forward calls move; None when a forward call's shapes are unknown (or none)."""
        traffic = [c.traffic for c in self.forward_calls]
        known = [t.bytes for t in traffic if t is not None]
        return sum(known) if known and len(known) == len(traffic) else None

    @property
    def achieved_gbps(self) -> float | None:
        """bytes_per_forward over the forward calls' device time, GB/s."""
        nbytes = self.bytes_per_forward
        return None if nbytes is None else gbps(nbytes, sum(c.time_us for c in self.forward_calls))

    def pct_of_read_bandwidth(self, achieved: float | None) -> float | None:
        """`achieved` (GB/s) in percent of the read bandwidth; None when either is unknown."""
        ref = self.read_bandwidth_gbps
        return None if achieved is None or not ref else min(100.0, 100.0 * achieved / ref)

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte where the peaks' compute figure meets the read bandwidth the percentages use
        (the achieved figure when a call beat the peaks' bandwidth); None without peaks."""
        if self.peaks is None or not self.read_bandwidth_gbps:
            return None
        return self.peaks.tensor_tflops * 1e3 / self.read_bandwidth_gbps

    def read_bandwidth(self, peaks: Peaks | None, gpu: str | None, shapes_recorded: bool = True) -> list[str]:
        """Take `peaks` (the GPU's datasheet or the figures measured on this machine; None when unknown) as
        the reference of the percentages; when a call's achieved figure beats its bandwidth, the highest
        achieved figure is the reference instead. Returns the notes to tell (bytes without shapes, an
        unknown GPU, a figure above the reference); `shapes_recorded`: whether the trace has any `Input Dims`."""
        self.peaks = peaks
        forward = self.forward_calls
        if not forward or self.time_base == "cpu":  # a CPU has no read bandwidth to compare with
            return []
        unknown = [c for c in forward if c.traffic is None]
        if unknown and not shapes_recorded:
            return [
                "attention bytes and GB/s need the calls' shapes: profile with record_shapes=True "
                "(a call replayed from a CUDA graph has no op, so no shapes)"
            ]
        if unknown:
            bare = [c for c in unknown if c.first_op < 0]  # launched by a library or a graph replay, under no op
            if bare:
                kernels = ", ".join(dict.fromkeys(f"{c.op} ({c.backend})" for c in bare))
                return [
                    f"attention bytes and GB/s are null: {kernels} ran under no torch op (launched by a library "
                    "such as cudnn-frontend, or replayed from a CUDA graph), so the trace holds no shapes for it"
                ]
            ops = ", ".join(dict.fromkeys(f"{c.op} ({c.backend})" for c in unknown))
            return [f"attention bytes and GB/s are null: the recorded inputs of {ops} are not Q, K and V"]
        if peaks is None:
            return [f"no datasheet bandwidth for GPU {gpu!r}: attention's % of read bandwidth is null"]
        achieved = [g for g in (self.achieved_gbps, *(c.achieved_gbps for c in forward)) if g is not None]
        best = max(achieved, default=0.0)
        if best <= peaks.read_gbps:
            self.read_bandwidth_gbps, self.read_bandwidth_basis = peaks.read_gbps, peaks.basis
            self.read_bandwidth_source = peaks.source
            return []
        self.read_bandwidth_gbps, self.read_bandwidth_basis = best, "achieved"
        self.read_bandwidth_source = f"achieved {best:.0f} GB/s, above the {peaks.source}"
        why = "data served from cache, or bytes counted that were not read"
        if peaks.basis == "measured":
            why = "the probe's kernels read slower than this attention, or " + why
        return [f"attention achieved {best:.0f} GB/s, above the {peaks.source} ({why}): its percentages use it"]

    @property
    def backends_text(self) -> str:
        """The backends as "cudnn:2" ("eager:1 flex:1" for several); "" without calls."""
        return " ".join(f"{backend}:{n}" for backend, n in self.backends.items())


def summarize(ledgers: list[ForwardLedger]) -> AttentionLedger:
    """The ledger over the instances (at least one)."""
    per_call = median_count([ledger.forward_count for ledger in ledgers])
    calls = _typical_calls(ledgers, per_call)
    kernel_times = [ledger.kernel_time_us for ledger in ledgers]
    pcts = [p for ledger in ledgers if (p := ledger.gpu_time_pct) is not None]
    cpu_pcts = [p for ledger in ledgers if (p := ledger.cpu_time_pct) is not None]
    has_backward = any(len(ledger.calls) > ledger.forward_count for ledger in ledgers)
    return AttentionLedger(
        calls_per_forward=per_call,
        backends=dict(sorted(Counter(c.backend for c in calls if c.phase == "forward").items())),
        kernel_time_us=median(kernel_times),
        backward_kernel_time_us=median([ledger.backward_time_us for ledger in ledgers]) if has_backward else None,
        gpu_time_pct=median(pcts) if pcts else None,
        overhead_us=median([ledger.overhead_us for ledger in ledgers]),
        calls=calls,
        overhead=_overhead_items(ledgers),
        time_base="cpu" if all(ledger.on_cpu for ledger in ledgers) else "device",
        cpu_time_pct=median(cpu_pcts) if cpu_pcts else None,
    )


def _typical_calls(ledgers: list[ForwardLedger], per_call: int) -> list[CallFacts]:
    """The calls of the first instance with the median number of forward calls, each timed by the
    median over the instances that ran the same calls."""
    first = next(ledger for ledger in ledgers if len(ledger.forward_calls) == per_call)
    shape = [c.signature for c in first.calls]
    same = [ledger for ledger in ledgers if [c.signature for c in ledger.calls] == shape]
    return [
        CallFacts(
            c.op,
            c.backend,
            c.phase,
            c.kernel_ids,
            median([s.calls[i].time_us for s in same]),
            c.forward_call,
            c.traffic,
            c.names,
            c.input_types,
            c.prep_ids,
            median([s.calls[i].prep_time_us for s in same]),
            varlen=c.varlen,
        )
        for i, c in enumerate(first.calls)
    ]


def _overhead_items(ledgers: list[ForwardLedger]) -> list[dict[str, Any]]:
    items = []
    for kind in OVERHEAD_KINDS:
        found = [ledger.overhead.get(kind) for ledger in ledgers]
        if not any(found):
            continue
        chains: Counter = Counter()
        for item in found:
            if item is not None:
                chains.update(item.chains)
        items.append(
            {
                "kind": kind,
                "ops": [chain for chain, _ in chains.most_common()],
                "count_per_forward": median_count([item.count if item else 0 for item in found]),
                "time_us": round(median([item.time_us if item else 0.0 for item in found]), 3),
            }
        )
    return items
