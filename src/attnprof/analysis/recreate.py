"""The work a finding names, and the fixes it proposes, re-created from what a trace recorded, for timing
(`analyze --time-fixes`, `pipeline.fixes`). Pure: no torch here; `pipeline.fixes` runs what this describes.

An op is re-created from its `Input Dims`, `Input type` and `Concrete Inputs` (record_shapes; the trace
loaded with `every_concrete_input`): a fresh tensor of each recorded dims and dtype, each scalar as
recorded (`RecordedOp`). A `Replay` runs ops one after another, each on its own inputs. Per finding, each
distinct call (or GEMM, or conversion) it names becomes a `Piece`, with how often an instance runs it:

- `unfused-attention`: the eager call's outermost ops that do work (the matmuls, scaling, masking,
  softmax, casts, and the copies inside a contiguous or reshape; views are left out) as traced; the fix,
  scaled_dot_product_attention at the call's q, k, v (and its mask, given densely as the eager code
  applied it), per fused backend on CUDA (`sdpa-flash`, `sdpa-cudnn`, `sdpa-efficient`), torch's choice
  on the CPU (`sdpa`);
- `dense-mask`: the SDPA call with its mask as traced (the mask's values are not recorded: it is
  re-created causal, bool or additive as traced); the fix, the same call with is_causal=True (a mask of
  queries x keys only) and, on CUDA, FlexAttention with a causal BlockMask built once;
- `mask-convert`: the conversion and the call it feeds (or the call converting its mask inside); the fix,
  the call given the mask already converted (`mask converted once`);
- `backend-fallback`: the SDPA call pinned to its math backend; the fix, each fused backend pinned;
- `fp32-cuda-cores`: each FP32 GEMM's op; the fix, the same op on bfloat16 inputs (`bf16 GEMM`).

`mask-rebuilt` and `mask-build` are not re-created: the mask's values and a BlockMask's mask_mod are
Python the trace does not record; their plans say so (`FixPlan.reason`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attnprof.analysis.instance.call_names import SDPA_OP
from attnprof.analysis.instance.mask_convert import MASK_INPUTS, broadcasts_to
from attnprof.analysis.trace.tables import ParsedTrace

if TYPE_CHECKING:
    from attnprof.analysis.analyze import TraceAnalysis
    from attnprof.analysis.instance.ledger import CallFacts, ForwardLedger

#: The findings whose fix can be timed, in the order their plans are made.
FIXABLE = (
    "unfused-attention",
    "dense-mask",
    "mask-rebuilt",
    "mask-build",
    "mask-convert",
    "backend-fallback",
    "fp32-cuda-cores",
)
NO_SHAPES = "the trace recorded no input shapes: profile with record_shapes=True to time the fix"
BF16 = "c10::BFloat16"
FP32 = "float"
#: SDPA's fused backends on CUDA, as the alternatives name them.
CUDA_BACKENDS = {"sdpa-flash": "flash", "sdpa-cudnn": "cudnn", "sdpa-efficient": "efficient"}
IS_CAUSAL = "sdpa is_causal"
FLEX_BLOCK_MASK = "flex BlockMask"
MASK_ONCE = "mask converted once"
BF16_GEMM = "bf16 GEMM"
_IS_CAUSAL_AT, _MASK_AT = 5, 3  # SDPA's is_causal and attn_mask among its inputs
#: Ops that only make views or allocate: left out of an eager call's replay (they launch no work).
VIEW_OPS = frozenset(
    {
        "aten::view",
        "aten::reshape",
        "aten::_reshape_alias",
        "aten::_unsafe_view",
        "aten::expand",
        "aten::as_strided",
        "aten::transpose",
        "aten::t",
        "aten::permute",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::select",
        "aten::slice",
        "aten::narrow",
        "aten::alias",
        "aten::detach",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::lift_fresh",
        "aten::split",
        "aten::unbind",
        "aten::chunk",
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
    }
)
#: Ops whose work depends on their input's strides (a copy of a strided tensor, none of a contiguous one): the
#: ops inside them are re-created instead.
_BY_STRIDES = frozenset({"aten::contiguous", "aten::reshape", "aten::flatten"})
_DESCEND = VIEW_OPS | _BY_STRIDES
_GEMM_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear"})


@dataclass(frozen=True)
class RecordedOp:
    """One op as the trace recorded it: its name and, per input, its dims (a tuple of ints for a tensor,
    () for a scalar or none), its type (`Input type`: "float", "c10::BFloat16", "Scalar", "" for none) and
    its concrete value as text (`Concrete Inputs`: "True", "64", "[2, 4]", "" for a tensor or none)."""

    name: str
    dims: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]
    concrete: tuple[str, ...]

    def with_input(self, at: int, dims: tuple[int, ...], type_: str, concrete: str = "") -> RecordedOp:
        """The same op with input `at` replaced."""
        dims_, types, values = list(self.dims), list(self.types), list(self.concrete)
        dims_[at], types[at], values[at] = dims, type_, concrete
        return replace(self, dims=tuple(dims_), types=tuple(types), concrete=tuple(values))

    def cast(self, from_type: str, to_type: str) -> RecordedOp:
        """The same op with every tensor input of `from_type` of `to_type` instead."""
        types = tuple(to_type if t == from_type and d else t for t, d in zip(self.types, self.dims, strict=True))
        return replace(self, types=types)

    @property
    def text(self) -> str:
        """`aten::bmm(8x64x16 float, 8x16x64 float)`: the op and its tensor inputs."""
        tensors = [f"{'x'.join(map(str, d))} {t}" for d, t in zip(self.dims, self.types, strict=True) if d]
        return f"{self.name}({', '.join(tensors)})"


def recorded_op(trace: ParsedTrace, op: int) -> RecordedOp | None:
    """The op `op` as recorded, None where it recorded no shapes, types or (with a scalar input) concrete
    inputs."""
    if op < 0:
        return None
    dims = trace.input_dims_of(op)
    at = trace.cpu_ops.input_types[op]
    if dims is None or at < 0:
        return None
    types = tuple(str(t) for t in trace.input_types[at])
    concrete = trace.concrete_inputs_of(op)
    if concrete is None:
        if any(t in ("Scalar", "ScalarList") for t in types):
            return None
        concrete = [""] * len(types)
    if not (len(dims) == len(types) == len(concrete)):
        return None
    shaped = tuple(tuple(d) if isinstance(d, list) and all(isinstance(x, int) for x in d) else () for d in dims)
    return RecordedOp(trace.names[trace.cpu_ops.name[op]], shaped, types, tuple(str(c) for c in concrete))


@dataclass(frozen=True)
class Replay:
    """Work to time: `ops` run one after another, each on fresh inputs of its recorded dims and types; with
    `backend`, under SDPA's backend of that name ("math", "flash", "cudnn", "efficient"; None: torch's
    choice); with `flex`, FlexAttention with a causal BlockMask (built once, outside the timing) over the
    q, k and v of its one SDPA op instead."""

    ops: tuple[RecordedOp, ...]
    backend: str | None = None
    flex: bool = False


def known_refusal(replay: Replay, cuda: bool) -> str | None:
    """Why torch refuses `replay`, where its recorded inputs alone say so (None: not known): on CUDA, SDPA's
    flash backend takes no attn_mask, and a refused call would only print torch's own warnings."""
    masked = any(op.name == SDPA_OP and len(op.dims) > 3 and op.dims[3] != () for op in replay.ops)
    if cuda and replay.backend == "flash" and masked:
        return "takes no attn_mask (torch's flash backend; the call passes a dense mask)"
    return None


