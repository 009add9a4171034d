"""Time triton-flash against PyTorch SDPA backends on one GPU (not part of the test suite).

    python3 plugins/attnprof-triton/bench/bench_triton_flash.py [--shape 4x16x8192x128] [--dtype bf16] [--full]

Prints ms and TFLOP/s (causal counts half the score matrix) for each, after checking the
outputs agree. Uses the autotuned kernel; ATTNPROF_TRITON_TMA=0/1 forces the load path.
"""

from __future__ import annotations

import argparse
import os

import attnprof_triton
import torch.nn.functional as F
from attnprof_triton import _kernel
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from attnprof import RunSpec
from attnprof.profiling.inputs import make_inputs


def main() -> None:
    """Parse the arguments, autotune, check agreement, and print the timings."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4x16x8192x128", help="BxHxSxD or BxHxSxD/kvN")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--full", action="store_true", help="non-causal")
    parser.add_argument("--tma", default=None, help="0 or 1: force the load path")
    args = parser.parse_args()
    if args.tma is not None:
        os.environ[_kernel.TMA_ENV] = args.tma
    dims, _, kv = args.shape.partition("/kv")
    b, h, s, d = (int(x) for x in dims.split("x"))
    causal = not args.full
    spec = RunSpec(device="cuda", dtype=args.dtype, batch=b, heads=h, seq=s, head_dim=d,
                   kv_heads=int(kv) if kv else None, causal=causal)
    variant = attnprof_triton.make_variant()
    reason = variant.unavailable_reason(spec)
    if reason:
        raise SystemExit(reason)
    variant.setup(spec)
    q, k, v = make_inputs(spec, seed=0)
    print(f"{spec.shape_label} {spec.dtype} causal={causal}: chose {_kernel.best_config(q, k, spec.mask.text)}")
    timings = getattr(_kernel._attn_fwd_tuned, "configs_timings", None) or {}
    for cfg, ms in sorted(timings.items(), key=lambda kv: kv[1][0] if isinstance(kv[1], list) else kv[1]):
        print(f"   {cfg}: {ms}")
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)

    ours = variant.forward(q, k, v, causal, None)
    group = h // spec.n_kv_heads
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    candidates = {
        "triton-flash": lambda: variant.forward(q, k, v, causal, None),
    }
    for name, backend in [("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        def run(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
        try:
            other = run()
        except Exception as exc:
            print(f"{name:>15}: unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
            continue
        err = (other.float() - ours.float()).abs().max().item()
        print(f"{name:>15}: max |diff| vs triton-flash {err:.3e}")
        candidates[name] = run
    for name, fn in candidates.items():
        ms = do_bench(fn, warmup=100, rep=500)
        print(f"{name:>15}: {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
