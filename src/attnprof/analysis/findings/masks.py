"""Findings on how attention got its mask and its backend: a dense mask handed to SDPA, a mask built
in every instance, SDPA's math backend on 16-bit inputs, and a mask converted on every call.

Read from the attention ledger only: its calls' input types and the work they ran outside their
backend (`ledger.CallFacts`), the masks each instance built outside its calls (`masks.MaskBuild`) and
those it converted for them (`mask_convert.MaskConvert`, in a CPU-only trace too: `FindingContext.ledgers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnprof.analysis.findings.registry import FindingContext, FindingRegistry, NoImpact, Said, listed, numbers, us
from attnprof.analysis.instance.call_names import SDPA_OP
from attnprof.analysis.instance.metrics import SIXTEEN_BIT, TRACE_DTYPES
from attnprof.analysis.short_names import short_kernel_name
from attnprof.stats import median, median_count

if TYPE_CHECKING:
    from attnprof.analysis.instance.ledger import CallFacts
    from attnprof.analysis.instance.mask_convert import MaskConvert
    from attnprof.analysis.instance.masks import MaskBuild

#: The rules of this module, in the order their findings are emitted.
RULES = FindingRegistry()
SHOWN = 3  # calls named in a message
#: `mask-build` fires when the mask's device time exceeds this share of the attention calls' own time
#: (as `attention-overhead` does for all the work beside them), or its host time exceeds all of it.
MASK_BUILD_SHARE = 0.10
DTYPE_LABEL = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64", "fp8": "fp8"}
#: The kernel that turns a boolean mask into an additive bias (torch's convert_boolean_attn_mask).
_WHERE = "where_kernel"


def _mask_label(mask_type: str) -> str:
    """ "boolean" or "bfloat16 (additive)" for an `Input type`."""
    if mask_type == "bool":
        return "boolean"
    dtype = TRACE_DTYPES.get(mask_type)
    return f"{DTYPE_LABEL.get(dtype, mask_type) if dtype else mask_type} (additive)"


def _dense_mask(call: CallFacts) -> bool:
    """True for an SDPA call given a mask tensor: its recorded 4th input, or without record_shapes the
    where kernel that converts a boolean mask, launched outside the backend's op."""
    if call.phase != "forward" or call.op != SDPA_OP:
        return False
    if call.mask_type is not None:
        return True
    return not call.input_types and any(_WHERE in call.names[n] for n in call.prep_ids)


