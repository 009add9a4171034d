"""Findings on the work of the forward itself: copies, GEMMs without tensor cores, the mask, the
softmax and the single fused kernel.

Each is computed from evidence in the trace (or the dtype hint); when the evidence is missing the
finding is simply absent. ``single-fused-kernel`` counts both phases: a training step with a
backward is never one kernel.
"""

from __future__ import annotations

from collections import Counter

from attnprof.analysis.findings.registry import (
    FindingContext,
    FindingRegistry,
    NoImpact,
    Said,
    listed,
    numbers,
    us,
)
from attnprof.analysis.instance.metrics import MASK_OPS, SAFE_SOFTMAX, SIXTEEN_BIT, KernelStats
from attnprof.stats import median, median_count

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
#: `mask-rebuilt` needs one of these in every instance (ones, where and scalar_tensor alone are not a mask).
MASK_CORE = frozenset({"aten::tril", "aten::triu"})
DTYPE_LABEL = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64", "fp8": "fp8"}


def _copies_time(ctx: FindingContext) -> float | NoImpact:
    """The device-to-device copies' device time per instance."""
    return sum(k.time_us for k in ctx.kernels if k.is_dtod_memcpy)


@RULES.rule(
    "hidden-memcpy",
    severity="problem",
    summary="A device-to-device memcpy inside the forward, with the op chain that caused it.",
    paragraph="""
    A device-to-device memcpy ran inside the region. It is usually hidden in an out-of-place op that copies
    its whole input before writing to it (masked_fill rather than masked_fill_: its clone becomes the
    memcpy), or in an explicit .clone() or copy_ between tensors of the same dtype and layout. The copy reads
    and writes the tensor once more in device memory (for the attention scores, batch x heads x seq x seq
    elements per forward) and allocates a second one of the same size: time and memory the attention itself
    does not need. The message names the copy kernel, its time and the op chain
    that launched it, outermost first. Make that op in-place (masked_fill_ instead of masked_fill), drop the
    copy, or let a fused kernel (scaled_dot_product_attention) apply the mask without materialising the scores.
    """,
    impact=_copies_time,
)
def _hidden_memcpy(ctx: FindingContext) -> str | None:
    counts = [m.dtod_memcpy or 0 for m in ctx.per_forward]
    with_copy = sum(1 for c in counts if c)
    if not with_copy:
        return None
    copies = [k for k in ctx.kernels if k.is_dtod_memcpy]
    if not copies:
        return None
    copy = max(copies, key=lambda k: k.time_us)
    per_forward = max(median_count([c for c in counts if c]), 1)
    chain = copy.launch_ops[0] if copy.launch_ops else None
    if chain:
        cause = f"caused by {chain}"
        ops = chain.split(" → ")
        out_of_place = not ops[0].endswith("_") and not ops[0].startswith("autograd::")  # not a backward op
        if out_of_place and any(op in ("aten::clone", "aten::copy_") for op in ops[1:]):
            cause += f" (the out-of-place {ops[0]} copies its input before writing)"
    else:
        cause = "launched directly inside the region, under no ATen op"
    who = ctx.every(with_copy, len(counts)).capitalize() + (" runs" if with_copy == len(counts) else " run")
    return f"{who} {per_forward} device-to-device memcpy ({copy.short_name}, {us(copy.time_us)}), {cause}."


def _fp32_gemms(ctx: FindingContext) -> list[KernelStats]:
    return [k for k in ctx.kernels if k.kind == "kernel" and k.family == "gemm" and k.tensor_cores is False]


#: FP32 GEMMs that all ran outside the attention calls and take under this share of the instance's time are
#: `info`: FP32 by design there (a rotary embedding's small GEMM), and removing them outright would move the
#: instance by less than a model step's timing resolves (its IQR runs to several percent: docs/validation.md).
BY_DESIGN_SHARE = 0.02


def _fp32_excess(ctx: FindingContext) -> float | NoImpact:
    """The FP32 GEMMs' device time per instance less the time their FLOPs (from the recorded shapes)
    take at the measured matmul ceiling of the inputs' dtype; without shapes or a measured ceiling (analyze,
    model), their whole device time, an upper bound of what tensor cores would save."""
    gemms = _fp32_gemms(ctx)
    kernel_time = sum(k.time_us for k in gemms)
    if not ctx.ceiling_tflops or not gemms or any(k.flops_per_forward is None for k in gemms):
        return kernel_time
    at_ceiling = sum(k.flops_per_forward or 0.0 for k in gemms) / (ctx.ceiling_tflops * 1e6)  # µs
    return kernel_time - at_ceiling


