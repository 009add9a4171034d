"""One step of a cell's mode, built in one place: the no-argument callable that timing and profiling
take unchanged, and what correctness and memory need beside it.

* `fwd`: the variant's forward; it returns the output, as before modes existed.
* `bwd`: the forward runs once, untimed, on q, k, v made with `requires_grad=True`; the step is
  `torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)` on that graph, so only the
  backward is timed and nothing accumulates into `.grad`.
* `fwd+bwd`: the forward, then `torch.autograd.grad(out, (q, k, v), grad_out)`: a whole step.

`grad_out` is seeded standard-normal in the output's shape, made once outside the timed region.
The backward modes' steps return a `StepOutput` (the forward output and the three gradients).
A `sinks` cell's sink logits (`inputs.make_sinks`) are made with q, k, v and passed to the forward as
`sinks=`; in the backward modes they require grad too, and the step returns their gradient as well.

torch.compile'd variants (`flex`, `compiled`) and `retain_graph=True`: AOTAutograd "donates" the
buffers a compiled backward saves, and refuses a backward that keeps its graph ("compiled with
non-empty donated buffers which requires ... retain_graph=False"). In the `bwd` mode the whole
cell therefore runs under `torch._functorch.config.donated_buffer = False` (`graph_retention`):
the forward compiles without donated buffers and the backward may run again on the same graph.
The cost: a compiled backward in `bwd` keeps its saved buffers until the graph is freed (it does
not free them as it goes), which `fwd+bwd`, where the graph is used once and donation stays on, does
not.

Some backwards cannot run twice on one graph at all (`Variant.repeatable_backward=False`: the
`compiled` variant's backward mutates what its forward saved, giving NaN or "modified by an inplace
operation" on the second run). For those, `bwd` has a `prepare` step: an untimed, unprofiled forward
before each timed backward, which then frees its graph (`retain_graph=False`). Timing runs `prepare`
outside the CUDA events and cannot use a CUDA graph; the profiler runs it outside the region.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple

from attnprof.errors import VariantUnavailableError
from attnprof.registry import NO_BACKWARD, RunSpec, Variant

GRAD_SEED_OFFSET = 1  # grad_out's generator seed = the inputs' seed + this, so the two differ


class StepOutput(NamedTuple):
    """What a backward-mode step returns: the forward output, (dq, dk, dv) in the variant's layout and,
    for a `sinks` cell, the sink logits' gradient (heads,)."""

    out: Any
    grads: tuple[Any, Any, Any]
    sink_grad: Any = None


@dataclass
class Step:
    """A cell's step: `call` is timed and profiled; `whole` runs one forward and backward (what peak
    memory measures in the backward modes); `inputs` are q, k, v and `grad_out` the output gradient
    (None in `fwd`); `prepare`, when set, must run untimed before each `call` (see the module
    docstring). `input_bytes`: what its inputs occupy (q, k, v, grad_out, and what the variant's
    `prepare_inputs` allocated on a GPU: a paged pool); `replica` (set by `cell_step`) builds the same step
    over a fresh copy of the inputs, for `--cold-l2 rotate`; `sinks` a `sinks` cell's sink logits."""

    mode: str
    call: Callable[[], Any]
    whole: Callable[[], Any]
    inputs: tuple[Any, Any, Any]
    grad_out: Any = None
    prepare: Callable[[], Any] | None = None
    input_bytes: int = 0
    replica: Callable[[], Step] | None = None
    sinks: Any = None
    fp8: Any = None  # an fp8 cell's `profiling.fp8.Fp8State` (its quantized inputs, the output's descale)


@contextlib.contextmanager
def graph_retention(mode: str) -> Iterator[None]:
    """In `bwd`, let compiled backwards run with `retain_graph=True` (the module docstring says
    why); in the other modes, change nothing."""
    if mode != "bwd":
        yield
        return
    try:
        import torch._functorch.config as functorch_config
    except ImportError:  # a torch without AOTAutograd has no donated buffers either
        yield
        return
    if not hasattr(functorch_config, "donated_buffer"):
        yield
        return
    with functorch_config.patch(donated_buffer=False):
        yield


