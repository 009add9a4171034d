"""load_trace: formats (dict, .json, .json.gz, bare list), streaming edge cases, errors (in the
CLI too), and reading a large file with two processes."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_json import analysis_json
from tracegen import CUDNN, MASKED_FILL, TraceBuilder, build, fused_forward, large_trace, naive_forward

from attnprof.analysis import load_trace
from attnprof.analysis.base import KERNEL, MEMCPY, MEMSET
from attnprof.analysis.trace import decoding, parallel, reader
from attnprof.errors import TraceError

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


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
    for _ in range(4):
        with b.step():
            with b.region():
                b.kernel("void k<{lambda()#1}, {lambda()#2}>(int)", gpu_us=3.0)
                naive_forward(b)
    path = b.write(tmp_path / "t.json", indent=1)
    expected = _summary(load_trace(b.to_dict()))
    for chunk in (7, 64, 1000):
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
        assert _summary(load_trace(path)) == expected


def test_dicts_are_read_by_the_decoder_files_are_read_by(monkeypatch):
    batches = []
    decode = decoding.decode_records
    monkeypatch.setattr(decoding, "decode_records", lambda payload: batches.append(payload) or decode(payload))
    trace = load_trace(build(naive_forward))
    assert batches and trace.event_count == sum(len(decode(p)) for p in batches)


def test_top_level_keys_after_the_events_are_read(tmp_path):
    path = tmp_path / "t.json"
    data = build(naive_forward, steps=1)
    # Kineto writes deviceProperties before traceEvents and traceName after; put both after.
    reordered = {"traceEvents": data["traceEvents"], "deviceProperties": data["deviceProperties"], "traceName": "x"}
    path.write_text(json.dumps(reordered))
    t = load_trace(path)
    assert t.device_properties and t.metadata["traceName"] == "x"


NOT_A_TRACE = "is not a torch.profiler Chrome trace"


@pytest.mark.parametrize(("content", "message"), [
    ('{"traceEvents": []}', "has no events"),
    ("[]", "has no events"),
    ("", f"{NOT_A_TRACE}: the file is empty"),
    ("  \n", f"{NOT_A_TRACE}: the file is empty"),
    ("{}", f"{NOT_A_TRACE}: it has no 'traceEvents' list"),
    ('{"schemaVersion": 1}', f"{NOT_A_TRACE}: it has no 'traceEvents' list"),
    ('{"foo": 1}', f"{NOT_A_TRACE}: it has no 'traceEvents' list"),
    ('{"traceEvents": {"a": 1}}', f"{NOT_A_TRACE}: 'traceEvents' is not a list"),
    ("[1,2]", f"{NOT_A_TRACE}: its events are not JSON objects"),
    ('{"traceEvents": [1, "x", null]}', f"{NOT_A_TRACE}: its events are not JSON objects"),
    ("3", f"{NOT_A_TRACE}: it is not a JSON object or list"),
    ("this is not json", f"{NOT_A_TRACE}: it is not a JSON object or list"),
])
def test_empty_or_not_a_trace_is_a_one_line_error_naming_the_file(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.message.startswith(f"trace {path} ") and message in info.value.message
    assert "\n" not in info.value.message


def test_dict_that_is_empty_or_not_a_trace():
    with pytest.raises(TraceError, match="trace <dict> has no events"):
        load_trace({"traceEvents": []})
    for data in ({}, {"foo": 1}, {"traceEvents": [1, 2]}, {"traceEvents": [{"x": object()}]}):
        with pytest.raises(TraceError, match=NOT_A_TRACE):
            load_trace(data)


def test_truncated_file_is_a_one_line_error(tmp_path):
    text = json.dumps(build(naive_forward, steps=1))
    path = tmp_path / "cut.json"
    for cut in (len(text) // 2, len(text) - 3, 30):
        path.write_text(text[:cut])
        with pytest.raises(TraceError) as info:
            load_trace(path)
        assert "truncated" in info.value.message and str(path) in info.value.message
        assert "\n" not in info.value.message


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(TraceError, match="directory"):
        load_trace(tmp_path)


def _truncated_gzip() -> bytes:
    packed = gzip.compress(json.dumps(build(naive_forward, steps=2)).encode())
    return packed[: len(packed) // 2]


@pytest.mark.parametrize("content", [b"\x1f\x8b" + b"garbage" * 10, "truncated"])
def test_corrupt_or_truncated_gzip_is_not_a_trace(tmp_path, content):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(_truncated_gzip() if content == "truncated" else content)
    with pytest.raises(TraceError, match=NOT_A_TRACE) as info:
        load_trace(path)
    assert str(path) in info.value.message and "\n" not in info.value.message


NOT_TRACES = {"empty.json": b"", "list.json": b"[1,2]", "object.json": b"{}", "text.json": b"this is not json"}


@pytest.mark.parametrize("name", [*NOT_TRACES, "cut.json.gz"])
def test_analyze_says_which_file_is_not_a_trace(cli, tmp_path, name):
    path = tmp_path / name
    path.write_bytes(NOT_TRACES.get(name) or _truncated_gzip())
    result = cli("analyze", str(path))
    assert result.exit_code == 4, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: trace {path} {NOT_A_TRACE}: "), lines


def test_analyze_of_an_empty_file_in_a_process(tmp_path):
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    out = subprocess.run([sys.executable, "-m", "attnprof", "analyze", str(path)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 4 and out.stdout == ""
    assert out.stderr.splitlines() == [f"error: trace {path} {NOT_A_TRACE}: the file is empty"]


# --------------------------------------------------------------------------- two processes

# Run in a fresh interpreter: forking needs a process with one thread, which pytest's may not be
# once torch is imported. PATCH may break the worker; the child prints what it saw as JSON.
_ONE_AND_TWO = """
import json, sys
from attnprof.analysis import load_trace
from attnprof.analysis.trace import builder
from attnprof.analysis.trace import parallel
from attnprof.analysis.trace import reader
from tracegen import parsed_contents
if not parallel._can_fork():
    print(json.dumps({"skip": True})); sys.exit()
{patch}
parallel.PARALLEL_MIN_BYTES = 1 << 62
one = load_trace(sys.argv[1])
parallel.PARALLEL_MIN_BYTES = 0
merged = []
absorb = builder.TableBuilder.absorb
builder.TableBuilder.absorb = lambda self, other: merged.append(1) or absorb(self, other)
two = load_trace(sys.argv[1])
print(json.dumps({"merged": len(merged), "same": parsed_contents(one) == parsed_contents(two),
                  "device": len(one.device), "meta": one.metadata, "notes": [one.read_notes, two.read_notes],
                  "concrete_ops": len(two.concrete_inputs_at)}))