def _fp32_by_design(ctx: FindingContext, impact: float) -> Said | None:
    """`info` when every FP32 GEMM ran outside the attention calls and the impact is under `BY_DESIGN_SHARE`
    of the instance's time."""
    base = ctx.instance_time_us
    placed = _gemm_placement(ctx, _fp32_gemms(ctx))
    if not placed or any(where != "outside" for where, _, _ in placed) or base <= 0:
        return None
    if impact >= BY_DESIGN_SHARE * base:
        return None
    share = 100.0 * impact / base
    return (
        f"They take {us(impact)} per {ctx.unit}, {share:.2g}% of its time (under {BY_DESIGN_SHARE:.0%}), outside "
        "the attention calls: FP32 by design there (a rotary embedding computes in FP32), nothing to act on.",
        numbers(fp32_gemm_us=impact, share_pct=share, by_design_share=BY_DESIGN_SHARE),
    )


@RULES.rule(
    "fp32-cuda-cores",
    severity="problem",
    summary="GEMMs ran in FP32 on CUDA cores, without tensor cores, although the inputs are 16-bit.",
    paragraph="""
    The inputs are bfloat16 or float16, yet GEMM kernels ran in FP32 on the CUDA cores (SIMT kernels such as
    cutlass_80_simt_sgemm), not on the tensor cores. On an A100 or H100 the tensor cores' 16-bit peak is about
    fifteen times the CUDA cores' FP32 peak, so these GEMMs take several times longer than they need to, and
    the FP32 copies of their operands cost memory and bandwidth besides. The usual cause is an upcast: SDPA's
    math backend computes in FP32 (the message counts the aten::to/aten::_to_copy upcasts per forward), or
    code calls .float() before a matmul. The message says whether each GEMM ran inside the attention calls or
    outside them, with the op chain that launched it. Inside: use a fused backend (flash, memory-efficient,
    cuDNN), or find why none was eligible; torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True) lets
    the math backend compute in 16-bit. Outside: check whether FP32 is meant there (a rotary embedding's small GEMM is
    FP32 by design) or an accidental cast. GEMMs that all ran outside the attention calls and take under 2% of
    the instance's time (BY_DESIGN_SHARE) are reported as info: by design, and too small to act on.
    """,
    impact=_fp32_excess,
    settle=_fp32_by_design,
)
def _fp32_cuda_cores(ctx: FindingContext) -> str | None:
    if ctx.dtype not in SIXTEEN_BIT:
        return None
    gemms = _fp32_gemms(ctx)
    if not gemms:
        return None
    n = sum(k.count_per_forward for k in gemms)
    if n:
        lead = f"{n} GEMM kernel(s) per {ctx.unit} run"
    else:  # each ran in fewer than half of the forwards: their counts per forward are 0
        lead = f"In {ctx.every(max(k.forwards_run for k in gemms))}, GEMM kernels ran"
    message = (
        f"{lead} in FP32 on CUDA cores, without tensor cores ({_gemms_shown(ctx, gemms)}), although "
        f"the inputs are {DTYPE_LABEL.get(ctx.dtype, ctx.dtype)} ({ctx.dtype_source})"
    )
    upcasts = _upcasts_per_forward(ctx)
    if upcasts:
        count, how = upcasts
        message += (
            f"; {count} upcast cop{'y' if count == 1 else 'ies'} per {ctx.unit} ({how}) turn 16-bit tensors into FP32"
        )
    return message + "."


def _gemms_shown(ctx: FindingContext, gemms: list[KernelStats]) -> str:
    """The FP32 GEMMs named, with where they ran when the ledger tells."""
    placed = _gemm_placement(ctx, gemms)
    inside = {backend for _, backend, _ in placed or () if backend}
    if placed is not None and len(inside) == 1 and all(where == "inside" for where, _, _ in placed):
        return f"{listed([k.short_name for k in gemms], 2)}; all inside the attention calls ({inside.pop()})"
    if placed is not None:
        pairs = zip(gemms, placed, strict=True)
        return listed([f"{k.short_name}{_times(k.count_per_forward)} {text}" for k, (_, _, text) in pairs], 2)
    return listed([k.short_name for k in gemms], 2)


