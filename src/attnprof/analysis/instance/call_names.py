"""The names the attention ledger tests, and what they say: the ops SDPA dispatches to and their
backends, PyTorch's fused attention modules, the fused-attention kernels' backends, the ops that
only wrap compiled code, the matmuls and softmaxes the eager recogniser pairs (`op_role`).

`ledger_names` tests every op and kernel name of a trace once (`index.TraceIndex.ledger`), so that
the recognisers of `calls`, the masks (`masks`) and the per-instance ledger (`ledger`) read name
ids only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress

from attnprof.analysis.base import KERNEL
from attnprof.analysis.instance.varlen_calls import varlen_kind
from attnprof.analysis.names import explain_kernel
from attnprof.analysis.trace.tables import ParsedTrace

SDPA_OP = "aten::scaled_dot_product_attention"
#: The ops SDPA dispatches to, by backend; their `_backward` ops name the same backend.
SDPA_BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_efficient_attention_forward": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_cudnn_attention_forward": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}
#: PyTorch's fused attention modules, by op: their backend and their role (see `op_role`), in the
#: order they are looked for (a multi-head attention op inside an encoder layer op is the call).
MODULE_OPS = {
    "aten::_native_multi_head_attention": ("native-mha", "mha"),
    "aten::_transformer_encoder_layer_fwd": ("encoder-layer", "encoder"),
}
#: Backend of a fused-attention kernel found outside an SDPA op, by its name rule's id.
KERNEL_BACKENDS = {
    "flex-attention": "flex",
    "flash-attn-cute": "flash-attn",
    "flash-attn-3": "flash-attn",
    "flash-attn-2": "flash-attn",
    "flash-attn-2-combine": "flash-attn",
    "triton-attention": "triton",
}
#: Ops that only wrap compiled code: a call found inside one is never widened to it.
CONTAINER_PREFIXES = ("Torch-Compiled Region", "## ", "CompiledFunction", "TorchDynamo", "AOTDispatcher")
MATMUL_OPS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum"})
BATCHED_MATMUL_OPS = frozenset({"aten::bmm", "aten::baddbmm"})
#: The ops that run a GEMM themselves (an eager call's matrix products on the CPU).
GEMM_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"})
ENGINE_PREFIX = "autograd::engine::evaluate_function: "
#: functorch's vmap records each op it batches under a name holding this (VmappedVmapped...ModIndex):
#: FlexAttention's `create_block_mask` run eagerly (see `masks`).
VMAPPED = "Vmapped"


def op_role(name: str) -> str | None:
    """The role of an op, by its name: "sdpa", "mha", "encoder" (`MODULE_OPS`), "matmul", "softmax",
    "container", or None for any other."""
    if name == SDPA_OP or name in SDPA_BACKEND_OPS:
        return "sdpa"
    module = MODULE_OPS.get(name)
    if module is not None:
        return module[1]
    if name in MATMUL_OPS:
        return "matmul"
    if "softmax" in name and "log_softmax" not in name and "backward" not in name:
        return "softmax"
    if name.startswith(CONTAINER_PREFIXES):
        return "container"
    return None


def kernel_backend(name: str) -> str | None:
    """The backend of a fused-attention kernel outside SDPA (see `KERNEL_BACKENDS`; SDPA's FlashAttention
    kernels, `pytorch_flash::`, are "flash"); None for any other."""
    expl = explain_kernel(name)
    if expl.family != "fused-attention":
        return None
    if "pytorch_flash::" in name:  # SDPA's own copy of FlashAttention-2 (e.g. replayed from a CUDA graph)
        return "flash"
    return KERNEL_BACKENDS.get(expl.rule or "") or expl.backend or expl.rule or "fused"


@dataclass(slots=True)
class LedgerNames:
    """What the ledger tests of a trace's names, found once per trace (`index.TraceIndex.ledger`): op
    roles (`op_role`) and SDPA dispatch backends by op name id, fused-attention backends
    (`kernel_backend`) by kernel name id. Filled by `ledger_names`, then only read."""

    role: dict[int, str]
    sdpa_backend: dict[int, str]
    fused: dict[int, str]
    batched: frozenset[int]  # the name ids of BATCHED_MATMUL_OPS
    vmapped: frozenset[int] = frozenset()  # the name ids of the ops holding VMAPPED
    gemm_ops: frozenset[int] = frozenset()  # the name ids of GEMM_OPS
    gemm_kernels: frozenset[int] = frozenset()  # the name ids of the kernels of the "gemm" family
    converts: frozenset[int] = frozenset()  # the name ids of the ops that may convert a mask (mask_convert)
    varlen: dict[int, str] = field(default_factory=dict)  # op name ids that mark a varlen call (varlen_calls)


def ledger_names(trace: ParsedTrace, converts: frozenset[str] = frozenset()) -> LedgerNames:
    """The `LedgerNames` of a trace (`converts`: the op names that may convert a mask)."""
    names, dev = trace.names, trace.device
    op_ids = set(trace.cpu_ops.name)
    kernel_ids = set(compress(dev.name, map(KERNEL.__eq__, dev.kind)))
    return LedgerNames(
        role={n: role for n in op_ids if (role := op_role(names[n])) is not None},
        sdpa_backend={n: SDPA_BACKEND_OPS[names[n]] for n in op_ids if names[n] in SDPA_BACKEND_OPS},
        fused={n: backend for n in kernel_ids if (backend := kernel_backend(names[n])) is not None},
        batched=frozenset(n for n in op_ids if names[n] in BATCHED_MATMUL_OPS),
        vmapped=frozenset(n for n in op_ids if VMAPPED in names[n]),
        gemm_ops=frozenset(n for n in op_ids if names[n] in GEMM_OPS),
        gemm_kernels=frozenset(n for n in kernel_ids if explain_kernel(names[n]).family == "gemm"),
        converts=frozenset(n for n in op_ids if names[n] in converts),
        varlen={n: kind for n in op_ids if (kind := varlen_kind(names[n])) is not None},
    )
