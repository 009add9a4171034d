"""Roofline arithmetic for one attention step: FLOPs, minimum bytes, achieved rates.

Pure math on a `RunSpec`; no torch. FLOPs are counted from the shape (the profiler's
`with_flops` is not used): they are the *useful* work of the attention, so a variant that
computes the masked half of a causal score matrix anyway gets no credit for it.

The step is the spec's mode. FLOPs follow the convention of tritonbench and flash-attention's
benchmarks, so figures compare across tools: backward = 2.5 × forward (five matmuls against the
forward's two; the recomputation of P is not counted), forward + backward = 3.5 × forward. The forward
counts exactly the (query, key) pairs the mask keeps (`attnprof.masks`: causal S(S+1)/2 rather than the
usual S²/2, sliding windows, documents, prefixes and bottom-right causal decode alike; a packed batch's
`seq_lens` summed per sequence), each 4·D FLOPs.
`flops_convention(spec)` states it in the results.

`executed_flops(spec, pairs)` is what a block-sparse kernel computes rather than what the mask keeps:
the same 4·D per pair and mode factors, over every pair inside the tiles the kernel visits (a variant's
`executed_pairs`: a flex BlockMask's full and partial blocks, triton-flash's key-block ranges), each tile
cut at q_len and kv_len; it is never below `step_flops`, and the gap is the masked work inside the tiles.

`kernel_tflops(spec, attention)` is the same FLOPs over the attention calls' device time per step in the
trace (the ledger's `kernel_time_us`), rather than over the latency, which at small shapes is mostly
host launch time.

`bytes_moved(spec, dense_mask)` is what the step must move: q, k, v, the output (and in the backward
their gradients, `MODE_TENSORS`) once each, plus the mask once per pass when the variant takes it as a
dense [q_len, kv_len] bool tensor, plus a paged KV cache's page table once (one int32 per page of each
sequence, `page_table_bytes`); achieved GB/s is computed from it. A paged cache changes no FLOPs.

`achieved` puts a step against the peaks: the matmul ceiling and the read bandwidth (measured on the
machine, `profiling.ceiling`), the ridge point being their ratio; a rate above a peak replaces it, so
no percentage is above 100.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnprof.kv_cache import PAGE_TABLE_ENTRY_BYTES, page_table_entries
from attnprof.registry import ExecutedPairs, RunSpec
from attnprof.varlen import packed_pairs

if TYPE_CHECKING:
    from attnprof.analysis.instance.ledger_summary import AttentionLedger

#: fp8 cells count every tensor at 1 byte: what an fp8 kernel with an fp8 output moves (a bf16 output or
#: bf16 gradients move more, so for those it is a lower bound).
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp8_e5m2": 1}
#: FLOPs of each mode as a multiple of the forward's (tritonbench, flash-attention benchmarks).
MODE_FLOPS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
#: Tensors a mode must move at least, as (query-head tensors, key/value-head tensors), each once:
#: fwd reads q, k, v and writes out; bwd reads q, k, v, out, dout and writes dq, dk, dv.
MODE_TENSORS = {"fwd": (2, 2), "bwd": (4, 4), "fwd+bwd": (6, 6)}


def attention_pairs(spec: RunSpec) -> int:
    """The (query, key) pairs one head keeps under the spec's mask (`Mask.pairs`), exactly; a packed batch's
    summed per sequence, each causal or not (`varlen.packed_pairs`)."""
    if spec.seq_lens is not None:
        return packed_pairs(spec.seq_lens, spec.causal)
    return spec.mask.pairs(spec.n_queries, spec.n_keys)


def attention_flops(spec: RunSpec) -> float:
    """Forward FLOPs: 4·B·H·D per kept (query, key) pair (QKᵀ and PV, a multiply-add being 2).

    H is the number of query heads; grouped-query attention (fewer key/value heads) does
    not change the count. Softmax, scaling and score mods are left out, as is usual.
    """
    return 4.0 * spec.batch * spec.heads * spec.head_dim * attention_pairs(spec)


def step_flops(spec: RunSpec) -> float:
    """FLOPs of the spec's mode: the forward's (`attention_flops`) times `MODE_FLOPS_FACTOR`
    (1 for fwd, 2.5 for bwd, 3.5 for fwd+bwd)."""
    return MODE_FLOPS_FACTOR[spec.mode] * attention_flops(spec)


def flops_convention(spec: RunSpec) -> str:
    """How the spec's FLOPs were counted, in words, for the results (`flops_convention`)."""
    mask = spec.mask
    pairs = "Sq·Skv" if mask.kind == "none" else f"the {attention_pairs(spec)} (query, key) pairs {mask.text} keeps"
    if spec.seq_lens is not None:
        each = "L(L+1)/2" if spec.causal else "L²"
        pairs = f"Σ {each} over the {len(spec.seq_lens)} packed sequences ({attention_pairs(spec)} pairs)"
    forward = f"fwd = 4·B·H·D × {pairs}"
    factor = MODE_FLOPS_FACTOR[spec.mode]
    scaled = "" if spec.mode == "fwd" else f"{spec.mode} = {factor:g} × fwd; "
    return f"{scaled}{forward} (exact pairs; backward factor of tritonbench / flash-attention)"


