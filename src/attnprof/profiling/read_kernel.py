"""The Triton kernel of the read-bandwidth probe (`profiling.read_probe`): a grid-stride sum.

Imported only when triton is installed and the probe runs on CUDA (it imports triton at the top).
Each of a fixed number of programs walks the buffer in tiles of BLOCK contiguous fp32 values,
`UNROLL` independent tiles per loop step (so several loads per thread are in flight at once), tile t
of step i being (i * UNROLL + u) * programs + pid: neighbouring programs read neighbouring tiles. The
loads take the cache hint `CACHE` ("" or ".cg", which bypasses L1); each thread's contiguous share of
a tile compiles to 16-byte loads (`ld.global.v4.b32`, for a 16-byte aligned buffer). The sums go into
one float per program, so the kernel writes next to nothing. No masks: the caller sizes the work to
whole tiles (`read_sum`).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def grid_stride_sum(src, out, steps, BLOCK: tl.constexpr, UNROLL: tl.constexpr, CACHE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offsets = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(steps):
        for u in tl.static_range(UNROLL):
            tile = (i * UNROLL + u) * programs + pid
            acc += tl.load(src + tile * BLOCK + offsets, cache_modifier=CACHE)
    tl.store(out + pid, tl.sum(acc, axis=0))


def read_sum(src: Any, out: Any, block: int, unroll: int, warps: int, cache: str = "") -> int:
    """Launch `grid_stride_sum` over the fp32 tensor `src` with one program per element of `out` (fp32),
    `cache` the loads' cache modifier ("" or ".cg"); returns the number of elements it reads: the most
    whole steps of programs × UNROLL × BLOCK that fit."""
    programs = out.numel()
    steps = src.numel() // (programs * unroll * block)
    if steps < 1:
        raise ValueError(f"{src.numel()} elements are fewer than one step of {programs} x {unroll} x {block}")
    grid_stride_sum[(programs,)](src, out, steps, BLOCK=block, UNROLL=unroll, CACHE=cache, num_warps=warps)
    return steps * programs * unroll * block
