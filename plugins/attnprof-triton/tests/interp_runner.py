"""Run triton-flash cases under the Triton interpreter; used by test_triton_plugin.py.

The interpreter has to be on before triton is first imported (triton's own helpers such as
tl.zeros are jitted at import), so the tests run this file in a fresh process with
TRITON_INTERPRET=1. It reads a JSON list of cases on stdin and prints one JSON object:
case id -> {"max_err": float} against a float64 reference, or {"error": "..."}.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from attnprof import RunSpec
from attnprof.profiling.correctness import reference_attention
from attnprof.profiling.inputs import make_inputs, make_sinks
from attnprof.varlen import cu_seqlens_tensor


def _spec(case, mode="fwd"):
    """The case's RunSpec: its shape, mask, `sinks` (score_mod sinks) and packed `seq_lens` (batch 1 of their total)."""
    seq_lens = case.get("seq_lens")
    return RunSpec(device="cpu", dtype=case["dtype"], batch=1 if seq_lens else case["batch"], heads=case["heads"],
                   seq=sum(seq_lens) if seq_lens else case["seq"], head_dim=case["head_dim"],
                   kv_heads=case["kv_heads"], causal=case["causal"], mode=mode, mask=case.get("mask"),
                   q_len=case.get("q_len"), score_mod="sinks" if case.get("sinks") else None, seq_lens=seq_lens)


def _score_inputs(spec, seed):
    """The sink logits (None without sinks) and the packed keywords of the kernels (empty when not packed)."""
    packed = {}
    if spec.seq_lens:
        packed = {"cu_seqlens": cu_seqlens_tensor(spec.seq_lens, "cpu"), "max_seqlen": max(spec.seq_lens)}
    return make_sinks(spec, seed), packed


def _mask(case):
    """The case's mask text: its `mask`, else causal or none."""
    return case.get("mask") or ("causal" if case["causal"] else "none")


def run_case(kernel, case):
    os.environ[kernel.TMA_ENV] = "1" if case["tma"] else "0"
    spec = _spec(case)
    if case.get("strided"):  # bhsd views of bshd storage
        q, k, v = (t.transpose(1, 2) for t in make_inputs(spec, seed=case["seed"], layout="bshd"))
    else:
        q, k, v = make_inputs(spec, seed=case["seed"])
    sinks, packed = _score_inputs(spec, case["seed"])
    expected = reference_attention(q, k, v, case["causal"], mask=_mask(case), sinks=sinks, seq_lens=spec.seq_lens)
    if case.get("poison_below"):  # keys no query keeps: NaN there shows whether their blocks were loaded
        k, v = k.clone(), v.clone()
        k[:, :, : case["poison_below"]] = float("nan")
        v[:, :, : case["poison_below"]] = float("nan")
    out = kernel.attention(q, k, v, config=kernel.BlockConfig(*case["config"]), mask=_mask(case), sinks=sinks,
                           **packed)
    if out.shape != q.shape or out.dtype != q.dtype:
        return {"error": f"got {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {q.dtype}"}
    return {"max_err": (out.double() - expected).abs().max().item()}


