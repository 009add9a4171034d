"""A model ready to run: its step (what is timed and profiled), its attention shape and its size.

The step of `fwd` is one forward under no_grad; the step of `fwd+bwd` is a training step: the
forward with autograd recording, the loss (the model's own when it computes one from `labels`, else
the mean of its output) and `loss.backward()`, with the gradients set to None before each step so
nothing accumulates. Both return the logits (the output's `logits`, else its first tensor), detached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnprof.errors import VariantFailure


@dataclass(frozen=True)
class AttentionShape:
    """Query heads, key/value heads and head dim of a model's attention, and whether it is causal; None where
    unknown (a factory model)."""

    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    causal: bool | None = None


@dataclass
class BuiltModel:
    """A model at one seq: `step()` runs the mode's step and returns the logits."""

    model: Any
    seq: int | None  # None: a factory model whose inputs the factory chose
    shape: AttentionShape
    step: Callable[[], Any]

    @property
    def params(self) -> int:
        """The number of parameters."""
        return sum(p.numel() for p in self.model.parameters())


def logits_of(output: Any) -> Any:
    """The tensor a model's output stands for: its `logits`, else the output itself when it is a tensor,
    else the first tensor in it (a tuple, list or dict); VariantFailure when it holds none."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else []
    for item in items:
        if isinstance(item, torch.Tensor):
            return item
    raise VariantFailure(f"the model returned {type(output).__name__}, which holds no tensor to compare")


def model_step(model: Any, call: Callable[[bool], Any], mode: str) -> Callable[[], Any]:
    """The step of `mode` for `call(with_loss)`, a no-argument callable returning the detached logits
    (see the module docstring)."""
    import torch

    if mode == "fwd":

        def forward() -> Any:
            with torch.no_grad():
                return logits_of(call(False))

        return forward

    def training_step() -> Any:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            output = call(True)
            loss = getattr(output, "loss", None)
            if not isinstance(loss, torch.Tensor):
                loss = logits_of(output).float().mean()
            loss.backward()
        return logits_of(output).detach()

    return training_step
