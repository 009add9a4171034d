"""attnprof plugin: `flash-attn`, the installed FlashAttention library, whichever generation.

Three interfaces are tried, newest first, and the first that imports is used:

* FA4, the CuTe-DSL kernels: `flash_attn.cute.flash_attn_func` (compiles on first call);
* FA3, the Hopper kernels: `flash_attn_interface.flash_attn_func`;
* FA2: `flash_attn.flash_attn_func`.

All three take and return [batch, seq, heads, head_dim] tensors, so the variant declares
`layout="bshd"` and attnprof prepares its inputs in that layout outside the timed region.
Nothing is imported when this module is: the lookup happens in check() or setup().

Masks beyond causal, where the installed interface has them (read from its signature, `FEATURES`):
a sliding window of W keys is `window_size=(W - 1, 0)` with `causal=True` (the W keys up to and
including the query's own position, bottom-right aligned as attnprof's); `softcap: C` is
`softcap=C`; N equal documents go through `flash_attn_varlen_func` with `cu_seqlens` at every
document's start (batch × N sequences of kv_len / N tokens, causal inside each). A packed batch of
`seq_lens` (`attnprof.varlen`) goes through the same function with its own `cu_seqlens`, causal or not.

A paged KV cache (`kv_cache: {page_size: N}`) goes through FA2's `flash_attn.flash_attn_with_kvcache`
when the installed one takes a `block_table` (flash-attn >= 2.5; `find_kvcache`): `prepare_inputs`
lays k and v out in a [pages, page_size, kv_heads, head_dim] pool by attnprof's seeded shuffled page
table, outside the timed region, and the forward passes the pool, the int32 block table and the
cache lengths. FA2 needs page_size divisible by 256. Queries are the last q_len positions (causal
bottom-right), so paged cells may be decode.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnprof import RunSpec, Variant
from attnprof.kv_cache import paged_pool, shuffled_page_table
from attnprof_flash_attn._paged import (
    KVCACHE_LABEL,
    PagedCache,
    call_paged,
    find_kvcache,
    first_line,
    paged_reason,
    unwrap,
)

__version__ = "0.1.0"

VARIANT_NAME = "flash-attn"
BASE_DESCRIPTION = "FlashAttention library (FA4 CuTe DSL, FA3 or FA2, whichever is installed)"


@dataclass(frozen=True)
class Interface:
    """One way to reach FlashAttention: a label, the module and its function."""

    label: str
    module: str
    attr: str = "flash_attn_func"
    min_capability: int = 8  # major compute capability the kernels need
    backward_capabilities: tuple[int, ...] | None = None  # majors with a backward kernel; None: all above

    def load(self) -> Callable[..., Any]:
        """Import the module and return its function (raises what the import raises)."""
        return getattr(importlib.import_module(self.module), self.attr)


INTERFACES = (
    # FA4's backward (flash_attn/cute/interface.py `_flash_attn_bwd`) asserts compute capability 9.x or 10.x.
    Interface("FA4 (flash_attn.cute)", "flash_attn.cute", min_capability=8, backward_capabilities=(9, 10)),
    Interface("FA3 (flash_attn_interface)", "flash_attn_interface", min_capability=9),
    Interface("FA2 (flash_attn)", "flash_attn", min_capability=8),
)


@dataclass(frozen=True)
class Found:
    """The interface in use and its flash_attn_func."""

    interface: Interface
    func: Callable[..., Any]

    @property
    def label(self) -> str:
        """The interface's label, e.g. "FA2 (flash_attn)"."""
        return self.interface.label


_found: Found | str | None = None  # the lookup's result (a Found, or the reason for none), once made


def _not_installed(interface: Interface, exc: BaseException) -> bool:
    """True when `exc` only says the interface's module is absent (not that it is broken)."""
    if isinstance(exc, ModuleNotFoundError):
        missing = exc.name or ""
        return interface.module == missing or interface.module.startswith(missing + ".")
    if isinstance(exc, AttributeError):
        # FA4's wheel ships flash_attn/cute without flash_attn/__init__.py: then `flash_attn`
        # is a bare namespace package, which is not FA2.
        module = importlib.import_module(interface.module)
        return getattr(module, "__file__", None) is None
    return False


