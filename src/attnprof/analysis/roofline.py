"""Roofline arithmetic for one attention forward: FLOPs, minimum bytes, achieved rates.

Pure math on a `RunSpec`; no torch. FLOPs are counted from the shape (the profiler's
`with_flops` is not used): they are the *useful* work of the attention, so a variant that
computes the masked half of a causal score matrix anyway gets no credit for it.
"""

from __future__ import annotations

from typing import Any

from attnprof.registry import RunSpec

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def attention_flops(spec: RunSpec) -> float:
    """Forward FLOPs: 4·B·H·S_q·S_kv·D (QKᵀ and PV, a multiply-add being 2), halved when causal.

    H is the number of query heads; grouped-query attention (fewer key/value heads) does
    not change the count. Softmax and scaling are left out, as is usual.
    """
    flops = 4.0 * spec.batch * spec.heads * spec.seq * spec.seq * spec.head_dim
    return flops / 2.0 if spec.causal else flops


def min_bytes(spec: RunSpec) -> float:
    """The fewest bytes a forward can move: read q, k, v once and write the output once.

    q and the output have `heads` heads; k and v have `n_kv_heads` (GQA). The element size
    follows the spec's dtype.
    """
    try:
        size = ELEMENT_BYTES[spec.dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {spec.dtype!r}; expected one of {', '.join(ELEMENT_BYTES)}") from None
    per_head = spec.batch * spec.seq * spec.head_dim
    elements = 2 * spec.heads * per_head + 2 * spec.n_kv_heads * per_head
    return float(elements * size)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte; infinite when no bytes move."""
    return flops / bytes_moved if bytes_moved > 0 else float("inf")


def achieved(flops: float, bytes_moved: float, seconds: float,
             peak_flops: float | None, peak_bandwidth: float | None) -> dict[str, Any]:
    """Achieved TFLOP/s and GB/s for `flops` and `bytes_moved` done in `seconds`, as a dict.

    Keys: `tflops`, `achieved_gbps`, `intensity` (FLOP/byte), `pct_of_peak` (achieved
    FLOP/s over the compute peak), `pct_of_bandwidth` (achieved bytes/s over the bandwidth
    peak), `pct_of_roofline` (achieved FLOP/s over the attainable min(peak_flops,
    intensity · peak_bandwidth)), `ridge` (FLOP/byte) and `bound`. Percentages, `ridge` and
    `bound` are None when the peak they need is unknown.

    Units: `peak_flops` in FLOP/s and `peak_bandwidth` in bytes/s (a `Ceiling` holds TFLOP/s
    and GB/s: multiply by 1e12 and 1e9). `bound` is 'compute' when the arithmetic intensity
    (flops / bytes) is at or above the ridge point peak_flops / peak_bandwidth, else 'memory'.
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    flop_rate = flops / seconds
    byte_rate = bytes_moved / seconds
    intensity = arithmetic_intensity(flops, bytes_moved)
    pct_peak = 100.0 * flop_rate / peak_flops if peak_flops else None
    pct_bw = 100.0 * byte_rate / peak_bandwidth if peak_bandwidth else None
    ridge = bound = pct_roof = None
    if peak_flops and peak_bandwidth:
        ridge = peak_flops / peak_bandwidth
        bound = "compute" if intensity >= ridge else "memory"
        pct_roof = 100.0 * flop_rate / min(peak_flops, intensity * peak_bandwidth)
    return {
        "tflops": flop_rate / 1e12,
        "achieved_gbps": byte_rate / 1e9,
        "intensity": intensity,
        "pct_of_peak": pct_peak,
        "pct_of_bandwidth": pct_bw,
        "pct_of_roofline": pct_roof,
        "ridge": ridge,
        "bound": bound,
    }


def achieved_for(spec: RunSpec, seconds: float, peak_tflops: float | None,
                 peak_gbps: float | None) -> dict[str, Any]:
    """`achieved` for one spec's forward taking `seconds`, with peaks in TFLOP/s and GB/s."""
    return achieved(
        attention_flops(spec), min_bytes(spec), seconds,
        peak_tflops * 1e12 if peak_tflops else None,
        peak_gbps * 1e9 if peak_gbps else None,
    )
