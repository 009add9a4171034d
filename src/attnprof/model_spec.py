"""What one row of `attnprof model` ran: its subject, `ModelSpec`, beside a cell's `registry.RunSpec`. No torch.

A cell's subject is one variant's attention at one `RunSpec`; a model row's is one attention implementation
inside a whole model at one seq and mode. The model states its attention shape (heads, kv heads, head dim,
causal) only once built, so the fields after `device` are filled in then (`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnprof.registry import RunSpec


@dataclass(frozen=True)
class ModelSpec:
    """One implementation inside a model at one seq and mode.

    `implementation` is what the model was given, an attnprof variant by its name (`attnprof:triton-flash`,
    the name its calls' range carries; transformers registers it as `attnprof:triton-FLASH`, see
    `models.implementations.bridge_name`); None for a model profiled as built. `seq` is None for a factory
    model whose inputs the factory chose; `params`, `heads`, `kv_heads`, `head_dim` and `causal` are None where
    the model does not state them (or before it
    is built). `mask` is the mask every attention implementation ran (None: the model's own, unknown).
    """

    model: str
    implementation: str | None
    batch: int
    seq: int | None
    mode: str
    dtype: str
    device: str
    params: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    causal: bool | None = None
    mask: str | None = None
    score_mod: str | None = None

    @property
    def backward(self) -> bool:
        """True for a training step (`fwd+bwd`): an instance is a step, not a forward."""
        return self.mode != "fwd"

    @property
    def speed_key(self) -> tuple[int | None, str]:
        """What a model row's speed-up matches against the baseline's: its seq and mode."""
        return self.seq, self.mode

    @property
    def shape(self) -> str | None:
        """The attention shape as `compare` labels it, `BxHxSxD` (`/kvN` with GQA, then a sized mask and a score
        mod: `... sw64 softcap30`), when the model states its heads; `BxS` otherwise; None for a factory model
        whose inputs the factory chose."""
        if self.seq is None:
            return None
        if self.heads is None or self.head_dim is None:
            return f"{self.batch}x{self.seq}"
        return self._attention("cpu", self.kv_heads).shape_label

    @property
    def attention_spec(self) -> RunSpec | None:
        """The attention call of the model's forward as a RunSpec, whose FLOPs the counters' roofline divides
        among the kernels of each call (one fused kernel a layer); None where the model does not state its
        heads, head dim or seq, and for a training step, whose layers' forward and backward kernels do not
        come in calls of one shape."""
        if self.mode != "fwd" or self.seq is None or self.heads is None or self.head_dim is None:
            return None
        return self._attention(self.device, self.kv_heads if self.kv_heads != self.heads else None)

    def _attention(self, device: str, kv_heads: int | None) -> RunSpec:
        assert self.seq is not None and self.heads is not None and self.head_dim is not None
        return RunSpec(
            device,
            self.dtype,
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            kv_heads,
            causal=self.causal is not False,
            mask=self.mask,
            score_mod=self.score_mod,
        )

    def label(self, implementation: str) -> str:
        """`sdpa @ seq 2048 fwd`: the implementation as the user named it, the seq (when known) and the mode."""
        seq = f" @ seq {self.seq}" if self.seq is not None else ""
        return f"{implementation}{seq} {self.mode}"