def executed_flops(spec: RunSpec, pairs: ExecutedPairs) -> float:
    """FLOPs of the spec's mode over the pairs a kernel computes (`ExecutedPairs`, summed over batch and
    query heads): 4·D per forward pair, 2.5 × 4·D per backward pair (the backward's own tiles when it has
    them, else the forward's); fwd+bwd is both."""
    per_pair = 4.0 * spec.head_dim
    backward = pairs.forward if pairs.backward is None else pairs.backward
    forward_part = per_pair * pairs.forward if spec.mode != "bwd" else 0.0
    backward_part = MODE_FLOPS_FACTOR["bwd"] * per_pair * backward if spec.backward else 0.0
    return forward_part + backward_part


#: How `executed_flops` is counted, appended to `flops_convention` on rows that carry it.
EXECUTED_CONVENTION = (
    "executed_flops: the same per pair over every (query, key) pair inside the tiles the kernel visits "
    "(block-sparse kernels; tiles cut at q_len and kv_len)"
)


#: How a padded batch's `executed_flops` is counted (`ExecutedPairs.padded`).
PADDED_CONVENTION = (
    "executed_flops: the same per pair over the padded dense batch (count sequences of the longest length, "
    "padding included, causal or not as the mask)"
)


def executed_convention(pairs: ExecutedPairs) -> str:
    """`EXECUTED_CONVENTION`, or `PADDED_CONVENTION` for a padded batch's pairs."""
    return PADDED_CONVENTION if pairs.padded else EXECUTED_CONVENTION


def kernel_tflops(spec: RunSpec, attention: AttentionLedger | None) -> float | None:
    """`step_flops` over the attention calls' device time per step (`attention.kernel_time_us`), TFLOP/s.

    The ledger's time is already of the spec's mode: its calls are those of the profiled step, the
    forward's in fwd, the backward's in bwd (the forward ran outside the region), both in fwd+bwd
    (`backward_kernel_time_us` is the backward's part of it, not an addition). None without device
    time (a CPU trace: its ledger is timed on the CPU) or without an attention call, and in the backward
    modes when no backward work was attributed (the time would then be the forward's alone, against the
    step's FLOPs).
    """
    if attention is None or attention.time_base != "device" or not attention.calls or not attention.kernel_time_us > 0:
        return None
    if spec.backward and not attention.backward_kernel_time_us:
        return None
    return step_flops(spec) / (attention.kernel_time_us * 1e-6) / 1e12