def _grads(out: Any, inputs: tuple[Any, ...], grad_out: Any, retain: bool) -> tuple[Any, ...]:
    """The gradients of `inputs` (dq, dk, dv, and dsinks when the sinks are among them) of `out` against
    `grad_out`; a forward whose output tracks no gradient, or
    whose backward is not implemented, is skipped as 'no backward'."""
    import torch

    if out.grad_fn is None:
        raise VariantUnavailableError(f"{NO_BACKWARD} (the output does not track gradients)")
    try:
        return torch.autograd.grad(out, inputs, grad_out, retain_graph=retain)
    except (NotImplementedError, RuntimeError) as exc:
        if "not implemented" in str(exc).lower():
            raise VariantUnavailableError(f"{NO_BACKWARD} ({str(exc).strip().splitlines()[0]})") from None
        raise


def build_step(
    spec: RunSpec,
    forward: Callable[[Any, Any, Any], Any],
    inputs: tuple[Any, Any, Any],
    seed: int,
    repeatable_backward: bool = True,
    sinks: Any = None,
) -> Step:
    """The step of `spec.mode` for `forward(q, k, v)` (which passes `sinks`, when given, to the variant
    itself); everything it needs is prepared here, outside the timed region: in the backward modes q, k, v
    (and `sinks`) get `requires_grad=True`, `grad_out` is drawn,
    and in `bwd` the forward whose graph the backward reuses runs once (or, when the backward is not
    `repeatable_backward`, before each backward, as the step's `prepare`)."""
    import torch

    q, k, v = inputs
    if not spec.backward:

        def call() -> Any:
            return forward(q, k, v)

        return Step(spec.mode, call, call, inputs, sinks=sinks)
    leaves = inputs if sinks is None else (*inputs, sinks)
    for tensor in leaves:
        tensor.requires_grad_(True)
    generator = torch.Generator(device=q.device).manual_seed(seed + GRAD_SEED_OFFSET)
    grad_out = torch.randn(q.shape, generator=generator, dtype=torch.float32, device=q.device).to(q.dtype)

    def whole() -> StepOutput:
        with torch.enable_grad():
            out = forward(q, k, v)
        return _output(out, _grads(out, leaves, grad_out, retain=False))

    if spec.mode == "fwd+bwd":
        return Step(spec.mode, whole, whole, inputs, grad_out, sinks=sinks)
    if not repeatable_backward:
        graph: list[Any] = []

        def prepare() -> None:
            graph.clear()
            with torch.enable_grad():
                graph.append(forward(q, k, v))

        def fresh_backward() -> StepOutput:
            if not graph:
                prepare()  # a caller that skipped prepare still gets a true backward
            out = graph.pop()
            return _output(out, _grads(out, leaves, grad_out, retain=False))

        prepare()  # the first forward runs here, as in the repeatable case
        return Step(spec.mode, fresh_backward, whole, inputs, grad_out, prepare, sinks=sinks)
    with torch.enable_grad():
        kept = forward(q, k, v)
    detached = kept.detach()

    def backward() -> StepOutput:
        return _output(detached, _grads(kept, leaves, grad_out, retain=True), detach=False)

    return Step(spec.mode, backward, whole, inputs, grad_out, sinks=sinks)


def _output(out: Any, grads: tuple[Any, ...], detach: bool = True) -> StepOutput:
    """The StepOutput of a forward's output and its leaves' gradients (dsinks fourth, when there)."""
    dq, dk, dv, *rest = grads
    return StepOutput(out.detach() if detach else out, (dq, dk, dv), rest[0] if rest else None)