"""
_WRONG_CUT = """
find = reader.ByteStream.find_event_start
reader.ByteStream.find_event_start = lambda self: find(self) + 9
"""
_FAILING_WORKER = """
def fail(self, key, value):
    raise ValueError("boom")
parallel._TopLevel.top_level = fail  # the worker reads traceName last
"""
_FAILING_EARLY = """
def fail(self):
    raise ValueError("no start")
reader.ByteStream.find_event_start = fail  # only the worker looks for where an event starts
"""
_NO_FORK = """
import os
def no_fork():
    raise BlockingIOError(11, "Resource temporarily unavailable")
os.fork = no_fork
"""
_KILLED_WORKER = """
import os, signal
parallel._read_part = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
"""


def _read_by_one_and_two(path, patch: str = "") -> dict:
    """What a fresh process saw reading `path` with one process and then with two."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    out = subprocess.run([sys.executable, "-c", _ONE_AND_TWO.replace("{patch}", patch), str(path)],
                         capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout)
    if result.get("skip"):
        pytest.skip("forking is not safe here (not Linux, or one core)")
    return result


@pytest.mark.parametrize("form", ["json", "gz", "bare"])
def test_two_processes_read_what_one_reads(tmp_path, form):
    seen = _read_by_one_and_two(large_trace(tmp_path, form))
    assert seen["merged"] == 1 and seen["same"] and seen["notes"] == [[], []]
    assert seen["device"] >= 540 and (form == "bare" or seen["meta"]["traceName"])


def test_two_processes_keep_the_sdpa_ops_concrete_inputs(tmp_path):
    seen = _read_by_one_and_two(large_trace(tmp_path, "json", name="sdpa_cudnn"))
    assert seen["merged"] == 1 and seen["same"]
    assert seen["concrete_ops"] == 60 * 3 * 2  # SDPA and its cuDNN op, 3 steps a copy, on both sides of the cut


ALONE = "the trace was read by one process: "


