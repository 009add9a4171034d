"""Run by torchrun from tests/test_sharded_sweep.py: the attnprof CLI with `naive` running out of memory at
sequence length SEQ and above on every rank. Usage: torchrun ... tests/oom_worker.py SEQ ATTNPROF-ARGS..."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from attnprof.entry import main
from attnprof.plugins import load_variants


def out_of_memory_from(seq: int, patch: Callable[[Any, str, Any], None] = setattr, no_plugins: bool = True) -> None:
    """`naive` raises torch's out-of-memory error at sequence length `seq` and above (`patch` sets its forward:
    pytest's `monkeypatch.setattr` undoes it after a test)."""
    variant = load_variants(no_plugins=no_plugins).registry.get("naive")
    original = variant.forward

    def forward(q, k, v, causal, state):
        if q.shape[2] >= seq:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return original(q, k, v, causal, state)

    patch(variant, "forward", forward)


if __name__ == "__main__":
    out_of_memory_from(int(sys.argv[1]))
    sys.argv = ["attnprof", *sys.argv[2:]]
    main()
