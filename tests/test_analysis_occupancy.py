"""Theoretical occupancy against the CUDA occupancy calculator's numbers."""

from __future__ import annotations

import pytest
from tracegen import A100, H200

from attnprof.analysis import limits_for, theoretical_occupancy
from attnprof.analysis.occupancy import ARCH_LIMITS, kineto_estimate_pct

SM80 = limits_for("8.0")


def test_255_registers_128_threads_on_sm80_is_two_blocks_12_5_pct():
    occ = theoretical_occupancy(255, 128, 0, SM80)
    assert (occ.active_blocks, occ.active_warps, occ.max_warps, occ.pct) == (2, 8, 64, 12.5)
    assert occ.limiter == "registers"
    assert occ.arithmetic == ("255 regs x 128 threads = 32,640 regs/block (allocated 32,768); "
                              "65,536/SM -> 2 blocks = 8 warps of 64 = 12.5%")


def test_240_registers_256_threads_is_one_block_8_warps():
    occ = theoretical_occupancy(240, 256, 0, SM80)
    assert (occ.active_blocks, occ.active_warps, occ.pct, occ.limiter) == (1, 8, 12.5, "registers")
    assert occ.arithmetic.startswith("240 regs x 256 threads = 61,440 regs/block; 65,536/SM -> 1 block")


@pytest.mark.parametrize("regs,threads,smem,arch,blocks,pct,limiter", [
    (32, 256, 0, "sm80", 8, 100.0, "registers"),       # 32 regs: 8 blocks by registers and by warps (tie)
    (64, 256, 0, "sm80", 4, 50.0, "registers"),
    (0, 1024, 0, "sm80", 2, 100.0, "threads"),
    (16, 32, 0, "sm80", 32, 50.0, "blocks"),           # block slots run out first
    (32, 128, 100 * 1024, "sm80", 1, 6.25, "shared memory"),
    (32, 128, 48 * 1024, "sm80", 3, 18.75, "shared memory"),  # (48 KB + 1 KB reserved) x 3 <= 164 KB
    (32, 128, 48 * 1024, "sm70", 2, 12.5, "shared memory"),   # no reservation on Volta, 96 KB/SM
    (32, 256, 0, "sm75", 4, 100.0, "threads"),         # Turing: 32 warps per SM
    (32, 128, 0, "sm86", 12, 100.0, "threads"),        # 48 warps per SM
    (32, 32, 0, "sm89", 24, 50.0, "blocks"),           # 24 block slots
    (168, 384, 134144, "sm90", 1, 18.75, "registers"),  # the cuDNN SDPA kernel on an H200
    (255, 128, 0, "sm100", 2, 12.5, "registers"),
])
def test_calculator_table(regs, threads, smem, arch, blocks, pct, limiter):
    occ = theoretical_occupancy(regs, threads, smem, ARCH_LIMITS[arch])
    assert (occ.active_blocks, occ.pct, occ.limiter) == (blocks, pct, limiter)
    assert occ.blocks_by_limit[occ.limiter] == blocks


def test_every_listed_architecture_has_limits():
    for arch in ("sm70", "sm75", "sm80", "sm86", "sm89", "sm90", "sm100"):
        limits = ARCH_LIMITS[arch]
        assert limits.regs_per_sm == 65536 and limits.max_regs_per_thread == 255 and limits.reg_alloc_unit == 256
        assert limits.reserved_smem_per_block == (1024 if arch >= "sm80" or arch == "sm100" else 0)


def test_shared_memory_arithmetic_names_the_reservation():
    occ = theoretical_occupancy(32, 128, 100 * 1024, SM80)
    assert occ.arithmetic == ("102,400 B shared memory + 1,024 B reserved = 103,424 B/block; "
                              "167,936 B/SM -> 1 block = 4 warps of 64 = 6.25%")


def test_impossible_launches_return_none():
    assert theoretical_occupancy(256, 128, 0, SM80) is None       # over 255 registers per thread
    assert theoretical_occupancy(32, 2048, 0, SM80) is None       # over 1024 threads per block
    assert theoretical_occupancy(32, 128, 200 * 1024, SM80) is None  # over the opt-in shared memory
    assert theoretical_occupancy(32, 0, 0, SM80) is None
    assert theoretical_occupancy(32, None, 0, SM80) is None


def test_device_properties_override_the_table():
    h200 = limits_for(device_properties=H200)
    assert h200.arch == "sm90" and h200.num_sms == 132 and h200.smem_per_sm == 233472
    assert h200.name == "NVIDIA H200" and h200.compute_capability == "9.0"
    odd = dict(A100, maxThreadsPerMultiprocessor=1024, regsPerMultiprocessor=32768)
    limits = limits_for(device_properties=odd)
    assert limits.max_warps_per_sm == 32 and limits.regs_per_sm == 32768
    occ = theoretical_occupancy(64, 256, 0, limits)
    assert occ.max_warps == 32 and occ.active_blocks == 2 and occ.pct == 50.0


@pytest.mark.parametrize("cc,arch", [("8.0", "sm80"), ((9, 0), "sm90"), ("sm_86", "sm86"), ("10.0", "sm100"),
                                     ("8.7", "sm87"), ("10.3", "sm103"), ("12.1", "sm121")])
def test_compute_capability_spellings(cc, arch):
    assert limits_for(cc).arch == arch


def test_unknown_architecture_is_none():
    assert limits_for("6.1") is None
    assert limits_for(None) is None
    assert limits_for(device_properties={"name": "mystery"}) is None


def test_kineto_estimate_matches_what_the_trace_shows():
    # fmha_cutlassF on an H200: 16x8 blocks of 128 threads over 132 SMs -> Kineto printed 6
    h200 = limits_for(device_properties=H200)
    occ = theoretical_occupancy(128, 128, 18944, h200)
    assert round(kineto_estimate_pct(128, 128, occ.active_blocks, h200)) == 6
    # a one-block fill kernel rounds to 0
    assert kineto_estimate_pct(1, 128, 16, h200) < 0.5
    assert kineto_estimate_pct(1, 128, 16, SM80) is None  # the table alone has no SM count
