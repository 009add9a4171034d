"""The Nsight Compute metrics attnprof reads, what each means, and the sections that collect them.

`COUNTER_METRICS` is the table: each per-kernel field of `KernelCounters`, the ncu metric it is read from
(a second name is tried when the first is missing), the section that collects it and its meaning.
`STALL_REASONS` names the warp-stall reasons in plain words; each is read from
`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`, the warps stalled for that reason
per issued instruction (WarpStateStats). `selected` is the warp issuing, not a stall: it is never part
of the stall shares.

`NCU_SECTIONS` and `NCU_METRICS` are what a collection asks `ncu` for (`--section` each, `--metrics` the
list): the sections give nearly everything, the metrics the few figures no section is certain to give.
The raw pages in tests/data/h200/ncu were collected with exactly these, on an H200 with ncu 2025.3.1.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The sections `ncu` collects (`--section NAME` each).
NCU_SECTIONS: tuple[str, ...] = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "ComputeWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
)

#: Metrics `ncu` collects beside the sections (`--metrics a,b,...`).
NCU_METRICS: tuple[str, ...] = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active",
)


@dataclass(frozen=True)
class CounterMetric:
    """One figure of `KernelCounters`: its field, the ncu metrics it is read from (the first present),
    the section (or `--metrics`) that collects it, and what it means."""

    field: str
    names: tuple[str, ...]
    source: str
    meaning: str


#: Every figure a kernel's counters hold, in the order of `KernelCounters`.
COUNTER_METRICS: tuple[CounterMetric, ...] = (
    CounterMetric("duration_us", ("gpu__time_duration.sum",), "SpeedOfLight", "the kernel's time on the GPU"),
    CounterMetric("dram_read_bytes", ("dram__bytes_read.sum",), "--metrics", "bytes read from DRAM (HBM)"),
    CounterMetric("dram_write_bytes", ("dram__bytes_write.sum",), "--metrics", "bytes written to DRAM"),
    CounterMetric(
        "dram_gbps",
        ("dram__bytes.sum.per_second",),
        "MemoryWorkloadAnalysis",
        "DRAM bytes (read and written) per second over the kernel's time, GB/s",
    ),
    CounterMetric(
        "dram_pct_of_peak",
        (
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        ),
        "SpeedOfLight",
        "DRAM throughput in percent of the GPU's peak DRAM bandwidth",
    ),
    CounterMetric(
        "sm_throughput_pct",
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
        "SpeedOfLight",
        "the busiest SM unit's throughput in percent of its peak (Speed Of Light: compute)",
    ),
    CounterMetric(
        "tensor_pipe_pct",
        (
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        ),
        "--metrics",
        "cycles the tensor pipe was active, in percent of the cycles the SMs were active",
    ),
    CounterMetric(
        "gmma_instructions",
        ("sm__inst_executed_pipe_tensor_op_gmma.sum",),
        "--metrics",
        "warpgroup MMA (wgmma, Hopper) instructions executed; above 0: the tensor pipe ran wgmma, else mma",
    ),
    CounterMetric(
        "achieved_occupancy_pct",
        ("sm__warps_active.avg.pct_of_peak_sustained_active",),
        "Occupancy",
        "achieved occupancy: warps resident per active cycle in percent of the SM's maximum, measured",
    ),
    CounterMetric(
        "theoretical_occupancy_pct",
        ("sm__maximum_warps_per_active_cycle_pct",),
        "Occupancy",
        "theoretical occupancy: the most warps the launch's registers, shared memory and block size allow",
    ),
    CounterMetric(
        "l2_hit_rate_pct",
        ("lts__t_sector_hit_rate.pct",),
        "--metrics",
        "L2 sector lookups that hit, in percent",
    ),
    CounterMetric("registers_per_thread", ("launch__registers_per_thread",), "LaunchStats", "registers per thread"),
    CounterMetric(
        "shared_memory_bytes",
        ("launch__shared_mem_per_block",),
        "LaunchStats",
        "shared memory per block (static, dynamic and the driver's reserve), bytes",
    ),
)

#: Block and grid dimensions (LaunchStats), x, y and z.
BLOCK_METRICS = ("launch__block_dim_x", "launch__block_dim_y", "launch__block_dim_z")
GRID_METRICS = ("launch__grid_dim_x", "launch__grid_dim_y", "launch__grid_dim_z")
#: The GPU's name as the report gives it.
DEVICE_METRIC = "device__attribute_display_name"

#: Warp-stall reasons (WarpStateStats) in plain words: what the stalled warps were waiting for.
STALL_REASONS: dict[str, str] = {
    "barrier": "block-wide syncs (warps waiting at a barrier for the rest of their block)",
    "branch_resolving": "branch targets being resolved",
    "dispatch_stall": "the dispatcher holding instructions back (a pipeline conflict)",
    "drain": "memory stores draining at the warp's exit",
    "gmma": "waiting on warpgroup MMA (wgmma) results",
    "imc_miss": "immediate-constant cache misses",
    "lg_throttle": "the global/local memory queue full (too many memory instructions in flight)",
    "long_scoreboard": "waiting on global memory (L1TEX: global, local or texture loads)",
    "math_pipe_throttle": "a math pipe saturated (warps waiting for their pipe to be free)",
    "membar": "memory barriers (fences)",
    "mio_throttle": "shared-memory pressure (the MIO instruction queue full)",
    "misc": "miscellaneous reasons",
    "no_instruction": "the instruction cache (no instruction fetched yet)",
    "not_selected": "nothing: the warp was eligible but another warp issued",
    "short_scoreboard": "waiting on shared memory or special-function (MUFU) results",
    "sleeping": "sleeping warps (nanosleep, or threads of the warp waiting)",
    "tex_throttle": "the texture queue full",
    "wait": "fixed-latency dependencies (the fixed wait after an instruction)",
}
#: The warp issuing, reported among the stall ratios but not a stall.
ISSUING = "selected"


def stall_metric(reason: str) -> str:
    """The ncu metric of one stall reason: warps stalled for it per issued instruction."""
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def stall_label(reason: str) -> str:
    """`long scoreboard`: the reason as Nsight Compute's UI names it."""
    return reason.replace("_", " ")
