"""Attention sinks (`score_mod: {sinks: true}`): the config, the sink logits, the float64 reference and its
gradients against hand-written formulas, the variants that take sinks against it, the skip reasons of the
ones that cannot, and `compare` end to end on a CPU."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch

from attnprof.config import parse_config
from attnprof.errors import ConfigError
from attnprof.masks import parse_score_mod
from attnprof.pipeline.run import cell_specs
from attnprof.plugins import load_variants
from attnprof.profiling.correctness import THRESHOLDS, check_against_reference, reference_attention, relative_error
from attnprof.profiling.gradcheck import GRAD_THRESHOLDS, check_grads, reference_grads
from attnprof.profiling.inputs import make_inputs, make_sinks
from attnprof.profiling.steps import cell_step
from attnprof.registry import RunSpec

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}
BUILTINS = load_variants(no_plugins=True).registry


def no_stage(name: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


# -- the config --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [{"sinks": True}, "sinks", "sinks:true", {"sinks": "true"}])
def test_sinks_forms_have_one_canonical_text(value) -> None:
    assert parse_score_mod(value) == "sinks"


def test_sinks_false_is_no_score_mod() -> None:
    assert parse_score_mod({"sinks": False}) is None


def test_sinks_in_a_config_label_and_rows() -> None:
    (spec,) = cell_specs(parse_config({"score_mod": {"sinks": True}, "shapes": [SHAPE]}), "cpu")
    assert (spec.score_mod, spec.score_mod_kind, spec.cell_label) == ("sinks", "sinks", "1x2x64x16 sinks")
    masked = parse_config({"shapes": [SHAPE | {"mask": {"sliding_window": 8}, "score_mod": {"sinks": True}}]})
    assert masked.shapes[0].label == "1x2x64x16 sw8 sinks"


def test_sinks_as_a_sweep_axis() -> None:
    from attnprof.pipeline.sweep import sweep_specs

    config = parse_config({"shapes": [SHAPE], "sweep": {"score_mod": [None, {"sinks": True}]}})
    points, left_out = sweep_specs(config, "cpu")
    assert left_out == [] and {s.score_mod for s in points} == {None, "sinks"}


@pytest.mark.parametrize(
    ("score_mod", "message"),
    [
        ({"sinks": 1}, "score_mod: sinks must be true or false (got 1)"),
        ({"sinks": "yes"}, "score_mod: sinks must be true or false (got 'yes')"),
        ("sink", "score_mod: unknown score_mod 'sink'; did you mean sinks?"),
    ],
)
def test_bad_sinks_are_one_line_errors(score_mod, message) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"score_mod": score_mod, "shapes": [SHAPE]})
    assert info.value.message.splitlines()[-1].strip() == message  # one line for the field, under the heading


def test_a_model_config_refuses_sinks(model_config) -> None:
    from attnprof.model_config import load_model_config

    with pytest.raises(ConfigError) as info:
        load_model_config(model_config(score_mod={"sinks": True}))
    assert "score_mod sinks is for compare, run and sweep" in info.value.message


# -- the sink logits and the reference -----------------------------------------------------------------------


def test_sink_logits_one_per_query_head_seeded_in_the_input_dtype() -> None:
    spec = RunSpec("cpu", "bf16", 2, 8, 128, 16, 2, score_mod="sinks")
    sinks = make_sinks(spec, 0)
    assert sinks.shape == (8,) and sinks.dtype == torch.bfloat16
    assert torch.equal(sinks, make_sinks(spec, 0)) and not torch.equal(sinks, make_sinks(spec, 1))
    # standard-normal around ln(n_keys): exp(sink) weighs about as much as a row's keys
    assert abs(sinks.float().mean().item() - math.log(128)) < 1.5
    assert make_sinks(RunSpec("cpu", "bf16", 2, 8, 128, 16), 0) is None


def test_reference_with_sinks_is_the_hand_written_formula() -> None:
    """o_i = Σ_j exp(z_ij) v_j / (Σ_j exp(z_ij) + exp(s_h)), z the scaled causal scores, per head h."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    expected = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    for h in range(2):
        for i in range(3):
            z = [float(q[0, h, i] @ k[0, h, j]) / 2.0 for j in range(i + 1)]  # √D = 2
            denominator = sum(math.exp(x) for x in z) + math.exp(float(sinks[h]))
            for j in range(i + 1):
                expected[0, h, i] += math.exp(z[j]) / denominator * v[0, h, j]
    got = reference_attention(q, k, v, True, sinks=sinks)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    # the sink brings no value: the row's weights sum to less than 1, so the output shrinks
    assert got.norm() < reference_attention(q, k, v, True).norm()


