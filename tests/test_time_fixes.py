"""`analyze --time-fixes` and `attnprof model`'s timed fixes on the CPU: traces captured here with torch.profiler
(the nn.TransformerEncoder of issue 33, whose float causal mask is converted on every call; an eager
matmul → softmax → matmul), re-created from their recorded ops and timed as traced and with the fix; without
recorded shapes, or for a CUDA trace on this machine, the finding says how to get the timed figure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from profiled import capture_cpu

from attnprof.analysis import analyze_trace, load_trace
from attnprof.analysis.findings import FINDINGS, Finding, FixNotTimed, TimedFix, Verdict, judge
from attnprof.analysis.recreate import IS_CAUSAL, RecordedOp, Replay, fix_plans, known_refusal, parse_concrete
from attnprof.pipeline.fixes import FixTiming, judged, replay_call, time_fixes

DENSE_MASK_H200 = Path(__file__).parent / "data" / "h200" / "masks" / "dense-mask.json.gz"
#: A GPT-2-style model in plain user code on the H200, its causal mask a dense boolean given to SDPA
GPT2_DENSE_MASK = Path(__file__).parent / "data" / "h200-fixes" / "gpt2-dense-mask.json.gz"
BATCH, HEADS, SEQ = 2, 4, 128
BUDGET = "4"  # seconds for all the timings of one trace: enough for the few calls of these traces


@pytest.fixture(scope="module")
def encoder_trace(tmp_path_factory):
    """The issue's nn.TransformerEncoder: a float causal mask with is_causal=True, two layers."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=64, nhead=HEADS, dim_feedforward=128, dropout=0.0, batch_first=True
    )
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(BATCH, SEQ, 64)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(SEQ)
    return capture_cpu(lambda: model(x, mask=causal, is_causal=True), tmp_path_factory.mktemp("enc") / "enc.json")


def _eager(q, k, v):
    import torch

    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@pytest.fixture(scope="module")
def qkv():
    import torch

    torch.manual_seed(0)
    return [torch.randn(BATCH, HEADS, 64, 16) for _ in range(3)]


def analyzed(cli, trace: Path, *more: str) -> tuple[dict, str]:
    """`attnprof analyze TRACE --time-fixes --format json`: its JSON and stderr."""
    result = cli("analyze", str(trace), "--time-fixes", "--time-fixes-budget", BUDGET, "--format", "json", *more)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return json.loads(result.stdout), result.stderr


def finding(document: dict, finding_id: str) -> dict:
    found = [f for f in document["findings"] if f["id"] == finding_id]
    assert found, [f["id"] for f in document["findings"]]
    return found[0]


def _assert_timed(f: dict, alternative: str) -> None:
    ev = f["evidence"]
    assert ev["timed_alternative"] == alternative
    # a busy machine (CI's shared runner) marks the saving, and says so in the message
    assert ev["impact_basis"] == ("timed under contention" if (ev.get("timed_cpu_contention") or 0) > 0.25 else "timed")
    assert ("Other processes held" in f["message"]) == (ev["impact_basis"] == "timed under contention")
    assert ev["timed_before_us"] > 0 and ev["timed_after_us"] > 0
    assert f["impact_us"] == pytest.approx(max(ev["timed_before_us"] - ev["timed_after_us"], 0.0), abs=2e-3)
    assert ev["saved_us"] == f["impact_us"]
    assert "Timed at this shape" in f["message"] and f"{alternative} takes" in f["message"]
    assert "\n" not in f["message"] and f["message"].endswith(".")


def test_the_encoders_mask_conversion_is_timed_against_the_call_given_a_converted_mask(cli, encoder_trace):
    document, stderr = analyzed(cli, encoder_trace)
    f = finding(document, "mask-convert")
    _assert_timed(f, "mask converted once")
    assert "timed the fixes of mask-convert at the trace's shapes on cpu:" in stderr
    # what was re-created: the native MHA call (inside which the float mask is cast to bool), twice per forward
    trace = load_trace(encoder_trace, every_concrete_input=True)
    (plan,) = fix_plans(analyze_trace(trace), trace, cuda=False)
    (piece,) = plan.pieces
    assert piece.count == 2.0
    (before,) = piece.before.ops
    (after,) = dict(piece.alternatives)["mask converted once"].ops
    assert before.name == after.name == "aten::_native_multi_head_attention"
    assert before.dims[9] == after.dims[9] == (BATCH, HEADS, SEQ, SEQ)
    assert (before.types[9], after.types[9]) == ("float", "bool")  # the same call, given the mask converted once