def find_interface(refresh: bool = False) -> Found | str:
    """The first interface that imports, or a one-line reason why none does. Cached."""
    global _found
    if _found is not None and not refresh:
        return _found
    failures: list[tuple[Interface, BaseException]] = []
    for interface in INTERFACES:
        try:
            _found = Found(interface, interface.load())
            return _found
        except Exception as exc:  # ImportError, AttributeError, or a broken build's own error
            failures.append((interface, exc))
    broken = []
    for interface, exc in failures:
        try:
            absent = _not_installed(interface, exc)
        except Exception:
            absent = False
        if not absent:
            broken.append((interface, exc))
    if broken:  # installed but failing (a missing dependency, an ABI mismatch, ...): say so
        interface, exc = broken[0]
        _found = f"needs flash_attn (FA2/FA3/FA4): {interface.label} is installed but failed: {first_line(exc)}"
    else:
        fa2 = dict((i.module, e) for i, e in failures)["flash_attn"]
        _found = f"needs flash_attn (FA2/FA3/FA4): {first_line(fa2)}"
    return _found


@dataclass
class Varlen:
    """A documents mask as flash_attn_varlen_func takes it: the function, the documents' boundaries
    (`cu_seqlens`, int32 on the device: every document's first token over the flattened batch, and
    the total), the longest one's length, and whether each is causal (documents are; seq_lens as the mask)."""

    func: Callable[..., Any]
    cu_seqlens: Any
    length: int
    causal: bool = True


@dataclass
class FlashState:
    """What setup leaves for forward: the function to call, which interface it is, and the cell's masking:
    `masking` the keyword arguments beyond causal (window_size, softcap), `causal` what causal is then
    (None: as forward is told), `varlen` the documents' call (None: flash_attn_func); for a paged cell,
    `flash_attn_with_kvcache` and (after `prepare_inputs`) its cache in `paged`."""

    func: Callable[..., Any]
    label: str
    masking: dict[str, Any] = field(default_factory=dict)
    causal: bool | None = None
    varlen: Varlen | None = None
    paged: PagedCache | None = None
    sinks: tuple[Any, Any] | None = None  # the cell's sink logits and their bf16 copy (FA4's learnable_sink)


#: The FA2 release that added each masking feature attnprof uses (FA3 and FA4 have them all).
FA2_ADDED = {"window_size": "2.3", "softcap": "2.6", "flash_attn_varlen_func": "2.0"}


def _call(func: Callable[..., Any], q: Any, k: Any, v: Any, causal: bool, **masking: Any) -> Any:
    return unwrap(func(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=causal, **masking))


def _call_varlen(varlen: Varlen, q: Any, k: Any, v: Any, **masking: Any) -> Any:
    """The documents: [B, S, H, D] flattened to [B·S, H, D] (a view), one sequence per document."""
    batch, seq = q.shape[:2]
    out = varlen.func(
        q.reshape(batch * seq, *q.shape[2:]),
        k.reshape(batch * seq, *k.shape[2:]),
        v.reshape(batch * seq, *v.shape[2:]),
        cu_seqlens_q=varlen.cu_seqlens,
        cu_seqlens_k=varlen.cu_seqlens,
        max_seqlen_q=varlen.length,
        max_seqlen_k=varlen.length,
        softmax_scale=q.shape[-1] ** -0.5,
        causal=varlen.causal,
        **masking,
    )
    return unwrap(out).view(q.shape)


def forward(q: Any, k: Any, v: Any, causal: bool, state: FlashState | None = None, sinks: Any = None) -> Any:
    """One forward on [B, S, H, D] tensors (k, v may have fewer heads); returns [B, S, H, D], under the
    state's mask when setup gave one. A paged cell's state holds its cache, which the forward reads
    instead of k and v. `sinks` (a sinks cell's logits, one per query head) go to FA4 as `learnable_sink`."""
    if state is None:
        found = find_interface()
        if isinstance(found, str):
            raise RuntimeError(found)
        state = FlashState(found.func, found.label)
    if state.paged is not None:
        return call_paged(state.func, q, state.paged, causal)
    masking = state.masking if sinks is None else {**state.masking, "learnable_sink": _learnable_sink(state, sinks)}
    if state.varlen is not None:
        return _call_varlen(state.varlen, q, k, v, **masking)
    return _call(state.func, q, k, v, causal if state.causal is None else state.causal, **masking)


def _learnable_sink(state: FlashState, sinks: Any) -> Any:
    """The sink logits in bf16, as FA4 takes them, converted once per cell (not in each timed call)."""
    if state.sinks is None or state.sinks[0] is not sinks:
        import torch

        state.sinks = (sinks, sinks.detach().to(torch.bfloat16))
    return state.sinks[1]


def _has(found: Found, function: str, parameter: str | None) -> bool:
    """Whether the interface's module has `function` and, when named, that `function` takes `parameter`."""
    func = found.func if function == "flash_attn_func" else getattr(_module(found), function, None)
    if func is None:
        return False
    if parameter is None:
        return True
    try:
        return parameter in inspect.signature(func).parameters
    except (TypeError, ValueError):  # no signature to read: do not guess
        return False


