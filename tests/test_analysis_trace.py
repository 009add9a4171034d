"""load_trace: formats (dict, .json, .json.gz, bare list), streaming edge cases, errors."""

from __future__ import annotations

import gzip
import json

import pytest

from attnprof.analysis import load_trace
from attnprof.analysis import trace as trace_module
from attnprof.analysis.trace import KERNEL, MEMCPY, MEMSET
from attnprof.errors import TraceError
from tracegen import CUDNN, MASKED_FILL, TraceBuilder, build, fused_forward, naive_forward


def _summary(t):
    return (t.event_count, len(t.cpu_ops), len(t.annotations), len(t.runtime), len(t.device),
            len(t.gpu_annotations), sorted(t.names), list(t.device.corr), list(t.cpu_ops.ts))


def test_dict_json_and_gz_parse_identically(tmp_path):
    data = build(naive_forward)
    (tmp_path / "t.json").write_text(json.dumps(data, indent=2))
    with gzip.open(tmp_path / "t.json.gz", "wt") as fh:
        json.dump(data, fh)
    from_dict = load_trace(data)
    assert _summary(load_trace(tmp_path / "t.json")) == _summary(from_dict)
    assert _summary(load_trace(str(tmp_path / "t.json.gz"))) == _summary(from_dict)
    assert from_dict.device_properties[0]["name"] == "NVIDIA H200"
    assert from_dict.metadata["schemaVersion"] == 1


def test_tables_hold_the_expected_events():
    t = load_trace(build(naive_forward, steps=2))
    kinds = list(t.device.kind)
    assert kinds.count(KERNEL) == 10 and kinds.count(MEMCPY) == 2 and kinds.count(MEMSET) == 0
    ann_names = {t.names[n] for n in t.annotations.name}
    assert ann_names == {"ProfilerStep#1", "ProfilerStep#2", "attnprof"}
    assert len(t.gpu_annotations) == 2
    # flows (ac2g) and metadata are not kept as events of any table
    assert len(t.runtime) == 2 * 6 + 1  # 5 kernel launches + 1 memcpy per forward, + the final sync
    cpu_types = {t.input_types[i] for i in t.cpu_ops.input_types if i >= 0}
    assert ("c10::BFloat16", "bool", "Scalar") in cpu_types


def test_kernel_launch_facts_are_interned_and_typed():
    b = TraceBuilder()
    with b.region():
        for _ in range(4):
            b.kernel(CUDNN, api="cuLaunchKernelEx", regs=240, smem=134144, block=(256, 1, 1), grid=(64, 1, 1),
                     occupancy=0)
    t = load_trace(b.to_dict())
    assert len({i for i in t.device.info}) == 1
    info = t.kernel_infos[t.device.info[0]]
    assert info.registers_per_thread == 240 and info.shared_memory_bytes == 134144
    assert info.block == (256, 1, 1) and info.threads_per_block == 256 and info.grid == (64, 1, 1)
    assert info.achieved_occupancy_pct == 0.0


@pytest.mark.parametrize("key", ["shared memory", "shared memory (bytes)", "Shared Memory"])
def test_shared_memory_key_variants(key):
    b = TraceBuilder()
    b.kernel(MASKED_FILL, smem=4096, shared_memory_key=key)
    t = load_trace(b.to_dict())
    assert t.kernel_infos[t.device.info[0]].shared_memory_bytes == 4096


def test_static_plus_dynamic_shared_memory_is_summed():
    b = TraceBuilder()
    b.kernel(MASKED_FILL, smem=0, shared_memory_key="ignored",
             extra_args={"static shared memory": 1024, "dynamic shared memory": 65536})
    t = load_trace(b.to_dict())
    assert t.kernel_infos[t.device.info[0]].shared_memory_bytes == 1024 + 65536


def test_activity_buffer_request_is_overhead_not_a_call():
    b = TraceBuilder()
    b.overhead("Activity Buffer Request", cat="overhead")
    b.overhead("Activity Buffer Request", cat="cuda_runtime")  # some exports list it among runtime calls
    b.call("cudaDeviceSynchronize")
    t = load_trace(b.to_dict())
    assert t.overhead_count == 2
    assert [t.names[n] for n in t.runtime.name] == ["cudaDeviceSynchronize"]


def test_legacy_category_spellings_and_string_timestamps():
    data = {"traceEvents": [
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": 7, "ts": "100.5", "dur": "2",
         "args": {"correlation": 3, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 90, "dur": 1,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 120,
         "dur": 1, "args": {"correlation": 4}},
    ]}
    t = load_trace(data)
    assert list(t.device.kind) == [KERNEL, MEMCPY]
    assert t.device.ts[0] == 100.5 and t.device.dur[0] == 2.0
    assert list(t.runtime.corr) == [3]


def test_bare_event_list_form(tmp_path):
    events = build(naive_forward, steps=1)["traceEvents"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(events))
    t = load_trace(path)
    assert len(t.device) == 6 and t.device_properties == []


def test_streaming_survives_tiny_chunks_and_tricky_names(tmp_path, monkeypatch):
    """Chunk boundaries land everywhere; a '}, {' inside a kernel name must not cut an event."""
    b = TraceBuilder()
    for step in range(4):
        with b.step():
            with b.region():
                b.kernel("void k<{lambda()#1}, {lambda()#2}>(int)", gpu_us=3.0)
                naive_forward(b)
    path = b.write(tmp_path / "t.json", indent=1)
    expected = _summary(load_trace(b.to_dict()))
    for chunk in (7, 64, 1000):
        monkeypatch.setattr(trace_module, "_CHUNK_CHARS", chunk)
        assert _summary(load_trace(path)) == expected


def test_streaming_falls_back_to_the_standard_decoder(tmp_path, monkeypatch):
    path = TraceBuilder().write(tmp_path / "t.json")
    monkeypatch.setattr(trace_module, "_batch_records", None)
    monkeypatch.setattr(trace_module, "_batch_loads", json.loads)
    assert load_trace(path).event_count > 0


def test_top_level_keys_after_the_events_are_read(tmp_path):
    path = tmp_path / "t.json"
    data = build(naive_forward, steps=1)
    # Kineto writes deviceProperties before traceEvents and traceName after; put both after.
    reordered = {"traceEvents": data["traceEvents"], "deviceProperties": data["deviceProperties"], "traceName": "x"}
    path.write_text(json.dumps(reordered))
    t = load_trace(path)
    assert t.device_properties and t.metadata["traceName"] == "x"


@pytest.mark.parametrize("content", ['{"traceEvents": []}', "{}", "", "[]", '{"schemaVersion": 1}'])
def test_empty_trace_is_an_error(tmp_path, content):
    path = tmp_path / "empty.json"
    path.write_text(content)
    with pytest.raises(TraceError, match="trace has no events"):
        load_trace(path)


def test_empty_dict_is_an_error():
    with pytest.raises(TraceError, match="trace has no events"):
        load_trace({})
    with pytest.raises(TraceError, match="trace has no events"):
        load_trace({"traceEvents": []})


def test_truncated_file_is_a_one_line_error(tmp_path):
    text = json.dumps(build(naive_forward, steps=1))
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert "truncated" in info.value.message and "\n" not in info.value.message


def test_not_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    with pytest.raises(TraceError, match="not a Chrome trace|not valid JSON"):
        load_trace(bad)
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(TraceError, match="directory"):
        load_trace(tmp_path)


def test_corrupt_gzip_is_a_trace_error(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(path)


def test_gc_state_is_restored():
    import gc
    assert gc.isenabled()
    load_trace(build(fused_forward, steps=1))
    assert gc.isenabled()
