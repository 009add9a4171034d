"""The cost-balanced, deterministic split of cells across ranks (pipeline.sharding), and resume's matching
of a folder's rows with the plan (pipeline.resume)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from attnprof.pipeline.resume import attach_row_speedups, kept_rows, ordered_rows, still_to_run
from attnprof.pipeline.sharding import CELL_OVERHEAD_S, cell_cost, cell_flops, cell_name, split_cells
from attnprof.registry import RunSpec, Variant
from attnprof.report.results_file import ResultsFile


def spec(seq: int = 1024, causal: bool = True, mode: str = "fwd", device: str = "cuda:0", **kw) -> RunSpec:
    shape = {"batch": 1, "heads": 8, "head_dim": 64} | kw
    return RunSpec(device=device, dtype="bf16", seq=seq, causal=causal, mode=mode, **shape)


def variant(name: str, collective: bool = False) -> Variant:
    return Variant(name, "test", lambda q, k, v, causal, state: q, collective=collective)


def test_cost_grows_with_the_square_of_the_sequence_and_keeps_an_overhead() -> None:
    assert cell_flops(spec(2048)) == 4 * cell_flops(spec(1024))
    assert cell_flops(spec(1024, causal=False)) == 2 * cell_flops(spec(1024))
    assert cell_flops(spec(1024, mode="bwd")) == 2.5 * cell_flops(spec(1024))
    assert cell_flops(spec(1024, mode="fwd+bwd")) == 3.5 * cell_flops(spec(1024))
    assert cell_cost(spec(16)) == pytest.approx(CELL_OVERHEAD_S, rel=1e-3)  # tiny cells still cost their start-up
    long, short = cell_cost(spec(65536)) - CELL_OVERHEAD_S, cell_cost(spec(32768)) - CELL_OVERHEAD_S
    assert long == pytest.approx(4 * short)


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


def row(name: str, s: RunSpec, **extra) -> dict:
    return {"variant": name, "device": s.device, "dtype": s.dtype, "batch": s.batch, "heads": s.heads,
            "kv_heads": s.n_kv_heads, "seq": s.seq, "head_dim": s.head_dim, "causal": s.causal, "mode": s.mode,
            "status": "ok"} | extra


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
    kept = kept_rows(ResultsFile(Path("run"), {"command": "compare"}, rows), {"ring"})
    assert [(r["variant"], r.get("rank")) for r in kept] == [("a", 1), ("ring", 0), ("ring", 1), ("zzz", None)]
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
    assert [r["variant"] for r in ordered] == ["base", "a", "other"]
    attach_row_speedups(ordered, "base")
    assert [r["speedup_vs_baseline"] for r in ordered] == [1.0, 2.0, None]
    assert [r["speedup_reliable"] for r in ordered] == [True, True, None]
