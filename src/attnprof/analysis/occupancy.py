"""Theoretical occupancy of a kernel launch, the way the CUDA occupancy calculator computes it.

Occupancy = resident warps per SM / the SM's maximum. Resident blocks per SM are the fewest of
four limits: registers, shared memory, warps (threads) and the hardware's block slots.
`theoretical_occupancy` returns the percentage, the limiting factor and the arithmetic as a
sentence, e.g. ``255 regs x 128 threads = 32,640 regs/block; 65,536/SM -> 2 blocks = 8 warps
of 64 = 12.5%``.

Per-architecture limits come from the CUDA C Programming Guide's table of compute capabilities
(and the occupancy calculator): registers are allocated per warp in units of 256 and split
over 4 SM sub-partitions; from sm80 on, the driver reserves 1 KB of shared memory per block.
A trace's `deviceProperties` entry overrides what it reports (registers and shared memory per
SM, threads per SM, warp size, SM count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

WARP_SIZE = 32


@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits of one compute capability."""

    arch: str  # "sm80"
    max_warps_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int = 65536
    reg_alloc_unit: int = 256  # registers, allocated per warp
    max_regs_per_thread: int = 255
    reg_sub_partitions: int = 4
    smem_per_sm: int = 0  # the largest shared-memory carveout, bytes
    max_smem_per_block: int = 0  # opt-in maximum for one block, bytes
    default_smem_per_block: int = 48 * 1024  # without the opt-in attribute
    reserved_smem_per_block: int = 0  # driver-reserved, added to every block (sm80+: 1 KB)
    smem_alloc_unit: int = 256
    max_threads_per_block: int = 1024
    warp_size: int = WARP_SIZE
    num_sms: int | None = None
    name: str | None = None

    @property
    def compute_capability(self) -> str:
        """The compute capability as major.minor ("9.0" for sm90)."""
        digits = self.arch[2:]
        return f"{digits[:-1]}.{digits[-1]}"


