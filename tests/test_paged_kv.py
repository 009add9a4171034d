"""Paged KV caches: `kv_cache: {page_size: N}` in the config (forms, defaults, labels, one-line errors, sweep
axis, row keys), the variants that declare it and the skip reasons of the others, the shuffled page pool,
the page table's bytes, and flex over a paged cache on CPU against the float64 reference."""

from __future__ import annotations

import msgspec
import pytest
from analysis_json import analysis_json

from attnprof.analysis.roofline import bytes_moved, min_bytes, page_table_bytes, step_flops
from attnprof.config import parse_config
from attnprof.errors import ConfigError
from attnprof.kv_cache import paged_pool, shuffled_page_table
from attnprof.pipeline.run import cell_specs
from attnprof.pipeline.sweep import sweep_specs
from attnprof.plugins import load_variants
from attnprof.registry import PAGED_NO_BACKWARD, RunSpec, Variant
from attnprof.results.keys import cell_key as row_cell_key
from attnprof.results.schema import Row
from attnprof.results.upgrade import upgrade_row

DECODE = {"batch": 32, "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 4096, "head_dim": 128}
PAGED = DECODE | {"kv_cache": {"page_size": 64}}


def specs(data: dict) -> list[RunSpec]:
    return cell_specs(parse_config(data), "cuda")


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.message


# --- config -----------------------------------------------------------------------------


def test_paged_shape_spec_and_label() -> None:
    (spec,) = specs({"shapes": [PAGED]})
    assert spec.page_size == 64
    assert spec.shape_label == "32x32x1/4096x128/kv8 paged64"
    assert spec.cell_key[-1] == 64
    (plain,) = specs({"shapes": [DECODE]})
    assert plain.page_size is None and plain.shape_label == "32x32x1/4096x128/kv8"
    masked = RunSpec("cuda", "bf16", 1, 2, 256, 64, mask="sliding_window:32", score_mod="alibi", page_size=16)
    assert masked.shape_label == "1x2x256x64 sw32 alibi paged16"


def test_top_level_kv_cache_is_the_default_a_shape_may_replace() -> None:
    config = parse_config({"kv_cache": {"page_size": 256}, "shapes": [DECODE, PAGED]})
    assert [s.page_size for s in cell_specs(config, "cuda")] == [256, 64]
    assert config.model_dump()["kv_cache"] == {"page_size": 256}  # written back as given
    assert parse_config(config.model_dump()) == config


@pytest.mark.parametrize(
    "data,message",
    [
        ({"shapes": [DECODE | {"kv_cache": {"pagesize": 64}}]}, "kv_cache key 'pagesize'; did you mean page_size?"),
        ({"shapes": [DECODE | {"kv_cache": {"pages": 64}}]}, "unknown kv_cache key 'pages'; did you mean page_size?"),
        ({"shapes": [DECODE | {"kv_cache": {"page_size": 0}}]}, "page_size must be a positive integer (got 0)"),
        ({"shapes": [DECODE | {"kv_cache": {"page_size": -16}}]}, "page_size must be a positive integer (got -16)"),
        ({"shapes": [DECODE | {"kv_cache": {"page_size": 1.5}}]}, "page_size must be a positive integer (got 1.5)"),
        ({"shapes": [DECODE | {"kv_cache": {"page_size": True}}]}, "page_size must be a positive integer (got True)"),
        ({"shapes": [DECODE | {"kv_cache": {}}]}, "kv_cache needs a page_size: {page_size: N}"),
        ({"shapes": [DECODE | {"kv_cache": "paged"}]}, "kv_cache must be null or {page_size: N}"),
        ({"shapes": [DECODE | {"kv_cache": {"page_size": 48}}]}, "shapes.0: page_size 48 does not divide kv_len 4096"),
        ({"kv_cache": {"page_size": 3}, "shapes": [DECODE]}, "shapes.0: page_size 3 does not divide kv_len 4096"),
    ],
)
def test_one_line_errors(data: dict, message: str) -> None:
    text = error(data)
    assert message in text
    assert len(text.splitlines()) == 2  # the heading and one line


def test_runspec_refuses_a_page_size_that_does_not_divide_kv_len() -> None:
    with pytest.raises(ValueError, match="page_size 48 does not divide kv_len 4096"):
        RunSpec("cpu", "fp32", 1, 2, 4096, 64, page_size=48)
    with pytest.raises(ValueError, match="page_size must be a positive integer"):
        RunSpec("cpu", "fp32", 1, 2, 4096, 64, page_size=0)


def test_kv_cache_sweep_axis() -> None:
    config = parse_config(
        {
            "shapes": [{"batch": 1, "heads": 2, "q_len": 1, "head_dim": 16}],
            "sweep": {"kv_len": [48, 64], "kv_cache": [None, {"page_size": 16}, {"page_size": 32}]},
        }
    )
    points, left_out = sweep_specs(config, "cpu")
    assert [(s.n_keys, s.page_size) for s in points] == [(48, None), (48, 16), (64, None), (64, 16), (64, 32)]
    assert left_out == ["page_size 32 does not divide kv_len 48"]
    shape = {"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}
    default = parse_config({"kv_cache": {"page_size": 32}, "shapes": [shape], "sweep": {"seq": [48, 64]}})
    points, left_out = sweep_specs(default, "cpu")
    assert [(s.seq, s.page_size) for s in points] == [(64, 32)]
    assert left_out == ["page_size 32 does not divide kv_len 48"]


def test_rows_carry_page_size_and_keep_their_keys() -> None:
    paged = RunSpec("cuda:0", "bf16", 32, 32, 4096, 128, 8, q_len=1, page_size=64)
    row = {
        "device": "cuda:1",
        "dtype": "bf16",
        "batch": 32,
        "heads": 32,
        "kv_heads": 8,
        "seq": 4096,
        "head_dim": 128,
        "causal": True,
        "mode": "fwd",
        "mask": "causal",
        "q_len": 1,
        "kv_len": 4096,
    }
    assert row_cell_key(Row(**row, page_size=64)) == paged.cell_key
    contiguous = RunSpec("cuda:0", "bf16", 32, 32, 4096, 128, 8, q_len=1)
    old = msgspec.convert(upgrade_row(row, "cell"), Row)  # as a version-1 file's row is read back
    assert row_cell_key(old) == contiguous.cell_key  # a row written before paged caches
    assert row_cell_key(Row(**row, page_size=None)) == contiguous.cell_key


# --- variants: who reads a paged cache ----------------------------------------------------


def test_a_variant_reads_no_paged_cache_unless_it_says_so() -> None:
    old = Variant(name="old-plugin", description="declares nothing new", forward=lambda q, k, v, c, s: q)
    assert old.paged_kv is False and old.prepare_inputs is None
    spec = RunSpec("cuda", "bf16", 2, 4, 512, 64, q_len=1, page_size=64)
    assert old.unavailable_reason(spec) == "paged KV cache not supported by old-plugin (use flex)"


def test_builtins_skip_paged_cells_naming_flex() -> None:
    registry = load_variants(no_plugins=True).registry
    spec = RunSpec("cuda", "bf16", 2, 4, 512, 64, 2, q_len=1, page_size=64)
    readers = [v.name for v in registry.all() if v.paged_kv]
    assert readers == ["flex"]
    for name in ("naive", "sdpa", "sdpa-math", "sdpa-cudnn", "sdpa-flash", "compiled"):
        assert registry.get(name).masking_reason(spec) == f"paged KV cache not supported by {name} (use flex)"
    assert registry.get("flex").masking_reason(spec) is None


def test_paged_cells_are_forward_only() -> None:
    flex = load_variants(no_plugins=True).registry.get("flex")
    spec = RunSpec("cpu", "fp32", 2, 4, 512, 64, q_len=1, page_size=64, mode="bwd")
    assert flex.unavailable_reason(spec) == PAGED_NO_BACKWARD == "no backward (a paged KV cache is timed forward only)"


@pytest.mark.parametrize(
    "page,q_len,reason",
    [
        (16, 1, None),
        (64, 16, None),
        (8, 1, "flex on CUDA needs a power-of-two page_size >= 16 (its key tile; got 8)"),
        (48, 1, "flex on CUDA needs a power-of-two page_size >= 16 (its key tile; got 48)"),
        (
            64,
            256,
            "flex on CUDA needs page_size a multiple of 128 at q_len >= 128 (its attention kernel's key tile; got 64)",
        ),
        (128, 256, None),
    ],
)
def test_flex_page_size_on_cuda(monkeypatch: pytest.MonkeyPatch, page: int, q_len: int, reason: str | None) -> None:
    from attnprof import devices

    monkeypatch.setattr(devices, "triton_installed", lambda: True)
    flex = load_variants(no_plugins=True).registry.get("flex")
    spec = RunSpec("cuda", "bf16", 2, 4, 768, 64, q_len=q_len, page_size=page)
    assert flex.check(spec) == reason
    assert flex.check(RunSpec("cpu", "fp32", 2, 4, 768, 64, q_len=q_len, page_size=page)) is None  # any page on CPU


def test_flex_paged_needs_torch_2_6(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnprof import devices

    monkeypatch.setattr(devices, "torch_version", lambda: (2, 5))
    flex = load_variants(no_plugins=True).registry.get("flex")
    assert flex.check(RunSpec("cpu", "fp32", 2, 4, 512, 64, q_len=1, page_size=64)) == (
        "a paged KV cache through flex needs torch >= 2.6 (torch.nn.attention.experimental.PagedAttention)"
    )
    assert flex.check(RunSpec("cpu", "fp32", 2, 4, 512, 64, q_len=1)) is None


# --- the page pool ----------------------------------------------------------------------


def test_page_table_is_a_seeded_shuffle_of_the_whole_pool() -> None:
    import torch

    table = shuffled_page_table(4, 1024, 64, seed=0)
    assert table.shape == (4, 16) and table.dtype == torch.int64
    assert sorted(table.flatten().tolist()) == list(range(64))  # every page once
    assert torch.equal(table, shuffled_page_table(4, 1024, 64, seed=0))
    assert not torch.equal(table, shuffled_page_table(4, 1024, 64, seed=1))
    in_order = sum(int(b) + 1 == int(a) for row in table for b, a in zip(row[:-1], row[1:], strict=True))
    assert in_order < 8  # fragmented: few logical neighbours are physical neighbours (60 pairs)


def test_paged_pool_puts_each_page_where_the_table_says() -> None:
    import torch

    cache = torch.randn(3, 2, 64, 8)  # [B, H_kv, S, D]
    table = shuffled_page_table(3, 64, 16, seed=4)
    pool = paged_pool(cache, table, 16)
    assert pool.shape == (12, 16, 2, 8)  # [pages, page_size, H_kv, D]
    for b in range(3):
        for i in range(4):
            assert torch.equal(pool[table[b, i]], cache[b, :, i * 16 : (i + 1) * 16].transpose(0, 1))


# --- bytes ------------------------------------------------------------------------------


def test_bytes_count_the_page_table_and_flops_do_not_change() -> None:
    paged = RunSpec("cuda", "bf16", 32, 32, 4096, 128, 8, q_len=1, page_size=64)
    contiguous = RunSpec("cuda", "bf16", 32, 32, 4096, 128, 8, q_len=1)
    assert page_table_bytes(paged) == 32 * (4096 // 64) * 4 == 8192
    assert page_table_bytes(contiguous) == 0
    assert bytes_moved(paged) == min_bytes(contiguous) + 8192 == bytes_moved(contiguous) + 8192
    assert min_bytes(contiguous) == (2 * 32 * 32 * 1 * 128 + 2 * 32 * 8 * 4096 * 128) * 2
    assert step_flops(paged) == step_flops(contiguous)


# --- flex over a paged cache, on CPU ------------------------------------------------------


def _flex_paged(spec: RunSpec, seed: int = 3):
    """Setup, inputs, prepare_inputs and one forward of flex, as a cell runs them; the output and q, k, v."""
    import torch

    flex = load_variants(no_plugins=True).registry.get("flex")
    from attnprof.profiling.inputs import make_inputs

    assert flex.unavailable_reason(spec) is None
    state = flex.setup(spec)
    q, k, v = make_inputs(spec, seed)
    with torch.no_grad():
        state = flex.prepare_inputs(spec, state, q, k, v, seed)
        k_logical, v_logical = k.clone(), v.clone()
        k.zero_(), v.zero_()  # the forward must read the pool, not the logical k and v
        out = flex.forward(q, k, v, spec.causal, state)
    return out, (q, k_logical, v_logical), state


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        dict(batch=2, heads=8, kv_heads=2, seq=256, head_dim=64, q_len=1, page_size=16),  # decode, GQA
        dict(
            batch=2, heads=4, seq=256, head_dim=32, q_len=5, page_size=32, mask="sliding_window:40", score_mod="alibi"
        ),
        dict(batch=1, heads=2, seq=128, head_dim=16, q_len=3, page_size=8, causal=False),  # mask none
    ],
    ids=["decode-gqa", "window-alibi", "none"],
)
def test_flex_paged_matches_the_reference_of_the_logical_cache(fields: dict) -> None:
    from attnprof.profiling.correctness import check_against_reference

    spec = RunSpec(device="cpu", dtype="fp32", **fields)
    out, (q, k, v), state = _flex_paged(spec)
    table = state["page_table"]
    assert state["k_cache"].shape == (1, spec.n_kv_heads, spec.batch * spec.n_keys, spec.head_dim)
    assert state["block_mask"].kv_indices.shape[0] == spec.batch
    assert sorted(table.flatten().tolist()) == list(range(table.numel()))
    check = check_against_reference(
        out, q, k, v, causal=spec.causal, dtype="fp32", mask=spec.mask, score_mod=spec.score_mod
    )
    assert check.passed, check.reason
    assert check.rel_error < 1e-5


# --- analyze: a K/V pool the batch shares ---------------------------------------------------


def test_a_shared_kv_pool_counts_each_position_for_one_sequence() -> None:
    """The real decode-flex trace (16 sequences of 8,192 keys) with its K and V recorded as one pool of
    16 x 8,192 positions at batch 1, as paged flex passes them: the same bytes, arithmetic intensity
    and keys per sequence as the contiguous call, not 16 times the pairs."""
    import copy
    import gzip
    import json
    from pathlib import Path

    from attnprof.analysis import analyze_trace

    path = Path(__file__).parent / "data" / "h200" / "masks" / "decode-flex.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        contiguous = json.load(fh)
    pooled = copy.deepcopy(contiguous)
    changed = 0
    for event in pooled["traceEvents"]:
        dims = event.get("args", {}).get("Input Dims")
        if dims and dims[:3] == [[16, 32, 1, 128], [16, 8, 8192, 128], [16, 8, 8192, 128]]:
            dims[1] = dims[2] = [1, 8, 16 * 8192, 128]
            changed += 1
    assert changed

    def memory_bound(trace: dict) -> tuple[dict, str]:
        result = analysis_json(analyze_trace(trace))
        (message,) = [f["message"] for f in result["findings"] if f["id"] == "memory-bound"]
        return result["attention"]["calls"][0], message

    (call, message), (pool_call, pool_message) = memory_bound(contiguous), memory_bound(pooled)
    assert pool_call["bytes"] == call["bytes"] == 537_133_056
    assert "arithmetic intensity 4.0 FLOP/byte" in message and "arithmetic intensity 4.0 FLOP/byte" in pool_message
    assert "walks all 8,192 keys" in pool_message