def run_grad_case(case):
    """The kernel's own backward (dq, dk, dv through `_backward.FlashAttention`) against float64 autograd."""
    from attnprof_triton import _backward, _kernel

    from attnprof.profiling.gradcheck import check_grads

    os.environ[_kernel.TMA_ENV] = "1" if case["tma"] else "0"
    os.environ[_kernel.AUTOTUNE_ENV] = "0"  # the autotuner needs a GPU driver
    _backward.default_configs = DEFAULT_CONFIGS
    if case.get("bwd_configs"):  # the backward's (dK/dV, dQ) tiles, where the defaults are square
        configs = tuple(_kernel.BlockConfig(*c) for c in case["bwd_configs"])
        _backward.default_configs = lambda *_args: configs
    spec = _spec(case, mode="fwd+bwd")
    q, k, v = (t.requires_grad_(True) for t in make_inputs(spec, seed=case["seed"]))
    sinks, packed = _score_inputs(spec, case["seed"])
    leaves = (q, k, v) if sinks is None else (q, k, v, sinks.requires_grad_(True))
    out = _backward.FlashAttention.apply(q, k, v, _mask(case), sinks, *packed.values())
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(case["seed"] + 1)).to(out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    check = check_grads(grads[:3], q, k, v, grad_out, causal=case["causal"], dtype=case["dtype"], mask=_mask(case),
                        sinks=sinks, sink_grad=grads[3] if sinks is not None else None, seq_lens=spec.seq_lens)
    return {"grad_rel_errors": check.rel_errors, "passed": check.passed, "reason": check.reason}


def run_variant_case(case):
    """A cell's step through the Variant as the pipeline builds it (setup, `bound_forward` with the sinks,
    `build_step`), checked as a cell checks it: the output, and in a backward mode the gradients."""
    import attnprof_triton
    from attnprof_triton import _kernel

    from attnprof.profiling.correctness import check_variant_output
    from attnprof.profiling.gradcheck import check_grads
    from attnprof.profiling.steps import bound_forward, build_step

    os.environ[_kernel.AUTOTUNE_ENV] = "0"
    spec = _spec(case, mode=case["mode"])
    variant = attnprof_triton.make_variant()
    state = variant.setup(spec)
    q, k, v = make_inputs(spec, seed=case["seed"])
    sinks = make_sinks(spec, case["seed"])
    step = build_step(spec, bound_forward(variant, spec, state, sinks), (q, k, v), case["seed"], sinks=sinks)
    result = step.call()
    out = result if spec.mode == "fwd" else result.out
    check = check_variant_output(out, q, k, v, causal=spec.causal, mask=spec.mask, score_mod=spec.score_mod,
                                 sinks=sinks, seq_lens=spec.seq_lens, dtype=spec.dtype)
    found = {"passed": check.passed, "reason": check.reason, "state": [state.forward_tiles, state.backward_tiles]}
    if spec.backward:
        grads = check_grads(result.grads, q, k, v, step.grad_out, causal=spec.causal, dtype=spec.dtype,
                            mask=spec.mask, sinks=sinks, sink_grad=result.sink_grad, seq_lens=spec.seq_lens)
        found.update(grad_passed=grads.passed, grad_reason=grads.reason, grad_rel_errors=grads.rel_errors)
    return found


def interpreter_problem() -> str | None:
    """Why this triton's interpreter cannot run the kernel's loops here, or None.

    Seen with triton 3.6 and numpy 2.5: a loop bounded by a runtime value fails inside the
    interpreter ("only 0-dimensional arrays can be converted to Python scalars"); triton 3.9
    with numpy 2.4 runs it. That is the interpreter's problem, not the kernel's.
    """
    import numpy
    import triton
    import triton.language as tl

    @triton.jit
    def _loop(out_ptr, n):
        acc = 0
        for i in tl.range(tl.program_id(0) * 2, n, 1):
            acc += i
        tl.store(out_ptr, acc)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _loop[(1,)](out, 4)
    except Exception as exc:
        return (f"the Triton {triton.__version__} interpreter cannot run a tl.range loop with numpy "
                f"{numpy.__version__}: {str(exc).splitlines()[0][:160]}")
    return None if int(out.item()) == 6 else "the Triton interpreter computed a simple loop wrongly"


DEFAULT_CONFIGS = None  # `_backward.default_configs` as shipped, restored before each gradient case


def main() -> None:
    global DEFAULT_CONFIGS
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1")
    problem = interpreter_problem()
    if problem:
        json.dump({"__skip__": problem}, sys.stdout)
        return
    from attnprof_triton import _backward, _kernel

    DEFAULT_CONFIGS = _backward.default_configs
    results = {}
    for case in json.load(sys.stdin):
        try:
            if case.get("variant"):
                results[case["id"]] = run_variant_case(case)
            else:
                results[case["id"]] = run_grad_case(case) if case.get("grad") else run_case(_kernel, case)
        except Exception as exc:  # report, keep going
            results[case["id"]] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
