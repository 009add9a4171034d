"""The bytes an attention call must move and the FLOPs it does, from the shapes the trace recorded.

A call's op (the outermost SDPA op, or the op of a fused-attention kernel, e.g. a compiled flex
template) records its inputs' `Input Dims` and `Input type` with `record_shapes=True`. Its bytes are
Q, K and V once each as they were passed (K/V repeated for grouped-query attention are read at their
repeated size: that is what the kernel reads), O (Q's shape with V's head dim) once, and a dense mask
when an SDPA op's fourth input is a tensor (`attn_mask`, a backend op's `attn_bias`). Its FLOPs are
2·(D_qk + D_v) per (query, key) pair the op keeps, 4·D for equal head dims: with is_causal=True (read
from the op's `Concrete Inputs`) the causal pairs (`attnprof.masks`; top-left aligned when the
queries and keys differ in number, as SDPA's is_causal is, bottom-right for the flash backend op,
which a lower-right `CausalBias` calls directly), else every pair: a dense mask's pairs are not
counted from its shape, and an op that did not record is_causal (no `Concrete Inputs`, a fused kernel
outside SDPA) says so (`Traffic.causal` None). K and V of batch 1
under a query batch of B are one pool the batch shares (a paged KV cache, as flex reads it): each of
its positions belongs to one sequence, so the pairs are Q's rows × the pool's positions, not × B, and
each sequence's keys are the pool's positions / B.

An eager call (matmul, softmax, matmul: `eager_traffic`) reads Q and K from its first matmul's inputs
(Q @ K^T) and V from its last one's second input (P @ V), 3-D or 4-D; its scores, mask and softmax
are intermediates, not counted (as for SDPA's math backend: the bytes are what a fused kernel would
move, so that the GB/s compare across backends).

None where the shapes were not recorded or do not read as attention: no op (a kernel launched under
none), a backward call.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from attnprof.analysis.instance.call_names import SDPA_BACKEND_OPS, SDPA_OP
from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.masks import Mask

#: Bytes per element of the `Input type`s attention inputs take.
ELEMENT_BYTES = {
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "float": 4,
    "double": 8,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "int": 4,
    "long int": 8,
}
_MASK_INPUT = 3  # SDPA's attn_mask, efficient's and cuDNN's attn_bias; a scalar (or nothing) elsewhere
#: The position of is_causal among an op's inputs (native_functions.yaml; checked against the
#: `Concrete Inputs` of torch 2.11's H200 traces in tests/data, the CPU flash op against the yaml only).
#: The SDPA op and the backend op it dispatched to agreed in every trace there. `_flash_attention_forward`
#: and `_efficient_attention_forward` are left out: their inputs are (batch, sequence, heads, dim).
IS_CAUSAL_INPUT = {
    SDPA_OP: 5,
    "aten::_scaled_dot_product_attention_math": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
}
#: The op whose is_causal is bottom-right aligned (flash-attention's; SDPA refuses flash for a
#: non-square is_causal, so only a lower-right CausalBias reaches it with q_len != kv_len).
_BOTTOM_RIGHT_CAUSAL_OP = "aten::_scaled_dot_product_flash_attention"
_CAUSAL = Mask("causal")


@dataclass(frozen=True, slots=True)
class Traffic:
    """What one call moves and computes: `bytes` read and written (Q, K, V, O, mask) and `flops`, with
    the shape they come from (Q's heads and rows, K's heads and rows). `causal`: whether `flops` counts
    the causal pairs (True), every pair of a call that recorded is_causal=False (False), or every pair
    of a call whose is_causal is unknown (None: not recorded, or an op that takes none)."""

    bytes: int
    flops: int
    batch: int = 0  # 3-D inputs (batch and heads flattened): batch x heads
    q_heads: int = 0  # 0 where 3-D inputs do not say
    kv_heads: int = 0
    queries: int = 0
    keys: int = 0
    causal: bool | None = None
    head_dim: int = 0  # Q's and K's head dim (0: unknown)

    @property
    def batch_heads(self) -> int:
        """Batch x query heads (3-D inputs: their flattened first dim)."""
        return self.batch * self.q_heads if self.q_heads else self.batch


def _tensor(dims: object, dtype: str, rank: tuple[int, ...] = (4,)) -> tuple[list[int], int] | None:
    """(shape, element bytes) of a tensor input of one of the ranks `rank`, else None."""
    size = ELEMENT_BYTES.get(dtype)
    if size is None or not isinstance(dims, list) or len(dims) not in rank or not all(isinstance(d, int) for d in dims):
        return None
    return dims, size


def _inputs(trace: ParsedTrace, op: int) -> tuple[list[Any], tuple[str, ...]] | None:
    """The `Input Dims` and `Input type` of `op`, or None when it recorded none."""
    if op < 0:
        return None
    dims = trace.input_dims_of(op)
    types_at = trace.cpu_ops.input_types[op]
    if dims is None or types_at < 0:
        return None
    return dims, trace.input_types[types_at]


def eager_traffic(trace: ParsedTrace, head: int, tail: int) -> Traffic | None:
    """The `Traffic` of an eager call whose first matmul is `head` (Q @ K^T) and last `tail` (P @ V)
    (see the module docstring); None when their shapes are unknown or do not fit."""
    first, last = _inputs(trace, head), _inputs(trace, tail)
    if first is None or last is None or len(first[0]) < 2 or len(last[0]) < 2:
        return None
    q_in = _tensor(first[0][0], first[1][0], (3, 4))
    k_in = _tensor(first[0][1], first[1][1], (3, 4))
    v_in = _tensor(last[0][1], last[1][1], (3, 4))
    if q_in is None or k_in is None or v_in is None:
        return None
    (q, q_size), (k, k_size), (v, v_size) = q_in, k_in, v_in
    queries, d_qk, keys, d_v = q[-2], q[-1], k[-1], v[-1]
    if k[-2] != d_qk or v[-2] != keys:
        return None
    rows = prod(q[:-2])  # batch x heads (3-D: already flattened)
    total = prod(q) * q_size + prod(k) * k_size + prod(v) * v_size + rows * queries * d_v * q_size
    heads = q[1] if len(q) == 4 else 0
    kv_heads = k[1] if len(k) == 4 else 0
    batch = q[0] if len(q) == 4 else rows
    flops = 2 * (d_qk + d_v) * rows * queries * keys
    return Traffic(total, flops, batch, heads, kv_heads, queries, keys, head_dim=d_qk)


def is_causal(trace: ParsedTrace, op: int, name: str) -> bool | None:
    """The is_causal `op` (named `name`) recorded in its `Concrete Inputs`; None when it did not."""
    at = IS_CAUSAL_INPUT.get(name)
    concrete = trace.concrete_inputs_of(op) if at is not None else None
    if at is None or concrete is None or len(concrete) <= at:
        return None
    return {"True": True, "False": False}.get(concrete[at])


def causal_pairs(queries: int, keys: int, bottom_right: bool) -> int:
    """The (query, key) pairs one head keeps under a causal mask: `Mask.pairs` over the triangle, with
    the rows beyond it (keys of a top-left mask's later queries; none bottom-right) added whole."""
    if bottom_right:
        return _CAUSAL.pairs(min(queries, keys), keys)
    side = min(queries, keys)
    return _CAUSAL.pairs(side, side) + max(0, queries - keys) * keys


def call_traffic(trace: ParsedTrace, op: int) -> Traffic | None:
    """The `Traffic` of the attention call whose op is `op` (see the module docstring); None when the
    op recorded no shapes or its first three inputs are not 4-D tensors (batch, heads, sequence, dim)."""
    inputs = _inputs(trace, op)
    if inputs is None:
        return None
    dims, types = inputs
    if len(dims) < 3 or len(types) < 3:
        return None
    qkv = [_tensor(dims[i], types[i]) for i in range(3)]
    if any(t is None for t in qkv):
        return None
    (q, q_size), (k, k_size), (v, v_size) = qkv  # type: ignore[misc]
    batch, heads, queries, d_qk = q
    keys, d_v = k[2], v[3]
    name = trace.names[trace.cpu_ops.name[op]]
    causal = is_causal(trace, op, name)
    pairs = batch * heads * queries * keys
    if k[0] == 1 < batch:  # a pool the batch shares (paged): every position is one sequence's
        pairs, keys = heads * queries * keys, keys // batch
    if causal:
        pairs = batch * heads * causal_pairs(queries, keys, name == _BOTTOM_RIGHT_CAUSAL_OP)
    total = prod(q) * q_size + prod(k) * k_size + prod(v) * v_size
    total += batch * heads * queries * d_v * q_size  # O: Q's shape with V's head dim, in Q's dtype
    if (name == SDPA_OP or name in SDPA_BACKEND_OPS) and len(dims) > _MASK_INPUT and len(types) > _MASK_INPUT:
        mask = dims[_MASK_INPUT]
        size = ELEMENT_BYTES.get(types[_MASK_INPUT])
        if size is not None and isinstance(mask, list) and mask and all(isinstance(d, int) for d in mask):
            total += prod(mask) * size
    return Traffic(total, 2 * (d_qk + d_v) * pairs, batch, heads, k[1], queries, keys, causal, d_qk)


#: GEMM ops by name: the position of their first matrix among the inputs (addmm and baddbmm take
#: the bias first).
_GEMM_INPUTS = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}


def gemm_flops(trace: ParsedTrace, op: int) -> int | None:
    """The FLOPs of the GEMM that op `op` (aten::mm, bmm, addmm, baddbmm) launched, 2·m·k·n per matrix
    product, from its recorded `Input Dims`; None for another op or without shapes."""
    if op < 0:
        return None
    first = _GEMM_INPUTS.get(trace.names[trace.cpu_ops.name[op]])
    dims = trace.input_dims_of(op) if first is not None else None
    if first is None or dims is None or len(dims) < first + 2:
        return None
    a, b = dims[first], dims[first + 1]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and len(a) in (2, 3)):
        return None
    if not all(isinstance(d, int) for d in a + b) or a[-1] != b[-2]:
        return None
    return 2 * prod(a) * b[-1]
