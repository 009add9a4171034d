"""Attention variants by name: the spec a variant declares, and the registry that holds them.

Nothing here imports torch; a variant's own callables import it when they run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnprof.kv_cache import page_label, page_size_problem, positive_page_size
from attnprof.masks import (
    MASK_KINDS,
    PLAIN_KINDS,
    SCORE_MODS,
    Mask,
    parse_score_mod,
    score_mod_kind,
    score_mod_label,
    spec_mask,
)
from attnprof.varlen import label as varlen_label
from attnprof.varlen import packed_problem

DTYPES = ("bf16", "fp16", "fp32")
#: FP8 dtypes: `fp8` is e4m3, `fp8_e5m2` e5m2. A cell's q, k and v are quantized from bf16 outside the timed
#: region (`profiling.fp8`); a variant runs them only when it names them in its `dtypes`.
FP8_DTYPES = ("fp8", "fp8_e5m2")
ALL_DTYPES = DTYPES + FP8_DTYPES
FP8_NEEDS_CUDA = "fp8 needs a CUDA GPU (e4m3/e5m2 tensor cores: sm_89 or newer)"
FP8_SCALINGS = ("per-tensor", "per-head")  # a variant's fp8 descale granularity
DEVICE_TYPES = ("cpu", "cuda")
LAYOUTS = ("bhsd", "bshd")
DEFAULT_REGION = "attnprof"  # the record_function name around each forward
MODES = ("fwd", "bwd", "fwd+bwd")  # what a cell times: the forward, the backward alone, or a whole step
NO_BACKWARD = "no backward"  # the skip reason of a variant without backward in bwd or fwd+bwd
PAGED_NO_BACKWARD = f"{NO_BACKWARD} (a paged KV cache is timed forward only)"
PAGED_KV_BUILT_IN = "flex"  # the built-in variant that reads a paged KV cache, named in skip reasons
VARLEN_BUILT_IN = "padded-sdpa, nested-sdpa, flex, naive or inplace"  # built-ins that run seq_lens
VARLEN_ONLY = "runs packed seq_lens only (a shape's seq_lens)"  # the skip reason of a varlen_only variant elsewhere


@dataclass(frozen=True, init=False)
class RunSpec:
    """One cell to run: the device, dtype and attention shape a variant is asked to handle.

    Masking: `mask` is a `Mask` (`attnprof.masks`: `causal`, `none`, `sliding_window:W`, `documents:N`,
    `prefix:P`), parsed once when the spec is built, from its text or a Mask; `causal` is derived from it
    (the plain causal mask: what `is_causal` may express). The constructor also takes the older inputs: a
    `causal` flag, when given, chooses between the plain masks (it replaces `mask` `causal` or `none`, a
    sized mask overrides it); neither given is causal. `replace(spec, ...)` keeps the spec's Mask.
    `score_mod` is None, `softcap:C`, `alibi` or `sinks`.

    Lengths: `q_len` queries against `kv_len` keys, each `seq` when None; a value equal to `seq` is
    stored as None, so `replace(spec, seq=...)` moves a square shape whole. `n_queries` and `n_keys`
    give the lengths in force. Causal masks are bottom-right aligned (the queries are the last tokens).

    `page_size`: the keys and values live in a paged KV cache of pages of that many positions
    (`attnprof.kv_cache`; it divides `n_keys`); None: one contiguous tensor each.

    `seq_lens`: a packed variable-length batch (`attnprof.varlen`): batch 1 of `seq` = their total tokens,
    each sequence attending only within itself, causal or not by the (plain) mask; None: not packed.
    """

    device: str
    dtype: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    kv_heads: int | None
    mode: str
    mask: Mask
    score_mod: str | None
    q_len: int | None
    kv_len: int | None
    page_size: int | None
    seq_lens: tuple[int, ...] | None

    # Written out (init=False) because `causal` is an input here but a property of the mask, not a field;
    # `dataclasses.replace` passes every field to it, so a replaced spec keeps its Mask as it is.
    def __init__(
        self,
        device: str,
        dtype: str,
        batch: int,
        heads: int,
        seq: int,
        head_dim: int,
        kv_heads: int | None = None,
        causal: bool | None = None,
        mode: str = "fwd",
        mask: Mask | str | None = None,
        score_mod: str | None = None,
        q_len: int | None = None,
        kv_len: int | None = None,
        page_size: int | None = None,
        seq_lens: tuple[int, ...] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
        fields = {
            "device": device,
            "dtype": dtype,
            "batch": batch,
            "heads": heads,
            "seq": seq,
            "head_dim": head_dim,
            "kv_heads": kv_heads,
            "mode": mode,
            "mask": spec_mask(mask, causal),
            "score_mod": parse_score_mod(score_mod),
            "q_len": None if q_len == seq else q_len,
            "kv_len": None if kv_len == seq else kv_len,
            "page_size": None if page_size is None else positive_page_size(page_size),
            "seq_lens": None if seq_lens is None else tuple(seq_lens),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        if self.page_size is not None and (problem := page_size_problem(self.page_size, self.n_keys)):
            raise ValueError(problem)
        if self.seq_lens is not None and (problem := packed_problem(self)):
            raise ValueError(problem)

    @property
    def causal(self) -> bool:
        """True for the plain causal mask (what `is_causal` may express); False for every other mask."""
        return self.mask.kind == "causal"

    @property
    def score_mod_kind(self) -> str | None:
        """`softcap`, `alibi`, `sinks` or None."""
        return score_mod_kind(self.score_mod)

    @property
    def n_queries(self) -> int:
        """Query positions: `q_len`, else `seq`."""
        return self.q_len or self.seq

    @property
    def n_keys(self) -> int:
        """Key/value positions: `kv_len`, else `seq`."""
        return self.kv_len or self.seq

    @property
    def fully_masked_rows(self) -> int:
        """Query rows whose every key the mask hides (`Mask.empty_rows`; the reference gives them zeros)."""
        return self.mask.empty_rows(self.n_queries, self.n_keys)

    @property
    def causal_alignment(self) -> str | None:
        """`bottom-right` (the queries are the last n_queries of n_keys positions) for every mask but
        `none`, which has no alignment (None)."""
        return None if self.mask.kind == "none" else "bottom-right"

    @property
    def fp8(self) -> bool:
        """True for an FP8 cell (`FP8_DTYPES`)."""
        return self.dtype in FP8_DTYPES

    @property
    def backward(self) -> bool:
        """True when the mode runs the backward (`bwd` or `fwd+bwd`)."""
        return self.mode != "fwd"

    @property
    def device_type(self) -> str:
        """`cpu` or `cuda`, without the device index."""
        return self.device.split(":", 1)[0]

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: `kv_heads` when set (GQA), else `heads`."""
        return self.kv_heads or self.heads

    @property
    def shape_label(self) -> str:
        """`BxHxSxD`, with `/kvN` appended when key/value heads differ (GQA); S is `Q/KV` when the query
        and key lengths differ from seq (`8x32x1/16384x128/kv8`); a sized mask, a score mod and a paged
        KV cache follow after a space (`4x16x4096x64 sw256`, `... doc8 softcap30`, `... paged64`)."""
        same = self.n_queries == self.n_keys
        lengths = str(self.n_queries) if same else f"{self.n_queries}/{self.n_keys}"
        label = f"{self.batch}x{self.heads}x{lengths}x{self.head_dim}"
        if self.n_kv_heads != self.heads:
            label += f"/kv{self.n_kv_heads}"
        packed = varlen_label(self.seq_lens) if self.seq_lens is not None else ""
        extras = [
            text
            for text in (packed, self.mask.label, score_mod_label(self.score_mod), page_label(self.page_size))
            if text
        ]
        return " ".join([label, *extras])

    @property
    def cell_key(self) -> tuple[Any, ...]:
        """What identifies the cell across processes and runs: every field, the device by its type
        only (`cuda:1` and `cuda:0` name the same cell on two ranks)."""
        return (
            self.device_type,
            self.dtype,
            self.batch,
            self.heads,
            self.n_kv_heads,
            self.seq,
            self.head_dim,
            self.causal,
            self.mode,
            self.mask.text,
            self.score_mod,
            self.q_len,
            self.kv_len,
            self.seq_lens,
            self.page_size,
        )

    @property
    def cell_label(self) -> str:
        """`shape_label`, with the mode after it when that is not the default `fwd`."""
        return f"{self.shape_label} {self.mode}" if self.backward else self.shape_label


