"""The attention ledger's varlen calls (issue 34): SDPA on nested jagged tensors in a small CPU trace captured
here (named, its sequences and FLOPs summed per sequence from the recorded lengths), next to an ordinary SDPA
call that stays unmarked, and the op names that mark a varlen call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from analysis_json import analysis_json
from profiled import REGION, capture_cpu

from attnprof.analysis import analyze_trace
from attnprof.analysis.instance.varlen_calls import FLASH_VARLEN, NESTED, varlen_kind

LENGTHS = [7, 30, 2, 19]
HEADS, HEAD_DIM = 2, 16


def nested_and_dense():
    """One SDPA call on nested jagged tensors of LENGTHS, then one dense SDPA call."""
    generator = torch.Generator().manual_seed(0)
    packed = torch.randn(sum(LENGTHS), HEADS, HEAD_DIM, generator=generator)
    offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    nested = torch.nested.nested_tensor_from_jagged(packed, offsets).transpose(1, 2)
    dense = torch.randn(1, HEADS, 24, HEAD_DIM, generator=generator)

    def step() -> None:
        F.scaled_dot_product_attention(nested, nested, nested)
        F.scaled_dot_product_attention(dense, dense, dense, is_causal=True)

    return step


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = capture_cpu(nested_and_dense(), tmp_path_factory.mktemp("varlen") / "nested.json")
    return analysis_json(analyze_trace(path, region=REGION))["attention"]


def test_nested_sdpa_is_named_with_its_sequences_and_flops_per_sequence(ledger) -> None:
    calls = ledger["calls"]
    assert len(calls) == 2
    nested, dense = calls
    assert nested["backend"] == "math"
    flops = 4 * HEADS * HEAD_DIM * sum(n * n for n in LENGTHS)  # every pair of each sequence
    assert nested["varlen"] == {"kind": NESTED, "sequences": len(LENGTHS), "flops": flops}
    assert dense["varlen"] is None


def test_the_attention_table_says_the_call_is_nested(tmp_path) -> None:
    from attnprof.report.analysis_tables import render_analysis

    analysis = analyze_trace(capture_cpu(nested_and_dense(), tmp_path / "nested.json"), region=REGION)
    assert f"| math (nested, {len(LENGTHS)} sequences) |" in render_analysis(analysis, "markdown")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("flash_attn::_flash_attn_varlen_forward", FLASH_VARLEN),
        ("FlashAttnVarlenFunc", FLASH_VARLEN),
        ("aten::_nested_tensor_from_tensor_list", NESTED),
        ("aten::to_padded_tensor", NESTED),
        ("aten::_flash_attention_forward", NESTED),  # only with a 1-D cum_seq_q (varlen_call checks the shapes)
        ("aten::scaled_dot_product_attention", None),
        ("aten::_scaled_dot_product_flash_attention", None),
    ],
)
def test_the_names_that_mark_a_varlen_call(name, kind) -> None:
    assert varlen_kind(name) == kind
