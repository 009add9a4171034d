"""Which region `analyze` looks at: the choice without --region, glob patterns such as
`ProfilerStep#*`, and the hint when a named region is missing."""

from __future__ import annotations

import json
import re

import pytest
from analysis_json import analysis_json
from tracegen import GEMM_BF16, MUL, REAL_TRACES, SOFTMAX, TraceBuilder

from attnprof.analysis import analyze_trace, load_trace
from attnprof.analysis.attribution.attribute import find_forwards
from attnprof.analysis.attribution.regions import WHOLE_TRACE, choose_region
from attnprof.errors import TraceError


def plain_loop(regions: tuple[str, ...], steps: int = 3, outside: int = 1) -> dict:
    """A plain torch.profiler loop: per step, one kernel outside any region, then each user region
    (nested in the order given) around two kernels, then prof.step()."""
    b = TraceBuilder()
    for _ in range(steps):
        with b.step():
            for _ in range(outside):
                with b.op("aten::fill_"):
                    b.kernel(MUL, gpu_us=3.0)
            _nested(b, regions)
            b.advance(5.0)
    b.synchronize()
    return b.to_dict()


def _nested(b: TraceBuilder, regions: tuple[str, ...]) -> None:
    if not regions:
        with b.op("aten::bmm"):
            b.kernel(GEMM_BF16, gpu_us=8.0)
        with b.op("aten::softmax"):
            b.kernel(SOFTMAX, gpu_us=4.0)
        return
    with b.region(regions[0], gpu_annotation=False):
        _nested(b, regions[1:])


# ---------------------------------------------------------------------- without --region

def test_the_only_user_annotation_is_chosen():
    analysis = analyze_trace(plain_loop(("train_step",)))
    assert analysis.region == "train_step"
    assert analysis.region_choice == "no --region: using 'train_step', the only user annotation"
    assert (analysis.forwards, analysis.kernels_per_forward) == (3, 2)


def test_one_name_used_several_times_per_step_is_still_the_only_one():
    b = TraceBuilder()
    for _ in range(2):
        with b.step():
            for _ in range(2):
                _nested(b, ("block",))
    analysis = analyze_trace(b.to_dict())
    assert analysis.region == "block" and analysis.forwards == 4


def test_several_user_annotations_choose_the_profiler_steps():
    analysis = analyze_trace(plain_loop(("model", "attention", "softmax_block")))
    assert analysis.region == "ProfilerStep#*"
    assert analysis.region_choice == ("no --region: using the profiler steps 'ProfilerStep#*' (3 user annotations: "
                                      "'model', 'attention', 'softmax_block'; pass one with --region)")
    # a step counts everything launched in it, inside the user's regions or not
    assert (analysis.forwards, analysis.kernels_per_forward) == (3, 3)


def test_only_profiler_steps_choose_the_steps():
    analysis = analyze_trace(plain_loop(()))
    assert analysis.region == "ProfilerStep#*"
    assert analysis.region_choice == "no --region: using the profiler steps 'ProfilerStep#*' (no user annotations)"
    assert (analysis.forwards, analysis.kernels_per_forward) == (3, 3)


def test_attnprof_region_wins_over_other_annotations():
    """Traces attnprof wrote analyse as before, even with the user's own names around."""
    data = plain_loop(("model", "attnprof"))
    analysis = analyze_trace(data)
    assert analysis.region == "attnprof" and analysis.kernels_per_forward == 2
    assert analysis.region_choice == "no --region: using 'attnprof', the region attnprof writes"
    named = analyze_trace(data, region="attnprof")
    assert named.region_choice is None
    assert analysis_json(named) | {"region_choice": analysis.region_choice} == analysis_json(analysis)


def test_a_trace_without_annotations_is_one_window_with_a_note():
    b = TraceBuilder()
    for _ in range(2):
        with b.op("aten::mul"):
            b.kernel(MUL)
    analysis = analyze_trace(b.to_dict())
    assert analysis.region == WHOLE_TRACE and analysis.forwards == 1
    assert analysis.kernels_per_forward == 2  # both launches, correlated as in any forward
    assert analysis.region_choice.startswith("no --region: the trace has no record_function annotations")
    assert "analysed as one window" in analysis.region_choice
    assert any(n.startswith("no annotations: one window over thread") for n in analysis.notes)


