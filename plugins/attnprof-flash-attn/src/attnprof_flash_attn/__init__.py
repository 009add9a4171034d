"""attnprof plugin: `flash-attn`, the installed FlashAttention library, whichever generation.

Three interfaces are tried, newest first, and the first that imports is used:

* FA4, the CuTe-DSL kernels: `flash_attn.cute.flash_attn_func` (compiles on first call);
* FA3, the Hopper kernels: `flash_attn_interface.flash_attn_func`;
* FA2: `flash_attn.flash_attn_func`.

All three take and return [batch, seq, heads, head_dim] tensors, so the variant declares
`layout="bshd"` and attnprof prepares its inputs in that layout outside the timed region.
Nothing is imported when this module is: the lookup happens in check() or setup().
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnprof import RunSpec, Variant

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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        _found = f"needs flash_attn (FA2/FA3/FA4): {interface.label} is installed but failed: {_first_line(exc)}"
    else:
        fa2 = dict((i.module, e) for i, e in failures)["flash_attn"]
        _found = f"needs flash_attn (FA2/FA3/FA4): {_first_line(fa2)}"
    return _found


@dataclass
class FlashState:
    """What setup leaves for forward: the function to call and which interface it is."""

    func: Callable[..., Any]
    label: str


def _call(func: Callable[..., Any], q: Any, k: Any, v: Any, causal: bool) -> Any:
    out = func(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=causal)
    # FA4 (and some FA3 releases) return (out, softmax_lse).
    return out[0] if isinstance(out, (tuple, list)) else out


def forward(q: Any, k: Any, v: Any, causal: bool, state: FlashState | None = None) -> Any:
    """One forward on [B, S, H, D] tensors (k, v may have fewer heads); returns [B, S, H, D]."""
    if state is None:
        found = find_interface()
        if isinstance(found, str):
            raise RuntimeError(found)
        state = FlashState(found.func, found.label)
    return _call(state.func, q, k, v, causal)


def check(spec: RunSpec) -> str | None:
    """Why `flash-attn` cannot run `spec` (no interface, head_dim, heads, the GPU), or None."""
    found = find_interface()
    if isinstance(found, str):
        return found
    if spec.head_dim % 8 or spec.head_dim > 256:
        return f"head_dim must be a multiple of 8 up to 256 (got {spec.head_dim})"
    if spec.heads % spec.n_kv_heads:
        return f"heads ({spec.heads}) must be a multiple of kv_heads ({spec.n_kv_heads})"
    if spec.device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch sees none)"
        major, minor = torch.cuda.get_device_capability(spec.device)
        if major < found.interface.min_capability:
            return (f"{found.label} needs compute capability {found.interface.min_capability}.0 "
                    f"or newer (got {major}.{minor})")
        return backward_missing(found.interface, spec, (major, minor))
    return None


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
    """Find the interface and call it once on the spec's shape (FA4 compiles here, seconds)."""
    import torch

    found = find_interface()
    if isinstance(found, str):
        raise RuntimeError(found)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    q = torch.randn(spec.batch, spec.seq, spec.heads, spec.head_dim, device=spec.device, dtype=dtype)
    k = torch.randn(spec.batch, spec.seq, spec.n_kv_heads, spec.head_dim, device=spec.device, dtype=dtype)
    v = torch.randn_like(k)
    _call(found.func, q, k, v, spec.causal)
    if spec.device_type == "cuda":
        torch.cuda.synchronize(spec.device)
    return FlashState(found.func, found.label)


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
        # plain causal (is_causal) and no mask only, q_len == kv_len, no score mods: what the forward runs today
        masks=frozenset({"causal", "none"}),
        score_mods=frozenset(),
        unequal_lengths=False,
    )


def register_variants(register: Any) -> None:
    """The `attnprof.variants` entry-point hook."""
    register(make_variant())