def _module(found: Found) -> Any:
    return importlib.import_module(found.interface.module)


def masking_needs(spec: RunSpec) -> list[tuple[str, str, str | None]]:
    """What the spec's mask and score mod need of the interface: (what for, function, parameter or None)."""
    documents = spec.mask.kind == "documents"
    needs: list[tuple[str, str, str | None]] = []
    if spec.mask.kind == "sliding_window":
        needs.append(("sliding_window", "flash_attn_func", "window_size"))
    if documents:
        needs.append(("documents", "flash_attn_varlen_func", None))
    if spec.seq_lens is not None:
        needs.append(("seq_lens", "flash_attn_varlen_func", None))
    if spec.score_mod_kind == "softcap":
        needs.append(("softcap", "flash_attn_varlen_func" if documents else "flash_attn_func", "softcap"))
    if spec.score_mod_kind == "sinks":
        packed = documents or spec.seq_lens is not None
        needs.append(("sinks", "flash_attn_varlen_func" if packed else "flash_attn_func", "learnable_sink"))
    return needs


def masking_missing(found: Found, spec: RunSpec) -> str | None:
    """Why the installed interface cannot run the spec's mask or score mod, or None (also for causal and none)."""
    for what, function, parameter in masking_needs(spec):
        if not _has(found, function, parameter):
            needed = f"{function}({parameter}=...)" if parameter else function
            if parameter == "learnable_sink":
                return f"{what} needs {needed}, which {found.label} lacks (FA4, flash_attn.cute, has it)"
            added = FA2_ADDED[parameter or function]
            return f"{what} needs {needed}, which {found.label} lacks (flash-attn {added} added it)"
    if spec.mask.kind == "documents" and spec.n_queries != spec.n_keys:
        return f"documents with q_len {spec.n_queries} != kv_len {spec.n_keys} not supported by {VARIANT_NAME}"
    return None


def masking_state(found: Found, spec: RunSpec) -> FlashState:
    """The state that runs the spec's mask and score mod through `found` (check `masking_missing` first):
    tensors (a documents mask's cu_seqlens) are made on the spec's device, here in setup."""
    from attnprof.masks import softcap_value

    masking: dict[str, Any] = {}
    cap = softcap_value(spec.score_mod)
    if cap is not None:
        masking["softcap"] = cap
    mask = spec.mask
    if mask.kind == "sliding_window":
        assert mask.size is not None
        masking["window_size"] = (mask.size - 1, 0)  # keys p - (W - 1) .. p: the W up to its own position
        return FlashState(found.func, found.label, masking, causal=True)
    if spec.seq_lens is not None:
        from attnprof.varlen import cu_seqlens_tensor

        cu_seqlens = cu_seqlens_tensor(spec.seq_lens, spec.device)
        packed = Varlen(_module(found).flash_attn_varlen_func, cu_seqlens, max(spec.seq_lens), spec.causal)
        return FlashState(found.func, found.label, masking, varlen=packed)
    if mask.kind == "documents":
        import torch

        assert mask.size is not None
        length = spec.n_keys // mask.size
        total = spec.batch * spec.n_keys
        cu_seqlens = torch.arange(0, total + 1, length, dtype=torch.int32, device=spec.device)
        varlen = Varlen(_module(found).flash_attn_varlen_func, cu_seqlens, length)
        return FlashState(found.func, found.label, masking, causal=True, varlen=varlen)
    return FlashState(found.func, found.label, masking)


def check(spec: RunSpec) -> str | None:
    """Why `flash-attn` cannot run `spec` (no interface, head_dim, heads, the GPU), or None."""
    found = find_interface()
    if isinstance(found, str):
        return found
    if spec.head_dim % 8 or spec.head_dim > 256:
        return f"head_dim must be a multiple of 8 up to 256 (got {spec.head_dim})"
    if spec.heads % spec.n_kv_heads:
        return f"heads ({spec.heads}) must be a multiple of kv_heads ({spec.n_kv_heads})"
    if spec.page_size is not None and (reason := paged_reason(spec)):
        return reason
    if spec.score_mod_kind == "sinks" and spec.backward:
        return "no backward with sinks: FA4's autograd returns no learnable_sink gradient (dsinks)"
    if spec.page_size is not None and (spec.mask.kind not in ("causal", "none") or spec.score_mod):
        return f"a paged KV cache in {VARIANT_NAME} runs causal or no mask, no score mod (use flex)"
    if spec.page_size is None and spec.n_queries != spec.n_keys:
        lengths = f"q_len {spec.n_queries} != kv_len {spec.n_keys}"
        return f"{lengths} not supported by {VARIANT_NAME} without a paged KV cache"
    if spec.device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch sees none)"
        major, minor = torch.cuda.get_device_capability(spec.device)
        if major < found.interface.min_capability:
            return (f"{found.label} needs compute capability {found.interface.min_capability}.0 "
                    f"or newer (got {major}.{minor})")
        if reason := backward_missing(found.interface, spec, (major, minor)):
            return reason
    return masking_missing(found, spec)


