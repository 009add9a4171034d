"""On a CUDA GPU: the attention ledger of a small 2-layer GQA model, profiled here and analysed.

A Llama-like block in plain torch (no transformers): q/k/v projections, attention (eager with
`repeat_kv`, SDPA with `enable_gqa`, or compiled FlexAttention with a BlockMask built in every
forward), the output copy and o_proj; one data-dependent branch (`bool(tensor)`) per forward is a
host sync. Run on the device with `python -m pytest -m gpu tests/test_gpu_ledger.py`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from attnprof.analysis import analyze_trace
from attnprof.results.files import to_builtins
from attnprof.results.records import attention_record

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 2, 1024, 8, 2, 64, 2
HIDDEN = HEADS * HEAD_DIM


class Layer(torch.nn.Module):
    def __init__(self, impl: str) -> None:
        super().__init__()
        self.impl = impl
        self.q = torch.nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o = torch.nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        if self.impl == "eager":
            groups = HEADS // KV_HEADS  # transformers' repeat_kv
            k = k[:, :, None].expand(b, KV_HEADS, groups, s, HEAD_DIM).reshape(b, HEADS, s, HEAD_DIM)
            v = v[:, :, None].expand(b, KV_HEADS, groups, s, HEAD_DIM).reshape(b, HEADS, s, HEAD_DIM)
            scores = torch.matmul(q, k.transpose(2, 3)) * (1 / math.sqrt(HEAD_DIM)) + mask
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, v)
        elif self.impl == "sdpa":
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = mask(q, k, v)
        return self.o(out.transpose(1, 2).contiguous().view(b, s, HIDDEN))


class Model(torch.nn.Module):
    def __init__(self, impl: str) -> None:
        super().__init__()
        self.impl = impl
        self.layers = torch.nn.ModuleList(Layer(impl) for _ in range(LAYERS))
        if impl == "flex":
            from torch.nn.attention.flex_attention import flex_attention

            self.flex = torch.compile(flex_attention)

    def forward(self, x):
        if bool((x.abs().amax() > 1e4).any()):  # a data-dependent branch: a host sync
            x = x.clamp(-1e4, 1e4)
        if self.impl == "eager":
            causal = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).tril()
            mask = torch.zeros(SEQ, SEQ, dtype=x.dtype, device=x.device).masked_fill(~causal, float("-inf"))
        elif self.impl == "flex":
            from torch.nn.attention.flex_attention import create_block_mask

            block = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, SEQ, SEQ, device=x.device)

            def mask(q, k, v):
                return self.flex(q, k, v, block_mask=block, enable_gqa=True)
        else:
            mask = None
        for layer in self.layers:
            x = x + layer(x, mask)
        return x


def profile_model(impl: str, out: Path, train: bool = False):
    """Profile 3 steps of the model (forward, or forward and backward with `train`) and analyse them."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.manual_seed(0)
    model = Model(impl).to("cuda", torch.bfloat16)
    x = torch.randn(BATCH, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=train)
    region = "train_step" if train else "model_forward"

    def step():
        if train:
            with record_function(region):
                model(x).float().square().mean().backward()
        else:
            with torch.no_grad(), record_function(region):
                model(x)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule(wait=1, warmup=1, active=3)
    ) as prof:
        for _ in range(5):
            step()
            prof.step()
        torch.cuda.synchronize()
    path = out / f"{impl}{'-train' if train else ''}.json"
    prof.export_chrome_trace(str(path))
    return analyze_trace(path, region=region)


def ledger_json(ledger: Any) -> dict[str, Any]:
    """The attention ledger as its JSON (the schema's AttentionRecord)."""
    return to_builtins(attention_record(ledger))


def kinds(ledger: dict) -> dict[str, int]:
    return {o["kind"]: o["count_per_forward"] for o in ledger["overhead"]}


def test_eager_attention_is_two_calls_with_the_kv_repeat_and_the_host_sync(tmp_path: Path) -> None:
    analysis = profile_model("eager", tmp_path)
    ledger = ledger_json(analysis.attention)
    assert ledger["calls_per_forward"] == 2 and ledger["backends"] == {"eager": 2}
    assert ledger["calls"][0]["op"] == "aten::matmul → aten::softmax → aten::matmul"
    assert kinds(ledger).get("kv-repeat") == 4 and kinds(ledger).get("mask-build", 0) >= 1
    assert 0 < ledger["gpu_time_pct"] < 100
    message = analysis.finding("host-sync").message
    assert "aten::item" in message and "aten::is_nonzero" in message and "Memcpy DtoH" in message


def test_sdpa_with_gqa_is_two_fused_calls_without_a_repeat(tmp_path: Path) -> None:
    ledger = ledger_json(profile_model("sdpa", tmp_path).attention)
    assert ledger["calls_per_forward"] == 2
    [(backend, count)] = ledger["backends"].items()
    assert backend in {"flash", "efficient", "cudnn"} and count == 2
    assert "kv-repeat" not in kinds(ledger)


def test_flex_attention_calls_are_its_compiled_kernels(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    ledger = ledger_json(profile_model("flex", tmp_path).attention)
    assert ledger["calls_per_forward"] == 2 and ledger["backends"] == {"flex": 2}
    assert all("flex_attention" in c["kernels"][0] for c in ledger["calls"])


def test_a_training_step_links_each_backward_to_its_forward_call(tmp_path: Path) -> None:
    ledger = ledger_json(profile_model("eager", tmp_path, train=True).attention)
    assert ledger["calls_per_forward"] == 2
    backward = [c for c in ledger["calls"] if c["phase"] == "backward"]
    assert [c["forward_call"] for c in backward] == [0, 1]
    assert all("SoftmaxBackward0" in c["op"] for c in backward)
    assert 0 < ledger["backward_kernel_time_us"] < ledger["kernel_time_us"]