@dataclass(frozen=True)
class Piece:
    """One distinct call (GEMM, conversion) a finding names, run `count` times per instance: the work as
    traced (`before`) and each alternative the finding proposes, by name."""

    what: str
    count: float
    before: Replay
    alternatives: tuple[tuple[str, Replay], ...]


@dataclass(frozen=True)
class FixPlan:
    """What to time for one finding: its pieces, or why it cannot be re-created (`reason`, no pieces)."""

    finding: str
    pieces: tuple[Piece, ...] = ()
    reason: str | None = None


def fix_plans(analysis: TraceAnalysis, trace: ParsedTrace, cuda: bool) -> list[FixPlan]:
    """The plans of the analysis' findings that propose a fix (`FIXABLE`), in that order; `cuda`: the
    alternatives of a CUDA trace (its fused backends, flex) rather than a CPU trace's."""
    present = {f.id for f in analysis.findings}
    ledgers = [m.attention if m.attention is not None else m.cpu_attention for m in analysis.per_forward]
    instances = max(len(analysis.per_forward), 1)
    plans = []
    for finding in FIXABLE:
        if finding not in present:
            continue
        if not trace.input_dims:
            plans.append(FixPlan(finding, reason=NO_SHAPES))
            continue
        if finding == "fp32-cuda-cores":
            pieces = _gemm_pieces(analysis, trace, instances)
        elif finding in ("mask-rebuilt", "mask-build"):
            plans.append(FixPlan(finding, reason=_NOT_RECREATED[finding]))
            continue
        else:
            pieces = _call_pieces(finding, ledgers, trace, instances, cuda)
        plans.append(pieces if isinstance(pieces, FixPlan) else FixPlan(finding, tuple(pieces)))
    return plans


