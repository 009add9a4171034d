"""CUDA graphs and events for `profiling.timing`: whether a cell is timed by graph replay (`graph_choice`), how
many forwards one graph holds, capturing and replaying it, recovering from a failed capture, the L2 (its size,
the flush buffer, the input copies that rotation needs), and the time between two CUDA events.

One graph holds k back-to-back forwards, with k chosen so that a replay holds about `GRAPH_TARGET_US` of GPU
work (at most `GRAPH_MAX_FORWARDS`): that spreads the graph's own launch over k forwards. With rotating input
copies (`--cold-l2 rotate`) forward j of a graph calls copy j mod c, and k is a multiple of c, so that every
forward, across replays too, reads the copy read longest ago: FlashInfer's bench_gpu_time_with_cudagraph
captures its rotating copies the same way, one graph cycling through them, its replay time divided by k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from attnprof.stats import median

FLUSH_MIN_BYTES = 256 * 1024 * 1024
SIDE_STREAM_WARMUP = 3
GRAPH_TARGET_US = 1000.0
GRAPH_MAX_FORWARDS = 64
#: --cuda-graph auto: forward cells with at most this many queries (decode, a speculative chunk) are graph-timed.
AUTO_GRAPH_MAX_QUERIES = 16
#: --cold-l2 rotate: the input copies together exceed this many times the L2 (FlashInfer's threshold).
ROTATE_L2_FACTOR = 5


def graph_choice(choice: str, mode: str, q_len: int, device: str) -> tuple[bool, str]:
    """Whether a cell is timed by CUDA-graph replay under `--cuda-graph` `choice` ("auto", "on", "off"), and
    why in a few words ("" when forced on). "auto" graphs forward cells on CUDA with at most
    `AUTO_GRAPH_MAX_QUERIES` queries, as a serving engine replays a decode step; a backward mode stays eager
    (a serving engine runs no backward, and the backward's saved graph or its untimed forward do not belong
    in a replay)."""
    if choice == "on":
        return True, ""
    if choice == "off":
        return False, "--no-cuda-graph"
    if not device.startswith("cuda"):
        return False, ""
    if mode != "fwd":
        return False, f"auto: {mode} is timed eagerly"
    if q_len > AUTO_GRAPH_MAX_QUERIES:
        return False, f"auto: q_len {q_len} > {AUTO_GRAPH_MAX_QUERIES}"
    return True, f"auto: q_len {q_len} <= {AUTO_GRAPH_MAX_QUERIES}"


def rotation_copies(working_set_bytes: int, l2_bytes: int, factor: int = ROTATE_L2_FACTOR) -> int:
    """How many copies of the inputs (`working_set_bytes` each) make every call read cold data: enough that
    together they exceed `factor` times the L2 (at least 2); 1 when one copy alone is at least that large."""
    if working_set_bytes <= 0 or l2_bytes <= 0:
        raise ValueError(f"need positive sizes, got working set {working_set_bytes}, L2 {l2_bytes}")
    if working_set_bytes >= factor * l2_bytes:
        return 1
    return max(2, math.floor(factor * l2_bytes / working_set_bytes) + 1)


def l2_cache_bytes(device: Any) -> int | None:
    """The device's L2 cache size in bytes (torch's `L2_cache_size`); None when it does not say."""
    import torch

    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0) or None


def forwards_per_graph(
    replay_us: float,
    target_us: float = GRAPH_TARGET_US,
    max_forwards: int = GRAPH_MAX_FORWARDS,
    cycle: int = 1,
) -> int:
    """How many forwards one CUDA graph should hold so that a replay takes about `target_us`, given the
    replay time of a graph of `cycle` forwards (one per input copy; 1 without copies): a multiple of `cycle`,
    at least `cycle`, at most `max_forwards` unless `cycle` alone is more."""
    if max_forwards < 1 or cycle < 1:
        raise ValueError(f"max_forwards and cycle must be >= 1, got {max_forwards}, {cycle}")
    most = max(1, max_forwards // cycle)
    cycles = most if replay_us <= 0 else max(1, min(most, round(target_us / replay_us)))
    return cycles * cycle


def flush_buffer(device: Any) -> Any:
    """A byte buffer at least 256 MiB and twice the device's L2, to zero between timed calls."""
    import torch

    return torch.empty(max(FLUSH_MIN_BYTES, 2 * (l2_cache_bytes(device) or 0)), dtype=torch.int8, device=device)


