"""Factories for `attnprof model --model model_factories:NAME` in the tests (tests/ is on sys.path)."""

from __future__ import annotations

from typing import Any

#: A 2-layer Llama with GQA (16 query heads, 4 KV heads): the GPU model tests' transformers config.
LLAMA_2L = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def _tiny_module() -> Any:
    import torch

    class Tiny(torch.nn.Module):
        """One projection into q, k, v and causal SDPA: attention the model does its own way."""

        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 48)

        def forward(self, x: Any) -> Any:
            q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum(1)

    return Tiny()


def as_built(batch: int = 1, seq: int = 16) -> Any:
    """A model whose attention cannot be swapped: profiled as built."""
    import torch

    torch.manual_seed(0)
    return _tiny_module(), (torch.randn(batch, seq, 16),)


def _llama(attn_implementation: str, seq: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation)
    ids = torch.randint(0, 64, (1, seq))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}


def llama_keyword(attn_implementation: str = "sdpa", seq: int = 16) -> Any:
    """A transformers model built by a factory that takes `attn_implementation`."""
    return _llama(attn_implementation, seq)


def llama_settable(seq: int = 16) -> Any:
    """A transformers model whose implementation is set afterwards (`set_attn_implementation`)."""
    return _llama("sdpa", seq)


def raises() -> Any:
    """A factory that fails."""
    raise RuntimeError("no weights here")


def not_a_pair() -> Any:
    """A factory that returns a model without example inputs."""
    return _tiny_module()