def test_a_trace_without_any_op_is_a_one_line_error():
    with pytest.raises(TraceError) as info:
        analyze_trace(TraceBuilder().to_dict())
    assert "\n" not in info.value.message


def test_several_user_annotations_without_steps_is_an_error_naming_them():
    b = TraceBuilder()
    for _ in range(2):
        _nested(b, ("encoder",))
        _nested(b, ("decoder",))
    with pytest.raises(TraceError) as info:
        analyze_trace(b.to_dict())
    message = info.value.message
    assert "\n" not in message and "'encoder'" in message and "'decoder'" in message
    assert info.value.hint == "pass one of these with --region: 'encoder', 'decoder'"


def test_choose_region_sees_old_style_steps_written_as_cpu_ops():
    data = plain_loop(("a", "b"), steps=2)
    for e in data["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["cat"] = "cpu_op"
    trace = load_trace(data)
    assert choose_region(trace)[0] == "ProfilerStep#*"
    analysis = analyze_trace(trace)
    assert (analysis.forwards, analysis.kernels_per_forward) == (2, 3)
    assert analysis.cpu_ops_per_forward == 3  # the step itself is not one of its ops


# ---------------------------------------------------------------------- explicit --region

def test_profiler_step_family_is_one_forward_per_step():
    analysis = analyze_trace(plain_loop(("model",)), region="ProfilerStep#*")
    assert analysis.region == "ProfilerStep#*" and analysis.region_choice is None
    assert (analysis.forwards, analysis.kernels_per_forward) == (3, 3)


def test_a_step_keeps_its_kernels_that_finish_inside_the_next_step():
    """Attribution by correlation: a kernel still running when the next step opens stays with its step."""
    b = TraceBuilder()
    for n in (2, 3, 4):
        with b.step():
            for _ in range(n):
                b.kernel(MUL, gpu_us=2.0)
            b.kernel(GEMM_BF16, gpu_us=500.0)  # runs long into the next step's window
    b.synchronize()
    data = b.to_dict()
    attribution = find_forwards(load_trace(data), "ProfilerStep#*")
    assert [len(f.device) for f in attribution.forwards] == [3, 4, 5]
    first, second = attribution.forwards[:2]
    gemm = next(e for e in data["traceEvents"] if e.get("cat") == "kernel" and e["name"] == GEMM_BF16)
    assert first.end < gemm["ts"] + gemm["dur"] and gemm["ts"] + gemm["dur"] > second.start  # really overlaps


def test_a_single_step_by_its_exact_name():
    analysis = analyze_trace(plain_loop(("model",)), region="ProfilerStep#2")
    assert analysis.forwards == 1 and analysis.kernels_per_forward == 3


def test_glob_pattern_matches_several_names_as_one_region():
    b = TraceBuilder()
    with b.step():
        for name in ("layer0", "layer1", "layer2", "head"):
            _nested(b, (name,))
    analysis = analyze_trace(b.to_dict(), region="layer*")
    assert (analysis.forwards, analysis.kernels_per_forward) == (3, 2)
    assert analyze_trace(b.to_dict(), region="layer[02]").forwards == 2


def test_a_name_with_glob_characters_means_only_itself():
    b = TraceBuilder()
    with b.step():
        _nested(b, ("block[0]",))
        _nested(b, ("block0",))  # what block[0] would match as a pattern
    assert analyze_trace(b.to_dict(), region="block[0]").forwards == 1


def test_pattern_matching_nothing_is_the_missing_region_error():
    with pytest.raises(TraceError, match=r"region 'layer\*' not found in the trace; annotations present"):
        analyze_trace(plain_loop(("model",)), region="layer*")


def test_missing_region_hint_names_exactly_what_region_accepts():
    data = plain_loop(("model", "attention"))
    with pytest.raises(TraceError) as info:
        analyze_trace(data, region="attnprof")
    hint = info.value.hint
    assert hint == "pass one of these with --region: 'ProfilerStep#*', 'model', 'attention'"
    for accepted in re.findall(r"'([^']+)'", hint):  # every string the hint prints works
        assert analyze_trace(data, region=accepted).forwards == 3


def test_missing_region_hint_leaves_out_names_seen_only_on_the_gpu():
    b = TraceBuilder()
    with b.step():
        with b.region("model"):
            b.kernel(MUL)
    data = b.to_dict()
    for e in data["traceEvents"]:
        if e.get("cat") == "gpu_user_annotation":
            e["name"] = "gpu_only"
    with pytest.raises(TraceError) as info:
        analyze_trace(data, region="nope")
    assert "'gpu_only' (1)" in info.value.message
    assert info.value.hint == "pass one of these with --region: 'ProfilerStep#*', 'model'"


# ---------------------------------------------------------------------- a real H200 trace

@pytest.mark.skipif(not (REAL_TRACES / "naive.json.gz").exists(), reason="real traces not present")
@pytest.mark.parametrize("name", ["naive", "sdpa_math", "twostream"])
def test_real_trace_steps_hold_the_same_kernels_as_the_attnprof_regions(name):
    """One forward per step in these traces: each step's device work is exactly its forward's."""
    trace = load_trace(REAL_TRACES / f"{name}.json.gz")
    by_region = find_forwards(trace, "attnprof").forwards
    by_step = find_forwards(trace, "ProfilerStep#*").forwards
    assert len(by_step) == len(by_region) == 3
    for step, fwd in zip(by_step, by_region, strict=True):
        assert step.start <= fwd.start and fwd.end <= step.end
        assert step.device == fwd.device
    steps, regions = analyze_trace(trace, region="ProfilerStep#*"), analyze_trace(trace)
    assert steps.kernels_per_forward == regions.kernels_per_forward
    assert [k.name for k in steps.kernels] == [k.name for k in regions.kernels]


# ---------------------------------------------------------------------- the CLI

@pytest.fixture
def plain_trace(tmp_path):
    """A plain-loop trace on disk with three user annotations and three profiler steps."""
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(plain_loop(("model", "attention", "softmax_block"))))
    return path