_NOT_RECREATED = {
    "mask-rebuilt": "not re-created: the trace records the mask ops' shapes but not the code that builds the "
    "mask, and the fix (the mask built once) is that code moved out of the forward",
    "mask-build": "not re-created: a BlockMask's mask_mod (or a mask's index arithmetic) is Python the trace "
    "does not record",
}


def _call_pieces(
    finding: str, ledgers: list[ForwardLedger | None], trace: ParsedTrace, instances: int, cuda: bool
) -> list[Piece] | FixPlan:
    """The pieces of a finding on attention calls: each distinct call (conversion) with its count."""
    counts: Counter[Piece | str] = Counter()
    for ledger in ledgers:
        if ledger is None:
            continue
        if finding == "mask-convert":
            for convert in ledger.converts:
                counts[_convert_piece(trace, convert.op, ledger.forward_calls[convert.call], convert.inside)] += 1
            continue
        for call in ledger.forward_calls:
            made = _piece(finding, trace, call, cuda)
            if made is not None:
                counts[made] += 1
    failed = [key for key in counts if isinstance(key, str)]
    if failed:
        return FixPlan(finding, reason=failed[0])
    if not counts:
        return FixPlan(finding, reason="no call of the finding could be found again in the ledger")
    return [replace(piece, count=n / instances) for piece, n in counts.items() if isinstance(piece, Piece)]


def _piece(finding: str, trace: ParsedTrace, call: CallFacts, cuda: bool) -> Piece | str | None:
    """The piece of one call for `finding`, a reason where its shapes are missing, None for a call the
    finding does not name."""
    if finding == "unfused-attention":
        return _eager_piece(trace, call, cuda) if call.backend == "eager" else None
    if call.op != SDPA_OP:
        return None
    if finding == "dense-mask" and call.mask_type is not None:
        return _dense_piece(trace, call, cuda)
    if finding == "backend-fallback" and call.backend == "math":
        op = recorded_op(trace, call.first_op)
        if op is None:
            return NO_SHAPES
        fused = tuple((name, Replay((op,), backend)) for name, backend in CUDA_BACKENDS.items())
        return Piece(f"call {op.text}", 1.0, Replay((op,), "math"), fused)
    return None


