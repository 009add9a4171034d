"""Communication per forward (analysis.comm): NCCL kernels against compute kernels on the device timeline,
the overlap arithmetic, c10d ops on a CPU-only trace, and the comm-exposed finding."""

from __future__ import annotations

import pytest
from analysis_json import analysis_json
from tracegen import FLASH, GEMM_BF16, TraceBuilder, build, fused_forward

from attnprof.analysis import analyze_trace
from attnprof.analysis.findings.comm import COMM_EXPOSED_SHARE
from attnprof.analysis.instance.comm import intersection, is_comm_kernel, merged, overlap_facts, total
from attnprof.report.analysis_tables import render_analysis

SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMM, COMPUTE, OTHER = 20, 7, 8  # streams


def test_comm_kernel_names() -> None:
    assert is_comm_kernel(SEND_RECV) and is_comm_kernel(ALL_GATHER)
    assert is_comm_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")
    assert is_comm_kernel("void ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWork)")
    assert not is_comm_kernel(FLASH) and not is_comm_kernel(GEMM_BF16)
    assert not is_comm_kernel("void at::native::vectorized_elementwise_kernel<4, nccl_like>()")


def test_interval_arithmetic() -> None:
    assert merged([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]
    assert total(merged([(0, 10), (5, 15)])) == 15
    assert intersection([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert intersection([(0, 1)], [(1, 2)]) == []
    comm = [(COMM, (0.0, 100.0))]
    compute = [(COMPUTE, (0.0, 30.0)), (OTHER, (50.0, 80.0)), (COMM, (10.0, 90.0))]  # same stream: never hides it
    assert overlap_facts(comm, compute) == (100.0, 90.0, 60.0)


def ring_step(b: TraceBuilder, comm: tuple[float, float], computes: list[tuple[int, float, float]]) -> None:
    """One forward: a send/recv kernel on the comm stream, compute kernels at the given times (offsets from a
    start 100 µs after the forward begins, so every launch lands before its kernel starts)."""
    t0 = b.now + 100.0
    with b.op("c10d::send"):
        b.stream_clock[COMM] = t0 + comm[0]
        b.kernel(SEND_RECV, gpu_us=comm[1] - comm[0], stream=COMM, api="cudaLaunchKernelExC")
    for stream, start, end in computes:
        with b.op("aten::_scaled_dot_product_flash_attention"):
            b.stream_clock[stream] = t0 + start
            b.kernel(FLASH, gpu_us=end - start, stream=stream)


def analysed(comm: tuple[float, float], computes: list[tuple[int, float, float]]):
    return analyze_trace(build(ring_step, comm=comm, computes=computes))


@pytest.mark.parametrize(
    ("comm", "computes", "hidden", "exposed", "pct"),
    [
        ((0.0, 50.0), [(COMPUTE, -10.0, 100.0)], 50.0, 0.0, 100.0),  # full overlap
        ((0.0, 50.0), [(COMPUTE, 60.0, 160.0)], 0.0, 50.0, 0.0),  # none: compute waits for the transfer
        ((0.0, 100.0), [(COMPUTE, 40.0, 200.0)], 60.0, 40.0, 60.0),  # partial
        ((0.0, 100.0), [(COMPUTE, 0.0, 30.0), (OTHER, 50.0, 80.0)], 60.0, 40.0, 60.0),  # two compute streams
    ],
)
def test_overlap_per_forward(comm, computes, hidden, exposed, pct) -> None:
    analysis = analysed(comm, computes)
    facts = analysis.comm
    assert facts is not None and facts.source == "device"
    assert facts.kernels_per_forward == 1 and facts.ops_per_forward == 1
    assert facts.kernels == ["ncclDevKernel_SendRecv"]
    assert facts.comm_time_us == pytest.approx(comm[1] - comm[0])
    assert facts.overlapped_us == pytest.approx(hidden)
    assert facts.exposed_us == pytest.approx(exposed)
    assert facts.overlap_pct == pytest.approx(pct)
    assert analysis.kernels_per_forward == 1 + len(computes)  # the comm kernel belongs to the forward too
    assert analysis_json(analysis)["comm"]["overlap_pct"] == pytest.approx(pct)


def test_comm_exposed_fires_over_the_share_with_its_numbers() -> None:
    hidden = analysed((0.0, 50.0), [(COMPUTE, -10.0, 100.0)])
    assert "comm-exposed" not in hidden.finding_ids
    exposed = analysed((0.0, 50.0), [(COMPUTE, 60.0, 160.0)])
    finding = exposed.finding("comm-exposed")
    assert finding is not None
    assert exposed.gpu_time_us == pytest.approx(160.0)
    assert "50.0 us exposed" in finding.message and "31% of the forward's 160.0 us GPU time" in finding.message
    assert "0% of it under compute" in finding.message and "ncclDevKernel_SendRecv" in finding.message
    small = analysed((0.0, 10.0), [(COMPUTE, 12.0, 200.0)])  # 10 of 200 µs exposed: under the share
    assert small.comm.exposed_us / small.gpu_time_us <= COMM_EXPOSED_SHARE
    assert "comm-exposed" not in small.finding_ids


def test_a_forward_without_communication_has_none() -> None:
    analysis = analyze_trace(build(fused_forward, backend="flash"))
    assert analysis.comm is None and analysis_json(analysis)["comm"] is None


def test_cpu_only_trace_counts_c10d_ops_and_times_nothing() -> None:
    def gloo_ring(b: TraceBuilder) -> None:
        with b.op("c10d::send"):
            b.leaf("c10d::send")  # nested in another c10d op: counted once
        b.leaf("c10d::recv_")
        b.leaf("aten::_scaled_dot_product_flash_attention_for_cpu", dur=50.0)

    analysis = analyze_trace(build(gloo_ring, builder=TraceBuilder(device_properties=[]), sync=False))
    facts = analysis.comm
    assert facts is not None and facts.source == "cpu ops"
    assert (facts.ops_per_forward, facts.kernels_per_forward, facts.comm_time_us, facts.overlap_pct) == (
        2,
        None,
        None,
        None,
    )
    assert "comm-exposed" not in analysis.finding_ids
    assert "the communication runs on the backend's own threads" in render_analysis(analysis, "table", None)


def test_the_analysis_table_shows_the_overlap() -> None:
    text = render_analysis(analysed((0.0, 100.0), [(COMPUTE, 40.0, 200.0)]), "table", None)
    assert "Communication" in text and "overlap" in text and "60%" in text and "ncclDevKernel_SendRecv" in text
