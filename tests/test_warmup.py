"""The process warm-up: a cell's timing must not depend on running first in its process."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnprof.profiling.warmup import forget_warmed, warm_process

# Page faults of sdpa-math's calls in a fresh process, before and after warm_process: deterministic where
# wall times on a shared machine are not.
FAULTS = """
import resource, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from attnprof.profiling.warmup import warm_process

torch.manual_seed(0)
torch.set_num_threads(1)  # one arena: with the pool's threads, which arena frees a block varies (61 or 450 faults)
q, k, v = (torch.randn(1, 4, 256, 64) for _ in range(3))

def faults_per_call(calls=20):
    def call():
        with sdpa_kernel(SDPBackend.MATH):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for _ in range(3):
        call()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        call()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls

cold = faults_per_call()
warm_process("cpu")
print(cold, faults_per_call())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the dynamic mmap threshold is glibc's")
def test_warming_keeps_the_allocator_from_handing_back_blocks_every_call() -> None:
    """sdpa-math at 1x4x256x64 allocates MiB-sized intermediates; in a fresh process glibc hands them back
    to the kernel after every call, so each call faults its pages in again (the first cell of a process ran
    2x slower for it). After warm_process the calls reuse the heap."""
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True)
    cold, warm = (float(x) for x in out.stdout.split())
    assert warm <= max(cold, 20.0), f"{warm} page faults a call after warming, {cold} before"  # never worse
    if cold < 100:  # seen inside the full suite on CI (27 a call); alone the same process faults about 500
        pytest.skip(f"a fresh process faulted only {cold} pages a call here: glibc kept the blocks, nothing to remove")
    # alone: about 500 cold and 0-2 warm; in a full suite on a loaded 2-core box, 136 and 9.6 (14x) were seen
    assert warm <= cold / 10, f"{warm} page faults a call after warming, {cold} before"


def test_warm_process_runs_once_per_device() -> None:
    forget_warmed()
    first = warm_process("cpu")
    assert first is not None and first.device == "cpu" and first.seconds > 0
    assert first.note.startswith("process warmed for cpu in ")
    assert "allocator: a 31 MiB block freed" in first.note and "profiler initialised" in first.note
    assert warm_process("cpu") is None


def _latency(tmp_path: Path, device: str, order: list[str], variant: str, tag: str, *extra: str) -> float:
    """`variant`'s median latency in a fresh process's compare of `order` on `device`."""
    args = [a for name in order for a in ("--variants", name)]
    out_dir = tmp_path / tag
    subprocess.run(
        [
            sys.executable,
            "-m",
            "attnprof",
            "compare",
            "--device",
            device,
            *args,
            *extra,
            "-o",
            str(out_dir),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(next(out_dir.glob("*/results.json")).read_text())
    row = next(row for row in document["results"] if row["variant"] == variant)
    _CONTENDED[out_dir.name] = bool(row.get("contended"))
    return row["latency_us"]


#: Whether the row `_latency` last read from each output folder was timed under CPU contention.
_CONTENDED: dict[str, bool] = {}


@pytest.mark.slow
def test_a_cell_times_the_same_whether_it_runs_first_or_last(tmp_path: Path) -> None:
    """Issue 25: sdpa-math first in a process measured 2x its time after sdpa. Each attempt runs both
    orders in fresh processes. Other work on a shared machine only ever adds time, so each order keeps its
    fastest median over the attempts (at most three), and the two must agree within 1.5x: well inside the
    2x of the bug, well outside the 1.3x that CI's shared 2-core runner put between single pairs. An
    attempt whose rows attnprof itself marked contended measured the other processes and is not counted;
    when every attempt was contended the test is skipped with the reason."""
    best = {"first": float("inf"), "last": float("inf")}
    seen = []
    for attempt in range(3):
        quick = ("--min-time", "0.15")
        first = _latency(tmp_path, "cpu", ["sdpa-math", "sdpa"], "sdpa-math", f"first-{attempt}", *quick)
        last = _latency(tmp_path, "cpu", ["sdpa", "sdpa-math"], "sdpa-math", f"last-{attempt}", *quick)
        seen.append((round(first), round(last)))
        if _CONTENDED[f"first-{attempt}"] or _CONTENDED[f"last-{attempt}"]:
            continue
        best = {"first": min(best["first"], first), "last": min(best["last"], last)}
        if max(best.values()) / min(best.values()) <= 1.25:
            return
    if best["first"] == float("inf"):
        pytest.skip(f"every attempt was timed under CPU contention (first, last µs: {seen}): not judged")
    ratio = max(best.values()) / min(best.values())
    assert ratio <= 1.5, f"sdpa-math first vs last in its process: best {ratio:.2f}x (first, last µs: {seen})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_warm_process_on_cuda_settles_the_clock_once() -> None:
    forget_warmed()
    first = warm_process("cuda:0")
    assert first is not None and first.device == "cuda:0" and first.seconds < 5
    assert "context, cuBLAS and SM clock:" in first.note and "profiler initialised" in first.note
    assert warm_process("cuda:0") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["sdpa-flash", "sdpa-math"])
def test_a_cuda_cell_times_the_same_whether_it_runs_first_or_last(tmp_path: Path, variant: str) -> None:
    """At a shape where the GPU sets the pace (4x16x4096x128), each variant's latency first in its process and
    after the other agree within 1.25x. (At the default 1x4x256x64 the cells are host-bound and their
    latency follows the host's CPU, which on the H200 machine varied 1.7x between identical compares in one
    process, in either order: docs/validation.md.)"""
    shape = ("--batch", "4", "--heads", "16", "--seq", "4096", "--head-dim", "128", "--min-time", "0.2")
    other = "sdpa-math" if variant == "sdpa-flash" else "sdpa-flash"
    first = _latency(tmp_path, "cuda", [variant, other], variant, "first", *shape)
    last = _latency(tmp_path, "cuda", [other, variant], variant, "last", *shape)
    assert max(first, last) / min(first, last) <= 1.25, (first, last)
