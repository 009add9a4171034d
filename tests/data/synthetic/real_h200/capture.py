"""How the traces beside this file were captured (on the H200 machine, torch 2.11+cu130).

Run there from this folder with OUT set to an output folder:  python3 capture.py
B=1, H=8, S=1024, D=64, bf16, causal; schedule(wait=1, warmup=1, active=3), record_shapes=True,
each forward wrapped in record_function("attnprof"). Not a test: pytest does not collect it.
"""

import gzip
import math
import os
import shutil

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

out = os.environ.get("OUT", "/tmp/out")
dev = "cuda"
B, H, S, D = 1, 8, 1024, 64
g = torch.Generator(device=dev).manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(3))
mask = torch.triu(torch.ones(S, S, device=dev, dtype=torch.bool), 1)
scale = 1 / math.sqrt(D)


def naive():
    s = torch.matmul(q, k.transpose(-2, -1))
    s = s * scale
    s = s.masked_fill(mask, float("-inf"))
    a = torch.softmax(s, -1)
    return torch.matmul(a, v)


def inplace():
    s = torch.matmul(q, k.transpose(-2, -1))
    s = torch.mul(s, scale)
    s.masked_fill_(mask, float("-inf"))
    a = torch.softmax(s, -1)
    return torch.matmul(a, v)


def sdpa(b):
    def f():
        with sdpa_kernel(b):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return f


s2 = torch.cuda.Stream()


def twostream():
    a = torch.matmul(q, k.transpose(-2, -1))
    with torch.cuda.stream(s2):
        b = torch.matmul(k, q.transpose(-2, -1))
    torch.cuda.current_stream().wait_stream(s2)
    return a + b


cases = {
    "naive": naive,
    "inplace": inplace,
    "sdpa_math": sdpa(SDPBackend.MATH),
    "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
    "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    "twostream": twostream,
}
for name, fn in cases.items():
    try:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=schedule(wait=1, warmup=1, active=3),
            record_shapes=True,
        ) as p:
            for _ in range(5):
                with record_function("attnprof"):
                    fn()
                p.step()
            torch.cuda.synchronize()
        path = f"/tmp/{name}.json"
        p.export_chrome_trace(path)
        with open(path, "rb") as fi, gzip.open(f"{out}/{name}.json.gz", "wb") as fo:
            shutil.copyfileobj(fi, fo)
        if name in ("sdpa_math", "sdpa_cudnn"):
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12))
        print(name, "ok", os.path.getsize(f"{out}/{name}.json.gz"))
    except Exception as e:
        print(name, "FAILED", repr(e)[:300])
