"""Traces for `attnprof analyze TRACE --time-fixes` on the H200 (issue 33's done-means): a small GPT-2-style model
written in plain PyTorch (not the Llama of tests/data/h200/model), in two variants of its attention:

- gpt2-unfused.json.gz: eager attention, Q @ K^T scaled, a causal mask applied with masked_fill, softmax, @ V
  (matmul → softmax → matmul: `unfused-attention`, its fix SDPA's fused backends);
- gpt2-dense-mask.json.gz: scaled_dot_product_attention given the causal mask as a dense boolean tensor built
  once before the loop (`dense-mask`, its fix is_causal=True or a BlockMask).

Plain user code, not attnprof: 4 blocks (LayerNorm, fused QKV projection, attention, output projection, MLP),
d_model 768, 12 heads of 64, batch 4, 1,024 tokens, bf16, forward only under torch.no_grad(); record_shapes=True,
schedule(wait=1, warmup=1, active=3), each step inside record_function("step").

Run on the H200 from the project root:  OUT=tests/data/h200-fixes python3 tests/data/h200-fixes/capture.py
then:  attnprof analyze tests/data/h200-fixes/gpt2-unfused.json.gz --time-fixes
       attnprof analyze tests/data/h200-fixes/gpt2-dense-mask.json.gz --time-fixes

Not a test: pytest does not collect it.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OUT = Path(os.environ.get("OUT", "/tmp/out"))
DEV, DTYPE = "cuda", torch.bfloat16
BATCH, SEQ, D_MODEL, HEADS, LAYERS = 4, 1024, 768, 12, 4


class Block(nn.Module):
    """A GPT-2 block: pre-norm attention and MLP, each with a residual."""

    def __init__(self, dense_mask: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))
        self.dense_mask = dense_mask

    def attention(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(D_MODEL, dim=-1)
        q, k, v = (y.view(b, t, HEADS, D_MODEL // HEADS).transpose(1, 2) for y in (q, k, v))
        if self.dense_mask:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            scores = scores.masked_fill(~keep, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, D_MODEL))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x), keep)
        return x + self.mlp(self.ln2(x))


class Gpt2Small(nn.Module):
    def __init__(self, dense_mask: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dense_mask) for _ in range(LAYERS))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, keep)
        return x


def capture(name: str, dense_mask: bool) -> None:
    torch.manual_seed(0)
    model = Gpt2Small(dense_mask).to(DEV, DTYPE).eval()
    x = torch.randn(BATCH, SEQ, D_MODEL, device=DEV, dtype=DTYPE)
    keep = torch.ones(SEQ, SEQ, dtype=torch.bool, device=DEV).tril()  # built once, before the loop
    with torch.no_grad():
        for _ in range(3):
            model(x, keep)
        torch.cuda.synchronize()
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            record_shapes=True,
            schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        ) as prof:
            for _ in range(5):
                with record_function("step"):
                    model(x, keep)
                torch.cuda.synchronize()
                prof.step()
    raw = OUT / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(OUT / f"{name}.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"{name}.json.gz: {(OUT / f'{name}.json.gz').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    capture("gpt2-unfused", dense_mask=False)
    capture("gpt2-dense-mask", dense_mask=True)
