"""`sdpa-fp8`, torch's quantized SDPA on FlashAttention-3: its skip reasons, q quantized per GQA group (the op's
q descale is [B, H_kv]), FA3 switched on for the cell and off after it, and a whole cell on CPU with a stand-in
for the op (torch's own needs FA3 on a Hopper GPU)."""

from __future__ import annotations

import pytest
import torch

from attnprof.config import MeasureOptions, parse_config
from attnprof.pipeline.cell import run_cell
from attnprof.pipeline.rows import cell_row
from attnprof.profiling import fp8
from attnprof.profiling.steps import cell_step
from attnprof.registry import RunSpec, Variant
from attnprof.variants import builtin_variants, sdpa_fp8

SHAPE = {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 32, "head_dim": 16}


def variant() -> Variant:
    return {v.name: v for v in builtin_variants()}["sdpa-fp8"]


def test_it_is_a_built_in_forward_only_fp8_variant_with_per_head_descales():
    v = variant()
    assert v.dtypes == ("fp8",) and v.fp8_scaling == "per-head" and v.fp8_output == "bf16"
    assert v.teardown is sdpa_fp8.teardown
    assert v.unavailable_reason(RunSpec("cuda", "fp8", **SHAPE, mode="bwd")) == (
        "no backward (torch's quantized SDPA is forward only)"
    )


def test_without_fa3_the_cell_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(sdpa_fp8.importlib.util, "find_spec", lambda name: None)
    reason = sdpa_fp8.check(RunSpec("cuda", "fp8", **SHAPE))
    assert reason.startswith("needs FlashAttention-3 (flash_attn_interface")
    assert "activate_flash_attention_impl" in reason


def test_a_torch_without_the_op_is_named(monkeypatch):
    monkeypatch.setattr(sdpa_fp8, "_quantized_sdpa", lambda: None)
    reason = sdpa_fp8.check(RunSpec("cuda", "fp8", **SHAPE))
    assert reason.startswith(f"needs {sdpa_fp8.OP_PATH} (torch 2.11 or newer; this is {torch.__version__}")


def test_q_is_quantized_once_per_gqa_group():
    q = torch.randn(2, 4, 32, 16)
    q[0, 1] *= 8  # the first group's second head holds its largest value
    q8, descale = sdpa_fp8.quantize_per_group(q, kv_heads=2, dtype="fp8")
    assert q8.shape == q.shape and q8.dtype == torch.float8_e4m3fn and descale.shape == (2, 2)
    amax = q.abs().reshape(2, 2, -1).amax(dim=-1)
    torch.testing.assert_close(descale, amax / fp8.FP8_MAX["fp8"])
    back = q8.double() * descale.double().repeat_interleave(2, dim=1)[:, :, None, None]
    assert float((back - q.double()).norm() / q.double().norm()) < 5e-2


def test_prepare_inputs_gives_the_check_the_q_the_kernel_reads():
    spec = RunSpec("cpu", "fp8", **SHAPE)
    q, k, v = torch.randn(2, 4, 32, 16), torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    state = fp8.Fp8State(fp8.quantize_inputs(q, k, v, "fp8", "per-head"), sdpa_fp8.Fa3State(activated=False))
    sdpa_fp8.prepare_inputs(spec, state, q, k, v, seed=0)
    assert state.state.q_descale.shape == (2, 2) and state.inputs.descale_q.shape == (2, 4)
    assert torch.equal(state.inputs.descale_q[:, 0], state.inputs.descale_q[:, 1])  # heads 0, 1 share K/V head 0
    dq = state.inputs.dequantized()[0]
    assert float((dq - q.double()).norm() / q.double().norm()) < 5e-2


@pytest.fixture
def fa3_switch(monkeypatch):
    """torch's FA3 switch recorded instead of flipped, and a stand-in for the op: dequantize, then SDPA in float."""
    import torch.nn.attention as attention

    calls = []
    monkeypatch.setattr(attention, "activate_flash_attention_impl", lambda impl: calls.append(("on", impl)))
    monkeypatch.setattr(attention, "restore_flash_attention_impl", lambda _raise_warn=True: calls.append(("off",)))

    def stand_in(q, k, v, is_causal, q_descale, k_descale, v_descale):
        group = q.shape[1] // k.shape[1]
        dq = q.float() * q_descale.repeat_interleave(group, dim=1)[:, :, None, None]
        dk, dv = (t.float() * d[:, :, None, None] for t, d in ((k, k_descale), (v, v_descale)))
        out = torch.nn.functional.scaled_dot_product_attention(dq, dk, dv, is_causal=is_causal, enable_gqa=True)
        return out.to(torch.bfloat16)

    monkeypatch.setattr(sdpa_fp8, "_quantized_sdpa", lambda: stand_in)
    monkeypatch.setattr(Variant, "unavailable_reason", lambda self, spec: None)
    return calls


def test_fa3_is_on_for_the_cell_and_off_after_it_even_when_the_cell_fails(fa3_switch):
    spec = RunSpec("cpu", "fp8", **SHAPE)
    stages = []

    def stage(what):
        stages.append(what)
        return torch.no_grad()

    with cell_step(variant(), spec, 0, stage) as step:
        assert fa3_switch == [("on", "FA3")]
        step.call()
    assert fa3_switch == [("on", "FA3"), ("off",)]
    with pytest.raises(RuntimeError, match="boom"), cell_step(variant(), spec, 0, stage):
        raise RuntimeError("boom")
    assert fa3_switch[-1] == ("off",) and len(fa3_switch) == 4


def test_a_whole_sdpa_fp8_cell_on_cpu_with_the_stand_in(fa3_switch, tmp_path):
    shape = {k: v for k, v in SHAPE.items()}
    config = parse_config({"device": "cpu", "dtype": "fp8", "output_dir": str(tmp_path), "shapes": [shape]})
    row = cell_row(run_cell(variant(), RunSpec("cpu", "fp8", **SHAPE), config, MeasureOptions()))
    assert row.status == "ok", row.reason
    assert (row.fp8_scaling, row.output_dtype) == ("per-head", "bf16") and row.quantize_ms > 0
    assert row.passed and row.sqnr_db > 20
    assert fa3_switch.count(("off",)) >= 1 and fa3_switch[-1] == ("off",)
