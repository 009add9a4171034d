"""Reading a large trace ahead: `attnprof analyze TRACE` forks the reader of the trace's second half
before the CLI loads (`entry.read_ahead`, `parallel.start_early`), and `load_trace` takes it over.

Each case runs in a fresh interpreter (forking needs a process with one thread, which pytest's may
not be once torch is imported) that prints what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracegen import large_trace

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

_PRELUDE = """
import json, os, sys
from pathlib import Path
from attnprof.analysis.trace import builder
from attnprof.analysis.trace import parallel
from attnprof.analysis.trace import load as trace
if not parallel._can_fork():
    print(json.dumps({"skip": True})); sys.exit()
from tracegen import parsed_contents
path = Path(sys.argv[1])
parallel.PARALLEL_MIN_BYTES = 1 << 62
one = trace.load_trace(path)  # one process: the reference
parallel.PARALLEL_MIN_BYTES = 0
merged = []
absorb = builder.TableBuilder.absorb
builder.TableBuilder.absorb = lambda self, other: merged.append(1) or absorb(self, other)
forked = []
fork = os.fork
os.fork = lambda: forked.append(1) or fork()
"""


def _run(path: Path, body: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    out = subprocess.run([sys.executable, "-c", _PRELUDE + body, str(path)], capture_output=True, text=True,
                         env=env, check=True)
    seen = json.loads(out.stdout)
    if seen.get("skip"):
        pytest.skip("forking is not safe here (not Linux, or one core)")
    return seen


_READ_AHEAD = """
from attnprof.entry import read_ahead
started = read_ahead({args})
early_forks = len(forked)
two = trace.load_trace(path)
print(json.dumps({{"started": started, "early_forks": early_forks, "forks": len(forked), "merged": len(merged),
                  "same": parsed_contents(one) == parsed_contents(two), "left": len(parallel._early)}}))
"""


@pytest.mark.parametrize("form", ["json", "gz", "bare"])
def test_the_reader_started_ahead_is_the_one_that_reads(tmp_path, form):
    path = large_trace(tmp_path, form)
    seen = _run(path, _READ_AHEAD.format(args=repr(["--debug", "analyze", "--region", "attnprof", str(path)])))
    assert seen["started"] and seen["early_forks"] == 1
    assert seen["forks"] == 1 and seen["merged"] == 1 and seen["same"] and seen["left"] == 0


@pytest.mark.parametrize("args", [["run", "--variant", "x"], ["analyze"], ["analyze", "--region", "attnprof"],
                                  ["explain", "{path}"], ["analyze", "missing.json"], ["analyze", "{path}", "-h"]],
                         ids=["other-command", "no-trace", "no-file", "not-analyze", "missing", "help"])
def test_nothing_is_read_ahead_but_for_analyze_of_a_file(tmp_path, args):
    path = large_trace(tmp_path, "json")
    args = [a.replace("{path}", str(path)) for a in args]
    seen = _run(path, _READ_AHEAD.format(args=repr(args)))
    assert not seen["started"] and seen["early_forks"] == 0
    assert seen["forks"] == 1 and seen["merged"] == 1 and seen["same"]  # load_trace forks its own


_CHANGED = """
parallel.start_early(path, builder.TableBuilder)
worker = next(iter(parallel._early.values()))
path.write_text(path.read_text() + " ")  # the file changes after the reader started: another size
two = trace.load_trace(path)
reaped = False
try:
    os.waitpid(worker.pid, os.WNOHANG)
except ChildProcessError:
    reaped = True
print(json.dumps({"forks": len(forked), "merged": len(merged), "reaped": reaped,
                  "same": parsed_contents(one) == parsed_contents(two), "left": len(parallel._early)}))
"""


def test_a_reader_started_ahead_of_another_file_is_ended_unused(tmp_path):
    seen = _run(large_trace(tmp_path, "json"), _CHANGED)
    assert seen["forks"] == 2 and seen["merged"] == 1  # a worker of its own for the file as it is now
    assert seen["same"] and seen["reaped"] and seen["left"] == 0


_UNSAFE_NOW = """
parallel.start_early(path, builder.TableBuilder)
path.write_text(path.read_text() + " ")  # the early reader no longer matches the file
parallel._can_fork = lambda: False  # and forking is not safe any more (say, a thread started)
two = trace.load_trace(path)
print(json.dumps({"forks": len(forked), "merged": len(merged), "left": len(parallel._early),
                  "same": parsed_contents(one) == parsed_contents(two)}))
"""


def test_no_new_reader_is_forked_when_forking_is_no_longer_safe(tmp_path):
    seen = _run(large_trace(tmp_path, "json"), _UNSAFE_NOW)
    assert seen["forks"] == 1 and seen["merged"] == 0 and seen["left"] == 0 and seen["same"]


_OUTSIDE = """
started = parallel.start_early(path, builder.TableBuilder)
two = trace.load_trace(path)
print(json.dumps({"started": started, "forks": len(forked), "merged": len(merged),
                  "same": parsed_contents(one) == parsed_contents(two)}))
"""


def test_a_reader_that_starts_before_the_events_is_not_used(tmp_path):
    """A document whose first half is another list of objects: the early reader starts there, before
    the event list; it is ended, and a reader of the event list's second half is forked instead."""
    data = json.loads(large_trace(tmp_path, "json").read_text())
    events = data.pop("traceEvents")
    padding = [{"id": i, "name": "x" * 200} for i in range(len(events) * 4)]
    path = tmp_path / "padded.json"
    path.write_text(json.dumps({"deviceProperties": padding, "traceEvents": events, "traceName": "t"}, indent=1))
    assert path.stat().st_size * parallel_split() < len(json.dumps({"deviceProperties": padding}, indent=1))
    seen = _run(path, _OUTSIDE)
    assert seen["started"] and seen["forks"] == 2 and seen["merged"] == 1 and seen["same"]


def parallel_split() -> float:
    from attnprof.analysis.trace import parallel

    return parallel.EARLY_PLAIN_SPLIT


def test_the_cli_reads_a_large_trace_ahead_and_says_what_it_says_in_process(tmp_path):
    """End to end: `python -m attnprof analyze` on a trace over the two-process threshold."""
    from attnprof.analysis import analyze_trace
    from attnprof.analysis.trace import parallel

    path = large_trace(tmp_path, "json", copies=max(60, parallel.PARALLEL_MIN_BYTES // 30_000))
    assert path.stat().st_size > parallel.PARALLEL_MIN_BYTES
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "attnprof", "analyze", str(path), "--format", "json"],
                         capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == json.loads(json.dumps(analyze_trace(path).to_dict()))


def test_the_reader_loads_before_the_analysis():
    code = "import sys, attnprof.analysis.trace.parallel; print('attnprof.analysis.analyze' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
