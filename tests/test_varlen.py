"""Packed variable-length batches (`seq_lens`, issue 34) on the CPU: the config's forms and their one-line errors,
the spec and its label, FLOPs summed per sequence (hand-computed), the float64 reference per sequence, every
built-in variant that runs them against it (or its skip reason), the rows, and `compare` end to end."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from attnprof.analysis.roofline import PADDED_CONVENTION, attention_flops, executed_flops, step_flops
from attnprof.config import Config
from attnprof.profiling.correctness import check_variant_output, reference_attention
from attnprof.profiling.gradcheck import check_grads
from attnprof.profiling.inputs import make_inputs, to_bhsd
from attnprof.profiling.steps import build_step
from attnprof.registry import RunSpec
from attnprof.variants import builtin_variants
from attnprof.varlen import (
    MAX_SEQUENCES,
    cu_seqlens_tensor,
    label,
    packed_dense_mask,
    packed_pairs,
    padded_pairs,
    parse_seq_lens,
    summary,
)

LENGTHS = (5, 3, 9, 1)  # 18 tokens, the longest 9


def packed(causal: bool = True, lengths: tuple[int, ...] = LENGTHS, **overrides) -> RunSpec:
    fields = dict(device="cpu", dtype="fp32", batch=1, heads=4, seq=sum(lengths), head_dim=16, causal=causal)
    return RunSpec(**(fields | overrides), seq_lens=lengths)


def variant(name: str):
    return next(v for v in builtin_variants() if v.name == name)


# --- the config ------------------------------------------------------------------------------------------


def test_a_list_is_the_lengths_and_a_generator_draws_the_same_ones_for_a_seed() -> None:
    assert parse_seq_lens([512, 100, 2048]) == (512, 100, 2048)
    uniform = parse_seq_lens({"count": 400, "mean": 128, "distribution": "uniform", "seed": 3})
    assert uniform == parse_seq_lens({"count": 400, "mean": 128, "seed": 3})  # uniform is the default
    assert uniform != parse_seq_lens({"count": 400, "mean": 128, "seed": 4})
    assert len(uniform) == 400 and 1 <= min(uniform) and max(uniform) <= 255
    assert abs(statistics.mean(uniform) - 128) < 8
    lognormal = parse_seq_lens({"count": 2000, "mean": 512, "distribution": "lognormal", "seed": 0})
    assert abs(statistics.mean(lognormal) - 512) < 20 and max(lognormal) > 2 * 512  # a long tail
    assert summary((5, 3, 10)) == {"count": 3, "total": 18, "min": 3, "mean": 6.0, "max": 10}
    assert label((5, 3, 10)) == "varlen3x~6"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "seq_lens must not be empty"),
        ([4, 0], "seq_lens must be positive integers (got 0)"),
        ([4, -2], "seq_lens must be positive integers (got -2)"),
        ([1.5], "seq_lens must be positive integers (got 1.5)"),
        ([True], "seq_lens must be positive integers (got True)"),
        ("512", "seq_lens must be a list of lengths or {count: N, mean: L, distribution: uniform|lognormal}"),
        ({"count": 4}, "seq_lens needs mean: {count: N, mean: L}"),
        ({"count": 4, "mean": 8, "distribution": "normal"}, "seq_lens distribution must be uniform or lognormal"),
        ({"count": 4, "mean": 8, "sed": 1}, "unknown seq_lens key 'sed'; did you mean seed?"),
        ({"count": 4, "mean": 8, "seed": "x"}, "seq_lens seed must be an integer (got 'x')"),
        ({"count": MAX_SEQUENCES + 1, "mean": 8}, f"seq_lens count {MAX_SEQUENCES + 1} is above {MAX_SEQUENCES}"),
        ([10_000_000, 10_000_000], "seq_lens total 20000000 tokens is above 16777216"),
    ],
)
def test_bad_lengths_are_one_line_errors(value, message) -> None:
    with pytest.raises(ValueError) as raised:
        parse_seq_lens(value)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def shape_error(**shape) -> str:
    with pytest.raises(ValueError) as raised:
        Config(device="cpu", shapes=[{"heads": 2, "head_dim": 16, **shape}])
    return str(raised.value)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"seq_lens": [10, 20], "seq": 16}, "seq_lens has a sequence of 20 tokens, longer than seq 16"),
        ({"seq_lens": [10, 20], "batch": 3}, "batch 3 contradicts seq_lens' 2 sequences (give batch 1, 2 or none)"),
        ({"seq_lens": [10, 20], "mask": {"sliding_window": 4}}, "seq_lens takes the causal or none mask"),
        ({"seq_lens": [10, 20], "q_len": 5}, "seq_lens takes no q_len"),
        ({"seq_lens": [10, 20], "kv_cache": {"page_size": 5}}, "seq_lens takes no kv_cache"),
        ({"seq_lens": [10, 20], "score_mod": "alibi"}, "seq_lens takes no score_mod"),
        ({"seq": 16}, "batch is required (or seq_lens)"),
    ],
)
def test_a_shape_that_contradicts_its_lengths_is_refused(shape, message) -> None:
    assert message in shape_error(**shape)


def test_the_configs_sized_mask_or_score_mod_does_not_fit_a_packed_shape() -> None:
    with pytest.raises(ValueError, match=r"seq_lens takes no sized mask, score_mod or kv_cache \(the config gives "
                       r"mask sliding_window:4, score_mod softcap:5\)"):
        Config(device="cpu", mask={"sliding_window": 4}, score_mod={"softcap": 5},
               shapes=[{"heads": 2, "head_dim": 16, "seq_lens": [5, 9]}])


@pytest.mark.parametrize("batch", [None, 1, 2])
def test_a_packed_shape_gives_batch_1_of_the_total_tokens(batch) -> None:
    config = Config(device="cpu", causal=False, shapes=[{"heads": 2, "head_dim": 16, "seq_lens": [5, 9],
                                                          "seq": 9, "batch": batch}])
    spec = config.shapes[0].spec("cpu", "fp32", config.causal, "fwd", config.mask, config.score_mod)
    assert (spec.batch, spec.seq, spec.seq_lens, spec.mask.text) == (1, 14, (5, 9), "none")
    assert spec.shape_label == "1x2x14x16 varlen2x~7" == config.shapes[0].label
    assert spec.cell_key != RunSpec("cpu", "fp32", 1, 2, 14, 16, causal=False, seq_lens=(9, 5)).cell_key


def test_a_spec_that_is_not_one_packed_batch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a packed batch is batch 1 of seq 18 \(got 2x18\)"):
        packed(batch=2)
    with pytest.raises(ValueError, match=r"a packed batch is batch 1 of seq 18 \(got 1x20\)"):
        packed(seq=20)
    with pytest.raises(ValueError, match="seq_lens takes the causal or none mask and no score_mod"):
        packed(mask="sliding_window:4")


# --- FLOPs, bytes and the reference --------------------------------------------------------------------


def test_flops_are_summed_per_sequence_and_padding_is_executed_not_useful() -> None:
    # causal: 5·6/2 + 3·4/2 + 9·10/2 + 1 = 15 + 6 + 45 + 1 = 67 pairs; none: 25 + 9 + 81 + 1 = 116
    assert packed_pairs(LENGTHS, True) == 67 and packed_pairs(LENGTHS, False) == 116
    assert attention_flops(packed(True)) == 4 * 4 * 16 * 67
    assert attention_flops(packed(False)) == 4 * 4 * 16 * 116
    assert step_flops(packed(True, mode="fwd+bwd")) == 3.5 * 4 * 4 * 16 * 67
    # the padded batch: 4 sequences of 9, 9·10/2 = 45 causal pairs each, 81 without a mask
    assert padded_pairs(LENGTHS, True) == 4 * 45 and padded_pairs(LENGTHS, False) == 4 * 81
    spec = packed(False)
    state = variant("padded-sdpa").setup(spec)
    pairs = variant("padded-sdpa").executed_pairs(spec, state)
    assert pairs.padded and executed_flops(spec, pairs) == 4 * 16 * 4 * 324
    assert executed_flops(spec, pairs) / attention_flops(spec) == pytest.approx(324 / 116)


def test_bytes_are_the_packed_tokens_once() -> None:
    from attnprof.analysis.roofline import min_bytes

    assert min_bytes(packed()) == 4 * (2 * 4 * 16 * 18 + 2 * 4 * 16 * 18)  # q, out, k, v of 18 tokens, fp32


def test_cu_seqlens_and_the_block_diagonal_mask() -> None:
    assert cu_seqlens_tensor(LENGTHS, "cpu").tolist() == [0, 5, 8, 17, 18]
    keep = packed_dense_mask((2, 3), causal=True)
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(keep, expected)
    assert torch.equal(packed_dense_mask((2, 3), causal=False), expected | expected.T)


@pytest.mark.parametrize("causal", [True, False])
def test_the_reference_per_sequence_is_each_sequence_on_its_own(causal) -> None:
    spec = packed(causal, kv_heads=2)
    q, k, v = make_inputs(spec, seed=1)
    ref = reference_attention(q, k, v, causal, seq_lens=LENGTHS)
    start = 0
    for n in LENGTHS:
        one = slice(start, start + n)
        alone = reference_attention(q[:, :, one], k[:, :, one], v[:, :, one], causal)
        torch.testing.assert_close(ref[:, :, one], alone, rtol=0, atol=1e-12)
        start += n
    # the same as the dense block-diagonal mask over the packed batch
    keep = packed_dense_mask(LENGTHS, causal)
    scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) / 4.0
    dense = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v.double().repeat_interleave(2, 1)
    torch.testing.assert_close(ref, dense, rtol=0, atol=1e-12)
    rows = torch.tensor([0, 6, 7, 16, 17])  # rows of several sequences, as the big-shape subset takes them
    torch.testing.assert_close(
        reference_attention(q, k, v, causal, q_rows=rows, seq_lens=LENGTHS), ref[:, :, rows], rtol=0, atol=1e-12
    )


def test_a_wrong_sequence_fails_the_check() -> None:
    spec = packed(False)
    q, k, v = make_inputs(spec, seed=1)
    wrong = reference_attention(q, k, v, False, seq_lens=(5, 3, 10))  # the last two sequences merged
    check = check_variant_output(wrong.float(), q, k, v, causal=False, dtype="fp32", seq_lens=LENGTHS)
    assert not check.passed and check.rel_error > 0.1


# --- the variants --------------------------------------------------------------------------------------


def run_forward(name: str, spec: RunSpec):
    v = variant(name)
    assert v.unavailable_reason(spec) is None
    state = v.setup(spec) if v.setup is not None else None
    q, k, vv = make_inputs(spec, seed=2, layout=v.layout)
    out = v.forward(q, k, vv, spec.causal, state)
    return check_variant_output(out, q, k, vv, causal=spec.causal, dtype=spec.dtype, layout=v.layout,
                                seq_lens=spec.seq_lens)


@pytest.mark.parametrize("name", ["naive", "inplace", "padded-sdpa"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_variants_match_the_reference(name, causal, kv_heads, dtype) -> None:
    check = run_forward(name, packed(causal, kv_heads=kv_heads, dtype=dtype))
    assert check.passed, check.reason


def test_nested_tensors_match_the_reference_without_causal() -> None:
    check = run_forward("nested-sdpa", packed(False))
    assert check.passed, check.reason


def test_flex_runs_the_document_mask() -> None:
    check = run_forward("flex", packed(True, lengths=(20, 7, 37)))
    assert check.passed, check.reason
    spec = packed(True, lengths=(20, 7, 37))
    flex = variant("flex")
    pairs = flex.executed_pairs(spec, flex.setup(spec))
    assert not pairs.padded and pairs.forward >= 4 * packed_pairs((20, 7, 37), True)


@pytest.mark.parametrize("name", ["naive", "padded-sdpa"])
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_the_reference_per_sequence(name, causal) -> None:
    spec = packed(causal, kv_heads=2, mode="fwd+bwd")
    v = variant(name)
    state = v.setup(spec)
    q, k, vv = make_inputs(spec, seed=3, layout=v.layout)
    step = build_step(spec, lambda q, k, v_: v.forward(q, k, v_, causal, state), (q, k, vv), seed=3)
    result = step.call()
    check = check_grads(result.grads, q, k, vv, step.grad_out, causal=causal, dtype="fp32", layout=v.layout,
                        seq_lens=LENGTHS)
    assert check.passed, (check.reason, check.rel_errors)


def test_skip_reasons() -> None:
    spec = packed()
    assert variant("sdpa").unavailable_reason(spec) == (
        "packed seq_lens not supported by sdpa (use padded-sdpa, nested-sdpa, flex, naive or inplace)"
    )
    from attnprof.errors import VariantUnavailableError

    nested = variant("nested-sdpa")
    with pytest.raises(VariantUnavailableError, match="Nested tensors for query / key are not supported when "
                                                      "is_causal=True"):
        nested.setup(packed(True))
    with pytest.raises(VariantUnavailableError, match="^SDPA on nested jagged tensors: "):
        nested.setup(packed(False, kv_heads=2))  # GQA: the CPU math path cannot broadcast the heads


# --- end to end ----------------------------------------------------------------------------------------


def test_compare_with_seq_lens_end_to_end(cli, write_config, tmp_path) -> None:
    path = write_config(
        shapes=[{"heads": 2, "head_dim": 16, "seq_lens": [24, 5, 40]}],
        causal=False,
        variants=["padded-sdpa", "nested-sdpa", "naive", "sdpa"],
        baseline="padded-sdpa",
    )
    result = cli("compare", str(path), "--format", "json", "--min-time", "0.01")
    assert result.exit_code == 0, result.output
    document = json.loads(open(json.loads(result.stdout)["files"]["results_json"]).read())
    rows = {r["variant"]: r for r in document["results"]}
    useful = 4 * 2 * 16 * (24 * 24 + 5 * 5 + 40 * 40)
    for name in ("padded-sdpa", "nested-sdpa", "naive"):
        row = rows[name]
        assert row["status"] == "ok", row["status"]
        assert row["shape"] == "1x2x69x16 varlen3x~23" and row["batch"] == 1 and row["seq"] == 69
        assert row["seq_lens"] == [24, 5, 40] and row["seq_lens_count"] == 3
        assert (row["seq_lens_min"], row["seq_lens_mean"], row["seq_lens_max"]) == (5, 23.0, 40)
        assert row["flops"] == useful and row["rel_error"] < 1e-5
    assert rows["padded-sdpa"]["executed_flops"] == 4 * 2 * 16 * 3 * 40 * 40
    assert PADDED_CONVENTION in rows["padded-sdpa"]["flops_convention"]
    assert rows["naive"]["executed_flops"] is None
    assert rows["sdpa"]["status"].startswith("skipped: packed seq_lens not supported by sdpa")
    # a resumed run finds the cell again: the row's key is the spec's
    from attnprof.results.files import load_results
    from attnprof.results.keys import cell_key

    typed = load_results(json.loads(result.stdout)["files"]["results_json"]).rows[0]
    spec = RunSpec("cpu", "fp32", 1, 2, 69, 16, causal=False, seq_lens=(24, 5, 40))
    assert cell_key(typed) == spec.cell_key


def test_a_sweep_over_packed_shapes(cli, write_config) -> None:
    path = write_config(shapes=[{"heads": 2, "head_dim": 16, "seq_lens": [5, 20]}], variants=["naive"],
                        baseline="naive", sweep={"heads": [2, 4]})
    result = cli("sweep", str(path), "--format", "json", "--min-time", "0.01")
    assert result.exit_code == 0, result.output
    rows = json.loads(open(json.loads(result.stdout)["files"]["results_json"]).read())["results"]
    assert sorted(r["shape"] for r in rows) == ["1x2x25x16 varlen2x~12", "1x4x25x16 varlen2x~12"]
    assert all(r["status"] == "ok" for r in rows)
    path = write_config(shapes=[{"heads": 2, "head_dim": 16, "seq_lens": [5, 20]}], sweep={"seq": [8, 32]})
    result = cli("sweep", str(path))
    assert result.exit_code != 0 and "seq_lens has a sequence of 20 tokens, longer than seq 8" in result.output


def test_the_varlen_configs_are_valid() -> None:
    from pathlib import Path

    from attnprof.config import load_config

    configs = Path(__file__).resolve().parents[1] / "configs"
    config = load_config(configs / "varlen-cpu.yaml")
    assert all(shape.seq_lens is not None for shape in config.shapes)
    assert sum(sum(shape.seq_lens or ()) for shape in config.shapes) < 4096
    h200 = load_config(configs / "varlen-h200.yaml")
    labels = ["1x32x32135x128/kv8 varlen16x~2008", "1x32x15294x128/kv8 varlen64x~239"]
    assert [shape.label for shape in h200.shapes] == labels


def test_bhsd_output_of_a_bshd_variant_is_the_packed_rows() -> None:
    spec = packed(False)
    v = variant("padded-sdpa")
    q, k, vv = make_inputs(spec, seed=2, layout="bshd")
    out = to_bhsd(v.forward(q, k, vv, False, v.setup(spec)), "bshd")
    assert out.shape == (1, 4, 18, 16)


def test_a_wildcard_chooses_the_varlen_only_variants_for_packed_shapes_only(write_config) -> None:
    from attnprof.config import load_config
    from attnprof.pipeline import select_variants, without_unrunnable_wildcards
    from attnprof.plugins import load_variants

    registry = load_variants(no_plugins=True).registry

    def chosen(**overrides) -> list[str]:
        config = load_config(write_config(**overrides))
        return [v.name for v in without_unrunnable_wildcards(config, select_variants(config, registry, "cpu"))]

    assert not {"padded-sdpa", "nested-sdpa"} & set(chosen(variants=["*"])) and "sdpa" in chosen(variants=["*"])
    assert chosen(variants=["padded-sdpa", "naive"]) == ["padded-sdpa", "naive"]  # named: its row says why
    packed_shape = {"shapes": [{"heads": 2, "head_dim": 16, "seq_lens": [3, 9]}]}
    assert {"padded-sdpa", "nested-sdpa"} <= set(chosen(variants=["*"], **packed_shape))
    assert "padded-sdpa" not in chosen(variants=["sdpa*"], **packed_shape)  # the sdpa-* pins stay their own
    assert variant("padded-sdpa").unavailable_reason(RunSpec("cpu", "fp32", 1, 2, 8, 16)) == (
        "runs packed seq_lens only (a shape's seq_lens)"
    )
