"""`TraceIndex`: one per analysis, its caches shared by instances of one op sequence or shape, read-only
views where forwards share an entry, and medians over instances that take each entry's multiplicity."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from analysis_json import analysis_json

from attnprof.analysis import analyze_trace, load_trace
from attnprof.analysis.attribution.attribute import find_forwards
from attnprof.analysis.attribution.regions import choose_region
from attnprof.analysis.instance.index import TraceIndex
from attnprof.analysis.instance.metrics import forward_metrics, median_counts
from attnprof.stats import median_count

H200 = Path(__file__).resolve().parent / "data" / "h200"
TRACES = [
    H200 / "8x16x1024x64" / "sdpa-math.json.gz",
    H200 / "8x16x1024x64" / "flex.json.gz",
    H200 / "model" / "llama2l-eager-train_step.json.gz",
]


def measured(path: Path):
    trace = load_trace(path)
    attribution = find_forwards(trace, choose_region(trace)[0])
    index = TraceIndex(trace)
    return attribution, index, [forward_metrics(attribution, f, index) for f in attribution.forwards]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_instance_is_counted_once_in_the_entries_it_reads(path):
    attribution, index, per_forward = measured(path)
    n = len(attribution.forwards)
    assert n >= 2
    assert sum(forwards for _, forwards in index.op_counts()) == n
    assert sum(forwards for _, forwards in index.launch_apis()) == n
    assert len(index.op_counts()) <= n  # one entry per distinct op sequence


@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_medians_with_multiplicity_equal_the_medians_over_every_instance(path):
    _, index, per_forward = measured(path)
    for from_index, per_instance in (
        (index.op_counts(), [m.op_counts for m in per_forward]),
        (index.launch_apis(), [m.launch_apis for m in per_forward]),
    ):
        keys = sorted(set().union(*per_instance))
        plain = {key: median_count([counts.get(key, 0) for counts in per_instance]) for key in keys}
        assert median_counts(from_index) == plain


def test_forwards_that_share_an_entry_see_it_read_only():
    _, _, per_forward = measured(TRACES[0])
    first, second = per_forward[0], per_forward[1]
    assert first.op_counts == second.op_counts and first.op_counts
    with pytest.raises(TypeError):
        first.op_counts["aten::mm"] = 0  # type: ignore[index]
    with pytest.raises(TypeError):
        first.launch_apis["cudaLaunchKernel"] = 0  # type: ignore[index]
    own = Counter(first.op_counts)  # a forward that needs its own copy makes one
    own["aten::mm"] += 1
    assert own != second.op_counts


def test_a_second_analysis_of_the_same_trace_starts_from_a_fresh_index():
    trace = load_trace(TRACES[1])
    once = analysis_json(analyze_trace(trace))
    again = analysis_json(analyze_trace(trace))
    assert once == again
