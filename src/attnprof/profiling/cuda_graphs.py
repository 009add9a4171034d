"""CUDA graphs and events for `profiling.timing`: how many forwards one graph holds, capturing and replaying
it, recovering from a failed capture, the L2 flush buffer, and the time between two CUDA events.

One graph holds k back-to-back forwards, with k chosen so that a replay holds about `GRAPH_TARGET_US` of GPU
work (at most `GRAPH_MAX_FORWARDS`): that spreads the graph's own launch over k forwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnprof.stats import median

FLUSH_MIN_BYTES = 256 * 1024 * 1024
SIDE_STREAM_WARMUP = 3
GRAPH_TARGET_US = 1000.0
GRAPH_MAX_FORWARDS = 64


def forwards_per_graph(
    replay_us: float, target_us: float = GRAPH_TARGET_US, max_forwards: int = GRAPH_MAX_FORWARDS
) -> int:
    """How many forwards one CUDA graph should hold so that a replay takes about `target_us`,
    given one single-forward replay's time; at least 1, at most `max_forwards`."""
    if max_forwards < 1:
        raise ValueError(f"max_forwards must be >= 1, got {max_forwards}")
    if replay_us <= 0:
        return max_forwards
    return max(1, min(max_forwards, round(target_us / replay_us)))


def flush_buffer(device: Any) -> Any:
    """A byte buffer at least 256 MiB and twice the device's L2, to zero between timed calls."""
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return torch.empty(max(FLUSH_MIN_BYTES, 2 * l2), dtype=torch.int8, device=device)


def event_time_s(launch: Callable[[], Any]) -> float:
    """Seconds between CUDA events around `launch()`, synchronized."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def capture_graph(fn: Callable[[], Any], forwards: int = 1) -> tuple[Any, Any]:
    """Capture `forwards` back-to-back calls of `fn()` into one torch.cuda.CUDAGraph, after a
    side-stream warm-up, and replay it once.

    Returns (graph, last output). Raises whatever the capture raised when it fails.
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(SIDE_STREAM_WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(max(1, forwards) - 1):
            fn()  # dropped at once, as in an eager loop, so the next call reuses its memory
        out = fn()
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


def graphed(fn: Callable[[], Any], warmup_reps: int, single: bool) -> tuple[Any, int, list[float]]:
    """A graph of k forwards ready to replay, k, and its warm replay times (seconds per replay).

    A one-forward graph is captured first; its replay time picks k (`forwards_per_graph`),
    and when k > 1 (never when `single`) a k-forward graph replaces it.
    """
    graph, _ = capture_graph(fn)
    times = [event_time_s(graph.replay) for _ in range(max(1, warmup_reps))]
    forwards = 1 if single else forwards_per_graph(median(times) * 1e6)
    if forwards == 1:
        return graph, 1, times
    del graph
    graph, _ = capture_graph(fn, forwards)
    return graph, forwards, [event_time_s(graph.replay) for _ in range(max(1, warmup_reps))]