def bound_forward(variant: Variant, spec: RunSpec, state: Any, sinks: Any = None) -> Callable[[Any, Any, Any], Any]:
    """`forward(q, k, v)`: the variant's forward at `spec` with its `state`, and `sinks=` when the cell has
    sink logits."""
    extra = {} if sinks is None else {"sinks": sinks}

    def forward(q: Any, k: Any, v: Any) -> Any:
        return variant.forward(q, k, v, spec.causal, state, **extra)

    return forward


#: Wraps one stage of building a cell's step, named as a failure would name it ("input creation", "setup",
#: "input preparation", "forward"): the pipeline times it and turns the variant's exceptions into one line.
Stage = Callable[[str], AbstractContextManager[Any]]


@contextlib.contextmanager
def cell_step(
    variant: Variant,
    spec: RunSpec,
    seed: int,
    stage: Stage,
    after_setup: Callable[[Any], None] | None = None,
) -> Iterator[Step]:
    """The step of `variant` at `spec`, built as every cell builds it: seeded inputs in the variant's layout,
    its `setup`, its `prepare_inputs` (untimed, without autograd), then `build_step`; its `teardown` once the block
    is done. The block runs under `torch.no_grad()` and `graph_retention(spec.mode)`, as the step's calls must.
    `after_setup(state)` runs right after setup (the pipeline reads the variant's executed pairs there). Used by a
    cell (`pipeline.cell`) and by its Nsight Compute child (`pipeline.ncu_child`), so both run the same step."""
    import torch

    from attnprof.profiling.inputs import make_inputs, make_sinks

    with stage("input creation"):
        q, k, v = make_inputs(spec, seed, variant.layout)
        sinks = make_sinks(spec, seed)
    set_up = None
    if variant.setup is not None:
        with stage("setup"):
            set_up = variant.setup(spec)
    if after_setup is not None:
        try:
            after_setup(set_up)
        except BaseException:
            _teardown(variant, set_up)
            raise

    def prepared(q: Any, k: Any, v: Any) -> tuple[Any, int]:
        """The variant's state for these inputs, and the bytes its `prepare_inputs` allocated (GPU only);
        an fp8 cell's is an `Fp8State` around it, its inputs quantized under the stage `quantization`."""
        before = _allocated(q.device)
        state = set_up
        if spec.fp8:
            from attnprof.profiling.fp8 import Fp8State, quantize_inputs

            with stage("quantization"), torch.no_grad():
                quantized = quantize_inputs(q, k, v, spec.dtype, variant.fp8_scaling, variant.layout)
            state = Fp8State(quantized, set_up)
        if variant.prepare_inputs is not None:
            with stage("input preparation"), torch.no_grad():  # its own layout of k and v (a paged pool), untimed
                state = variant.prepare_inputs(spec, state, q, k, v, seed)
        return state, _allocated(q.device) - before

    def step_over(q: Any, k: Any, v: Any, sinks: Any) -> Step:
        state, extra = prepared(q, k, v)
        forward = bound_forward(variant, spec, state, sinks)
        with stage("forward"):
            built = build_step(spec, forward, (q, k, v), seed, variant.repeatable_backward, sinks)
        optional = (built.grad_out, built.sinks)
        tensors = [*built.inputs, *(t for t in optional if t is not None)]
        built.input_bytes = sum(t.numel() * t.element_size() for t in tensors) + extra
        built.fp8 = state if spec.fp8 else None
        return built

    def replica() -> Step:
        with stage("input copy"):
            copy = make_inputs(spec, seed, variant.layout)
            sinks_copy = make_sinks(spec, seed)
        return step_over(*copy, sinks_copy)

    try:
        with torch.no_grad(), graph_retention(spec.mode):
            step = step_over(q, k, v, sinks)
            step.replica = replica
            yield step
    finally:
        _teardown(variant, set_up)


def _teardown(variant: Variant, state: Any) -> None:
    """The variant's `teardown` of what its setup switched on, where it has one."""
    if variant.teardown is not None:
        variant.teardown(state)


def _allocated(device: Any) -> int:
    """Bytes torch has allocated on a GPU `device` (0 on a CPU)."""
    import torch

    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0