def _sdpa_alternatives(op: RecordedOp, cuda: bool) -> tuple[tuple[str, Replay], ...]:
    if cuda:
        return tuple((name, Replay((op,), backend)) for name, backend in CUDA_BACKENDS.items())
    return (("sdpa", Replay((op,))),)


def _working_ops(trace: ParsedTrace, ops: list[int]) -> list[int]:
    """The ops of `ops` (one thread's, nested by time) that do the work, in order: the outermost ones, except
    that a view or a copy whose cost depends on its input's strides (`VIEW_OPS`, `_BY_STRIDES`) gives way to
    the ops inside it (a clone, a copy_), and a view with nothing inside is left out."""
    ts, dur, name = trace.cpu_ops.ts, trace.cpu_ops.dur, trace.cpu_ops.name
    chosen: list[int] = []
    open_: list[int] = []  # the ops around the current one, outermost first
    for op in sorted(ops, key=lambda o: (ts[o], -dur[o])):
        while open_ and ts[op] >= ts[open_[-1]] + dur[open_[-1]]:
            open_.pop()
        inside_work = any(trace.names[name[o]] not in _DESCEND for o in open_)
        if not inside_work and trace.names[name[op]] not in _DESCEND:
            chosen.append(op)
        open_.append(op)
    return chosen


def _eager_piece(trace: ParsedTrace, call: CallFacts, cuda: bool) -> Piece | str:
    """An eager call: its working ops as traced; SDPA at its q, k, v (and mask) as the fix."""
    head, tail = recorded_op(trace, call.first_op), recorded_op(trace, call.last_op)
    if head is None or tail is None or len(head.dims) < 2 or len(tail.dims) < 2:
        return NO_SHAPES
    work = []
    for op in _working_ops(trace, list(call.op_ids)):
        found = recorded_op(trace, op)
        if found is None:
            return NO_SHAPES
        work.append(found)
    q, kt, v = head.dims[0], head.dims[1], tail.dims[1]
    if len(q) not in (3, 4) or len(kt) != len(q) or len(v) != len(q):
        return f"the eager call's matmuls do not read as attention ({head.text}, {tail.text})"
    k = kt[:-2] + (kt[-1], kt[-2])
    mask, mask_type = _eager_mask(trace, call, q[:-1] + (k[-2],))
    if len(q) == 3:  # batch x heads flattened: one batch of that many heads
        q, k, v = (1, *q), (1, *k), (1, *v)
        mask = (1, *mask) if mask else mask
    gqa = "True" if q[1] != k[1] else "False"
    sdpa = RecordedOp(
        SDPA_OP,
        (q, k, v, mask, (), (), (), ()),
        (head.types[0], head.types[1], tail.types[1], mask_type, "Scalar", "Scalar", "", "Scalar"),
        ("", "", "", "", "0.0", "False", "", gqa),
    )
    shape = "x".join(map(str, q))
    return Piece(f"eager call at {shape} {head.types[0]}", 1.0, Replay(tuple(work)), _sdpa_alternatives(sdpa, cuda))


