"""The event schema (decoding.Record): one source of truth for the fields read, and odd events.

Dicts and files take the same path (a dict is encoded to JSON and read like a file), so every
synthetic-trace test exercises the decoder real runs use; here: the schema itself, events that
do not fit it, and the text edge cases of the byte stream.
"""

from __future__ import annotations

import gzip
import json

import msgspec
import pytest
from tracegen import REAL_TRACES, TraceBuilder, build, fused_forward, math_forward, naive_forward, parsed_contents

from attnprof.analysis import load_trace
from attnprof.analysis.trace import decoding, reader

SAMPLES = {"grid": [2, 3, 1], "block": [128, 1, 1], "regs": 64, "regs_alt": 65, "smem": 1024, "smem_bytes": 2048,
           "smem_cap": 3072, "smem_us": 4096, "smem_static": 5120, "smem_dynamic": 6144, "blocks_per_sm": 1.5,
           "warps_per_sm": 6.0, "occupancy": 12.5, "occupancy_alt": 25.0, "occupancy_pct": 50.0}


def test_every_launch_fact_field_is_read_by_kernel_info():
    """KERNEL_FACTS comes from the Args struct; each of its fields changes the KernelInfo."""
    assert set(decoding.KERNEL_FACTS) == set(SAMPLES)
    empty = decoding.kernel_info(decoding.Args())
    for name in decoding.KERNEL_FACTS:
        assert decoding.kernel_info(decoding.Args(**{name: SAMPLES[name]})) != empty, name


def test_the_first_spelling_of_a_fact_wins():
    info = decoding.kernel_info(decoding.Args(**SAMPLES))
    assert (info.registers_per_thread, info.shared_memory_bytes, info.achieved_occupancy_pct) == (64, 1024, 12.5)
    split = decoding.kernel_info(decoding.Args(smem_static=1024, smem_dynamic=65536))
    assert split.shared_memory_bytes == 1024 + 65536


def test_field_names_are_the_json_keys():
    args = msgspec.json.decode(b'{"External id": 5, "registers per thread": 32, "est. achieved occupancy %": 0}',
                               type=decoding.Args)
    assert (args.ext, args.regs, args.occupancy) == (5, 32, 0)


@pytest.mark.parametrize("name", sorted(p.name for p in REAL_TRACES.glob("*.json.gz")))
def test_real_traces_parse_identically_from_file_and_dict(name):
    path = REAL_TRACES / name
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    from_file, from_dict = load_trace(path), load_trace(data)
    assert parsed_contents(from_file) == parsed_contents(from_dict)
    assert len(from_file.device) > 0 and len(from_file.cpu_ops) > 0


def _odd_events():
    return [
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


def test_odd_events_that_fit_the_schema():
    """Missing ph, null args, string timestamps, overhead rows, legacy categories, odd ids."""
    b = TraceBuilder()
    b.overhead("Activity Buffer Request", cat="overhead")
    b.overhead("Buffer Flush", cat="cuda_runtime")
    data = b.to_dict()
    data["traceEvents"] += _odd_events()
    t = load_trace(data)
    assert [t.names[n] for n in t.device.name] == ["no_ph", "legacy", "Memcpy"]
    assert list(t.device.ts) == [1.0, 3.5, 9.0] and list(t.device.dur) == [2.0, 1.0, 1.0]
    assert list(t.device.device) == [0, 0, -1] and list(t.device.nbytes) == [-1, -1, 64]
    assert [t.names[n] for n in t.cpu_ops.name] == ["types"] and list(t.cpu_ops.ext) == [-1]
    assert list(t.cpu_ops.input_types) == [-1]
    assert (t.overhead_count, t.python_function_count) == (2, 1)
    assert "f" not in t.names  # python functions are counted, never interned


def test_an_id_too_large_for_its_column_fails_as_the_array_would():
    """The columns are packed by `struct`; a value out of a column's range raises what `array` raises."""
    data = build(math_forward, steps=1)
    op = next(e for e in data["traceEvents"] if e.get("cat") == "cpu_op")
    op["args"]["External id"] = 2**64
    with pytest.raises(OverflowError):
        load_trace(data)


def test_events_outside_the_schema_are_read_one_by_one(tmp_path, monkeypatch):
    """A batch holding events that do not fit the schema is decoded generically, and each event
    converted: the events that fit read exactly as they would without the odd ones."""
    data = build(math_forward, steps=2)
    clean = load_trace(data)
    odd = [7, "x", {"ph": "X", "cat": "cpu_op", "name": "list_args", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0,
                    "args": ["not", "an", "object"]},
           {"ph": 5, "cat": "kernel", "name": "odd_ph", "pid": 0, "tid": 7, "ts": 1.0},
           {"ph": "X", "cat": ["kernel"], "name": "odd_cat", "pid": 0, "tid": 7, "ts": 1.0},
           {"ph": "X", "cat": "cuda_runtime", "name": "odd_pid", "pid": [1], "tid": True, "ts": 1.0,
            "args": {"correlation": 9, "Input type": {"a": 1}}}]
    data["traceEvents"] = odd[:3] + data["traceEvents"] + odd[3:]
    converted = []
    convert = decoding.record_from_object
    monkeypatch.setattr(decoding, "record_from_object", lambda e: converted.append(e) or convert(e))
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    t = load_trace(path)
    assert len(converted) == len(data["traceEvents"])
    assert t.event_count == clean.event_count + len(odd)
    assert [t.names[n] for n in t.cpu_ops.name][0] == "list_args" and t.cpu_ops.ext[0] == -1
    assert t.threads[t.runtime.thread[len(t.runtime) - 1]] == ("[1]", "True")
    keep = len(clean.cpu_ops)
    assert list(t.cpu_ops.ts)[1:] == list(clean.cpu_ops.ts) and len(t.cpu_ops) == keep + 1
    assert list(t.device.corr) == list(clean.device.corr)


def test_a_large_event_and_a_wrong_cut(tmp_path, monkeypatch):
    """An event larger than the buffer, and `}, {` inside strings near every cut."""
    b = TraceBuilder()
    with b.step():
        with b.region():
            b.kernel("k" + "}, {" * 5000, gpu_us=3.0)
            fused_forward(b, "cudnn")
    path = b.write(tmp_path / "t.json")
    expected = parsed_contents(load_trace(b.to_dict()))
    for chunk in (16, 4096):
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
        assert parsed_contents(load_trace(path)) == expected


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
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
        t = load_trace(path)
        assert "kérnel_ü" in t.names and t.metadata["traceName"] == "naïve ✓"