@pytest.mark.parametrize(("patch", "why"), [
    (_WRONG_CUT, "byte {}, where the second reading process began, is not between two events"),
    (_FAILING_WORKER, "the second reading process failed: ValueError: boom\nTraceback (most recent call last):\n"),
    (_FAILING_EARLY, "the second reading process failed: ValueError: no start\nTraceback (most recent call last):\n"),
    (_KILLED_WORKER, "the second reading process failed: it ended without sending its part (killed by signal 9)"),
    (_NO_FORK, "the second reading process could not be started ([Errno 11] Resource temporarily unavailable)"),
], ids=["worker-inside-an-event", "worker-fails", "worker-fails-before-its-first-event", "worker-killed", "no-fork"])
def test_a_worker_that_cannot_help_is_not_used_and_says_why(tmp_path, patch, why):
    seen = _read_by_one_and_two(large_trace(tmp_path, "json"), patch)
    assert seen["merged"] == 0 and seen["same"]
    (one_notes, two_notes) = seen["notes"]
    assert one_notes == [] and len(two_notes) == 1
    note = two_notes[0]
    assert note.startswith(ALONE + why.split("{}")[0]) and why.split("{}")[-1] in note
    if "Traceback" in why:  # the worker's own frames, down to the line that raised
        assert note.rstrip().endswith(why.split(": ", 2)[2].split("\n")[0]) and "in fail" in note


# `attnprof [--debug] analyze` in a fresh interpreter, on a trace read by two processes; PATCH may break the worker.
_CLI = """
import sys
from attnprof.analysis.trace import parallel
if not parallel._can_fork():
    print("skip"); sys.exit()
parallel.PARALLEL_MIN_BYTES = 0
{patch}
from attnprof.entry import main
sys.argv = ["attnprof", *sys.argv[1:]]
main()
"""


def _cli(*args: str, patch: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    out = subprocess.run([sys.executable, "-c", _CLI.replace("{patch}", patch), *args], capture_output=True,
                         text=True, env=env, check=False)
    if out.stdout == "skip\n":
        pytest.skip("forking is not safe here (not Linux, or one core)")
    return out


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_a_failing_worker_changes_no_output_and_debug_says_why(tmp_path, fmt):
    path = str(large_trace(tmp_path, "json"))
    two = _cli("analyze", path, "--format", fmt)
    failed = _cli("analyze", path, "--format", fmt, patch=_FAILING_WORKER)
    debug = _cli("--debug", "analyze", path, "--format", fmt, patch=_FAILING_WORKER)
    assert two.returncode == failed.returncode == debug.returncode == 0
    assert two.stdout == failed.stdout == debug.stdout and two.stderr == failed.stderr
    assert "debug:" not in failed.stderr and "boom" not in failed.stderr
    said = debug.stderr.replace(two.stderr, "", 1)
    assert said.startswith(f"debug: {ALONE}the second reading process failed: ValueError: boom\n"
                           "Traceback (most recent call last):\n")
    assert said.rstrip().endswith(", in fail\nValueError: boom")  # the frame that raised, in the worker


def test_debug_says_nothing_more_when_both_processes_read(tmp_path):
    path = str(large_trace(tmp_path, "json"))
    plain, debug = _cli("analyze", path), _cli("--debug", "analyze", path)
    assert (plain.returncode, plain.stdout, plain.stderr) == (debug.returncode, debug.stdout, debug.stderr)


def test_the_cli_reads_a_trace_over_the_threshold_as_it_is_read_in_process(tmp_path):
    """End to end: `python -m attnprof analyze` on a trace over the two-process threshold."""
    from attnprof.analysis import analyze_trace

    path = large_trace(tmp_path, "json", copies=max(60, parallel.PARALLEL_MIN_BYTES // 30_000))
    assert path.stat().st_size > parallel.PARALLEL_MIN_BYTES
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "attnprof", "analyze", str(path), "--format", "json"],
                         capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == json.loads(json.dumps(analysis_json(analyze_trace(path))))


@pytest.mark.parametrize(("files", "cpus"), [
    ({"cpu.max": "max 100000\n"}, float("inf")),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, float("inf")),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.0),
    ({}, float("inf")),
])
def test_a_cgroup_cpu_quota_limits_the_processes(tmp_path, files, cpus):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert parallel._cgroup_cpus(tmp_path) == cpus


def test_gc_state_is_restored():
    import gc
    assert gc.isenabled()
    load_trace(build(fused_forward, steps=1))
    assert gc.isenabled()