def test_reference_sink_gradient_is_the_hand_written_formula() -> None:
    """dL/ds_h = −Σ_{b,i} p_sink(b,h,i) · (dO·O)_{b,h,i}, p_sink = exp(s_h) / (Σ_j exp(z_ij) + exp(s_h))."""
    gen = torch.Generator().manual_seed(7)
    q, k, v, grad_out = (torch.randn(2, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    sinks = torch.tensor([1.0, 2.0], dtype=torch.float64)
    *_, dsinks = reference_grads(q, k, v, grad_out, False, sinks=sinks)
    out = reference_attention(q, k, v, False, sinks=sinks)
    lse = torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1)  # [B, H, S]
    p_sink = torch.exp(sinks[None, :, None]) / (torch.exp(lse) + torch.exp(sinks[None, :, None]))
    expected = -(p_sink * (grad_out * out).sum(-1)).sum(dim=(0, 2))
    assert torch.allclose(dsinks, expected, rtol=1e-10, atol=1e-12)


def test_chunked_reference_grads_give_the_same_dsinks() -> None:
    spec = RunSpec("cpu", "fp32", 1, 4, 32, 16, 2, score_mod="sinks")
    q, k, v = make_inputs(spec, 0)
    sinks, grad_out = make_sinks(spec, 0), torch.randn(q.shape)
    whole = reference_grads(q, k, v, grad_out, True, sinks=sinks)
    chunked = reference_grads(q, k, v, grad_out, True, limit=32 * 32, sinks=sinks)  # one head a chunk
    assert len(whole) == len(chunked) == 4
    for a, b in zip(whole, chunked, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


# -- the variants ---------------------------------------------------------------------------------------------


def run_cell(name: str, spec: RunSpec):
    """The cell's step run once, as a cell runs it, and its checks: (forward Check, GradCheck or None)."""
    variant = BUILTINS.get(name)
    assert variant.unavailable_reason(spec) is None
    with cell_step(variant, spec, 0, no_stage) as step:
        if step.prepare is not None:
            step.prepare()
        output = step.call()
        out = output.out if spec.backward else output
        q, k, v = step.inputs
        check = check_against_reference(out, q, k, v, spec.causal, spec.dtype, None, spec.mask, "sinks", step.sinks)
        if not spec.backward:
            return check, None
        grads = check_grads(
            output.grads,
            q,
            k,
            v,
            step.grad_out,
            causal=spec.causal,
            dtype=spec.dtype,
            mask=spec.mask,
            score_mod="sinks",
            sinks=step.sinks,
            sink_grad=output.sink_grad,
        )
        return check, grads


@pytest.mark.parametrize("name", ["naive", "inplace"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_handwritten_variants_with_sinks_match_the_reference(name, dtype, mode) -> None:
    spec = RunSpec("cpu", dtype, 2, 4, 48, 16, 2, mode=mode, score_mod="sinks")
    check, grads = run_cell(name, spec)
    assert check.passed and check.rel_error <= THRESHOLDS[dtype], check.reason
    if mode != "fwd":
        assert grads.passed, grads.reason
        assert set(grads.rel_errors) == {"dq", "dk", "dv", "dsinks"}
        assert grads.rel_errors["dsinks"] <= GRAD_THRESHOLDS[dtype]


@pytest.mark.parametrize("name", ["naive", "inplace"])
def test_sinks_with_a_window_and_decode(name) -> None:
    spec = RunSpec("cpu", "fp32", 1, 4, 32, 16, 2, mask="sliding_window:8", q_len=9, mode="fwd+bwd", score_mod="sinks")
    check, grads = run_cell(name, spec)
    assert check.passed and grads.passed, (check.reason, grads.reason)


def test_compiled_takes_sinks_forward_and_backward() -> None:
    check, grads = run_cell("compiled", RunSpec("cpu", "fp32", 1, 2, 32, 16, mode="fwd+bwd", score_mod="sinks"))
    assert check.passed and grads.passed, (check.reason, grads.reason)
    assert grads.rel_errors["dsinks"] < 1e-5


def test_the_checks_catch_a_dropped_sink_and_a_wrong_sink_gradient() -> None:
    spec = RunSpec("cpu", "fp32", 1, 2, 32, 16, mode="fwd+bwd", score_mod="sinks")
    variant = BUILTINS.get("naive")
    with cell_step(variant, spec, 0, no_stage) as step:
        output = step.call()
        q, k, v = step.inputs
        without = variant.forward(q.detach(), k.detach(), v.detach(), True, variant.setup(spec))
        dropped = check_against_reference(without, q, k, v, True, "fp32", None, spec.mask, "sinks", step.sinks)
        assert not dropped.passed and dropped.rel_error > 0.1
        kwargs = {"causal": True, "dtype": "fp32", "score_mod": "sinks", "sinks": step.sinks}
        wrong = check_grads(output.grads, q, k, v, step.grad_out, sink_grad=-output.sink_grad, **kwargs)
        assert not wrong.passed and "dsinks" in wrong.reason and "dq" not in wrong.reason
        missing = check_grads(output.grads, q, k, v, step.grad_out, sink_grad=None, **kwargs)
        assert missing.reason == "dsinks shape None != expected (2,)"


def sliced_grad_check(batch: int, limit: int):
    spec = RunSpec("cpu", "fp32", batch, 2, 16, 16, mode="fwd+bwd", score_mod="sinks")
    with cell_step(BUILTINS.get("naive"), spec, 0, no_stage) as step:
        output = step.call()
        q, k, v = step.inputs
        return check_grads(
            output.grads,
            q,
            k,
            v,
            step.grad_out,
            causal=True,
            dtype="fp32",
            limit=limit,
            score_mod="sinks",
            sinks=step.sinks,
            sink_grad=output.sink_grad,
        )


def test_a_slice_checks_dsinks_only_when_it_keeps_every_batch_element() -> None:
    dropped = sliced_grad_check(3, 2 * 2 * 16 * 16)  # batches 0 and 2 of 3
    assert dropped.passed and set(dropped.rel_errors) == {"dq", "dk", "dv"}
    assert dropped.scope.endswith("; dsinks not checked (it sums over all 3 batch elements)")
    kept = sliced_grad_check(2, 2 * 16 * 16)  # batches 0 and 1, key/value head 0 with its query head
    assert kept.passed and kept.rel_errors["dsinks"] < 1e-5 and "1 of 2 kv heads" in kept.scope


def test_flex_sink_formula_is_exact_on_cpu_eagerly() -> None:
    """flex's output scaled by sigmoid(lse − sink) (`flex_with_sinks`, uncompiled: the CPU's compiled flex
    returns no lse) is the reference with sinks."""
    from torch.nn.attention.flex_attention import create_block_mask

    from attnprof.variants.compiled import flex_with_sinks

    spec = RunSpec("cpu", "fp32", 1, 4, 128, 16, 2, score_mod="sinks")
    q, k, v = make_inputs(spec, 0)
    sinks = make_sinks(spec, 0)
    block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, 128, 128, device="cpu")
    with pytest.warns(UserWarning):  # eager flex warns that it is slow
        out = flex_with_sinks(q, k, v, sinks, block_mask=block_mask, enable_gqa=True)
    assert relative_error(out, reference_attention(q, k, v, True, sinks=sinks)) < 1e-6


def test_a_dense_masks_timed_alternative_gets_the_sinks_too() -> None:
    """flex's block-mask alternative to a dense sinks cell runs at the same spec: its forward needs the sinks."""
    from attnprof.config import Config, MeasureOptions
    from attnprof.pipeline.mask_alternatives import time_alternative
    from attnprof.registry import Variant

    seen = []

    def forward(q, k, v, causal, state, sinks=None):
        seen.append(sinks)
        return BUILTINS.get("naive").forward(q, k, v, causal, state, sinks=sinks)

    naive = BUILTINS.get("naive")
    fake = Variant(
        "needs-sinks", "naive that records its sinks", forward, setup=naive.setup, score_mods=naive.score_mods
    )
    spec = RunSpec("cpu", "fp32", 1, 2, 64, 16, mask="sliding_window:8", score_mod="sinks")
    config = Config(shapes=[{"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}], device="cpu", dtype="fp32")
    assert time_alternative(fake, spec, config, MeasureOptions(min_time_s=0.02)) > 0
    assert seen and all(s is not None and torch.equal(s, make_sinks(spec, config.seed)) for s in seen)


# -- what cannot take sinks -------------------------------------------------------------------------------------

SINKS_CPU = RunSpec("cpu", "fp32", 1, 2, 64, 16, score_mod="sinks")
SINKS_CUDA = RunSpec("cuda", "bf16", 1, 2, 64, 16, score_mod="sinks")


@pytest.mark.parametrize("name", ["sdpa", "sdpa-math", "sdpa-flash"])
def test_sdpa_skips_sinks_with_the_reason(name) -> None:
    assert BUILTINS.get(name).unavailable_reason(SINKS_CPU) == (
        f"score_mod sinks not supported by {name} (SDPA's softmax runs over the keys alone, and an attn_mask can "
        "only bias a key's score)"
    )


def test_flex_declares_sinks_but_skips_them_on_a_cpu() -> None:
    flex = BUILTINS.get("flex")
    assert "sinks" in flex.score_mods
    assert flex.unavailable_reason(SINKS_CPU) == (
        "sinks through flex need its log-sum-exp output, which torch.compile's CPU flex kernel does not give"
    )


def test_triton_flash_and_flash_attn_take_sinks() -> None:
    """triton-flash in every mode; flash-attn through FA4's learnable_sink, which `check` asks of the installed
    interface (plugins/attnprof-flash-attn/tests: the stand-in FA4, the refusals)."""
    from attnprof_flash_attn import make_variant as flash_attn
    from attnprof_triton import make_variant as triton_flash

    triton, fa = triton_flash(), flash_attn()
    assert "sinks" in triton.score_mods and triton.masking_reason(SINKS_CUDA) is None
    assert "sinks" in fa.score_mods and fa.masking_reason(SINKS_CUDA) is None


# -- compare end to end ---------------------------------------------------------------------------------------


def test_compare_sinks_cpu_end_to_end(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    config = REPO / "configs" / "sinks-cpu.yaml"
    result = cli("compare", str(config), "-o", str(tmp_path), "--min-time", "0.02", "--format", "json")
    assert result.exit_code == 0, result.output
    files = json.loads(result.stdout)["files"]
    rows = {
        (r["variant"], r["shape"], r["mode"]): r for r in json.loads(Path(files["results_json"]).read_text())["results"]
    }
    for shape in ("1x4x256x64 sinks", "1x4x256x64/kv2 sw64 sinks"):
        for variant in ("naive", "inplace"):
            fwd, step = rows[(variant, shape, "fwd")], rows[(variant, shape, "fwd+bwd")]
            assert fwd["status"] == step["status"] == "ok" and fwd["score_mod"] == "sinks"
            assert fwd["rel_error"] <= fwd["rel_error_threshold"] == THRESHOLDS["fp32"]
            assert set(step["grad_rel_error"]) == {"dq", "dk", "dv", "dsinks"}
            assert step["grad_rel_error_dsinks"] == step["grad_rel_error"]["dsinks"] <= GRAD_THRESHOLDS["fp32"]
        assert rows[("sdpa-math", shape, "fwd")]["status"].startswith("skipped: score_mod sinks not supported")
        assert rows[("flex", shape, "fwd+bwd")]["status"].startswith("skipped: sinks through flex need")
    header = Path(files["results_csv"]).read_text().splitlines()[0].split(",")
    assert "grad_rel_error_dsinks" in header
