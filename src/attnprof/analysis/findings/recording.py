"""The profiler's own recording per instance (`RecordingCost`), which the judge takes from the host time of
`cpu-bound` and `gpu-idle` in a trace without an unprofiled latency (`judge.net_of_recording`); the cost per op
is calibrated on the machine (`profiling.profiler_cost`)."""

from __future__ import annotations

from dataclasses import dataclass

from attnprof.analysis.findings.registry import Numbers, numbers, us


@dataclass(frozen=True)
class RecordingCost:
    """The profiler's own recording per instance, as the judge weighs it: the ops it recorded per instance,
    its cost per op calibrated on this machine (`per_op_us`, on `calibrated_on`, YYYY-MM-DD), and whether
    that calibration recorded CPU activity only for a trace with device activity (`lower_bound`: recording
    CUDA activity costs more)."""

    ops: int
    per_op_us: float
    calibrated_on: str
    lower_bound: bool = False

    @property
    def cost_us(self) -> float:
        """The recording's host time per instance."""
        return self.ops * self.per_op_us

    def part_us(self, host_us: float) -> float:
        """The recording's share of `host_us`, the CPU's work per instance (never more than all of it)."""
        return min(self.cost_us, host_us)

    def sentence(self, host_us: float, unit: str) -> str:
        """How much of `host_us`, the CPU's work per instance, the recording was, in one clause."""
        bound = "; CPU activity only, a lower bound with CUDA activity recorded" if self.lower_bound else ""
        return (
            f"Of the {us(host_us)} CPU time per {unit}, about {us(self.part_us(host_us))} is the profiler's own "
            f"recording ({self.ops:,} ops x {self.per_op_us:.2f} us, calibrated on the machine analysing it on "
            f"{self.calibrated_on}{bound})"
        )

    def evidence(self, host_us: float) -> Numbers:
        """The recording's numbers against `host_us`, as evidence beside a finding's."""
        return numbers(
            recording_ops=self.ops,
            recording_per_op_us=self.per_op_us,
            recording_us=self.part_us(host_us),
            recording_calibrated_on=self.calibrated_on,
            recording_lower_bound=self.lower_bound,
        )
