"""How the CPU traces beside this file were captured (torch 2.13.0+cpu, 2 cores). Run from the project
root:  python3 tests/data/cpu/capture.py   (writes into tests/data/cpu/)

Small real torch.profiler traces of what users profile on a CPU, each a few forwards, CPU activity only:

- `encoder.json.gz`: a 2-layer `nn.TransformerEncoder` (d_model 64, 4 heads, feed-forward 128, batch 2,
  seq 32) in eval mode under `torch.no_grad()`: the fast path, `aten::_transformer_encoder_layer_fwd` with
  `aten::_native_multi_head_attention` inside. The region "encoder" around each forward,
  schedule(wait=1, warmup=1, active=3), record_shapes=True.
- `encoder-train.json.gz`: the same encoder in training mode (dropout 0), a training step (forward, sum,
  backward) in the region "train_step" three times, no schedule, no shapes: `F.multi_head_attention_forward`
  calls `aten::scaled_dot_product_attention` (the CPU flash backend), and its backward runs on autograd's
  thread.
- `sdpa-math.json.gz`: in one region ("attention"), `F.scaled_dot_product_attention` with a boolean mask
  pinned to the math backend (`aten::_scaled_dot_product_attention_math`), then the same attention written
  eagerly (matmul, masked_fill, softmax, matmul); three times, record_shapes=True.
- `unannotated.json.gz`: the encoder's forward three times under `profile()` with no `record_function` and
  no schedule (no ProfilerStep#N): the trace most users have.

Not a test: pytest does not collect it.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OUT = Path(__file__).parent


def _save(prof: profile, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        path = OUT / f"{name}.json.gz"
        with raw.open("rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    print(f"{path.name}: {path.stat().st_size // 1024} KB", flush=True)


def _encoder() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), torch.randn(2, 32, 64)


def encoder() -> None:
    model, x = _encoder()
    model.eval()
    with torch.no_grad():
        model(x)
        with profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=1, warmup=1, active=3)
        ) as prof:
            for _ in range(5):
                with record_function("encoder"):
                    model(x)
                prof.step()
    _save(prof, "encoder")


def encoder_train() -> None:
    model, x = _encoder()
    model.train()
    model(x).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("train_step"):
                model(x).sum().backward()
    _save(prof, "encoder-train")


def sdpa_math() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 64, 32) for _ in range(3))
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            with record_function("attention"):
                with sdpa_kernel(SDPBackend.MATH):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                scores = q @ k.transpose(-2, -1) / 32**0.5
                torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
    _save(prof, "sdpa-math")


def unannotated() -> None:
    model, x = _encoder()
    model.eval()
    with torch.no_grad():
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                model(x)
    _save(prof, "unannotated")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    encoder()
    encoder_train()
    sdpa_math()
    unannotated()
