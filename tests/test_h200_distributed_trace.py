"""A real context-parallel trace from the H200: `cp-ring` at world size 1 under torchrun with NCCL
(1x16x16384x128, bf16, causal; captured 2026-12-01, see docs/validation.md). The ring sends its
K/V block to itself, so the trace holds a real NCCL kernel next to the attention kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_json import comm_json, ledger_json

from attnprof.analysis import analyze_trace

TRACE = Path(__file__).parent / "data" / "h200" / "distributed" / "cp-ring-ws1-1x16x16384x128.json.gz"


@pytest.fixture(scope="module")
def analysis():
    return analyze_trace(TRACE)


def test_the_ring_communication_is_counted_per_forward_and_overlaps_the_compute(analysis) -> None:
    assert (analysis.region, analysis.forwards, analysis.kernels_per_forward) == ("attnprof", 3, 4)
    comm = comm_json(analysis.comm)
    assert comm["source"] == "device" and comm["kernels"] == ["ncclDevKernel_SendRecv"]
    assert (comm["kernels_per_forward"], comm["ops_per_forward"]) == (1, 2)  # one kernel for the send/recv pair
    assert comm["comm_time_us"] == pytest.approx(179.0, abs=1.0)
    assert comm["compute_time_us"] == pytest.approx(3563.4, abs=5.0)
    # the send-to-self runs while the block's attention computes on another stream: fully hidden
    assert comm["exposed_us"] == 0.0 and comm["overlap_pct"] == 100.0
    assert "comm-exposed" not in analysis.finding_ids


def test_the_block_attention_is_one_flash_call(analysis) -> None:
    ledger = ledger_json(analysis.attention)
    assert ledger["calls_per_forward"] == 1 and ledger["backends"] == {"flash": 1}
