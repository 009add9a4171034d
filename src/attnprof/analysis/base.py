"""Facts every stage of the analysis shares: device event kinds, runtime domains, the time
tolerance of Kineto's timestamps, and the runtime APIs that launch device work or wait for it."""

from __future__ import annotations

import re

KERNEL, MEMCPY, MEMSET = 0, 1, 2  # device event kinds
KIND_NAMES = ("kernel", "memcpy", "memset")
RUNTIME, DRIVER = 0, 1  # runtime event domains

EPS = 0.0021  # us; Kineto widens GPU annotations by 1 ns each side and rounds to ns

#: Launch APIs by what they put on the device. Memcpy and memset variants are matched by prefix.
KERNEL_LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaLaunchHostFunc",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernelMultiDevice",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
_MEMCPY_API = re.compile(r"^(?:cuda|cu|hip)Memcpy")
_MEMSET_API = re.compile(r"^(?:cuda|cu|hip)Memset")


def launch_kind(api: str) -> str | None:
    """'kernel', 'graph', 'memcpy' or 'memset' for a launch API name; None for other calls
    (synchronization, events, attribute queries, profiler overhead)."""
    if api in KERNEL_LAUNCH_APIS:
        return "kernel"
    if api in GRAPH_LAUNCH_APIS:
        return "graph"
    if _MEMCPY_API.match(api):
        return "memcpy"
    if _MEMSET_API.match(api):
        return "memset"
    return None


#: Runtime calls that block the CPU until the device catches up (host syncs).
SYNC_APIS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
    }
)