@dataclass(frozen=True)
class ExecutedPairs:
    """The (query, key) pairs a block-sparse kernel computes, summed over batch and query heads: every
    pair inside the tiles it visits, each tile cut at q_len and kv_len (the padding past them is not
    counted). `forward` is the forward's; `backward` the backward's, None when it visits the forward's
    tiles. `analysis.roofline.executed_flops` turns them into FLOPs by the convention of `flops`. `padded`:
    the pairs are a dense padded batch's (a packed batch's sequences padded to the longest), not tiles'."""

    forward: int
    backward: int | None = None
    padded: bool = False


ForwardFn = Callable[..., Any]
CheckFn = Callable[[RunSpec], "str | None"]
SetupFn = Callable[[RunSpec], Any]
PrepareInputsFn = Callable[[RunSpec, Any, Any, Any, Any, int], Any]
RowsFn = Callable[[RunSpec], Sequence[int]]
ExecutedFn = Callable[[RunSpec, Any], "ExecutedPairs | None"]


@dataclass
class Variant:
    """An attention implementation that attnprof can profile.

    `forward(q, k, v, causal, state)` receives q, k, v in the variant's `layout`
    (`bhsd` = [batch, heads, seq, head_dim], or `bshd`) and returns the output in
    the same layout. `state` is what `setup(spec)` returned (None without setup);
    setup runs once per cell, outside every timed and profiled region.

    A block-sparse variant may say what its kernel computes: `executed_pairs(spec, state)`, called once
    after setup with its state, returns the `ExecutedPairs` of the tiles it visits (None: unknown);
    rows then carry `executed_flops` beside the useful `flops`.
    `prepare_inputs(spec, state, q, k, v, seed)`, when set, runs once per cell of `run`, `compare`
    and `sweep` after setup and the inputs are made, outside every timed and profiled region, and
    returns the state forward then receives. It is where a variant lays out k and v its own way: a
    `paged_kv` variant builds its page pool and page table from them there (seeded by `seed`) and its
    forward reads the pool from the state (the k and v it is passed are the logical ones, which the
    correctness check compares against). `attnprof model` never calls it: a model's calls bring their
    own k and v each time.

    `paged_kv`: it reads a paged KV cache (a spec with `page_size`); any other variant is skipped on
    such a spec. A paged cell is timed forward only (a decode cache has no backward here).

    A `collective` variant runs one forward across every process of a torchrun group: all
    ranks run its cell together (never split across them), and `output_rows(spec)` names the
    global query positions, in order, of the output rows this process returns (its shard of
    the sequence); the correctness check compares those rows with the reference.
    """

    name: str
    description: str
    forward: ForwardFn
    devices: tuple[str, ...] = DEVICE_TYPES
    dtypes: tuple[str, ...] = DTYPES
    check: CheckFn | None = None
    setup: SetupFn | None = None
    layout: str = "bhsd"
    source: str = "built-in"
    has_backward: bool = True
    backward_refusal: str | None = None  # why it has none, where more can be said (the bwd skip reason)
    collective: bool = False
    output_rows: RowsFn | None = None
    repeatable_backward: bool = True  # False: its backward cannot run twice on one retained graph
    masks: frozenset[str] = frozenset(PLAIN_KINDS)  # mask kinds it runs (attnprof.masks.MASK_KINDS)
    score_mods: frozenset[str] = frozenset()  # score mod kinds it applies (softcap, alibi, sinks)
    #: Why it cannot apply a score mod kind, where more can be said than that it does not (the skip reason)
    score_mod_refusals: dict[str, str] = field(default_factory=dict)
    dense_masks: frozenset[str] = frozenset()  # mask kinds it takes as a dense [q_len, kv_len] tensor
    unequal_lengths: bool = False  # True: it runs q_len < kv_len (decode), causal bottom-right aligned
    executed_pairs: ExecutedFn | None = None  # block-sparse kernels: the pairs their tiles compute
    paged_kv: bool = False  # True: it reads a paged KV cache (RunSpec.page_size), built in prepare_inputs
    varlen: bool = False  # True: it runs a packed variable-length batch (RunSpec.seq_lens)
    varlen_only: bool = False  # True: it runs nothing else (a wildcard leaves it out of configs without seq_lens)
    prepare_inputs: PrepareInputsFn | None = None
    #: Undoes what `setup` changed outside its state (a process-wide switch), once the cell is done
    teardown: Callable[[Any], None] | None = None
    #: Finding ids that only restate what this variant is on purpose (sdpa-math pins the math backend:
    #: `backend-fallback` would call its choice a fallback); its cells leave them out.
    by_design: frozenset[str] = frozenset()
    load_error: str | None = field(default=None, repr=False)
    #: Set on the stand-in for an optional plugin's variant whose plugin is not there
    #: (`plugins.with_absent_plugins`): why every cell is skipped. A wildcard never chooses it; its name does.
    not_installed: str | None = field(default=None, repr=False)
    #: FP8 variants: how q, k and v are scaled (`FP8_SCALINGS`) and the dtype of the output they return.
    fp8_scaling: str = "per-tensor"
    fp8_output: str = "bf16"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._+-]*", self.name):
            raise ValueError(f"variant name {self.name!r}: use lower-case letters, digits, '.', '_', '+', '-'")
        if self.layout not in LAYOUTS:
            raise ValueError(f"variant {self.name}: layout must be one of {', '.join(LAYOUTS)}")
        unknown = set(self.devices) - set(DEVICE_TYPES)
        if unknown:
            raise ValueError(f"variant {self.name}: unknown devices {sorted(unknown)}")
        unknown = set(self.dtypes) - set(ALL_DTYPES)
        if unknown:
            raise ValueError(f"variant {self.name}: unknown dtypes {sorted(unknown)}")
        unknown = (set(self.masks) | set(self.dense_masks)) - set(MASK_KINDS) | set(self.score_mods) - set(SCORE_MODS)
        if unknown:
            raise ValueError(f"variant {self.name}: unknown masks or score mods {sorted(unknown)}")
        if self.fp8_scaling not in FP8_SCALINGS:
            raise ValueError(f"variant {self.name}: fp8_scaling must be one of {', '.join(FP8_SCALINGS)}")

    def takes_dense_mask(self, spec: RunSpec) -> bool:
        """True when this variant reads the spec's mask as a dense tensor (for `bytes_moved`)."""
        return spec.mask.kind in self.dense_masks

    def masking_reason(self, spec: RunSpec) -> str | None:
        """Why this variant cannot run the spec's mask, score mod, paged KV cache or lengths, or None."""
        if spec.mask.kind not in self.masks:
            return f"mask {spec.mask.kind} not supported by {self.name} (it runs {', '.join(sorted(self.masks))})"
        kind = spec.score_mod_kind
        if kind is not None and kind not in self.score_mods:
            takes = ", ".join(sorted(self.score_mods)) or "none"
            why = self.score_mod_refusals.get(kind, f"it applies {takes}")
            return f"score_mod {kind} not supported by {self.name} ({why})"
        if spec.page_size is not None and not self.paged_kv:
            return f"paged KV cache not supported by {self.name} (use {PAGED_KV_BUILT_IN})"
        if spec.seq_lens is None and self.varlen_only:
            return VARLEN_ONLY
        if spec.seq_lens is not None and not self.varlen:
            return f"packed seq_lens not supported by {self.name} (use {VARLEN_BUILT_IN})"
        if not self.unequal_lengths and spec.n_queries != spec.n_keys:
            return f"q_len {spec.n_queries} != kv_len {spec.n_keys} not supported by {self.name}"
        return None

    def unavailable_reason(self, spec: RunSpec) -> str | None:
        """Why this variant cannot run `spec`, or None when it can."""
        if self.load_error:
            return self.load_error
        if self.not_installed:
            return self.not_installed
        if spec.dtype in FP8_DTYPES and spec.device_type != "cuda":
            return FP8_NEEDS_CUDA
        if spec.device_type not in self.devices:
            return f"needs {' or '.join(d.upper() if d == 'cuda' else d for d in self.devices)}"
        if spec.dtype not in self.dtypes:
            return f"needs dtype {'/'.join(self.dtypes)} (got {spec.dtype})"
        if spec.backward and not self.has_backward:
            return f"{NO_BACKWARD} ({self.backward_refusal})" if self.backward_refusal else NO_BACKWARD
        if spec.backward and spec.page_size is not None:
            return PAGED_NO_BACKWARD
        if reason := self.masking_reason(spec):
            return reason
        if self.check is not None:
            try:
                return self.check(spec)
            except Exception as exc:  # a plugin's check must not break listing
                return f"check raised {type(exc).__name__}: {exc}"
        return None
