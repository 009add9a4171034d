"""FP8 cells: q, k and v quantized from their bf16 source outside the timed region, and the accuracy of the
output they give.

Quantization (`quantize_inputs`): each tensor is scaled so its largest magnitude lands on the format's largest
finite value (448 for e4m3, 57344 for e5m2), either per tensor or per (batch, head) slice (`per-head`), and cast;
the descale (1 / scale, float32) is what a kernel multiplies back. On a GPU it ends with a synchronize, so the
pipeline's `quantize` phase (its wall time in `phases_s`) holds the quantization's device time, never the
latency's.

Accuracy (`fp8_accuracy`): the relative Frobenius error and the SQNR (10·log10(‖ref‖² / ‖out − ref‖²), dB)
of the output against two float64 references: that of the dequantized inputs (what the kernel itself loses:
the fp8 softmax probabilities, its accumulation and an fp8 output) and that of the bf16 source inputs (what a
user who switches from bf16 loses, quantization included). `FP8_THRESHOLDS` bounds the first; the second is
reported. torch is imported inside functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: torch's dtype for each fp8 config dtype, and the largest finite value of that format.
TORCH_FP8 = {"fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
FP8_MAX = {"fp8": 448.0, "fp8_e5m2": 57344.0}
#: The dtype the source q, k and v of an fp8 cell are drawn in before quantization.
SOURCE_DTYPE = "bf16"
#: Relative error against the float64 reference of the dequantized inputs. Measured on CPU (torch 2.13,
#: standard-normal bf16 sources, B1 H4, D 64 and 128, S 256 to 2048, causal and not, both scalings) by
#: emulating an fp8 kernel (fp32 scores, probabilities cast to the format at scale FP8_MAX, an fp8 output at
#: the values' scale): at most 3.8e-2 (e4m3, SQNR 28.6 dB) and 7.6e-2 (e5m2, 22.6 dB); against the bf16
#: sources' reference 6.1e-2 and 1.25e-1. The limits sit about 2x above the first; a wrong descale gives 0.5+.
FP8_THRESHOLDS = {"fp8": 8e-2, "fp8_e5m2": 1.5e-1}


def torch_fp8(dtype: str) -> Any:
    """The torch dtype of `fp8` (float8_e4m3fn) or `fp8_e5m2` (float8_e5m2)."""
    import torch

    return getattr(torch, TORCH_FP8[dtype])


@dataclass
class Quantized:
    """One cell's fp8 q, k and v and their float32 descales: shape [1] per tensor, [B, H] per head."""

    dtype: str
    scaling: str
    q: Any
    k: Any
    v: Any
    descale_q: Any
    descale_k: Any
    descale_v: Any
    time_s: float | None = None  # the median of QUANTIZE_REPEATS timed quantizations of q, k and v (GPU only)

    def dequantized(self, layout: str = "bhsd") -> tuple[Any, Any, Any]:
        """q, k and v as the kernel reads them, in float64 and [B, H, S, D] (fp8 values times their descale)."""
        pairs = ((self.q, self.descale_q), (self.k, self.descale_k), (self.v, self.descale_v))
        q, k, v = (dequantize(t.transpose(1, 2) if layout == "bshd" else t, d) for t, d in pairs)
        return q, k, v


@dataclass
class Fp8State:
    """What an fp8 cell's forward receives as its state: the quantized inputs and what the variant's setup
    (and `prepare_inputs`) returned. The forward's q, k and v are the bf16 sources (the leaves gradients are
    taken for); it computes on `inputs`. An fp8 output is dequantized for the check with `descale_o`, which
    the variant sets when it chooses its output scale (per tensor; None: the output is not fp8)."""

    inputs: Quantized
    state: Any = None
    descale_o: Any = None


def quantize(tensor: Any, dtype: str, scaling: str, layout: str = "bhsd") -> tuple[Any, Any]:
    """`tensor` ([B, H, S, D] or, with `layout` bshd, [B, S, H, D]) in fp8 `dtype`, and its float32 descale:
    shape [1] for `per-tensor`, [B, H] for `per-head`. An all-zero tensor (or slice) gets descale 1."""
    import torch

    source = tensor.detach().float()
    if scaling == "per-tensor":
        amax = source.abs().amax().reshape(1)
        scale_shape: tuple[int, ...] = (1, 1, 1, 1)
    elif scaling == "per-head":
        dims = (2, 3) if layout == "bhsd" else (1, 3)
        amax = source.abs().amax(dim=dims)  # [B, H]
        batch, heads = amax.shape
        scale_shape = (batch, heads, 1, 1) if layout == "bhsd" else (batch, 1, heads, 1)
    else:
        raise ValueError(f"unknown fp8 scaling {scaling!r}; expected per-tensor or per-head")
    scale = torch.where(amax > 0, FP8_MAX[dtype] / amax, torch.ones_like(amax))
    quantized = (source * scale.reshape(scale_shape)).to(torch_fp8(dtype))
    return quantized, (1.0 / scale).float()