def _counted(names: list[str]) -> str:
    """Kernel names, each once in order of first launch, with "xN" where it ran more than once."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return listed([f"{name} x{n}" if n > 1 else name for name, n in counts.items()], 3)


def _conversion_time(ctx: FindingContext) -> float | NoImpact:
    """The device time per instance of the kernels that convert the dense masks to the backend's form
    (not measured where no call converted one). The larger cost, every masked block computed, shows only
    against the alternative: in run and compare, once the is_causal or block-mask alternative has been
    measured, the impact becomes the latency it would save (the cell's latency less the fastest
    alternative's, in % of the cell's latency)."""
    per = [
        [c for c in (m.attention.calls if m.attention is not None else []) if _dense_mask(c)] for m in ctx.per_forward
    ]
    if not any(c.prep_ids for calls in per for c in calls):
        return NoImpact("needs-alternative")
    return median([sum(c.prep_time_us for c in calls) for calls in per])


@RULES.rule(
    "dense-mask",
    severity="problem",
    summary="scaled_dot_product_attention was given a dense mask tensor: converted every call, and no masked "
    "block skipped.",
    paragraph="""
    A scaled_dot_product_attention call received attn_mask as a tensor (a boolean or additive seq x seq mask)
    rather than is_causal=True. Two costs follow. First, the fused backends (cuDNN, memory-efficient) take
    the mask as an additive bias: a boolean mask is converted on every call (scalar_tensor, fill and where
    kernels under the SDPA op, beside the attention kernel), writing a new L x S tensor. Second, and larger,
    the kernel cannot know which blocks the mask empties: it reads the mask and computes every query x key
    block, so a causal or sliding-window mask given densely does the full L x S work where is_causal=True
    skips about half (flash cannot take a mask at all, so SDPA also loses that backend). The message names
    each call, the mask's type where record_shapes recorded it, the conversion's device time and kernels,
    and the attention's own time beside it; in run and compare, also the measured latency of the alternative
    at the same shape (is_causal for a mask that keeps exactly the causal pairs, FlexAttention's BlockMask
    otherwise), from a cell of the same run or timed for comparison; with analyze --time-fixes, is_causal (and
    on CUDA a BlockMask) timed at the recorded shape against the call as traced. Pass is_causal=True for a causal mask;
    for other structured masks (sliding window, documents, prefix) use FlexAttention with a BlockMask built
    once per shape (create_block_mask), which skips the empty blocks.
    """,
    impact=_conversion_time,
)
def _dense_mask_rule(ctx: FindingContext) -> str | None:
    found: dict[int, list[CallFacts]] = {}  # call position -> that call in each instance that gave it a mask
    with_mask = 0
    for m in ctx.per_forward:
        calls = m.attention.calls if m.attention is not None else []
        masked = [(k, c) for k, c in enumerate(calls) if _dense_mask(c)]
        with_mask += bool(masked)
        for k, call in masked:
            found.setdefault(k, []).append(call)
    if not found:
        return None
    groups: dict[tuple[object, ...], list[int]] = {}  # calls alike (the layers of a model): one part
    for k in sorted(found):
        first = found[k][0]
        groups.setdefault((first.backend, first.mask_type, first.prep_ids), []).append(k)
    parts = [_dense_mask_part(positions, found, ctx.unit) for positions in list(groups.values())[:SHOWN]]
    if len(groups) > SHOWN:
        parts.append(f"and {sum(len(p) for p in list(groups.values())[SHOWN:])} more")
    verb = "passes" if with_mask == len(ctx.per_forward) else "pass"
    return (
        f"{ctx.every(with_mask).capitalize()} {verb} a dense mask to scaled_dot_product_attention: "
        + "; ".join(parts)
        + ". The fused kernel reads the mask and computes every query x key block, masked or not; "
        "is_causal=True or a BlockMask (FlexAttention) skips the empty ones."
    )


def _dense_mask_part(positions: list[int], found: dict[int, list[CallFacts]], unit: str) -> str:
    """What the calls at `positions` (alike: backend, mask type and conversion kernels) got and what it cost."""
    calls = [c for k in positions for c in found[k]]
    call = calls[0]
    given = (
        f"a {_mask_label(call.mask_type)} mask (per its Input type)"
        if call.mask_type
        else "a boolean mask (its where kernel converts it; the trace has no Input type)"
    )
    one = len(positions) == 1
    text = f"call {positions[0] + 1}" if one else f"calls {_numbered(positions)}"
    text += f" ({call.backend}) got {given}" if one else f" ({call.backend}) each got {given}"
    prep = median([c.prep_time_us for c in calls])
    own = median([c.time_us - c.prep_time_us for c in calls])
    if call.prep_ids:
        kernels = _counted([short_kernel_name(call.names[n]) for n in call.prep_ids])
        converting, beside = ("converting it", "the attention's own") if one else ("converting each", "each call's own")
        return text + f"; {converting} takes {us(prep)} per {unit} ({kernels}) beside {beside} {us(own)}"
    return text + (f"; the call takes {us(own)} per {unit}" if one else f"; each call takes {us(own)} per {unit}")


def _numbered(positions: list[int]) -> str:
    """Call numbers (positions + 1): "1-4" when consecutive, else "1, 3 and 5"."""
    numbers = [p + 1 for p in positions]
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"


def _build_text(kind: str, builds: list[MaskBuild]) -> str:
    ops = median_count([b.ops for b in builds])
    if kind == "dense":
        return f"a dense mask ({ops} op{'s' if ops != 1 else ''} outside the attention calls)"
    if all(b.compiled for b in builds):
        return "a BlockMask (create_block_mask compiled: one graph of Inductor kernels)"
    return (
        f"a BlockMask (create_block_mask run eagerly: {ops} ops, the mask_mod vmapped over every index, "
        "sorts and copies)"
    )


def _build_time(ctx: FindingContext) -> float | NoImpact:
    """The mask builds' time per instance on the side that bounds it: their host (CPU) time where the
    CPU bounds the instance (as cpu-bound judges), else their device time."""
    per = [m.attention.masks if m.attention is not None else [] for m in ctx.per_forward]
    side = "host_us" if ctx.host_bound() is not False else "device_us"
    return median([sum(getattr(b, side) for b in builds) for builds in per])


@RULES.rule(
    "mask-build",
    severity="problem",
    summary="A BlockMask or dense mask is built in every instance: its host and device time against the attention's.",
    paragraph=f"""
    Every forward (or step) builds its attention mask again outside the attention calls: a FlexAttention
    BlockMask by create_block_mask (run eagerly it evaluates the mask_mod over every query and key index
    through vmap, then sums, sorts and copies the block map into index tensors; compiled it is one graph of
    small kernels), or a dense mask from index comparisons (arange, le/lt/eq, where). The mask depends only
    on the shape (and the documents or padding), so this is the same work every time, and it is mostly host
    time: many small ops and launches, during which the GPU idles. The message gives the host (CPU) time
    and the device time per instance and their multiples of the attention calls' own device time; it fires
    when the device time exceeds {MASK_BUILD_SHARE:.0%} of the attention's or the host time exceeds it all.
    Build the mask once per shape (before the loop, or cached by sequence length and document
    boundaries) and pass it in; for a plain causal mask use is_causal=True or a mask_mod without a tensor.
    Unlike mask-rebuilt, which reports the causal triangle (ones, tril/triu, where) that eager code or SDPA's
    math backend builds, this finding covers BlockMasks and masks built from other ops; attention-overhead
    counts the same device time among all the work beside the calls.
    """,
    impact=_build_time,
)
def _mask_build(ctx: FindingContext) -> str | None:
    ledger = ctx.attention
    per = [m.attention.masks if m.attention is not None else [] for m in ctx.per_forward]
    if ledger is None or not per or not all(per):
        return None  # not built in every instance
    host = median([sum(b.host_us for b in builds) for builds in per])
    device = median([sum(b.device_us for b in builds) for builds in per])
    kernel = ledger.kernel_time_us
    if kernel <= 0 or (device <= MASK_BUILD_SHARE * kernel and host <= kernel):
        return None
    kinds = [kind for kind in ("BlockMask", "dense") if any(b.kind == kind for builds in per for b in builds)]
    what = " and ".join(_build_text(kind, [b for builds in per for b in builds if b.kind == kind]) for kind in kinds)
    unit = ctx.unit
    return (
        f"Every {unit} builds {what}: {us(host)} of host time and {us(device)} of device time per {unit}, "
        f"{host / kernel:,.1f}x and {device / kernel:,.1f}x the attention calls' own {us(kernel)}. "
        "Build it once per shape and pass it in."
    )


def _input_dtype(call: CallFacts, ctx: FindingContext) -> tuple[str | None, str | None]:
    """The dtype of a call's query and where it was read: its own Input type, else the analysis'."""
    if call.input_types:
        dtype = TRACE_DTYPES.get(call.input_types[0])
        return dtype, "per its Input type"
    return ctx.dtype, ctx.dtype_source


def _fallback_excess(ctx: FindingContext) -> float | NoImpact:
    """The math calls' device time per instance beyond their roofline bound: the larger of their FLOPs
    at the measured matmul ceiling (without one, the 16-bit tensor peak the ledger compares with: cached
    for this GPU, else its datasheet's) and their bytes at the read bandwidth (not measured without
    recorded shapes)."""
    ledger = ctx.attention
    if ledger is None:
        return NoImpact("no-device-work")
    ceiling = ctx.ceiling_tflops or (ledger.peaks.tensor_tflops if ledger.peaks is not None else None)
    calls = [c for c in ledger.calls if c.phase == "forward" and c.backend == "math"]
    if not calls or any(c.traffic is None for c in calls):
        return NoImpact("needs-record-shapes")
    if not ceiling:
        return NoImpact("needs-peaks")
    read = ledger.read_bandwidth_gbps
    excess = 0.0
    for call in calls:
        traffic = call.traffic
        assert traffic is not None
        bound = max(traffic.flops / (ceiling * 1e6), traffic.bytes / (read * 1e3) if read else 0.0)
        excess += max(call.time_us - bound, 0.0)
    return excess


@RULES.rule(
    "backend-fallback",
    severity="problem",
    summary="scaled_dot_product_attention ran its math backend on the GPU with 16-bit inputs: no fused backend "
    "took them.",
    paragraph="""
    On a GPU with bfloat16 or float16 inputs, scaled_dot_product_attention should run a fused kernel (flash,
    memory-efficient or cuDNN), yet a call ran the math backend: the scores written out as a seq x seq tensor,
    upcasts to FP32, separate matmul, softmax and mask kernels, several times the time and memory of a fused
    kernel. Either code pinned it (sdpa_kernel(SDPBackend.MATH)), or every fused backend refused the inputs:
    an attn_mask that requires grad, a head dim a backend does not support, dropout on some backends, GQA
    (enable_gqa) where a backend lacks it, non-contiguous or oddly strided inputs, a dtype mismatch between q,
    k and v, or a build without the backend. The message names each call, its dtype and its device time.
    To find the reason, pin the backend you expect with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    (or EFFICIENT_ATTENTION, CUDNN_ATTENTION): the call then raises "No available kernel" after UserWarnings
    that say why each backend refused (run with warnings enabled). Fix that input, or use FlexAttention for
    what SDPA's fused backends cannot express.
    """,
    impact=_fallback_excess,
)
def _backend_fallback(ctx: FindingContext) -> str | None:
    ledger = ctx.attention
    if ledger is None:
        return None
    found = []
    for k, call in enumerate(ledger.calls):
        if call.phase != "forward" or call.backend != "math":
            continue
        dtype, source = _input_dtype(call, ctx)
        if dtype in SIXTEEN_BIT:
            found.append((k, call, dtype, source))
    if not found:
        return None
    with_math = sum(
        1
        for m in ctx.per_forward
        if m.attention is not None and any(c.phase == "forward" and c.backend == "math" for c in m.attention.calls)
    )
    unit = ctx.unit
    verb = "runs" if with_math == len(ctx.per_forward) else "run"
    parts = [
        f"call {k + 1} on {DTYPE_LABEL[dtype]} inputs ({source}): {us(call.time_us)} per {unit} in "
        f"{len(call.kernel_ids)} kernels"
        for k, call, dtype, source in found[:SHOWN]
    ]
    if len(found) > SHOWN:
        parts.append(f"and {len(found) - SHOWN} more")
    return (
        f"{ctx.every(with_math).capitalize()} {verb} SDPA's math backend on the GPU with 16-bit inputs, "
        "where a fused backend runs one kernel: " + "; ".join(parts) + ". Pinning a fused backend with "
        "sdpa_kernel makes torch say why it refused the inputs."
    )


def _converts(ctx: FindingContext) -> list[list[MaskConvert]] | None:
    """Each instance's mask conversions (see `mask_convert`), None unless every instance has a ledger
    and converts a mask."""
    ledgers = ctx.ledgers()
    if not ledgers or any(ledger is None or not ledger.converts for ledger in ledgers):
        return None
    return [ledger.converts for ledger in ledgers if ledger is not None]


def _convert_time(ctx: FindingContext) -> float:
    """The mask conversions' time per instance on the side that bounds it: their host (CPU) time where the
    CPU bounds the instance (as cpu-bound judges) or the trace has no device work, else their device time."""
    per = _converts(ctx)
    if per is None:
        return 0.0
    if ctx.host_bound() is not False:
        return median([sum(c.host_us for c in converts) for converts in per])
    return median([sum(c.device_us or 0.0 for c in converts) for converts in per])


def _convert_text(convert: MaskConvert, count: int, calls: list[int], backends: list[str], unit: str) -> str:
    """One kind of conversion in words: its op chain, tensor, count per instance and the calls it feeds."""
    dims = "x".join(map(str, convert.dims)) if convert.dims else None
    what = ", ".join(part for part in (dims, convert.types) if part)
    where = "inside" if convert.inside else "before"
    fed = listed([str(k + 1) for k in calls], 6)
    backend = ", ".join(dict.fromkeys(backends[k] for k in calls if k < len(backends)))
    return (
        f"{convert.kind}: {convert.chain}{f' of {what}' if what else ''} x{count} per {unit}, {where} "
        f"call{'s' if len(calls) > 1 else ''} {fed}{f' ({backend})' if backend else ''}"
    )


@RULES.rule(
    "mask-convert",
    severity="problem",
    summary="The attention mask is converted (dtype, device or expanded) again on every call: the ops and their time.",
    paragraph="""
    Every instance converts its attention mask again before the attention applies it: a cast to another
    dtype (a float mask to bool for nn.MultiheadAttention's and nn.TransformerEncoderLayer's fast path,
    an FP32 mask to the model's 16-bit dtype), a copy to the device, a broadcast mask expanded and copied
    to the full batch x heads x seq x seq size, or a boolean mask filled into an additive one. The mask is
    the same every time, so this is the same work every call: a seq x seq tensor (or larger) written and
    read again, host time for the ops and device time for their kernels. The rule: a cast, an expand
    followed by a copy, or a masked_fill of a fresh tensor, inside an attention call or before it in the
    same instance, whose tensor has (or broadcasts to) the dims of a mask the call takes (record_shapes);
    without recorded shapes, a cast inside a fused module's call (aten::_native_multi_head_attention,
    aten::_transformer_encoder_layer_fwd), which casts nothing but its mask. It fires when every instance
    converts one. The message names each conversion with its op chain, the tensor's dims and dtypes where
    recorded, the call it feeds, and their host and device time per instance. Build the mask once in the
    dtype, on the device and in the shape the attention op takes, or drop it for is_causal=True where the
    op applies causality itself (scaled_dot_product_attention). nn.TransformerEncoder's fast path converts
    any mask it is given (a boolean one to float first, then to bool inside each layer), so there the
    conversion is the price of passing a mask at all. SDPA's own conversion of a boolean mask to its bias
    is dense-mask's; attention-overhead counts casts beside the calls among all the work there.
    """,
    impact=_convert_time,
)
def _mask_convert(ctx: FindingContext) -> Said | None:
    per = _converts(ctx)
    if per is None:
        return None
    unit = ctx.unit
    groups: dict[tuple, list[int]] = {}  # conversion -> its count in each instance
    fed: dict[tuple, list[int]] = {}  # conversion -> the calls it feeds, in order
    sample: dict[tuple, MaskConvert] = {}
    for k, converts in enumerate(per):
        for c in converts:
            key = (c.kind, c.chain, c.dims, c.types, c.inside)
            groups.setdefault(key, [0] * len(per))[k] += 1
            sample.setdefault(key, c)
            calls = fed.setdefault(key, [])
            if c.call not in calls:
                calls.append(c.call)
    ledgers = [ledger for ledger in ctx.ledgers() if ledger is not None]
    backends = [call.backend for call in ledgers[0].forward_calls]
    parts = [
        _convert_text(sample[key], median_count(counts) or 1, fed[key], backends, unit)
        for key, counts in list(groups.items())[:SHOWN]
    ]
    if len(groups) > SHOWN:
        parts.append(f"and {len(groups) - SHOWN} more")
    count = median_count([len(converts) for converts in per])
    host = median([sum(c.host_us for c in converts) for converts in per])
    on_device = all(c.device_us is not None for converts in per for c in converts)
    device = median([sum(c.device_us or 0.0 for c in converts) for converts in per]) if on_device else None
    times = f"{us(host)} of host time" + (f" and {us(device)} of device time" if device is not None else "")
    share = 100.0 * host / ctx.cpu_time_us if ctx.cpu_time_us > 0 else None
    of_host = f" ({share:.1f}% of the {unit}'s CPU time)" if share is not None else ""
    message = (
        f"Every {unit} converts the attention mask again: {count} conversion(s) per {unit}, {times}{of_host}: "
        + "; ".join(parts)
        + ". Build the mask once in the form the attention op takes, or pass is_causal=True where it applies causality."
    )
    evidence = numbers(conversions=count, host_us=host, device_us=device, host_pct=share)
    return message, evidence