def _eager_mask(trace: ParsedTrace, call: CallFacts, scores: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The mask an eager call applied to its scores (dims, type), as SDPA takes it; ((), "") without one."""
    for op in call.op_ids:
        name = trace.names[trace.cpu_ops.name[op]]
        at = MASK_INPUTS.get(name)
        if at is None or name == SDPA_OP:
            continue
        found = recorded_op(trace, op)
        if found is None or len(found.dims) <= at or not found.dims[at] or len(found.dims[at]) < 2:
            continue
        dims, type_ = found.dims[at], found.types[at]
        if broadcasts_to(dims, scores):
            return dims, type_
    return (), ""


def _dense_piece(trace: ParsedTrace, call: CallFacts, cuda: bool) -> Piece | str:
    """An SDPA call given a dense mask: as traced (the mask re-created causal), and without it."""
    op = recorded_op(trace, call.first_op)
    if op is None or len(op.dims) <= _IS_CAUSAL_AT:
        return NO_SHAPES
    q, k, mask = op.dims[0], op.dims[1], op.dims[_MASK_AT]
    alternatives: list[tuple[str, Replay]] = []
    if len(q) == 4 and mask and mask[-2:] == (q[-2], k[-2]):
        causal = op.with_input(_MASK_AT, (), "").with_input(_IS_CAUSAL_AT, (), "Scalar", "True")
        alternatives.append((IS_CAUSAL, Replay((causal,))))
    if cuda and len(q) == 4:
        alternatives.append((FLEX_BLOCK_MASK, Replay((op,), flex=True)))
    if not alternatives:
        return f"the mask ({'x'.join(map(str, mask))}) is not queries x keys and flex needs CUDA: no alternative"
    return Piece(f"call {op.text}", 1.0, Replay((op,)), tuple(alternatives))


def _convert_piece(trace: ParsedTrace, convert_op: int, call: CallFacts, inside: bool) -> Piece | str:
    """A mask conversion and the call it feeds: both as traced, and the call given the converted mask."""
    converting, op = recorded_op(trace, convert_op), recorded_op(trace, call.first_op)
    if converting is None or op is None:
        return NO_SHAPES
    if not inside:
        return Piece(
            f"{converting.text} before {op.name}", 1.0, Replay((converting, op)), ((MASK_ONCE, Replay((op,))),)
        )
    at = MASK_INPUTS.get(op.name)
    target = _converted_type(converting)
    if at is None or len(op.dims) <= at or not op.dims[at] or target is None:
        return f"the conversion inside {op.name} ({converting.text}) cannot be moved out of it"
    once = op.with_input(at, op.dims[at], target)
    return Piece(f"{op.text} converting its mask", 1.0, Replay((op,)), ((MASK_ONCE, Replay((once,))),))


#: ATen's ScalarType codes (c10/core/ScalarType.h) of the dtypes a mask is cast to, as `Input type` spells them.
_SCALAR_TYPES = {5: "c10::Half", 6: "float", 7: "double", 11: "bool", 15: BF16}
_DTYPE_AT = {"aten::to": 1, "aten::_to_copy": 1}


def _converted_type(converting: RecordedOp) -> str | None:
    """The type a cast (aten::to, aten::_to_copy) makes of its input, from its dtype argument."""
    at = _DTYPE_AT.get(converting.name)
    if at is None or len(converting.concrete) <= at:
        return None
    try:
        return _SCALAR_TYPES.get(int(converting.concrete[at]))
    except ValueError:
        return None


def _gemm_pieces(analysis: TraceAnalysis, trace: ParsedTrace, instances: int) -> list[Piece] | FixPlan:
    """Each distinct op that launched an FP32 CUDA-core GEMM, as traced and on bfloat16 inputs."""
    counts: Counter[RecordedOp] = Counter()
    for kernel in analysis.kernels:
        if kernel.family != "gemm" or kernel.tensor_cores is not False:
            continue
        for op in kernel.launch_op_ids:
            found = recorded_op(trace, op)
            if found is None:
                return FixPlan("fp32-cuda-cores", reason=NO_SHAPES)
            if found.name not in _GEMM_OPS or FP32 not in found.types:
                return FixPlan("fp32-cuda-cores", reason=f"{found.name} is not a GEMM op on float32 inputs")
            counts[found] += 1
    if not counts:
        return FixPlan("fp32-cuda-cores", reason="the GEMM kernels were launched under no op the trace recorded")
    return [
        Piece(op.text, n / instances, Replay((op,)), ((BF16_GEMM, Replay((op.cast(FP32, BF16),))),))
        for op, n in counts.items()
    ]


def parse_concrete(text: str) -> Any:
    """A `Concrete Inputs` text as its value: a bool, an int, a float, a list ("[2, 4]"), or None ("")."""
    if text in ("", "None"):
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return json.loads(text)
    except ValueError:
        return text