def min_bytes(spec: RunSpec) -> float:
    """The fewest bytes the spec's mode can move, each tensor once (`MODE_TENSORS`): a forward
    reads q, k, v and writes the output; a backward reads q, k, v, the output and its gradient
    and writes dq, dk, dv; fwd+bwd is both.

    q-like tensors have `heads` heads; k-like ones have `n_kv_heads` (GQA). The element size
    follows the spec's dtype.
    """
    try:
        size = ELEMENT_BYTES[spec.dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {spec.dtype!r}; expected one of {', '.join(ELEMENT_BYTES)}") from None
    q_like, kv_like = MODE_TENSORS[spec.mode]
    per_head = spec.batch * spec.head_dim
    elements = q_like * spec.heads * per_head * spec.n_queries + kv_like * spec.n_kv_heads * per_head * spec.n_keys
    return float(elements * size)


#: Passes over the mask of each mode: the forward reads it, the backward reads it again.
MODE_MASK_PASSES = {"fwd": 1, "bwd": 1, "fwd+bwd": 2}


def mask_bytes(spec: RunSpec, dense_mask: bool) -> float:
    """Bytes of the mask each pass reads: a dense [q_len, kv_len] bool tensor (1 byte each) when the
    variant takes the mask as one (`Variant.takes_dense_mask`), else 0 (is_causal, block masks, none)."""
    return float(spec.n_queries * spec.n_keys) if dense_mask else 0.0


def page_table_bytes(spec: RunSpec) -> float:
    """Bytes of a paged cell's page table, read once: B · kv_len / page_size int32 physical page indices
    (flash-attn's block_table; flex reads its block mask's kv_indices, the same int32 per page, and the
    page-to-logical map only at partial blocks). 0 when the cache is not paged."""
    if spec.page_size is None:
        return 0.0
    return float(page_table_entries(spec.batch, spec.n_keys, spec.page_size) * PAGE_TABLE_ENTRY_BYTES)


def bytes_moved(spec: RunSpec, dense_mask: bool = False) -> float:
    """`min_bytes` plus the dense mask once per pass (`MODE_MASK_PASSES`) when the variant takes one,
    plus a paged cache's page table (`page_table_bytes`)."""
    return min_bytes(spec) + MODE_MASK_PASSES[spec.mode] * mask_bytes(spec, dense_mask) + page_table_bytes(spec)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte; infinite when no bytes move."""
    return flops / bytes_moved if bytes_moved > 0 else float("inf")


def achieved(
    flops: float, bytes_moved: float, seconds: float, peak_flops: float | None, peak_read: float | None
) -> dict[str, Any]:
    """Achieved TFLOP/s and GB/s for `flops` and `bytes_moved` done in `seconds`, as a dict.

    Keys: `tflops`, `achieved_gbps`, `intensity` (FLOP/byte), `pct_of_peak` (achieved FLOP/s over
    the compute peak), `pct_of_read_bandwidth` (achieved bytes/s over the read bandwidth),
    `pct_of_roofline` (achieved FLOP/s over the attainable min(peak_flops, intensity · read
    bandwidth)), `ridge` (FLOP/byte), `bound`, and `peak_beaten` / `read_beaten`: the achieved
    FLOP/s or bytes/s is above the peak given. A beaten peak is no peak: the achieved figure takes
    its place, so no percentage is above 100 (the caller says so). Percentages, `ridge` and `bound`
    are None when the peak they need is unknown.

    Units: `peak_flops` in FLOP/s and `peak_read` in bytes/s (a `Ceiling` holds TFLOP/s and GB/s:
    multiply by 1e12 and 1e9). `bound` is 'compute' when the arithmetic intensity (flops / bytes) is
    at or above the ridge point peak_flops / peak_read (the matmul ceiling over the read bandwidth),
    else 'memory'.
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    flop_rate = flops / seconds
    byte_rate = bytes_moved / seconds
    intensity = arithmetic_intensity(flops, bytes_moved)
    top_flops = max(peak_flops, flop_rate) if peak_flops else None
    top_read = max(peak_read, byte_rate) if peak_read else None
    pct_peak = _pct(flop_rate, top_flops)
    pct_read = _pct(byte_rate, top_read)
    ridge = bound = pct_roof = None
    if top_flops and top_read:
        ridge = top_flops / top_read
        bound = "compute" if intensity >= ridge else "memory"
        pct_roof = _pct(flop_rate, min(top_flops, intensity * top_read))
    return {
        "tflops": flop_rate / 1e12,
        "achieved_gbps": byte_rate / 1e9,
        "intensity": intensity,
        "pct_of_peak": pct_peak,
        "pct_of_read_bandwidth": pct_read,
        "pct_of_roofline": pct_roof,
        "ridge": ridge,
        "bound": bound,
        "peak_beaten": bool(peak_flops) and flop_rate > (peak_flops or 0.0),
        "read_beaten": bool(peak_read) and byte_rate > (peak_read or 0.0),
    }


def _pct(rate: float, peak: float | None) -> float | None:
    """`rate` in percent of `peak` (at least the rate, but for rounding: capped at 100); None without a peak."""
    return min(100.0, 100.0 * (rate / peak)) if peak else None


def achieved_for(
    spec: RunSpec, seconds: float, peak_tflops: float | None, read_gbps: float | None, dense_mask: bool = False
) -> dict[str, Any]:
    """`achieved` for one step of the spec's mode taking `seconds`, with the matmul peak in TFLOP/s and the
    read bandwidth in GB/s, the bytes being `bytes_moved(spec, dense_mask)`."""
    return achieved(
        step_flops(spec),
        bytes_moved(spec, dense_mask),
        seconds,
        peak_tflops * 1e12 if peak_tflops else None,
        read_gbps * 1e9 if read_gbps else None,
    )
