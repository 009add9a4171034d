"""Hugging Face transformers models built from a config with random weights (never downloaded).

`hf: llama` with `hf_config: {hidden_size: ..., ...}` becomes `AutoConfig.for_model("llama", ...)`; every
implementation's model is built from it after `torch.manual_seed(seed)`, directly on the device and in
the dtype, so all of them hold the same weights and their logits can be compared. The inputs are seeded
random token ids of [batch, seq] with an all-ones attention mask, as a tokenizer gives for text without
padding (so transformers builds no mask for causal attention: SDPA's and attnprof variants' `is_causal`
path); no KV cache is kept.
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import TYPE_CHECKING, Any

from attnprof.errors import ConfigError, MissingExtraError, one_line
from attnprof.models.built import AttentionShape, BuiltModel, model_step

if TYPE_CHECKING:
    from attnprof.models.masking import MaskOverride

#: The oldest transformers whose attention interface, mask interface and `dtype=` attnprof uses.
MIN_TRANSFORMERS = (4, 56)
INSTALL_HINT = "pip install 'attnprof[hf]' (transformers 4.56 or newer)"


def require_transformers() -> Any:
    """The transformers module; MissingExtraError (exit 2) with the install hint when it is
    missing, broken or older than MIN_TRANSFORMERS."""
    try:
        import transformers
    except ImportError as exc:
        detail = "" if isinstance(exc, ModuleNotFoundError) and exc.name == "transformers" else f": {one_line(exc)}"
        raise MissingExtraError(
            f"transformers is not installed{detail}: attnprof model needs it for hf models and for attnprof variants "
            "inside a model",
            hint=INSTALL_HINT,
        ) from None
    match = re.match(r"(\d+)\.(\d+)", transformers.__version__)
    if match is None or (int(match.group(1)), int(match.group(2))) < MIN_TRANSFORMERS:
        raise MissingExtraError(
            f"transformers {transformers.__version__} is too old: attnprof model needs its attention interface",
            hint=INSTALL_HINT,
        )
    return transformers


def hf_config(model_type: str, fields: dict[str, Any], seqs: list[int]) -> Any:
    """The transformers config of `model_type` with `fields` set. ConfigError (exit 2, one line) for an
    unknown model type, a field the type's config does not have (with close matches), a value it
    rejects, or a seq beyond its `max_position_embeddings`."""
    require_transformers()
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    known_types = list(CONFIG_MAPPING.keys())
    if model_type not in known_types:
        close = difflib.get_close_matches(model_type, known_types, n=3, cutoff=0.6)
        suggestion = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"hf: unknown transformers model type {model_type!r}{suggestion}",
            hint="a model type transformers knows, such as llama, mistral, qwen2 or gpt2",
        )
    config_class = CONFIG_MAPPING[model_type]
    default = config_class()
    known = set(inspect.signature(config_class.__init__).parameters) | set(default.to_dict())
    for key in fields:
        if key not in known and not hasattr(default, key):
            close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
            suggestion = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"hf_config.{key}: not a field of {config_class.__name__}{suggestion}")
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except Exception as exc:
        raise ConfigError(f"hf_config: {config_class.__name__} rejects it: {one_line(exc)}") from None
    longest = getattr(config, "max_position_embeddings", None)
    if isinstance(longest, int) and max(seqs) > longest:
        raise ConfigError(
            f"seq {max(seqs)} is longer than hf_config.max_position_embeddings ({longest})",
            hint=f"set hf_config.max_position_embeddings to {max(seqs)} or more",
        )
    return config


def attention_shape(config: Any) -> AttentionShape:
    """Query heads, key/value heads and head dim of the model's attention, as its config states them; causal
    when the model type is a causal LM (None: not stated)."""
    from transformers import AutoModelForCausalLM

    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads and getattr(config, "hidden_size", None):
        head_dim = config.hidden_size // heads
    causal = True if type(config) in AutoModelForCausalLM._model_mapping else None
    return AttentionShape(heads, kv_heads, head_dim, causal)


def build_hf_model(config: Any, attn_implementation: str, device: str, dtype: str, seed: int) -> Any:
    """The causal-LM model of `config` (the base model when the type has none) with `attn_implementation`,
    random weights seeded with `seed`, built on `device` in `dtype`, in eval mode. What transformers raises
    for an implementation it rejects passes through."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    from attnprof.profiling.inputs import torch_dtype

    auto = AutoModelForCausalLM if type(config) in AutoModelForCausalLM._model_mapping else AutoModel
    torch.manual_seed(seed)
    with torch.device(device):
        model = auto.from_config(config, attn_implementation=attn_implementation, dtype=torch_dtype(dtype))
    return model.eval()


def prepare_hf(
    model: Any, config: Any, batch: int, seq: int, mode: str, seed: int, masking: MaskOverride | None = None
) -> BuiltModel:
    """`model` ready to run at `seq`: seeded random token ids of [batch, seq] and an all-ones attention mask
    on its device, and the step of `mode` (with `labels` for the loss in fwd+bwd when the model computes one).
    `masking`, when given, puts the configured mask into transformers' mask interface during each call."""
    import torch

    device = next(model.parameters()).device
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab <= 0:
        raise ConfigError(f"hf_config: {type(config).__name__} has no vocab_size to draw token ids from")
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=generator, device=device)
    mask = torch.ones_like(ids)
    takes_labels = "labels" in inspect.signature(model.forward).parameters

    def call(with_loss: bool) -> Any:
        extra = {"labels": ids} if with_loss and takes_labels else {}
        if masking is None:
            return model(input_ids=ids, attention_mask=mask, use_cache=False, **extra)
        with masking.applied():
            return model(input_ids=ids, attention_mask=mask, use_cache=False, **extra)

    return BuiltModel(model, seq, attention_shape(config), model_step(model, call, mode))
