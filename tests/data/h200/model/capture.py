"""How the whole-model traces beside this file were captured (on the H200 machine, torch 2.11+cu130,
transformers 5.17). Run there from the project root with OUT set:  python3 tests/data/h200/model/capture.py

A Llama-style model built from a config with random weights (nothing downloaded): 2 layers, hidden 1024,
16 query heads and 4 key/value heads (GQA), head_dim 64, bf16, batch 2, seq 2048; one trace per
attn_implementation (eager, sdpa, flex_attention), the region "model_forward" around each forward under
torch.no_grad(), schedule(wait=1, warmup=1, active=3). Without record_shapes (the profiler's default), plus
one sdpa trace with record_shapes=True and one eager fwd+bwd training step (region "train_step").

Not a test: pytest does not collect it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from transformers import LlamaConfig, LlamaForCausalLM

OUT = Path(os.environ.get("OUT", "/tmp/out")) / "model"
CONFIG = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2, num_attention_heads=16,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)
BATCH, SEQ = 2, 2048


def capture(name: str, model, ids, region: str, record_shapes: bool = False, train: bool = False) -> None:
    def step():
        if train:
            with record_function(region):
                model(input_ids=ids, labels=ids).loss.backward()
        else:
            with torch.no_grad(), record_function(region):
                model(input_ids=ids)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=record_shapes,
                 schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            step()
            prof.step()
        torch.cuda.synchronize()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json.gz"
    prof.export_chrome_trace(str(path))
    print(f"{path.name}: {path.stat().st_size // 1024} KB", flush=True)


def main() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), device="cuda")
    for impl in ("eager", "sdpa", "flex_attention"):
        try:
            model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation=impl)).to("cuda", torch.bfloat16)
            model.eval()
            capture(f"llama2l-{impl}", model, ids, "model_forward")
            if impl == "sdpa":
                capture("llama2l-sdpa-record_shapes", model, ids, "model_forward", record_shapes=True)
            if impl == "eager":
                model.train()
                capture("llama2l-eager-train_step", model, ids, "train_step", train=True)
        except Exception as exc:  # one implementation's failure must not lose the others
            print(f"{impl}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
