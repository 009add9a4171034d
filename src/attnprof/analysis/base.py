"""Facts every stage of the analysis shares: device event kinds, runtime domains and the time
tolerance of Kineto's timestamps."""

from __future__ import annotations

KERNEL, MEMCPY, MEMSET = 0, 1, 2  # device event kinds
KIND_NAMES = ("kernel", "memcpy", "memset")
RUNTIME, DRIVER = 0, 1  # runtime event domains

EPS = 0.0021  # us; Kineto widens GPU annotations by 1 ns each side and rounds to ns
