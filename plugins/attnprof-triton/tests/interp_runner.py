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
from attnprof.profiling.inputs import make_inputs


def _spec(case, mode="fwd"):
    return RunSpec(device="cpu", dtype=case["dtype"], batch=case["batch"], heads=case["heads"], seq=case["seq"],
                   head_dim=case["head_dim"], kv_heads=case["kv_heads"], causal=case["causal"], mode=mode,
                   mask=case.get("mask"), q_len=case.get("q_len"))


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
    expected = reference_attention(q, k, v, case["causal"], mask=_mask(case))
    if case.get("poison_below"):  # keys no query keeps: NaN there shows whether their blocks were loaded
        k, v = k.clone(), v.clone()
        k[:, :, : case["poison_below"]] = float("nan")
        v[:, :, : case["poison_below"]] = float("nan")
    out = kernel.attention(q, k, v, config=kernel.BlockConfig(*case["config"]), mask=_mask(case))
    if out.shape != q.shape or out.dtype != q.dtype:
        return {"error": f"got {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {q.dtype}"}
    return {"max_err": (out.double() - expected).abs().max().item()}


def run_grad_case(case):
    """The kernel's own backward (dq, dk, dv through `_backward.FlashAttention`) against float64 autograd."""
    from attnprof_triton import _backward, _kernel

    from attnprof.profiling.gradcheck import check_grads

    os.environ[_kernel.TMA_ENV] = "1" if case["tma"] else "0"
    os.environ[_kernel.AUTOTUNE_ENV] = "0"  # the autotuner needs a GPU driver
    if case.get("bwd_configs"):  # the backward's (dK/dV, dQ) tiles, where the defaults are square
        configs = tuple(_kernel.BlockConfig(*c) for c in case["bwd_configs"])
        _backward.default_configs = lambda *_args: configs
    spec = _spec(case, mode="fwd+bwd")
    q, k, v = (t.requires_grad_(True) for t in make_inputs(spec, seed=case["seed"]))
    out = _backward.FlashAttention.apply(q, k, v, _mask(case))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(case["seed"] + 1)).to(out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    check = check_grads(grads, q, k, v, grad_out, causal=case["causal"], dtype=case["dtype"], mask=_mask(case))
    return {"grad_rel_errors": check.rel_errors, "passed": check.passed, "reason": check.reason}


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


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1")
    problem = interpreter_problem()
    if problem:
        json.dump({"__skip__": problem}, sys.stdout)
        return
    from attnprof_triton import _kernel

    results = {}
    for case in json.load(sys.stdin):
        try:
            results[case["id"]] = run_grad_case(case) if case.get("grad") else run_case(_kernel, case)
        except Exception as exc:  # report, keep going
            results[case["id"]] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
