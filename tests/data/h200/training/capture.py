"""How the training-step traces beside this file were captured (on the H200 machine, torch 2.11+cu130).

Run there from the project root, attnprof installed, with OUT set:  python3 tests/data/h200/training/capture.py
Every built-in variant, bf16, causal, schedule(wait=1, warmup=1, active=3), no record_shapes (the profiler's
default, as attnprof profiles), inputs with requires_grad and a fixed grad_out:

- fwd+bwd/<shape>/<variant>.json.gz: record_function("attnprof") wraps a whole step,
  out = forward(q, k, v); torch.autograd.grad(out, (q, k, v), grad_out);
- bwd/<shape>/<variant>.json.gz: the forward runs outside the region; the region wraps only
  torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True);
- fwd-then-backward/<shape>/<variant>.json.gz: the region wraps only the forward, and
  out.backward(grad_out) runs after it (accumulating into .grad), as user code often does;
- train_step/<shape>/sdpa-flash.json.gz: a region named "train_step" around forward + loss.backward(),
  with record_shapes=True, as a user's own trace would look.

Not a test: pytest does not collect it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from attnprof.plugins import load_variants
from attnprof.profiling.inputs import make_inputs
from attnprof.registry import RunSpec

OUT = Path(os.environ.get("OUT", "/tmp/out")) / "training"
BLOG = dict(batch=8, heads=16, seq=1024, head_dim=64)
LONG = dict(batch=4, heads=16, seq=8192, head_dim=128)


def capture(path: Path, step, region: str = "attnprof", record_shapes: bool = False) -> None:
    for _ in range(3):
        step(None)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=record_shapes,
                 schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            step(region)
            prof.step()
        torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    print(f"{path.relative_to(OUT)}: {path.stat().st_size // 1024} KB", flush=True)


def region_or_none(region):
    return record_function(region) if region else contextlib.nullcontext()


def main() -> None:
    registry = load_variants(no_plugins=True).registry
    names = [v.name for v in registry.all()]
    for mode, shapes in (("fwd+bwd", (BLOG, LONG)), ("bwd", (BLOG,)), ("fwd-then-backward", (BLOG,))):
        for shape in shapes:
            for name in names:
                variant = registry.get(name)
                spec = RunSpec(device="cuda:0", dtype="bf16", causal=True, **shape)
                if variant.unavailable_reason(spec):
                    print(f"{mode} {name}: {variant.unavailable_reason(spec)}")
                    continue
                try:
                    run_mode(mode, variant, spec)
                except Exception as exc:  # one variant's failure must not lose the others
                    print(f"{mode} {spec.shape_label} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                torch.cuda.empty_cache()
    variant = registry.get("sdpa-flash")
    spec = RunSpec(device="cuda:0", dtype="bf16", causal=True, **BLOG)
    q, k, v = (t.requires_grad_() for t in make_inputs(spec, 0, variant.layout))

    def train_step(region):
        with region_or_none(region and "train_step"):
            out = variant.forward(q, k, v, True, None)
            out.float().square().mean().backward()

    capture(OUT / "train_step" / spec.shape_label / "sdpa-flash.json.gz", train_step, record_shapes=True)


def run_mode(mode: str, variant, spec: RunSpec) -> None:
    q, k, v = (t.requires_grad_() for t in make_inputs(spec, 0, variant.layout))
    state = variant.setup(spec) if variant.setup else None
    grad_out = torch.randn_like(q)
    path = OUT / mode / spec.shape_label / f"{variant.name}.json.gz"
    if mode == "fwd+bwd":
        def step(region):
            with region_or_none(region):
                out = variant.forward(q, k, v, True, state)
                torch.autograd.grad(out, (q, k, v), grad_out)
    elif mode == "bwd":
        def step(region):
            out = variant.forward(q, k, v, True, state)
            with region_or_none(region):
                torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    else:
        def step(region):
            with region_or_none(region):
                out = variant.forward(q, k, v, True, state)
            out.backward(grad_out)
    capture(path, step)


if __name__ == "__main__":
    main()