def dequantize(tensor: Any, descale: Any) -> Any:
    """An fp8 tensor ([B, H, S, D]) in float64 times its descale (per tensor: [1]; per head: [B, H])."""
    values = tensor.double()
    if descale.dim() == 2:
        return values * descale.double()[:, :, None, None]
    return values * descale.double()


def output_values(out: Any, descale_o: Any) -> Any:
    """A variant's output in float64: an fp8 one times `descale_o` (per tensor), any other as it is."""
    if str(out.dtype).removeprefix("torch.") in TORCH_FP8.values():
        return out.double() * (descale_o.double() if descale_o is not None else 1.0)
    return out.detach().double()


QUANTIZE_REPEATS = 5  # timed quantizations of q, k and v after one untimed warm-up; the row keeps their median


def quantize_inputs(q: Any, k: Any, v: Any, dtype: str, scaling: str, layout: str = "bhsd") -> Quantized:
    """q, k and v quantized (`quantize`): once untimed (a GPU's first call loads the kernels), then
    QUANTIZE_REPEATS times between CUDA events (on a CPU, perf_counter); `time_s` is their median."""
    import statistics
    import time

    import torch

    def once() -> Quantized:
        (q8, dq), (k8, dk), (v8, dv) = (quantize(t, dtype, scaling, layout) for t in (q, k, v))
        return Quantized(dtype, scaling, q8, k8, v8, dq, dk, dv)

    quantized = once()
    times = []
    for _ in range(QUANTIZE_REPEATS):
        if q.device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            quantized = once()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e-3)
        else:
            began = time.perf_counter()
            quantized = once()
            times.append(time.perf_counter() - began)
    quantized.time_s = statistics.median(times)
    return quantized


@dataclass(frozen=True)
class Fp8Accuracy:
    """An fp8 output against the float64 references of the dequantized inputs and of the bf16 sources."""

    rel_error: float
    sqnr_db: float
    rel_error_vs_bf16: float
    sqnr_db_vs_bf16: float
    threshold: float

    @property
    def passed(self) -> bool:
        return math.isfinite(self.rel_error) and self.rel_error <= self.threshold


def sqnr_db(out: Any, ref: Any) -> float:
    """10·log10(‖ref‖² / ‖out − ref‖²) in dB; inf when they are equal."""
    noise = float((out.double() - ref.double()).pow(2).sum())
    signal = float(ref.double().pow(2).sum())
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def relative_error(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ (Frobenius), in float64."""
    ref64 = ref.double()
    denom = float(ref64.norm())
    return float((out.double() - ref64).norm()) / denom if denom > 0 else float((out.double() - ref64).norm())


def fp8_accuracy(out: Any, ref_dequantized: Any, ref_source: Any, dtype: str) -> Fp8Accuracy:
    """`out` (in float, bhsd) against both references, with the threshold of `dtype`; `out` is compared where the
    references are (the float64 reference is computed on the CPU)."""
    out = out.detach().to(ref_dequantized.device)
    source_out = out.to(ref_source.device)
    return Fp8Accuracy(
        rel_error=relative_error(out, ref_dequantized),
        sqnr_db=sqnr_db(out, ref_dequantized),
        rel_error_vs_bf16=relative_error(source_out, ref_source),
        sqnr_db_vs_bf16=sqnr_db(source_out, ref_source),
        threshold=FP8_THRESHOLDS[dtype],
    )


#: The operands of each fp8 dtype's `torch._scaled_mm` (cuBLASLt has no e5m2 × e5m2 product).
SCALED_MM_OPERANDS = {"fp8": "e4m3 x e4m3", "fp8_e5m2": "e5m2 x e4m3"}


def scaled_mm_operands(n: int, dtype: str, dev: Any) -> tuple[Any, Any, Any]:
    """The fp8 operands of an n x n x n `torch._scaled_mm` in `dtype` (the second column-major, as
    cuBLASLt takes it) and its float32 scale of 1."""
    import torch

    first = torch_fp8(dtype)
    a = torch.randn(n, n, device=dev).to(first)
    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
    return a, b, torch.ones((), device=dev, dtype=torch.float32)


def scaled_matmul_seconds(n: int, dtype: str, dev: Any) -> float:
    """Median seconds of one n x n x n fp8 `torch._scaled_mm` with a bf16 output (GPU only)."""
    import torch

    from attnprof.profiling.read_probe import median_seconds

    a, b, one = scaled_mm_operands(n, dtype, dev)
    return median_seconds(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), dev)