def test_an_eager_attention_is_timed_against_fused_sdpa_at_its_shape(cli, qkv, tmp_path):
    path = capture_cpu(lambda: _eager(*qkv), tmp_path / "eager.json")
    document, stderr = analyzed(cli, path)
    f = finding(document, "unfused-attention")
    _assert_timed(f, "sdpa")
    assert "in place of the estimate of" in f["message"]
    # the estimate's sentence and its "to time it" command went: the timed saving stands in their place
    assert "estimated, not timed" not in f["message"] and "To time it" not in f["message"]
    assert f["message"].count("A fused kernel") == 0 and f["evidence"]["estimate_sentence"].startswith(" A fused")
    assert "timed the fixes of unfused-attention" in stderr
    trace = load_trace(path, every_concrete_input=True)
    (plan,) = fix_plans(analyze_trace(trace), trace, cuda=False)
    (piece,) = plan.pieces
    traced = [op.name for op in piece.before.ops]
    assert traced == ["aten::matmul", "aten::mul", "aten::softmax", "aten::matmul"]  # the transpose is a view
    assert piece.before.ops[0].dims[:2] == ((BATCH, HEADS, 64, 16), (BATCH, HEADS, 16, 64))  # Q @ K^T
    (sdpa,) = dict(piece.alternatives)["sdpa"].ops
    assert sdpa.name == "aten::scaled_dot_product_attention"
    assert sdpa.dims[:3] == ((BATCH, HEADS, 64, 16),) * 3 and sdpa.types[:3] == ("float",) * 3


def test_without_recorded_shapes_the_finding_says_how_to_get_the_timed_figure(cli, qkv, tmp_path):
    path = capture_cpu(lambda: _eager(*qkv), tmp_path / "plain.json", record_shapes=False)
    document, stderr = analyzed(cli, path)
    f = finding(document, "unfused-attention")
    assert f["evidence"]["impact_basis"] == "estimated"  # the estimate stands
    assert "record_shapes=True" in f["evidence"]["timed_fix_reason"]
    assert "Fix not timed: the trace recorded no input shapes: profile with record_shapes=True" in f["message"]
    assert "timed no fix" in stderr


