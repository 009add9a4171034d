"""Where `attnprof model` gets its models: transformers (`HfSource`) or a factory (`FactorySource`).

`open_source` checks everything that can be checked before a row runs (transformers installed, the model
type and its config fields, the factory importable) and raises one-line errors for it. A source then
hands out a `BuiltModel` per implementation, seq and mode (`prepare`): an hf model is built once per
implementation and kept until `release`; a factory is called for every row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from attnprof.errors import VariantUnavailableError, one_line
from attnprof.models.built import AttentionShape, BuiltModel
from attnprof.models.implementations import Implementation
from attnprof.registry import RunSpec

if TYPE_CHECKING:
    from attnprof.model_config import ModelConfig


class ModelSource(Protocol):
    """What the model pipeline needs of a source."""

    seqs: list[int | None]

    def prepare(self, implementation: Implementation, seq: int | None, mode: str) -> BuiltModel:
        """The model with `implementation`, ready to run the step of `mode` at `seq`."""
        ...

    def release(self) -> None:
        """Drop the model kept for the last implementation."""
        ...


class HfSource:
    """A transformers model type built from a config with random weights (see `models.hf`)."""

    def __init__(self, config: ModelConfig, device: str, dtype: str) -> None:
        from attnprof.models.hf import attention_shape, hf_config

        self.config, self.device, self.dtype = config, device, dtype
        self.hf_config = hf_config(str(config.hf), config.hf_config, config.seq)
        self.shape: AttentionShape = attention_shape(self.hf_config)
        self.seqs: list[int | None] = list(config.seq)
        self._model: Any = None
        self._built_for: str | None = None
        self._refusal: str | None = None

    def prepare(self, implementation: Implementation, seq: int | None, mode: str) -> BuiltModel:
        """Refuse an attnprof variant that cannot run the model's attention before building anything; build
        the model for a new implementation (a refusal by transformers is kept, and skips its other rows)."""
        from attnprof.models.hf import prepare_hf
        from attnprof.models.masking import MaskOverride, hf_refusal, needs_override

        name = str(implementation.attn_implementation)
        mask, score_mod = self.config.mask, self.config.score_mod
        override = None
        if implementation.variant is not None:
            self._check_variant(implementation, seq, mode)
        elif refusal := hf_refusal(name, mask, score_mod, self.shape.causal):
            raise VariantUnavailableError(refusal)
        elif mask is not None and needs_override(mask, self.shape.causal):
            override = MaskOverride(name, mask, int(seq or 0))
        if self._built_for != name:
            self.release()
            self._built_for = name
            self._model = self._build(implementation)
        if self._model is None:
            raise VariantUnavailableError(str(self._refusal))
        return prepare_hf(
            self._model, self.hf_config, self.config.batch, int(seq or 0), mode, self.config.seed, override
        )

    def _build(self, implementation: Implementation) -> Any:
        from attnprof.models.bridge import register_variant
        from attnprof.models.hf import build_hf_model
        from attnprof.profiling.memory import is_oom

        if implementation.variant is not None:
            register_variant(implementation.variant, self.config.mask, self.config.score_mod)
        try:
            return build_hf_model(
                self.hf_config, str(implementation.attn_implementation), self.device, self.dtype, self.config.seed
            )
        except Exception as exc:
            if is_oom(exc):
                raise
            self._refusal = (
                f"transformers rejects attn_implementation={implementation.attn_implementation} for "
                f"{self.config.hf}: {one_line(exc, with_type=False)}"
            )
            return None

    def _check_variant(self, implementation: Implementation, seq: int | None, mode: str) -> None:
        from attnprof.models.bridge import runnable_spec

        shape = self.shape
        if implementation.variant is None or not (shape.heads and shape.head_dim and seq):
            return
        spec = RunSpec(
            device=self.device,
            dtype=self.dtype,
            batch=self.config.batch,
            heads=shape.heads,
            seq=seq,
            head_dim=shape.head_dim,
            kv_heads=shape.kv_heads if shape.kv_heads != shape.heads else None,
            causal=self.config.mask in (None, "causal"),
            mode=mode,
            mask=self.config.mask,
            score_mod=self.config.score_mod,
        )
        runnable_spec(implementation.variant, spec)

    def release(self) -> None:
        """Drop the kept model and hand its memory back."""
        if self._model is not None:
            import gc

            from attnprof.profiling.memory import release_cached_memory

            self._model = None
            gc.collect()
            release_cached_memory()
        self._built_for, self._refusal = None, None


class FactorySource:
    """A factory model (see `models.factory`): the factory is called for every row."""

    def __init__(self, config: ModelConfig, device: str, dtype: str) -> None:
        from attnprof.models.factory import accepted_keywords, load_factory

        self.config, self.device, self.dtype = config, device, dtype
        self.factory = load_factory(str(config.factory))
        self.takes = accepted_keywords(self.factory)
        self.seqs: list[int | None] = list(config.seq) if "seq" in self.takes else [None]

    def swappable(self) -> bool:
        """Whether attnprof can choose the model's attention: the factory takes `attn_implementation`, or a
        model it builds (one is built to find out) has `set_attn_implementation`."""
        from attnprof.models.factory import build_factory_model

        if "attn_implementation" in self.takes:
            return True
        probe = build_factory_model(self.factory, None, self.config.batch, self.seqs[0], self.device, self.dtype, "fwd")
        return hasattr(probe.model, "set_attn_implementation")

    def prepare(self, implementation: Implementation, seq: int | None, mode: str) -> BuiltModel:
        """Call the factory for this row, with the implementation where the model takes one."""
        from attnprof.models.factory import build_factory_model

        if implementation.variant is not None:
            from attnprof.models.bridge import register_variant

            register_variant(implementation.variant)
        return build_factory_model(
            self.factory, implementation.attn_implementation, self.config.batch, seq, self.device, self.dtype, mode
        )

    def release(self) -> None:
        """Nothing is kept between rows."""


def open_source(config: ModelConfig, device: str, dtype: str, implementations: list[Implementation]) -> ModelSource:
    """The source of `config`'s model. Raises the one-line errors of a missing transformers (needed for hf
    models and for attnprof variants inside any model), an unknown model type or config field, or a factory
    that cannot be imported."""
    if config.hf is not None or any(i.variant is not None for i in implementations):
        from attnprof.models.hf import require_transformers

        require_transformers()
    if config.hf is not None:
        return HfSource(config, device, dtype)
    return FactorySource(config, device, dtype)