def backward_missing(interface: Interface, spec: RunSpec, capability: tuple[int, int]) -> str | None:
    """Why `interface` cannot run the backward of `spec` (its mode bwd or fwd+bwd) on a GPU of
    `capability`, or None (also for the fwd mode)."""
    allowed = interface.backward_capabilities
    if not spec.backward or allowed is None or capability[0] in allowed:
        return None
    majors = " or ".join(f"{m}.x" for m in allowed)
    return (f"no backward: {interface.label} has a backward kernel for compute capability {majors} only "
            f"(got {capability[0]}.{capability[1]})")


def setup(spec: RunSpec) -> FlashState:
    """Find the interface and call it once on the spec's shape (FA4 compiles here, seconds). A paged cell
    finds `flash_attn_with_kvcache` instead and calls nothing: its cache is built in `prepare_inputs`."""
    import torch

    if spec.page_size is not None:
        kvcache = find_kvcache()
        if isinstance(kvcache, str):
            raise RuntimeError(kvcache)
        return FlashState(kvcache, KVCACHE_LABEL)
    found = find_interface()
    if isinstance(found, str):
        raise RuntimeError(found)
    if reason := masking_missing(found, spec):
        raise RuntimeError(reason)
    state = masking_state(found, spec)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    q = torch.randn(spec.batch, spec.seq, spec.heads, spec.head_dim, device=spec.device, dtype=dtype)
    k = torch.randn(spec.batch, spec.seq, spec.n_kv_heads, spec.head_dim, device=spec.device, dtype=dtype)
    v = torch.randn_like(k)
    sinks = torch.zeros(spec.heads, device=spec.device) if spec.score_mod_kind == "sinks" else None
    forward(q, k, v, spec.causal, state, sinks)  # compiles the kernel the cell runs (with sinks, FA4's sink one)
    state.sinks = None
    if spec.device_type == "cuda":
        torch.cuda.synchronize(spec.device)
    return state


def prepare_inputs(spec: RunSpec, state: FlashState, q: Any, k: Any, v: Any, seed: int) -> FlashState:
    """For a paged cell: k and v ([B, S, H_kv, D]) laid out in page pools by attnprof's seeded shuffled
    page table (`attnprof.kv_cache`), with the int32 block table and cache lengths; any other cell's
    state as it is."""
    if spec.page_size is None:
        return state
    import torch

    table = shuffled_page_table(spec.batch, spec.n_keys, spec.page_size, seed, k.device)
    k_cache, v_cache = (paged_pool(t.transpose(1, 2), table, spec.page_size) for t in (k, v))
    seqlens = torch.full((spec.batch,), spec.n_keys, dtype=torch.int32, device=k.device)
    state.paged = PagedCache(k_cache, v_cache, table.to(torch.int32), seqlens)
    return state


def make_variant() -> Variant:
    """The `flash-attn` Variant. Its description names the three interfaces; `check` and `setup`
    find the one installed (the label is in setup's state) and change nothing."""
    return Variant(
        name=VARIANT_NAME,
        description=BASE_DESCRIPTION,
        forward=forward,
        devices=("cuda",),
        dtypes=("bf16", "fp16"),
        check=check,
        setup=setup,
        layout="bshd",
        has_backward=True,  # every interface's flash_attn_func is an autograd Function; `check` says where not
        # window_size, varlen documents and softcap where the installed interface has them (`check` says);
        # q_len < kv_len only over a paged cache (flash_attn_with_kvcache, causal bottom-right)
        masks=frozenset({"causal", "none", "sliding_window", "documents"}),
        score_mods=frozenset({"softcap", "sinks"}),  # sinks: FA4's learnable_sink, forward only (`check`)
        unequal_lengths=True,
        varlen=True,  # seq_lens through flash_attn_varlen_func

        paged_kv=True,
        prepare_inputs=prepare_inputs,
    )


def register_variants(register: Any) -> None:
    """The `attnprof.variants` entry-point hook."""
    register(make_variant())
