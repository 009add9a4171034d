import pytest
import torch

from attnprof.errors import VariantFailure
from attnprof.profiling import memory
from attnprof.profiling.memory import is_oom, oom_failure, oom_guard, peak_extra_memory_mib


def test_cpu_reports_none_and_does_not_run():
    calls = []
    assert peak_extra_memory_mib(lambda: calls.append(1), "cpu") is None
    assert calls == []


@pytest.fixture
def fake_cuda(monkeypatch):
    """Stand-ins for torch.cuda's memory counters, so the CUDA path runs on a CPU build."""
    state = {"allocated": 100 * memory.MIB, "peak": 0, "resets": 0}

    def reset(dev=None):
        state["resets"] += 1
        state["peak"] = state["allocated"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: state["peak"])
    monkeypatch.setattr(memory, "release_cached_memory", lambda: None)
    return state


def test_cuda_path_reports_peak_above_inputs(fake_cuda):
    def fn():
        fake_cuda["peak"] = fake_cuda["allocated"] + 64 * memory.MIB
        return "out"

    assert peak_extra_memory_mib(fn, "cuda:0") == pytest.approx(64.0)
    assert fake_cuda["resets"] == 1


def test_cuda_path_oom_becomes_variant_failure(fake_cuda):
    def fn():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 GiB")

    with pytest.raises(VariantFailure) as info:
        peak_extra_memory_mib(fn, "cuda:0")
    assert info.value.message == "out of memory: Tried to allocate 512.00 GiB"


def test_is_oom():
    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


def test_oom_failure_is_one_short_line():
    msg = oom_failure(torch.OutOfMemoryError("CUDA out of memory. " + "x" * 500 + "\nsecond line")).message
    assert msg.startswith("out of memory: ") and "\n" not in msg and len(msg) < 230


def test_oom_guard_passes_other_errors_and_values():
    with pytest.raises(KeyError):
        with oom_guard():
            raise KeyError("k")
    with oom_guard():
        value = 3
    assert value == 3
