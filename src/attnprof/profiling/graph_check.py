"""Does a captured CUDA graph hold the step? The device work of one eager step and of one replay of its graph,
counted by torch.profiler and compared: a replay of k forwards must launch k times the eager step's kernels,
memsets and memcpys, each kind on its own. A graph that missed some (work on another stream, or a call that
ran on the host during capture) would time less than the step and give silently wrong figures.

Counted from the profiler's Chrome trace (its `traceEvents`), as the analysis reads traces: device events are
`cat` kernel, gpu_memset and gpu_memcpy. In the eager profile every device event counts; in the replay's, only
those whose `correlation` is that of a graph launch (`cudaGraphLaunch`, `cuGraphLaunch`): torch's replay may
launch kernels of its own beside the graph (the RNG seed and offset of a graph that registered a generator),
which are not the step's.

`count_device_work` and `graph_mismatch` are pure (tests feed them fake events); `check_graph` profiles the
two and raises VariantFailure with the reason on a mismatch.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprof.errors import VariantFailure

#: The Chrome trace's categories of device work, by the kind they are counted as.
DEVICE_KINDS = {"kernel": "kernels", "gpu_memset": "memsets", "gpu_memcpy": "memcpys"}
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")


@dataclass(frozen=True)
class DeviceWork:
    """Device work counted in a profile: kernels, memsets and memcpys."""

    kernels: int = 0
    memsets: int = 0
    memcpys: int = 0

    def times(self, n: int) -> DeviceWork:
        """This work done `n` times over."""
        return DeviceWork(self.kernels * n, self.memsets * n, self.memcpys * n)

    @property
    def text(self) -> str:
        """ "2 kernels, 1 memset" (kinds with none left out; "no device work" for none)."""
        parts = [f"{count} {kind[:-1] if count == 1 else kind}" for kind, count in self._counts() if count]
        return ", ".join(parts) or "no device work"

    def _counts(self) -> list[tuple[str, int]]:
        return [("kernels", self.kernels), ("memsets", self.memsets), ("memcpys", self.memcpys)]


def _is_graph_launch(event: Mapping[str, Any]) -> bool:
    name = str(event.get("name", ""))
    return event.get("cat") in ("cuda_runtime", "cuda_driver") and any(api in name for api in GRAPH_LAUNCH_APIS)


def count_device_work(events: Iterable[Mapping[str, Any]], graph_only: bool = False) -> DeviceWork:
    """The device events among Chrome-trace `events` by kind; with `graph_only`, only those launched by a graph
    launch (the same `args.correlation`)."""
    events = list(events)
    launches = {e.get("args", {}).get("correlation") for e in events if _is_graph_launch(e)} if graph_only else None
    counts = dict.fromkeys(DEVICE_KINDS.values(), 0)
    for event in events:
        kind = DEVICE_KINDS.get(str(event.get("cat")))
        if kind is None:
            continue
        if launches is not None and event.get("args", {}).get("correlation") not in launches:
            continue
        counts[kind] += 1
    return DeviceWork(**counts)


def graph_mismatch(eager: DeviceWork, replay: DeviceWork, forwards: int) -> str | None:
    """Why a replay of a graph of `forwards` steps does not hold what one eager step launched (`forwards` times
    each kind); None when it does."""
    expected = eager.times(forwards)
    if replay == expected and eager.kernels + eager.memsets + eager.memcpys > 0:
        return None
    if eager == DeviceWork():
        return "the eager step launched no device work that the profiler saw, so its graph cannot be checked"
    per = f" ({forwards} forwards)" if forwards > 1 else ""
    return (
        f"its CUDA graph does not hold the step: one replay{per} launched {replay.text}, the eager step "
        f"{eager.text}{f' ({expected.text} for {forwards})' if forwards > 1 else ''}; "
        "time it with --no-cuda-graph"
    )


def trace_events(run: Callable[[], Any]) -> list[dict[str, Any]]:
    """The Chrome-trace events of one `run()` under torch.profiler (CPU and CUDA activities), synchronized."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory(prefix="attnprof-graph-check-") as folder:
        path = Path(folder) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
        return list(json.loads(path.read_text()).get("traceEvents", []))


def check_graph(step: Callable[[], Any], replay: Callable[[], Any], forwards: int) -> DeviceWork:
    """Profile one eager `step()` and one `replay()` of its graph of `forwards` steps; the eager step's device
    work when the replay holds `forwards` times it, else VariantFailure saying what differs."""
    eager = count_device_work(trace_events(step))
    replayed = count_device_work(trace_events(replay), graph_only=True)
    problem = graph_mismatch(eager, replayed, forwards)
    if problem is not None:
        raise VariantFailure(problem)
    return eager
