"""Findings on the GPU while a cell's latency was timed: a clock held down by power or heat.

Read from `FindingContext.gpu_health` only (`registry.GpuHealthReading`: NVML samples over the timed calls,
`profiling.gpu_health`); a trace alone has none, so these findings reach a row through the judge
(`judge.join_gpu_health`), whose context's instance time (`gpu_time_us`) is the row's latency. The
reference clock is the applications clock (see `profiling.gpu_health`).
"""

from __future__ import annotations

from attnprof.analysis.findings.registry import (
    FindingContext,
    FindingRegistry,
    GpuHealthReading,
    NoImpact,
    Said,
    numbers,
)

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `throttled` fires when the SM clock's median (the GPU busy) is below this share of the applications clock ...
CLOCK_FLOOR = 0.90
#: ... or when a power or thermal reason held the clock down in at least this percentage of the samples.
MIN_THROTTLED_PCT = 10.0
#: The driver's reasons that are throttling, and how a sentence names each (idle, the applications clocks
#: setting, sync boost and the display clock are not: they say the GPU ran as asked).
THROTTLE_REASONS = {
    "sw_power_cap": "SW power cap",
    "hw_slowdown": "HW slowdown",
    "hw_power_brake_slowdown": "HW power brake",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
}


def _clock_ratio(health: GpuHealthReading) -> float | None:
    """The median SM clock (the GPU busy) over the applications clock; None without one, or when the GPU was
    idle in every sample."""
    reference = health.application_clock_mhz
    busy = health.idle_samples < health.samples
    return health.sm_clock_mhz / reference if reference and busy else None


def _clock_shortfall(ctx: FindingContext) -> float | NoImpact:
    """The latency per instance times the SM clock's shortfall below the applications clock (1 - median /
    applications clock): what the instance would save at that clock if all its time followed the SM clock, so
    an upper bound (memory-bound work follows it less); not measured without an applications clock or a
    latency."""
    health, latency = ctx.gpu_health, ctx.gpu_time_us
    ratio = _clock_ratio(health) if health is not None else None
    if ratio is None or not latency:
        return NoImpact("needs-clock-reference")
    return latency * max(0.0, 1.0 - ratio)


@RULES.rule(
    "throttled",
    severity="problem",
    summary=f"Power or heat held the GPU's clock down while the latency was timed, or it ran below {CLOCK_FLOOR:.0%} "
    "of its applications clock.",
    paragraph=f"""
    NVML sampled the GPU while the cell's timed calls ran (on CUDA, with the `nvml` extra installed;
    `--no-clocks` turns it off). The driver held the SM clock down for power or heat (SW power cap, HW
    slowdown or power brake, SW or HW thermal slowdown) in at least {MIN_THROTTLED_PCT:.0f}% of the samples,
    or the median SM clock while the GPU was busy was below {CLOCK_FLOOR:.0%} of its applications clock, the
    clock the driver runs kernels at when nothing holds it down. The latency is then that of a slowed GPU: it
    compares only with latencies timed at the same clock, and a speed-up against a cell that ran at another
    clock is partly the clock's. The message gives the clock against the applications clock, each reason's
    share of the samples, the power draw against the enforced limit and the highest temperature. The impact
    is an upper bound: how much of a step follows the SM clock depends on the step, and a memory-bound
    kernel follows it less. Let the GPU cool between runs, check its cooling and power limit (`nvidia-smi -q
    -d POWER,TEMPERATURE,PERFORMANCE`), or compare cells timed at the same clock.
    """,
    impact=_clock_shortfall,
)
def _throttled(ctx: FindingContext) -> Said | None:
    health = ctx.gpu_health
    if health is None or health.samples == 0:
        return None
    reasons = sorted(
        ((name, pct) for name, pct in health.reason_pcts.items() if name in THROTTLE_REASONS),
        key=lambda item: -item[1],
    )
    reference, ratio = health.application_clock_mhz, _clock_ratio(health)
    slow = ratio is not None and ratio < CLOCK_FLOOR
    if not slow and not any(pct >= MIN_THROTTLED_PCT for _, pct in reasons):
        return None
    clock = f"SM clock {health.sm_clock_mhz:,} MHz median ({health.sm_clock_min_mhz:,} lowest)"
    if ratio is not None:
        clock += f", {ratio:.0%} of the {reference:,} MHz applications clock"
    parts = [clock]
    if reasons:
        parts.append(", ".join(f"{THROTTLE_REASONS[name]} throttled {pct:.0f}% of samples" for name, pct in reasons))
    if health.power_pct is not None and health.power_max_pct is not None:
        parts.append(f"power {health.power_pct:.0f}% of its limit median, {health.power_max_pct:.0f}% max")
    if health.temperature_max_c is not None:
        parts.append(f"{health.temperature_max_c} °C max")
    values = numbers(
        sm_clock_mhz=health.sm_clock_mhz,
        sm_clock_min_mhz=health.sm_clock_min_mhz,
        application_clock_mhz=reference,
        clock_pct_of_application=None if ratio is None else 100.0 * ratio,
        power_pct=health.power_pct,
        power_max_pct=health.power_max_pct,
        temperature_max_c=health.temperature_max_c,
        samples=health.samples,
        **{f"{name}_pct": pct for name, pct in reasons},
    )
    return f"{'; '.join(parts)} ({health.samples} NVML samples over the timed calls).", values