def test_a_cuda_trace_on_a_machine_without_cuda_says_it_needs_a_cuda_gpu(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    document, stderr = analyzed(cli, DENSE_MASK_H200)
    f = finding(document, "dense-mask")
    assert "on a machine with a CUDA GPU" in f["evidence"]["timed_fix_reason"]
    assert f"run `attnprof analyze {DENSE_MASK_H200} --time-fixes` on a machine with a CUDA GPU" in f["message"]
    assert "impact_basis" not in f["evidence"] and f["impact_us"] is not None  # its own impact stands
    assert "fixes not timed: the trace ran on a CUDA GPU and this machine has none" in stderr


def test_analyze_without_the_flag_leaves_the_findings_as_the_trace_gives_them(cli, qkv, tmp_path):
    path = capture_cpu(lambda: _eager(*qkv), tmp_path / "eager.json")
    result = cli("analyze", str(path), "--format", "json")
    f = finding(json.loads(result.stdout), "unfused-attention")
    assert f["evidence"]["impact_basis"] == "estimated" and "timed_fix_reason" not in f["evidence"]
    assert "timed" not in result.stderr


def test_the_h200_dense_mask_is_recreated_with_is_causal_and_a_block_mask_as_its_alternatives():
    trace = load_trace(DENSE_MASK_H200, every_concrete_input=True)
    (plan,) = fix_plans(analyze_trace(trace), trace, cuda=True)
    (piece,) = plan.pieces
    (traced,) = piece.before.ops
    assert traced.dims[3] == (2048, 2048) and traced.types[3] == "bool" and traced.concrete[5] == "False"
    alternatives = dict(piece.alternatives)
    (causal,) = alternatives[IS_CAUSAL].ops
    assert causal.dims[3] == () and causal.types[3] == "" and causal.concrete[5] == "True"
    assert causal.dims[:3] == traced.dims[:3]
    assert alternatives["flex BlockMask"].flex


def test_a_hand_written_gpt2_s_boolean_mask_is_planned_once_for_its_four_layers():
    """User code, not attnprof: its region is its own `step`; the four layers' calls share one shape, so one piece."""
    trace = load_trace(GPT2_DENSE_MASK, every_concrete_input=True)
    analysis = analyze_trace(trace)
    assert (analysis.region, analysis.forwards) == ("step", 3)
    assert analysis.attention.calls_per_forward == 4 and analysis.attention.backends == {"cudnn": 4}
    (plan,) = fix_plans(analysis, trace, cuda=True)
    assert plan.finding == "dense-mask"
    (piece,) = plan.pieces
    (traced,) = piece.before.ops
    assert traced.dims[:4] == ((4, 12, 1024, 64),) * 3 + ((1024, 1024),) and traced.types[3] == "bool"
    assert set(dict(piece.alternatives)) == {IS_CAUSAL, "flex BlockMask"}


def test_torch_s_flash_backend_is_not_asked_to_take_a_dense_mask_on_cuda():
    """It would refuse with torch's own warnings on stderr; the fix's evidence says why it was left out instead."""
    from attnprof.pipeline.fixes import _Timer

    qkv = ((4, 12, 1024, 64),) * 3
    types = ("c10::BFloat16",) * 3 + ("bool", "Scalar", "Scalar", "", "Scalar")
    masked = RecordedOp("aten::scaled_dot_product_attention", (*qkv, (1024, 1024), (), (), (), ()), types, ("",) * 8)
    causal = replace(masked, dims=(*qkv, (), (), (), (), ()))
    assert "takes no attn_mask" in known_refusal(Replay((masked,), "flash"), cuda=True)
    assert known_refusal(Replay((masked,), "flash"), cuda=False) is None  # the CPU's flash path takes masks
    assert known_refusal(Replay((causal,), "flash"), cuda=True) is None
    assert known_refusal(Replay((masked,), "cudnn"), cuda=True) is None
    timer = _Timer("cuda", budget_s=1.0, planned=1)
    assert "takes no attn_mask" in timer.time(Replay((masked,), "flash")) and timer.count == 0  # never run


def test_a_refusal_s_torch_warnings_go_into_its_reason_not_stderr(monkeypatch, capsys):
    """A backend refusing a re-created call for a reason the recorded inputs do not show: torch's warnings (its
    backend checks, each with C++'s "Triggered internally" tail) become the reason's tail, headers left out."""
    import warnings

    from attnprof.pipeline import fixes

    def refusing(replay, device):
        said = (
            "Flash attention kernel not used because: (Triggered internally at sdp_utils.cpp:123.)",
            "Flash attention requires q, k, v to have the same head dim (Triggered internally at x.h:9.)",
        )
        for message in (*said, said[1]):
            warnings.warn(message, stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(fixes, "replay_call", refusing)
    qkv = ((4, 12, 1024, 64),) * 3
    op = RecordedOp("aten::scaled_dot_product_attention", (*qkv, (), (), (), (), ()), ("c10::BFloat16",) * 3, ())
    reason = fixes._Timer("cpu", budget_s=1.0, planned=1).time(Replay((op,), "flash"))
    assert reason == (
        "RuntimeError: No available kernel. Aborting execution. "
        "(torch: Flash attention requires q, k, v to have the same head dim)"
    )
    assert capsys.readouterr().err == ""
    assert fixes.with_torch_reasons("refused", []) == "refused"
    assert fixes.with_torch_reasons("refused", ["a", "b", "c"], limit=2) == "refused (torch: a; b; and 1 more)"


def test_a_replayed_sdpa_takes_its_keyword_only_inputs_by_name():
    """The recorded scale and enable_gqa are SDPA's keyword-only inputs: a replay with 2 key/value heads under 4
    query heads runs only when enable_gqa reaches it."""
    sdpa = RecordedOp(
        "aten::scaled_dot_product_attention",
        ((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), (), (), (), (), ()),
        ("float", "float", "float", "", "Scalar", "Scalar", "Scalar", "Scalar"),
        ("", "", "", "", "0.0", "True", "0.5", "True"),
    )
    run = replay_call(Replay((sdpa,)), "cpu")
    run()
    refused = Replay((sdpa.with_input(7, (), "Scalar", "False"),))
    with pytest.raises(RuntimeError):
        replay_call(refused, "cpu")


def test_concrete_inputs_read_as_their_values():
    assert [parse_concrete(t) for t in ("True", "64", "1e-05", "[2, 4, -1]", "")] == [True, 64, 1e-05, [2, 4, -1], None]


def test_a_fix_that_ran_out_of_budget_is_named_not_timed(qkv, tmp_path):
    path = capture_cpu(lambda: _eager(*qkv), tmp_path / "eager.json")
    trace = load_trace(path, every_concrete_input=True)
    analysis = analyze_trace(trace)
    fixes = time_fixes(analysis, trace, budget_s=0.0)
    assert fixes.timed == () and "--time-fixes-budget of 0 s ran out" in fixes.untimed[0].reason
    judged(analysis, fixes)
    assert "ran out" in analysis.finding("unfused-attention").evidence["timed_fix_reason"]


@pytest.mark.parametrize("others", [0.0, 0.7])
def test_a_fix_timed_while_other_processes_held_the_cpu_says_so(qkv, tmp_path, monkeypatch, others):
    """The share of the CPU other processes took is read around each timing, as the cells' is: above the
    limit the saving is marked (`timed under contention`), the message says how much and the note too."""
    from attnprof.profiling import contention

    monkeypatch.setattr(contention.CpuShare, "others", lambda self: others)
    path = capture_cpu(lambda: _eager(*qkv), tmp_path / "eager.json")
    trace = load_trace(path, every_concrete_input=True)
    analysis = analyze_trace(trace)
    fixes = time_fixes(analysis, trace, budget_s=4.0)
    assert fixes.timed and all(fix.cpu_contention == others for fix in fixes.timed)
    assert all(fix.contended == (others > 0.25) for fix in fixes.timed)
    assert ("other processes held up to 70% of the CPU meanwhile" in fixes.note) == (others > 0.25)
    judged(analysis, fixes)
    f = analysis.finding("unfused-attention")
    assert f.evidence["impact_basis"] == ("timed under contention" if others else "timed")
    assert f.evidence["timed_cpu_contention"] == others
    assert ("Other processes held 70% of the CPU while it was timed" in f.message) == (others > 0.25)


def test_the_judge_names_every_alternative_timed_or_not():
    unfused = Finding("unfused-attention", "Unfused.", "problem", 900.0, 45.0, {"impact_basis": "estimated"})
    dense = Finding("dense-mask", "Dense.", "problem", None, None, {}, "needs-alternative")
    fixes = FixTiming(
        (TimedFix("unfused-attention", "sdpa-efficient", 1000.0, 400.0),),
        (
            FixNotTimed("unfused-attention", "sdpa-flash", "RuntimeError: No available kernel."),
            FixNotTimed("dense-mask", "", "the trace recorded no input shapes: profile with record_shapes=True"),
        ),
        "",
    )
    verdict = Verdict([unfused, dense], timed_fixes=fixes.timed, untimed_fixes=fixes.untimed, gpu_time_us=2000.0)
    timed, untimed = judge(verdict)
    assert timed.impact_us == 600.0 and timed.evidence["timed_alternative"] == "sdpa-efficient"
    assert (
        timed.evidence["timed_alternatives"]
        == "sdpa-efficient 400.0 us; sdpa-flash: RuntimeError: No available kernel."
    )
    assert "(also: sdpa-flash: RuntimeError: No available kernel.)." in timed.message
    assert untimed.impact_us is None and untimed.no_impact_reason == "needs-alternative"  # nothing timed: it stands
    assert (
        untimed.message == "Dense. Fix not timed: the trace recorded no input shapes: profile with record_shapes=True."
    )
    assert FINDINGS.get("dense-mask").severity == untimed.severity


def test_model_rows_time_their_fixes_by_default(cli, model_config):
    result = cli("model", str(model_config()), "--attn", "eager,sdpa", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["measure"]["time_fixes"] is True
    eager = document["results"][0]
    assert eager["variant"] == "eager" and "time_fixes" in eager["phases_s"]
    f = next(f for f in eager["findings"] if f["id"] == "unfused-attention")
    assert f["evidence"]["impact_basis"].startswith("timed") and f["evidence"]["timed_alternative"] == "sdpa"
    skipped = cli("model", str(model_config()), "--attn", "eager", "--no-time-fixes", "--format", "json")
    row = json.loads(skipped.stdout)["results"][0]
    assert "time_fixes" not in row["phases_s"]
    assert next(f for f in row["findings"] if f["id"] == "unfused-attention")["evidence"]["impact_basis"] == "estimated"
