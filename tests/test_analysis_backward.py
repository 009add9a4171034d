"""Attribution of backward work on synthetic traces: which threads' work belongs to a region instance.

The rule (analysis.backward): the region's own thread, plus autograd engine ops linked to the
instance's forward ops by sequence number (wherever they run), or running on another thread inside
the instance's range with their forward op on the region's thread; AccumulateGrad follows the
previous linked op of its thread. Anything else on another thread is not counted.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from analysis_json import analysis_json
from tracegen import BF16, FLASH, MUL, TraceBuilder

from attnprof.analysis import analyze_trace

MAIN, AUTOGRAD, OTHER = 4242, 5151, 6161
DOT_DO_O = "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64, 128, 128, 8> >(params)"
BWD = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64> >(params)"
CONVERT = "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8> >(params)"
ADD = "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16> >(int)"


@contextmanager
def engine_op(b: TraceBuilder, node: str, seq: int | None = None):
    """`autograd::engine::evaluate_function: node` around `node`, with the forward op's sequence
    number and Fwd thread id 1 (AccumulateGrad nodes carry neither: seq None)."""
    with b.op(f"autograd::engine::evaluate_function: {node}", seq=seq, fwd_tid=1 if seq is not None else 0):
        with b.op(node, seq=seq, fwd_tid=1 if seq is not None else 0):
            yield


def forward(b: TraceBuilder, seq: int) -> None:
    with b.op("aten::scaled_dot_product_attention", [BF16, BF16, BF16], seq=seq):
        b.kernel(FLASH, gpu_us=100.0, regs=255, smem=49152, grid=(16, 32, 1))


def backward(b: TraceBuilder, seq: int, accumulate: bool = True, bwd_us: float = 200.0) -> None:
    """On the autograd thread: the fused backward (dO·O, memset, main kernel, dQ convert) and,
    with `accumulate`, three AccumulateGrad adds."""
    with b.thread(AUTOGRAD):
        with engine_op(b, "ScaledDotProductFlashAttentionBackward0", seq):
            b.kernel(DOT_DO_O, gpu_us=16.0)
            b.memset(gpu_us=1.0)
            b.kernel(BWD, gpu_us=bwd_us)
            b.kernel(CONVERT, gpu_us=17.0)
        for _ in range(3 if accumulate else 0):
            with engine_op(b, "torch::autograd::AccumulateGrad"):
                b.kernel(ADD, gpu_us=12.0)


def unrelated_work(b: TraceBuilder) -> None:
    """Another thread launching a kernel while the region runs, linked to nothing."""
    with b.thread(OTHER), b.op("aten::mul", [BF16, "Scalar"]):
        b.kernel(MUL, gpu_us=5.0, stream=9)


def steps(body, n: int = 3) -> dict:
    b = TraceBuilder()
    for k in range(n):
        with b.step():
            body(b, 100 + k)
            b.advance(20.0)
    b.synchronize()
    return b.to_dict()


def phases(trace: dict) -> tuple[tuple[int, int, int], tuple[int, int, int], bool]:
    d = analysis_json(analyze_trace(trace))["phases"]
    f, w = d["forward"], d["backward"]
    return (f["kernels"], f["memcpy"], f["memset"]), (w["kernels"], w["memcpy"], w["memset"]), w["outside_region"]


def test_a_whole_step_counts_the_autograd_thread():
    def body(b, seq):
        with b.region():
            forward(b, seq)
            backward(b, seq)

    a = analyze_trace(steps(body))
    assert phases(steps(body)) == ((1, 0, 0), (6, 0, 1), False)
    assert (a.kernels_per_forward, a.memset_per_forward) == (7, 1)
    assert a.finding("single-fused-kernel") is None
    assert {"bwd-dot-do-o", "bwd-dq-convert", "bwd-memsets", "grad-accumulation"} <= set(a.finding_ids)
    assert "3 kernel(s) per step, 36.0 us per step" in a.finding("grad-accumulation").message
    assert "1 kernel(s) per step, 16.0 us per step" in a.finding("bwd-dot-do-o").message


def test_forward_alone_is_still_a_single_fused_kernel():
    def body(b, seq):
        with b.region():
            forward(b, seq)

    a = analyze_trace(steps(body))
    assert phases(steps(body)) == ((1, 0, 0), (0, 0, 0), False)
    assert a.finding("single-fused-kernel") is not None
    assert not any(f.startswith(("bwd-", "grad-")) for f in a.finding_ids)


def test_an_unrelated_thread_is_not_counted_and_a_note_says_so():
    def body(b, seq):
        with b.region():
            forward(b, seq)
            unrelated_work(b)
            backward(b, seq, accumulate=False)

    a = analyze_trace(steps(body))
    assert phases(steps(body)) == ((1, 0, 0), (3, 0, 1), False)
    assert a.kernels_per_forward == 4
    assert any(n.startswith("3 launch call(s) by other threads") and "not counted" in n for n in a.notes)


def test_a_backward_of_another_threads_forward_is_not_counted():
    """An engine op inside the region whose forward op ran on a thread other than the region's."""
    def body(b, seq):
        with b.thread(OTHER):
            forward(b, 900 + seq)  # outside any region
        with b.region():
            forward(b, seq)
            backward(b, 900 + seq, accumulate=False)

    assert phases(steps(body)) == ((1, 0, 0), (0, 0, 0), False)