def _times(count: int) -> str:
    return f" x{count}" if count else ""


def _gemm_placement(ctx: FindingContext, gemms: list[KernelStats]) -> list[tuple[str, str, str]] | None:
    """For each GEMM: where its launches ran with respect to the attention calls the ledger found
    ("inside", "outside" or "partly", over all instances), their backends, and that said in words
    with the op chain that launched it most often; None without the ledger."""
    if ctx.attention is None:
        return None
    wanted = {k.name for k in gemms}
    backends: dict[str, Counter] = {name: Counter() for name in wanted}
    wanted_ids: set[int] | None = None  # their name ids in the trace's names (the calls' `names`)
    for m in ctx.per_forward:
        for call in m.attention.calls if m.attention is not None else ():
            if wanted_ids is None:
                wanted_ids = {n for n, name in enumerate(call.names) if name in wanted}
            if wanted_ids.isdisjoint(call.kernel_ids):
                continue
            for nid in call.kernel_ids:
                if nid in wanted_ids:
                    backends[call.names[nid]][call.backend] += 1
    placed = []
    for k in gemms:
        ran_inside = sum(backends[k.name].values())
        backend = ", ".join(sorted(backends[k.name], key=lambda b: -backends[k.name][b]))
        chain = f", launched by {k.launch_ops[0]}" if k.launch_ops else ""
        if ran_inside == 0:
            placed.append(("outside", backend, f"outside the attention calls{chain}"))
        elif ran_inside >= k.total_count:
            placed.append(("inside", backend, f"inside the attention calls ({backend})"))
        else:
            text = f"{ran_inside} of its {k.total_count} runs inside the attention calls ({backend}), the rest outside"
            placed.append(("partly", backend, text + chain))
    return placed


def _upcasts_per_forward(ctx: FindingContext) -> tuple[int, str] | None:
    count = median_count([m.upcasts for m in ctx.per_forward])
    if not count:
        return None
    typed = any(m.upcast_types_known for m in ctx.per_forward)
    return count, ("aten::to → aten::_to_copy from 16-bit" if typed else "aten::to/aten::_to_copy")


def _mask_time(ctx: FindingContext) -> float | NoImpact:
    """The mask ops' time per instance on the side that bounds it: their host (CPU) time where the CPU
    bounds the instance (as cpu-bound judges), else the device time of the kernels they launched."""
    if ctx.host_bound() is not False:  # the CPU bounds it, or there is no device work
        return median([m.mask_host_us for m in ctx.per_forward])
    device = [m.mask_device_us for m in ctx.per_forward]
    return NoImpact("no-device-work") if None in device else median(device)  # type: ignore[arg-type]


@RULES.rule(
    "mask-rebuilt",
    severity="problem",
    summary="The causal mask is built again in every forward (ones, tril/triu, where, scalar_tensor).",
    paragraph="""
    Every forward builds the attention mask from scratch: aten::ones, then tril or triu, often where and
    scalar_tensor, each an op on the CPU and a kernel on the GPU, writing a seq x seq tensor that attention then
    reads back. The mask depends only on the sequence length, so this is the same work every time: CPU time
    for the ops and their launches, GPU time and memory for the tensor. The message counts the ops and the
    kernels they launched per forward. Build the mask once (in setup, or cached per sequence length), or not at
    all: scaled_dot_product_attention(..., is_causal=True) on a fused backend (flash, memory-efficient, cuDNN)
    applies causality inside its kernel, with no mask tensor. SDPA's math backend is the exception: given
    is_causal=True it builds the mask itself on every call, so under aten::_scaled_dot_product_attention_math
    the cure is a fused backend. This finding covers the causal triangle (tril/triu) only; mask-build covers
    the other masks built in every forward (a FlexAttention BlockMask, a mask from index comparisons), with
    their host and device time, so no op is reported by both.
    """,
    impact=_mask_time,
)
def _mask_rebuilt(ctx: FindingContext) -> str | None:
    if not ctx.per_forward or any(not any(m.mask_ops[name] for name in MASK_CORE) for m in ctx.per_forward):
        return None  # the mask is not built in every forward
    kernel_counts: list[int] = []
    kernel_names: Counter[str] = Counter()
    for m in ctx.per_forward:
        if m.mask_kernels is not None:
            kernel_counts.append(len(m.mask_kernels))
            kernel_names.update(m.mask_kernels)
    per_op = {name: median_count([m.mask_ops[name] for m in ctx.per_forward]) for name in MASK_OPS}
    shown = ", ".join(f"{name} x{n}" for name, n in per_op.items() if n)
    message = f"Every {ctx.unit} builds the attention mask again: {shown} per {ctx.unit}"
    if kernel_counts and median_count(kernel_counts):
        message += (
            f", launching {median_count(kernel_counts)} kernels "
            f"({listed(sorted(kernel_names, key=lambda k: -kernel_names[k]), 4)})"
        )
    return message + "."


