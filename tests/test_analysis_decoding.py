"""The msgspec fast path reads traces exactly as the generic (dict) path does."""

from __future__ import annotations

import gzip
import json
from dataclasses import fields

import pytest

from attnprof.analysis import decoding, load_trace
from attnprof.analysis import trace as trace_module
from tracegen import REAL_TRACES, TraceBuilder, build, fused_forward, math_forward, naive_forward

needs_msgspec = pytest.mark.skipif(not decoding.fast_decoder_available(), reason="msgspec is not installed")


def _everything(t):
    """Every table column and interned list of a ParsedTrace, for exact comparison."""
    tables = {}
    for name in ("cpu_ops", "annotations", "runtime", "device", "gpu_annotations"):
        table = getattr(t, name)
        tables[name] = {f.name: list(getattr(table, f.name)) for f in fields(table)}
    return (tables, t.names, t.threads, t.input_types, t.kernel_infos, t.device_properties, t.metadata,
            t.event_count, t.overhead_count, t.python_function_count)


def _both_ways(path, monkeypatch):
    fast = load_trace(path)
    monkeypatch.setattr(trace_module, "_batch_records", None)
    slow = load_trace(path)
    monkeypatch.undo()
    return fast, slow


@needs_msgspec
@pytest.mark.parametrize("name", sorted(p.name for p in REAL_TRACES.glob("*.json.gz")))
def test_real_traces_parse_identically_both_ways(name, monkeypatch):
    fast, slow = _both_ways(REAL_TRACES / name, monkeypatch)
    assert _everything(fast) == _everything(slow)
    assert len(fast.device) > 0 and len(fast.cpu_ops) > 0


@needs_msgspec
def test_odd_events_parse_identically_both_ways(tmp_path, monkeypatch):
    """Missing ph, null args, string timestamps, overhead rows, legacy categories, odd shared-memory keys."""
    b = TraceBuilder()
    with b.step():
        with b.region():
            naive_forward(b)
            fused_forward(b, "cudnn")
            b.kernel("k", smem=0, shared_memory_key="ignored",
                     extra_args={"static shared memory": 1024, "dynamic shared memory": 65536})
            b.kernel("k", smem=2048, shared_memory_key="Shared Memory")
    b.overhead("Activity Buffer Request", cat="overhead")
    b.overhead("Buffer Flush", cat="cuda_runtime")
    data = b.to_dict()
    data["traceEvents"] += [
        {"cat": "kernel", "name": "no_ph", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0, "args": None},
        {"ph": "X", "cat": "Kernel", "name": "legacy", "pid": 0, "tid": 7, "ts": "3.5", "dur": "1"},
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "pid": 0, "tid": 7, "ts": 9, "dur": 1,
         "args": {"device": None, "bytes": 64}},
        {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0},
        {"name": "Activity Buffer Request", "pid": -1, "tid": 0, "ts": 1.0, "dur": 5.0},
        {"ph": "X", "cat": "cpu_op", "name": "types", "pid": 1, "tid": 1, "ts": 2.0, "dur": 1.0,
         "args": {"Input type": None, "External id": 3.5}},
    ]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    fast, slow = _both_ways(path, monkeypatch)
    assert _everything(fast) == _everything(slow)
    from_dict = load_trace(data)
    assert _everything(fast)[:-4] == _everything(from_dict)[:-4]


@needs_msgspec
def test_events_outside_the_schema_fall_back_to_dicts(tmp_path, monkeypatch):
    data = build(math_forward, steps=2)
    data["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 1.0,
                                "dur": 1.0, "args": ["not", "an", "object"]})
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    calls = {"records": 0, "dicts": 0}
    real_add_records, real_add_events = trace_module._Builder.add_records, trace_module._Builder.add_events

    def add_records(self, records):
        calls["records"] += 1
        return real_add_records(self, records)

    def add_events(self, events):
        calls["dicts"] += 1
        return real_add_events(self, events)

    monkeypatch.setattr(trace_module._Builder, "add_records", add_records)
    monkeypatch.setattr(trace_module._Builder, "add_events", add_events)
    t = load_trace(path)
    assert calls["dicts"] >= 1
    assert t.event_count == len(data["traceEvents"])


def test_invalid_utf8_in_a_top_level_value_is_replaced(tmp_path):
    data = build(naive_forward, steps=1)
    body = json.dumps({k: v for k, v in data.items() if k != "traceName"})[:-1]
    raw = body.encode() + b', "traceName": "caf\xe9 \xff"}'
    path = tmp_path / "latin1.json.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(raw)
    t = load_trace(path)
    assert t.metadata["traceName"] == "caf\ufffd \ufffd"
    assert len(t.device) == 6


def test_non_ascii_names_keep_their_byte_offsets(tmp_path, monkeypatch):
    b = TraceBuilder()
    with b.step():
        with b.region("régión"):
            b.kernel("kérnel_ü", gpu_us=3.0)
    data = b.to_dict()
    data["traceName"] = "naïve ✓"
    path = tmp_path / "utf8.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    for chunk in (5, 64, 4096):
        monkeypatch.setattr(trace_module, "_CHUNK_CHARS", chunk)
        t = load_trace(path)
        assert "kérnel_ü" in t.names and t.metadata["traceName"] == "naïve ✓"