def test_backward_after_the_region_is_linked_by_sequence_number():
    def body(b, seq):
        with b.region():
            forward(b, seq)
        b.advance(30.0)
        backward(b, seq)

    a = analyze_trace(steps(body))
    assert phases(steps(body)) == ((1, 0, 0), (6, 0, 1), True)
    assert any("ran after the region ended" in n for n in a.notes)
    # today's attribution would have seen the forward only
    assert a.kernels_per_forward == 7


def test_a_region_around_the_backward_only():
    def body(b, seq):
        forward(b, seq)  # before the region
        with b.region():
            backward(b, seq, accumulate=False)

    assert phases(steps(body)) == ((0, 0, 0), (3, 0, 1), False)


def test_a_lagging_kernel_stays_with_its_step():
    """Step N's long backward kernel ends inside step N+1's window; it stays with step N."""
    def body(b, seq):
        with b.region():
            forward(b, seq)
            backward(b, seq, accumulate=False, bwd_us=3000.0)

    trace = steps(body)
    a = analyze_trace(trace)
    assert [(m.kernels, m.memset) for m in a.per_forward] == [(4, 1)] * 3
    regions = sorted((e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
                      and e["name"] == "attnprof"), key=lambda e: e["ts"])
    lagging = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e["name"] == BWD]
    assert lagging[0]["ts"] + lagging[0]["dur"] > regions[1]["ts"]  # it really lags into the next step
    first = a.per_forward[0]
    assert first.gpu_time_us > regions[1]["ts"] - regions[0]["ts"]  # its end is counted in step 1


def test_cpu_bound_leaves_out_the_wait_for_the_engine():
    """The main thread waits (no op) while the autograd thread runs two engine ops with 400 us of
    nothing between them: that wait is not CPU work, and without it the step is not CPU-bound."""
    def body(b, seq):
        with b.region():
            b.advance(100.0)  # Python before the forward: CPU work of the main thread
            forward(b, seq)
            with b.thread(AUTOGRAD):
                with engine_op(b, "ScaledDotProductFlashAttentionBackward0", seq):
                    b.kernel(BWD, gpu_us=10.0)
                b.advance(400.0)  # the engine waits on something else; no op runs
                with engine_op(b, "torch::autograd::AccumulateGrad"):
                    b.kernel(ADD, gpu_us=1.0)

    a = analyze_trace(steps(body))
    for m in a.per_forward:
        assert m.cpu_work_us == m.cpu_time_us - 400.0
    assert a.cpu_time_us > a.gpu_time_us  # counting the wait, it would read CPU-bound by far
    # without it the CPU's work still exceeds the 111 us the GPU is busy, by what the wait is not
    finding = a.finding("cpu-bound")
    busy = a.per_forward[0].stalls.busy_us
    assert busy == pytest.approx(111.0)
    assert finding.impact_us == pytest.approx(a.per_forward[0].cpu_work_us - busy)
    assert f"({a.per_forward[0].cpu_work_us:,.1f} us: the region's" in finding.message
