"""The cost-balanced, deterministic split of cells across ranks (pipeline.sharding), and resume's matching
of a folder's rows with the plan (pipeline.resume)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from attnprof.analysis.roofline import bytes_moved, step_flops
from attnprof.pipeline.resume import attach_row_speedups, kept_rows, ordered_rows, still_to_run
from attnprof.pipeline.sharding import (
    CALLS_PER_CELL,
    CELL_OVERHEAD_S,
    NOMINAL_BANDWIDTH,
    NOMINAL_FLOP_RATE,
    call_seconds,
    cell_cost,
    cell_name,
    split_cells,
)
from attnprof.registry import RunSpec, Variant
from attnprof.results.files import ResultsFile
from attnprof.results.schema import Document, Row


def spec(seq: int = 1024, causal: bool = True, mode: str = "fwd", device: str = "cuda:0", **kw) -> RunSpec:
    shape = {"batch": 1, "heads": 8, "head_dim": 64} | kw
    return RunSpec(device=device, dtype="bf16", seq=seq, causal=causal, mode=mode, **shape)


def variant(name: str, collective: bool = False) -> Variant:
    return Variant(name, "test", lambda q, k, v, causal, state: q, collective=collective)


def previous_cost(s: RunSpec) -> float:
    """The estimate before masks and decode: 4·B·H·S²·D (the square of `seq`), halved when causal."""
    flops = 4.0 * s.batch * s.heads * s.seq * s.seq * s.head_dim * (0.5 if s.causal else 1.0)
    flops *= {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[s.mode]
    return CELL_OVERHEAD_S + CALLS_PER_CELL * flops / NOMINAL_FLOP_RATE[(s.device_type, s.dtype)]


def decode(kv_len: int = 131072, **kw) -> RunSpec:
    """One query against `kv_len` cached keys (configs/decode-h200.yaml's shape)."""
    return spec(kv_len, **({"batch": 8, "heads": 32, "kv_heads": 8, "head_dim": 128, "q_len": 1} | kw))


def test_cost_grows_with_the_square_of_the_sequence_and_keeps_an_overhead() -> None:
    # The FLOPs are roofline's exact ones: no mask is exactly S², causal S(S+1)/2 (no longer S²/2, so
    # doubling S is 4x only to within 1/S: approx here, where the S²-estimate was exact).
    assert step_flops(spec(2048, causal=False)) == 4 * step_flops(spec(1024, causal=False))
    assert step_flops(spec(2048)) == pytest.approx(4 * step_flops(spec(1024)), rel=1e-3)
    assert cell_cost(spec(16)) == pytest.approx(CELL_OVERHEAD_S, rel=1e-3)  # tiny cells still cost their start-up
    long, short = cell_cost(spec(65536)) - CELL_OVERHEAD_S, cell_cost(spec(32768)) - CELL_OVERHEAD_S
    assert long == pytest.approx(4 * short, rel=1e-4)
    # The mode scales a compute-bound cell's work as it scales its FLOPs.
    work = call_seconds(spec(8192))
    assert call_seconds(spec(8192, mode="bwd")) == pytest.approx(2.5 * work)
    assert call_seconds(spec(8192, mode="fwd+bwd")) == pytest.approx(3.5 * work)


def test_a_prefill_cell_costs_what_the_previous_estimate_said() -> None:
    # Square prefill is compute-bound: the cost is its FLOPs at the nominal rate, as before (causal to
    # within (S+1)/S, the exact diagonal; no mask exactly), in every mode and on the CPU too.
    for s in (spec(4096), spec(32768, batch=4, heads=16, head_dim=128), spec(8192, mode="fwd+bwd")):
        assert call_seconds(s) == step_flops(s) / NOMINAL_FLOP_RATE[("cuda", "bf16")]
        assert cell_cost(s) == pytest.approx(previous_cost(s), rel=1e-3)
    assert cell_cost(spec(4096, causal=False)) == pytest.approx(previous_cost(spec(4096, causal=False)), rel=1e-12)
    cpu = RunSpec("cpu", "fp32", 1, 4, 1024, 64)
    assert cell_cost(cpu) == pytest.approx(previous_cost(cpu), rel=1e-3)


def test_a_decode_cell_is_costed_by_the_cache_it_reads_not_as_a_prefill() -> None:
    one, prefill = decode(), decode(q_len=None)  # the same shape, 131072 queries instead of one
    assert call_seconds(one) == bytes_moved(one) / NOMINAL_BANDWIDTH["cuda"]  # memory-bound: its bytes
    assert step_flops(one) / NOMINAL_FLOP_RATE[("cuda", "bf16")] < call_seconds(one) / 10
    assert call_seconds(one) < call_seconds(prefill) / 1000
    assert cell_cost(one) < cell_cost(prefill) / 50  # 2.07 s, mostly the start-up, against 152 s
    assert previous_cost(one) == pytest.approx(cell_cost(prefill), rel=1e-3)  # the S² estimate: that prefill
    # It grows with the cache (linearly, past the start-up), and GQA's fewer K/V heads read less.
    assert call_seconds(decode(131072)) == pytest.approx(8 * call_seconds(decode(16384)), rel=1e-3)
    assert call_seconds(decode(kv_heads=32)) == pytest.approx(4 * call_seconds(decode(kv_heads=8)), rel=1e-3)
    assert call_seconds(prefill) == call_seconds(decode(q_len=None, kv_heads=32))  # compute-bound: no change


def test_a_masked_cell_costs_the_pairs_its_mask_keeps() -> None:
    shape = {"heads": 32, "kv_heads": 8, "head_dim": 128}
    causal, none = spec(131072, **shape), spec(131072, causal=False, **shape)
    window = spec(131072, mask="sliding_window:4096", **shape)
    assert cell_cost(window) < cell_cost(causal) / 5  # ~4096 keys a query against ~65536
    assert cell_cost(window) < previous_cost(window) / 10  # which took it for unmasked (causal False)
    documents = spec(131072, mask="documents:8", **shape)
    assert cell_cost(documents) < cell_cost(causal) / 4
    assert cell_cost(causal) < cell_cost(none) < previous_cost(none) * 1.001


def test_a_mixed_plan_of_prefill_and_decode_is_balanced() -> None:
    # Four long causal prefills and three 128k decodes over two ranks. The yardstick is each cell's
    # roofline at the rates measured on the H200 (docs/validation.md: ~560 TFLOP/s fused, 4.5 TB/s read),
    # not the nominal ones the split uses.
    specs = [spec(131072, heads=32, kv_heads=8, head_dim=128, batch=1) for _ in range(4)] + [decode()] * 3
    keys = [f"prefill{i}" for i in range(4)] + [f"decode{i}" for i in range(3)]

    def measured(s: RunSpec) -> float:
        return CELL_OVERHEAD_S + CALLS_PER_CELL * max(step_flops(s) / 560e12, bytes_moved(s) / 4.5e12)

    ideal = sum(measured(s) for s in specs) / 2

    def max_load(costs: list[float]) -> float:
        return max(sum(measured(specs[i]) for i in shard) for shard in split_cells(keys, costs, 2).shards)

    before = max_load([previous_cost(s) for s in specs])  # decodes first, 2 vs 1: then every prefill on one rank
    after = max_load([cell_cost(s) for s in specs])  # two prefills a rank, the decodes spread
    assert before > 1.8 * ideal
    assert after < 1.05 * ideal


def test_the_device_index_does_not_change_a_cell_or_its_cost() -> None:
    assert spec(device="cuda:0").cell_key == spec(device="cuda:3").cell_key
    assert cell_name("sdpa", spec(device="cuda:0")) == cell_name("sdpa", spec(device="cuda:1"))
    assert cell_cost(spec(device="cuda:0")) == cell_cost(spec(device="cuda:1"))
    assert spec(device="cpu").cell_key != spec(device="cuda:0").cell_key


def test_each_cell_lands_on_exactly_one_rank_in_plan_order() -> None:
    costs = [random.Random(7).uniform(1, 50) for _ in range(23)]
    keys = [f"cell{i:02d}" for i in range(23)]
    split = split_cells(keys, costs, 4)
    assert sorted(itertools.chain(*split.shards)) == list(range(23))
    assert all(shard == sorted(shard) for shard in split.shards)
    assert split.costs == pytest.approx([sum(costs[i] for i in shard) for shard in split.shards])
    assert split.rank_of() == {i: r for r, shard in enumerate(split.shards) for i in shard}


def test_the_split_balances_cost_not_count() -> None:
    # One long-sequence cell costs as much as the eight short ones together: it gets a rank to itself.
    specs = [spec(65536)] + [spec(1024)] * 8
    costs = [cell_cost(s) for s in specs]
    costs[0] = sum(costs[1:])
    split = split_cells([f"c{i}" for i in range(9)], costs, 2)
    assert split.shards[0] == [0] and split.shards[1] == list(range(1, 9))
    assert split.costs[0] == pytest.approx(split.costs[1])


def test_the_longest_first_rule_on_a_known_case() -> None:
    # LPT: 7 -> r0, 6 -> r1, 5 -> r1 (6 < 7), 4 -> r0 (7 < 11), 3 -> r0 (11 = 11: the lower rank).
    split = split_cells(["a", "b", "c", "d", "e"], [3, 7, 4, 6, 5], 2)
    assert split.shards == [[0, 1, 2], [3, 4]]
    assert split.costs == [14, 11]


def test_the_split_is_deterministic_and_ties_go_by_key() -> None:
    keys = [f"k{i}" for i in range(10)]
    costs = [5.0] * 10
    first = split_cells(keys, costs, 3)
    assert all(split_cells(keys, costs, 3) == first for _ in range(3))
    assert first.shards == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    # The key, not the position in the plan, breaks a tie: reversed, each rank gets the same keys.
    assert split_cells(keys[::-1], costs, 3).shards == [[0, 3, 6, 9], [2, 5, 8], [1, 4, 7]]


def test_more_ranks_than_cells_and_one_rank() -> None:
    assert split_cells(["a", "b"], [1.0, 2.0], 4).shards == [[1], [0], [], []]
    assert split_cells(["a", "b", "c"], [1.0, 2.0, 3.0], 1).shards == [[0, 1, 2]]
    assert split_cells([], [], 2).shards == [[], []]
    with pytest.raises(ValueError):
        split_cells(["a"], [1.0], 0)
    with pytest.raises(ValueError):
        split_cells(["a"], [], 2)


def test_a_group_keeps_its_cells_on_one_rank() -> None:
    # Three variants, each at a short and a long sequence; with `group`, each variant's chain stays on one rank.
    specs = [(name, seq) for name in ("a", "b", "c") for seq in (1024, 131072)]
    costs = [cell_cost(spec(seq)) for _, seq in specs]
    keys = [f"{name}|{seq}" for name, seq in specs]
    chains = split_cells(keys, costs, 2, group=lambda i: specs[i][0])
    assert all(len({specs[i][0] for i in shard}) == len(shard) // 2 for shard in chains.shards)
    assert sorted(chains.shards) == [[0, 1, 4, 5], [2, 3]]
    loose = split_cells(keys, costs, 2)  # without it the long cells spread first and a chain is cut
    assert any(len({specs[i][0] for i in shard}) * 2 != len(shard) for shard in loose.shards)


def row(name: str, s: RunSpec, **extra) -> Row:
    return Row(**({"variant": name, "device": s.device, "dtype": s.dtype, "batch": s.batch, "heads": s.heads,
                   "kv_heads": s.n_kv_heads, "seq": s.seq, "head_dim": s.head_dim, "causal": s.causal,
                   "mode": s.mode, "status": "ok"} | extra))


def test_resume_keeps_each_finished_cell_once_and_collective_cells_only_whole() -> None:
    a, b, ring = variant("a"), variant("b"), variant("ring", collective=True)
    cells = [(a, spec(1024)), (b, spec(1024)), (ring, spec(1024)), (a, spec(2048)), (ring, spec(2048))]
    rows = [
        row("a", spec(1024, device="cuda:1"), rank=1, world_size=2),  # another rank's GPU: the same cell
        row("a", spec(1024), rank=0, world_size=2),  # a duplicate: the first is kept
        row("ring", spec(1024), rank=0, world_size=2),
        row("ring", spec(1024, device="cuda:1"), rank=1, world_size=2),  # complete: both ranks
        row("ring", spec(2048), rank=1, world_size=2),  # rank 0's row is missing: run again
        row("a", spec(2048), status="failed: NaN in output", reason="NaN in output"),  # transient: run again
        row("zzz", spec(1024)),  # a variant the plan does not hold: kept, as a sweep's resume keeps it
    ]
    kept = kept_rows(ResultsFile(Path("run"), Document(command="compare"), rows), {"ring"})
    assert [(r.variant, r.rank) for r in kept] == [("a", 1), ("ring", 0), ("ring", 1), ("zzz", None)]
    assert still_to_run(cells, kept) == [1, 3, 4]


def test_merged_rows_follow_the_plan_and_get_their_speedups_again() -> None:
    a, base = variant("a"), variant("base")
    cells = [(base, spec(1024)), (a, spec(1024))]
    rows = [
        row("a", spec(1024, device="cuda:1"), latency_us=50.0, unstable=False, rank=1),
        row("base", spec(1024), latency_us=100.0, unstable=False, rank=0),
        row("other", spec(4096), latency_us=1.0),
    ]
    ordered = ordered_rows(cells, rows)
    assert [r.variant for r in ordered] == ["base", "a", "other"]
    attach_row_speedups(ordered, "base")
    assert [r.speedup_vs_baseline for r in ordered] == [1.0, 2.0, None]
    assert [r.speedup_reliable for r in ordered] == [True, True, None]