def _region_lines(stderr: str) -> list[str]:
    """stderr without the note on the profiler's cost (the plain loop's host time fires cpu-bound, and no
    calibration is cached in a test: docs/analyze.md)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("note: cpu-bound/gpu-idle")]


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_cli_says_which_region_it_chose_on_stderr(cli, plain_trace, fmt):
    result = cli("analyze", str(plain_trace), "--format", fmt)
    assert result.exit_code == 0, result.output
    assert _region_lines(result.stderr) == [
        "no --region: using the profiler steps 'ProfilerStep#*' (3 user annotations: 'model', 'attention', "
        "'softmax_block'; pass one with --region)"]
    if fmt == "json":
        document = json.loads(result.stdout)
        assert document["region"] == "ProfilerStep#*" and document["forwards"] == 3
        assert document["region_choice"].startswith("no --region: using the profiler steps")
    else:
        assert "region 'ProfilerStep#*', 3 forward(s)" in result.stdout.splitlines()[0]


def test_cli_accepts_the_step_family_and_says_nothing(cli, plain_trace):
    result = cli("analyze", str(plain_trace), "--region", "ProfilerStep#*", "--format", "json")
    assert result.exit_code == 0, result.output
    assert _region_lines(result.stderr) == []
    document = json.loads(result.stdout)
    assert (document["region"], document["region_choice"], document["kernels_per_forward"]) == (
        "ProfilerStep#*", None, 3)


def test_cli_missing_region_is_a_one_line_error_with_the_accepted_strings(cli, plain_trace):
    result = cli("analyze", str(plain_trace), "--region", "attnprof")
    assert result.exit_code == 4 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [
        "error: region 'attnprof' not found in the trace; annotations present: 'ProfilerStep#*' (3), 'model' (3), "
        "'attention' (3), 'softmax_block' (3)",
        "hint: pass one of these with --region: 'ProfilerStep#*', 'model', 'attention', 'softmax_block'"]


def test_cli_analyses_a_trace_without_annotations_as_one_window(cli, tmp_path):
    b = TraceBuilder()
    with b.op("aten::mul"):
        b.kernel(MUL)
    path = b.write(tmp_path / "bare.json.gz")
    result = cli("analyze", str(path))
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert result.stderr.startswith("no --region: the trace has no record_function annotations")
    assert "region '(whole trace)', 1 forward(s)" in result.stdout


def test_cli_help_documents_patterns_and_the_default(cli):
    result = cli("analyze", "--help")
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout).split())  # rich's box, wrapped at any width
    assert "ProfilerStep#*" in text and "glob pattern" in text and "only user annotation" in text