def _safety_time(ctx: FindingContext) -> float | NoImpact:
    """The device time per instance of the kernels aten::_safe_softmax launched beyond the softmax kernel itself."""
    extra = [m.safe_softmax_extra_us for m in ctx.per_forward if m.op_counts.get(SAFE_SOFTMAX)]
    return NoImpact("no-device-work") if not extra or None in extra else median(extra)  # type: ignore[arg-type]


@RULES.rule(
    "safe-softmax",
    severity="problem",
    summary="aten::_safe_softmax runs, with the kernels it launched beyond the softmax itself.",
    paragraph="""
    The softmax ran as aten::_safe_softmax, the form SDPA's math backend uses, with or without a mask: beyond
    the softmax it finds the rows in which every score is masked (isneginf, all, where) and writes 0 there
    instead of the NaN a plain softmax would give. That
    safety takes extra kernels and extra passes over the seq x seq scores in every forward (the message counts
    the kernels and names them). It comes with the math backend; the fused backends (flash, memory-efficient,
    cuDNN) handle fully masked rows inside their one kernel. If the math backend ran because no fused one was
    eligible, make one eligible: flash attention takes no mask tensor (pass is_causal=True instead of a causal
    mask), needs 16-bit inputs and a head size it supports; restricted to one backend with
    torch.nn.attention.sdpa_kernel, PyTorch warns why that backend cannot run.
    """,
    impact=_safety_time,
)
def _safe_softmax(ctx: FindingContext) -> str | None:
    with_op, kernel_counts, kernel_names = 0, [], []
    for m in ctx.per_forward:
        if not m.op_counts.get(SAFE_SOFTMAX):
            continue
        with_op += 1
        if m.safe_softmax_kernels is not None:
            kernel_counts.append(len(m.safe_softmax_kernels))
            for name in m.safe_softmax_kernels:
                if name not in kernel_names:
                    kernel_names.append(name)
    if not with_op:
        return None
    message = f"aten::_safe_softmax runs in {ctx.every(with_op)}"
    if kernel_counts and median_count(kernel_counts):
        message += (
            f" and launches {median_count(kernel_counts)} kernels ({listed(kernel_names, 5)}); "
            "beyond the softmax itself they find fully masked rows and write 0 there instead of NaN"
        )
    else:
        message += ", guarding fully masked rows against NaN with extra ops"
    return message + "."


@RULES.rule(
    "single-fused-kernel",
    severity="info",
    summary="Exactly one kernel per forward, and it is a fused attention kernel.",
    paragraph="""
    The whole forward is one fused attention kernel (FlashAttention, memory-efficient attention or cuDNN's):
    the scores never leave the chip, nothing is copied, no mask is built, nothing else is launched. This is
    the shape attention should have; what is left to tune is the kernel itself (its time, its occupancy) and
    what surrounds the region. A training step always has more than one kernel, so this finding appears only
    on forward-only instances.
    """,
)
def _single_fused_kernel(ctx: FindingContext) -> str | None:
    counts = [m.kernels for m in ctx.per_forward]
    if not counts or any(c != 1 for c in counts):
        return None
    kernels = [k for k in ctx.kernels if k.kind == "kernel"]
    if len(kernels) != 1:
        return None
    kernel = kernels[0]
    if kernel.family != "fused-attention":
        return None
    library = f", {kernel.library}" if kernel.library else ""
    return (
        f"Each {ctx.unit} runs exactly one kernel, the fused attention kernel {kernel.short_name} "
        f"({us(kernel.time_us)}{library})."
    )
