"""How the mask and decode traces beside this file were captured (on the H200 machine, torch 2.11+cu130).

Run there from the project root with OUT set:  python3 tests/data/h200/masks/capture.py
Plain user code, not attnprof: bf16, record_shapes=True, schedule(wait=1, warmup=1, active=3), each step
inside record_function("step"):

- dense-mask.json.gz / is-causal.json.gz: SDPA at 2x32x2048x128 given a dense boolean causal mask (built
  once, before the loop) or is_causal=True;
- flex-mask-rebuilt.json.gz / flex-mask-once.json.gz: compiled flex_attention at 2x16x4096x64 with a
  document mask of 8 equal documents, causal inside each, whose BlockMask is built by create_block_mask
  inside every step or once before the loop;
- decode-<backend>.json.gz: one query token against a KV cache of 8192, 16 sequences, 32 query heads and
  8 KV heads (GQA), head dim 128, for each SDPA backend pinned with sdpa_kernel (enable_gqa=True; where
  a backend refuses it, the K/V heads repeated first: decode-<backend>-repeat-kv) and compiled flex;
- sdpa-math-bf16.json.gz: SDPA pinned to its math backend at 2x32x1024x128 bf16;
- decode-flash-graph.json.gz: decode-flash's SDPA call captured once in a CUDA graph, each step a replay
  (the kernels run under no op, so no shapes);
- decode-flex-split.json.gz: compiled flex at 1 sequence, 8 heads (no GQA), 65,536 cached keys, which
  Inductor splits over the keys: a template kernel and two reduction kernels.

Not a test: pytest does not collect it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OUT = Path(os.environ.get("OUT", "/tmp/out"))
DEV = "cuda"
BF16 = torch.bfloat16


def capture(name: str, step: Callable[[], object]) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        schedule=schedule(wait=1, warmup=1, active=3),
    ) as prof:
        for _ in range(5):
            with record_function("step"):
                step()
            prof.step()
        torch.cuda.synchronize()
    path = OUT / f"{name}.json.gz"
    prof.export_chrome_trace(str(path))
    print(f"{path.name}: {path.stat().st_size // 1024} KB", flush=True)


def timed_us(step: Callable[[], object], reps: int = 50) -> float:
    for _ in range(5):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def masks() -> None:
    q, k, v = (torch.randn(2, 32, 2048, 128, device=DEV, dtype=BF16) for _ in range(3))
    dense = torch.ones(2048, 2048, dtype=torch.bool, device=DEV).tril()
    capture("dense-mask", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense))
    capture("is-causal", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    dense_us = timed_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense))
    causal_us = timed_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    print(f"2x32x2048x128: dense mask {dense_us:.1f} us, is_causal {causal_us:.1f} us")

    seq, docs = 4096, 8
    q, k, v = (torch.randn(2, 16, seq, 64, device=DEV, dtype=BF16) for _ in range(3))
    document = torch.arange(seq, device=DEV) // (seq // docs)

    def document_causal(b, h, q_idx, kv_idx):
        return (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)

    flex = torch.compile(flex_attention)
    once = create_block_mask(document_causal, None, None, seq, seq, device=DEV)
    capture("flex-mask-once", lambda: flex(q, k, v, block_mask=once))

    def rebuilt():
        return flex(q, k, v, block_mask=create_block_mask(document_causal, None, None, seq, seq, device=DEV))

    capture("flex-mask-rebuilt", rebuilt)
    print(f"flex document mask: built once {timed_us(lambda: flex(q, k, v, block_mask=once)):.1f} us, "
          f"rebuilt per step {timed_us(rebuilt, reps=10):.1f} us")

    q, k, v = (torch.randn(2, 32, 1024, 128, device=DEV, dtype=BF16) for _ in range(3))

    def math():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    capture("sdpa-math-bf16", math)


def decode() -> None:
    batch, heads, kv_heads, kv_len, dim = 16, 32, 8, 8192, 128
    q = torch.randn(batch, heads, 1, dim, device=DEV, dtype=BF16)
    k, v = (torch.randn(batch, kv_heads, kv_len, dim, device=DEV, dtype=BF16) for _ in range(2))
    repeat = heads // kv_heads
    k_rep, v_rep = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    for backend in ("flash", "efficient", "cudnn", "math"):
        pinned = getattr(SDPBackend, {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                                      "cudnn": "CUDNN_ATTENTION", "math": "MATH"}[backend])

        def gqa(pinned=pinned):
            with sdpa_kernel(pinned):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        def repeated(pinned=pinned):
            with sdpa_kernel(pinned):
                return F.scaled_dot_product_attention(q, k_rep, v_rep)

        for name, step in ((f"decode-{backend}", gqa), (f"decode-{backend}-repeat-kv", repeated)):
            try:
                step()
            except RuntimeError as exc:
                print(f"{name}: refused: {str(exc).splitlines()[0][:160]}")
                continue
            capture(name, step)
            print(f"{name}: {timed_us(step):.1f} us")
            break
    flex = torch.compile(flex_attention)
    step = lambda: flex(q, k, v, enable_gqa=True)  # noqa: E731
    capture("decode-flex", step)
    print(f"decode-flex: {timed_us(step):.1f} us")
    cache = torch.empty(2 * 1024**3, dtype=torch.uint8, device=DEV)
    read_us = timed_us(lambda: cache.view(torch.float32).sum(), reps=20)
    print(f"read probe (sum of 2 GiB): {2 * 1024**3 / read_us / 1e3:.0f} GB/s")


def replayed() -> None:
    """decode-flash-graph and decode-flex-split (see the module docstring)."""
    batch, heads, kv_heads, kv_len, dim = 16, 32, 8, 8192, 128
    q = torch.randn(batch, heads, 1, dim, device=DEV, dtype=BF16)
    k, v = (torch.randn(batch, kv_heads, kv_len, dim, device=DEV, dtype=BF16) for _ in range(2))

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            flash()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flash()
    capture("decode-flash-graph", graph.replay)
    q1 = torch.randn(1, 8, 1, dim, device=DEV, dtype=BF16)
    k1, v1 = (torch.randn(1, 8, 65536, dim, device=DEV, dtype=BF16) for _ in range(2))
    flex = torch.compile(flex_attention)
    capture("decode-flex-split", lambda: flex(q1, k1, v1))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    for part in (masks, decode, replayed):
        try:
            part()
        except Exception as exc:  # one part's failure must not lose the other's traces
            print(f"{part.__name__}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


if __name__ == "__main__":
    main()