KB = 1024
#: Limits by architecture. Shared memory is the maximum carveout per SM and the opt-in per block.
ARCH_LIMITS: dict[str, SmLimits] = {
    "sm70": SmLimits("sm70", 64, 32, smem_per_sm=96 * KB, max_smem_per_block=96 * KB, smem_alloc_unit=256),
    "sm72": SmLimits("sm72", 64, 32, smem_per_sm=96 * KB, max_smem_per_block=96 * KB, smem_alloc_unit=256),
    "sm75": SmLimits("sm75", 32, 16, smem_per_sm=64 * KB, max_smem_per_block=64 * KB, smem_alloc_unit=256),
    "sm80": SmLimits(
        "sm80",
        64,
        32,
        smem_per_sm=164 * KB,
        max_smem_per_block=163 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
    "sm86": SmLimits(
        "sm86",
        48,
        16,
        smem_per_sm=100 * KB,
        max_smem_per_block=99 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
    "sm87": SmLimits(
        "sm87",
        48,
        16,
        smem_per_sm=164 * KB,
        max_smem_per_block=163 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
    "sm89": SmLimits(
        "sm89",
        48,
        24,
        smem_per_sm=100 * KB,
        max_smem_per_block=99 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
    "sm90": SmLimits(
        "sm90",
        64,
        32,
        smem_per_sm=228 * KB,
        max_smem_per_block=227 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
    "sm100": SmLimits(
        "sm100",
        64,
        32,
        smem_per_sm=228 * KB,
        max_smem_per_block=227 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
    "sm120": SmLimits(
        "sm120",
        48,
        32,
        smem_per_sm=128 * KB,
        max_smem_per_block=99 * KB,
        reserved_smem_per_block=KB,
        smem_alloc_unit=128,
    ),
}

REGISTERS, SHARED_MEMORY, WARPS, BLOCKS = "registers", "shared memory", "threads", "blocks"


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one launch configuration on one SM."""

    pct: float  # 0..100
    active_blocks: int
    active_warps: int
    max_warps: int
    limiter: str  # REGISTERS, SHARED_MEMORY, WARPS or BLOCKS
    blocks_by_limit: dict[str, int]
    arithmetic: str
    arch: str


def limits_for(
    compute_capability: str | tuple[int, int] | None = None, device_properties: dict[str, Any] | None = None
) -> SmLimits | None:
    """Limits for a compute capability ("9.0", (9, 0), "sm90"), refined by a trace's
    `deviceProperties` entry when given. None when neither names a known architecture."""
    props = device_properties or {}
    major, minor = None, None
    if compute_capability is not None:
        major, minor = _parse_cc(compute_capability)
    elif "computeMajor" in props:
        try:
            major, minor = int(props["computeMajor"]), int(props.get("computeMinor", 0))
        except (TypeError, ValueError):
            major = None
    if major is None:
        return None
    arch = f"sm{major}{minor}"
    base = ARCH_LIMITS.get(arch)
    if base is None:  # nearest known architecture of the same major version, at or below
        same = sorted(
            (a for a in ARCH_LIMITS if a.startswith(f"sm{major}") and len(a) == len(arch) and a <= arch), reverse=True
        )
        if not same:
            return None
        base = replace(ARCH_LIMITS[same[0]], arch=arch)
    return _apply_properties(base, props) if props else base


def _parse_cc(cc: str | tuple[int, int]) -> tuple[int | None, int | None]:
    if isinstance(cc, tuple):
        return int(cc[0]), int(cc[1])
    text = str(cc).lower().removeprefix("sm_").removeprefix("sm")
    if "." in text:
        major, _, minor = text.partition(".")
        return int(major), int(minor[:1] or 0)
    if text.isdigit() and len(text) >= 2:
        return int(text[:-1]), int(text[-1])
    return None, None


def _apply_properties(base: SmLimits, props: dict[str, Any]) -> SmLimits:
    def num(key: str) -> int | None:
        value = props.get(key)
        try:
            return int(value) if value is not None and int(value) > 0 else None
        except (TypeError, ValueError):
            return None

    changes: dict[str, Any] = {}
    warp = num("warpSize") or base.warp_size
    if threads := num("maxThreadsPerMultiprocessor"):
        changes["max_warps_per_sm"] = threads // warp
    if num("maxBlocksPerMultiProcessor"):
        changes["max_blocks_per_sm"] = num("maxBlocksPerMultiProcessor")
    if num("regsPerMultiprocessor"):
        changes["regs_per_sm"] = num("regsPerMultiprocessor")
    if num("sharedMemPerMultiprocessor"):
        changes["smem_per_sm"] = num("sharedMemPerMultiprocessor")
    if num("sharedMemPerBlockOptin"):
        changes["max_smem_per_block"] = num("sharedMemPerBlockOptin")
    if num("sharedMemPerBlock"):
        changes["default_smem_per_block"] = num("sharedMemPerBlock")
    if num("reservedSharedMemPerBlock") is not None:
        changes["reserved_smem_per_block"] = num("reservedSharedMemPerBlock")
    if num("maxThreadsPerBlock"):
        changes["max_threads_per_block"] = num("maxThreadsPerBlock")
    changes["warp_size"] = warp
    if num("numSms"):
        changes["num_sms"] = num("numSms")
    if props.get("name"):
        changes["name"] = str(props["name"])
    return replace(base, **changes)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit if unit > 0 else value


def _fmt_pct(pct: float) -> str:
    return f"{pct:.2f}".rstrip("0").rstrip(".") + "%"


def theoretical_occupancy(
    registers_per_thread: int | None, threads_per_block: int | None, shared_memory_bytes: int | None, limits: SmLimits
) -> Occupancy | None:
    """The occupancy calculator's result for one launch, or None if the launch cannot run
    (no threads, too many threads, registers or shared memory for one block) or is unknown."""
    if not threads_per_block or threads_per_block <= 0 or threads_per_block > limits.max_threads_per_block:
        return None
    regs = registers_per_thread or 0
    smem = shared_memory_bytes or 0
    if regs > limits.max_regs_per_thread or smem < 0:
        return None
    warps_per_block = math.ceil(threads_per_block / limits.warp_size)
    max_warps = limits.max_warps_per_sm

    by_limit: dict[str, int] = {BLOCKS: limits.max_blocks_per_sm, WARPS: max_warps // warps_per_block}
    regs_per_warp = _round_up(regs * limits.warp_size, limits.reg_alloc_unit)
    if regs_per_warp:
        parts = limits.reg_sub_partitions or 1
        per_part = limits.regs_per_sm // parts
        by_limit[REGISTERS] = (per_part // regs_per_warp) * parts // warps_per_block
    smem_alloc = 0
    if smem:
        smem_alloc = _round_up(smem + limits.reserved_smem_per_block, limits.smem_alloc_unit)
        if smem > limits.max_smem_per_block:
            return None
        by_limit[SHARED_MEMORY] = limits.smem_per_sm // smem_alloc
    blocks = min(by_limit.values())
    if blocks <= 0:
        return None
    order = (REGISTERS, SHARED_MEMORY, WARPS, BLOCKS)  # ties: name the resource the kernel spends
    limiter = next(name for name in order if by_limit.get(name) == blocks)
    active_warps = blocks * warps_per_block
    pct = 100.0 * active_warps / max_warps
    tail = f"{blocks} block{'s' if blocks != 1 else ''} = {active_warps} warps of {max_warps} = {_fmt_pct(pct)}"
    if limiter == REGISTERS:
        per_block = regs * threads_per_block
        allocated = regs_per_warp * warps_per_block
        note = f" (allocated {allocated:,})" if allocated != per_block else ""
        arithmetic = (
            f"{regs} regs x {threads_per_block} threads = {per_block:,} regs/block{note}; "
            f"{limits.regs_per_sm:,}/SM -> {tail}"
        )
    elif limiter == SHARED_MEMORY:
        reserved = f" + {limits.reserved_smem_per_block:,} B reserved" if limits.reserved_smem_per_block else ""
        arithmetic = (
            f"{smem:,} B shared memory{reserved} = {smem_alloc:,} B/block; {limits.smem_per_sm:,} B/SM -> {tail}"
        )
    elif limiter == WARPS:
        arithmetic = f"{threads_per_block} threads = {warps_per_block} warps/block; {max_warps} warps/SM -> {tail}"
    else:
        arithmetic = (
            f"{threads_per_block} threads = {warps_per_block} warps/block; "
            f"at most {limits.max_blocks_per_sm} blocks/SM -> {tail}"
        )
    return Occupancy(
        pct=round(pct, 2),
        active_blocks=blocks,
        active_warps=active_warps,
        max_warps=max_warps,
        limiter=limiter,
        blocks_by_limit=by_limit,
        arithmetic=arithmetic,
        arch=limits.arch,
    )


def kineto_estimate_pct(grid_blocks: int, threads_per_block: int, active_blocks: int, limits: SmLimits) -> float | None:
    """What Kineto's `est. achieved occupancy %` would be: min(grid blocks / SMs, resident
    blocks) x threads / max threads per SM. None without the SM count."""
    if not limits.num_sms:
        return None
    blocks_per_sm = min(grid_blocks / limits.num_sms, active_blocks)
    return 100.0 * blocks_per_sm * threads_per_block / (limits.max_warps_per_sm * limits.warp_size)