def event_time_s(launch: Callable[[], Any]) -> float:
    """Seconds between CUDA events around `launch()`, synchronized."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def capture_graph(fn: Callable[[], Any] | Sequence[Callable[[], Any]], forwards: int = 1) -> tuple[Any, Any]:
    """Capture `forwards` back-to-back calls into one torch.cuda.CUDAGraph, after a side-stream warm-up,
    and replay it once. `fn` is one call, or one per input copy (call j of the graph is copy j mod their
    number, each warmed up).

    Returns (graph, last output). Raises whatever the capture raised when it fails.
    """
    import torch

    calls = [fn] if callable(fn) else list(fn)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(SIDE_STREAM_WARMUP):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(max(1, forwards) - 1):
            calls[j % len(calls)]()  # dropped at once, as in an eager loop, so the next call reuses its memory
        out = calls[(max(1, forwards) - 1) % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


def recover_from_failed_capture(device: Any) -> None:
    """Undo what a failed capture leaves behind, so later work on the device runs normally.

    When a capture is invalidated (e.g. by a synchronizing `.item()`), torch's capture_end
    raises before the CUDA RNG generators leave capture mode, and every later random op
    then fails with "Offset increment outside graph capture". One tiny successful capture
    runs the generators' capture prologue and epilogue again and clears that state.
    """
    import torch

    torch.cuda.synchronize(device)
    scratch = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            scratch.add_(1)
    except Exception:  # nothing more to do; the eager fallback still runs
        pass
    del graph
    torch.cuda.synchronize(device)


def graphed(calls: Sequence[Callable[[], Any]], warmup_reps: int, single: bool) -> tuple[Any, int, list[float]]:
    """A graph of k forwards ready to replay, k, and its warm replay times (seconds per replay). `calls`: the
    step over each input copy (one without rotation).

    A graph of one forward per copy is captured first; its replay time picks k (`forwards_per_graph`),
    and when k is more (never when `single`) a k-forward graph replaces it.
    """
    cycle = len(calls)
    graph, _ = capture_graph(calls, cycle)
    times = [event_time_s(graph.replay) for _ in range(max(1, warmup_reps))]
    forwards = cycle if single else forwards_per_graph(median(times) * 1e6, cycle=cycle)
    if forwards == cycle:
        return graph, cycle, times
    del graph
    graph, _ = capture_graph(calls, forwards)
    return graph, forwards, [event_time_s(graph.replay) for _ in range(max(1, warmup_reps))]


def rotation_note(copies: int, l2_bytes: int | None) -> str:
    """How the calls rotated through `copies` copies of the inputs, for a timing's method."""
    l2 = f"{l2_bytes / 2**20:.0f} MiB" if l2_bytes else "its size unknown"
    if copies == 1:
        return f"L2 rotated: one copy of the inputs alone exceeds 5x the L2 ({l2})"
    return f"L2 rotated: each call reads the next of {copies} copies of the inputs, together over 5x the L2 ({l2})"


def event_samples(
    launch: Callable[[], Any], setup: Callable[[], Any], dev: Any, reps: int, flush_l2: bool
) -> list[float]:
    """`reps` launches back to back, each between a pair of CUDA events (after `setup`, and the L2 flush
    outside the events), one synchronize at the end; the seconds of each."""
    import torch

    cache = flush_buffer(dev) if flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize(dev)
    for i in range(reps):
        setup()
        if cache is not None:
            cache.zero_()
        starts[i].record()
        launch()
        ends[i].record()
    torch.cuda.synchronize(dev)
    del cache
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
