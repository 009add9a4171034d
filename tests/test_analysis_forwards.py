"""Attribution: which ops and which GPU work belong to which forward, by correlation."""

from __future__ import annotations

import pytest
from analysis_json import analysis_json
from tracegen import (
    CUDNN,
    FLASH,
    GEMM_BF16,
    MUL,
    SOFTMAX,
    TraceBuilder,
    build,
    fused_forward,
    math_forward,
    naive_forward,
)

from attnprof.analysis import analyze_trace, load_trace
from attnprof.analysis.attribution.attribute import find_forwards
from attnprof.analysis.base import launch_kind
from attnprof.errors import TraceError


def five_kernels(b: TraceBuilder) -> None:
    for name in (GEMM_BF16, MUL, SOFTMAX, MUL, GEMM_BF16):
        with b.op("aten::op"):
            b.kernel(name, gpu_us=8.0)


def test_five_kernel_forward_is_exactly_five_even_with_a_lagging_kernel():
    """A long kernel launched before a forward runs into the forward's CPU window: not counted."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            # launched outside the region, on another stream, still running when the forward starts
            b.kernel(MUL, gpu_us=400.0, stream=21)
            b.advance(2.0)
            with b.region():
                five_kernels(b)
            b.advance(10.0)
    b.synchronize()
    data = b.to_dict()
    attribution = find_forwards(load_trace(data), "attnprof")
    lagging = [e for e in data["traceEvents"] if e.get("cat") == "kernel" and e["tid"] == 21]
    fwd = attribution.forwards[1]
    # the lagging kernel really overlaps the forward's window: a time-window count would include it
    assert any(e["ts"] < fwd.end and e["ts"] + e["dur"] > fwd.start for e in lagging)
    analysis = analyze_trace(data)
    assert analysis.kernels_per_forward == 5
    assert [m.kernels for m in analysis.per_forward] == [5, 5, 5]
    assert "kernels_per_forward" not in analysis.spread
    assert analysis.annotation_mismatches == 0


def test_device_work_whose_launch_is_missing_is_never_counted():
    """A kernel from before the active window (its launch call not in the trace) inside forward 1."""
    b = TraceBuilder()
    with b.step():
        b.kernel(MUL, gpu_us=500.0, launch=False, correlation=5)  # orphan: no runtime event
        with b.region():
            five_kernels(b)
    analysis = analyze_trace(b.to_dict())
    assert analysis.kernels_per_forward == 5
    assert all(k.name != MUL or k.count_per_forward == 2 for k in analysis.kernels)


def test_launch_api_counts_cover_runtime_driver_memcpy_memset_and_exclude_the_rest():
    b = TraceBuilder()
    with b.step():
        with b.region():
            with b.op("aten::x"):
                b.kernel(MUL, api="cudaLaunchKernel")
                b.kernel(GEMM_BF16, api="cudaLaunchKernelExC")
                b.kernel(FLASH, api="cuLaunchKernel")
                b.kernel(CUDNN, api="cuLaunchKernelEx", occupancy=0)
                b.memcpy("DtoD")
                b.memcpy("HtoD", api="cudaMemcpy")
                b.memset()
                b.call("cudaStreamIsCapturing")
                b.call("cudaEventRecord")
                b.call("cudaStreamSynchronize")
                b.overhead("Activity Buffer Request", cat="cuda_runtime")
            b.call("cudaDeviceSynchronize")
    analysis = analyze_trace(b.to_dict())
    assert analysis.launch_apis == {"cudaLaunchKernel": 1, "cudaLaunchKernelExC": 1, "cuLaunchKernel": 1,
                                    "cuLaunchKernelEx": 1, "cudaMemcpyAsync": 1, "cudaMemcpy": 1,
                                    "cudaMemsetAsync": 1}
    assert (analysis.kernels_per_forward, analysis.memcpy_per_forward, analysis.memset_per_forward) == (4, 2, 1)
    launched = {k.short_name: k.launch_api for k in analysis.kernels}
    cudnn = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
    assert launched[cudnn] == "cuLaunchKernelEx"
    assert launched["flash_fwd_kernel"] == "cuLaunchKernel"


@pytest.mark.parametrize("api,kind", [("cudaLaunchKernel", "kernel"), ("cuLaunchKernelEx", "kernel"),
                                      ("cudaGraphLaunch", "graph"), ("cudaMemcpy2DAsync", "memcpy"),
                                      ("cuMemsetD32Async", "memset"), ("cudaDeviceSynchronize", None),
                                      ("cudaEventRecord", None), ("Activity Buffer Request", None),
                                      ("cudaFuncSetAttribute", None)])
def test_launch_kind(api, kind):
    assert launch_kind(api) == kind


def test_graph_launch_attributes_every_node():
    b = TraceBuilder()
    for _ in range(2):
        with b.step():
            with b.region():
                b.graph([MUL, SOFTMAX, GEMM_BF16])
    analysis = analyze_trace(b.to_dict())
    assert analysis.kernels_per_forward == 3
    assert analysis.launch_apis == {"cudaGraphLaunch": 1}


def test_multi_stream_forward_and_per_stream_gpu_annotations():
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.region():
                with b.op("aten::matmul"):
                    b.kernel(GEMM_BF16, gpu_us=30.0, stream=7)
                with b.op("aten::matmul"):
                    b.kernel(GEMM_BF16, gpu_us=30.0, stream=13)
                with b.op("aten::add"):
                    b.kernel(MUL, gpu_us=5.0, stream=7)
    data = b.to_dict()
    assert sum(1 for e in data["traceEvents"] if e.get("cat") == "gpu_user_annotation") == 6
    analysis = analyze_trace(data)
    assert analysis.kernels_per_forward == 3
    assert analysis.annotation_mismatches == 0
    fwd = find_forwards(load_trace(data), "attnprof").forwards[0]
    assert len(fwd.gpu_annotations) == 2
    assert analysis.gpu_time_us == pytest.approx(analysis.gpu_annotation_time_us, abs=0.01)


def test_gpu_annotation_mismatch_is_counted_not_fatal():
    data = build(naive_forward, steps=2)
    shrunk = next(e for e in data["traceEvents"] if e.get("cat") == "gpu_user_annotation")
    shrunk["dur"] = 1.0  # shorter than the first kernel: it now holds none of the 6 device events
    analysis = analyze_trace(data)
    assert analysis.kernels_per_forward == 5
    assert analysis.annotation_mismatches == 6
    assert any("gpu_user_annotation" in note for note in analysis.notes)


def test_gpu_annotations_without_external_id_are_matched_by_overlap():
    data = build(fused_forward, steps=3)
    for e in data["traceEvents"]:
        if e.get("cat") == "gpu_user_annotation":
            e["args"].pop("External id")
    analysis = analyze_trace(data)
    assert analysis.annotation_mismatches == 0
    assert analysis.gpu_annotation_time_us is not None


def test_no_gpu_annotations_gives_null_mismatches():
    analysis = analyze_trace(build(naive_forward, builder=TraceBuilder(gpu_annotations=False)))
    assert analysis.annotation_mismatches is None
    assert analysis.gpu_annotation_time_us is None
    assert analysis.kernels_per_forward == 5


def test_ops_and_transposes_are_counted_per_forward():
    analysis = analyze_trace(build(naive_forward))
    # transpose, matmul>bmm, mul, masked_fill>(clone>(empty_like, copy_), masked_fill_), softmax>_softmax, matmul>bmm
    assert analysis.cpu_ops_per_forward == 13
    assert analysis.transposes_per_forward == 1
    assert analysis.op_counts["aten::bmm"] == 2


def test_op_tree_and_launch_chain():
    attribution = find_forwards(load_trace(build(naive_forward, steps=1)), "attnprof")
    fwd = attribution.forwards[0]
    trace = attribution.trace
    dev = trace.device
    memcpy = next(e for e in fwd.device if trace.names[dev.name[e]].startswith("Memcpy"))
    op = fwd.launch_op[fwd.device_launch[memcpy]]
    chain = [trace.names[trace.cpu_ops.name[o]] for o in fwd.op_chain(op)]
    assert chain == ["aten::masked_fill", "aten::clone", "aten::copy_"]


def test_ops_that_are_consecutive_rows_are_a_range_and_others_a_list():
    """On one thread in order, a forward's ops are a range of table rows (no object per op); with a
    second thread's ops interleaved in the table, a list. Both give the same counts and op chains."""
    one = find_forwards(load_trace(build(naive_forward)), "attnprof")

    def interleaved(b):
        naive_forward(b)
        with b.thread(5151):
            b.leaf("aten::empty")  # another thread's op inside the table, after the region's

    two = find_forwards(load_trace(build(interleaved)), "attnprof")
    assert all(isinstance(f.ops, range) for f in one.forwards)
    assert not any(isinstance(f.ops, range) for f in two.forwards)
    for a, b in zip(one.forwards, two.forwards, strict=True):
        chains = [
            [" → ".join(t.names[t.cpu_ops.name[c]] for c in f.op_chain(o)) for o in f.ops]
            for t, f in ((one.trace, a), (two.trace, b))
        ]
        assert chains[0] == chains[1] and len(chains[0]) == 13
        assert "aten::masked_fill → aten::clone → aten::copy_" in chains[0]


def test_cpu_only_trace_has_null_gpu_fields_never_zero():
    b = TraceBuilder(device_properties=[])
    for _ in range(2):
        with b.step():
            with b.region():
                with b.op("aten::scaled_dot_product_attention", ["float", "float", "float"]):
                    b.leaf("aten::_scaled_dot_product_flash_attention_for_cpu", ["float"])
                    b.leaf("aten::transpose", ["float", "Scalar", "Scalar"])
    analysis = analyze_trace(b.to_dict())
    d = analysis_json(analysis)
    for key in ("kernels_per_forward", "memcpy_per_forward", "memset_per_forward", "gpu_time_us",
                "kernel_time_us", "self_device_time_total_us"):
        assert d[key] is None, key
    assert d["cpu_time_us"] > 0 and d["cpu_ops_per_forward"] == 3 and d["forwards"] == 2
    assert d["kernels"] == [] and d["device"] is None
    assert "metadata-transposes" not in analysis.finding_ids  # no launch evidence on a CPU trace
    assert any("CPU-only" in n for n in d["notes"])


def test_region_missing_lists_the_annotations_that_exist():
    data = build(naive_forward, region="my_fwd")
    with pytest.raises(TraceError) as info:
        analyze_trace(data, region="attnprof")
    message = info.value.message
    assert "'attnprof'" in message and "'my_fwd'" in message and "'ProfilerStep#*'" in message
    assert info.value.hint and "--region" in info.value.hint
    assert analyze_trace(data, region="my_fwd").forwards == 3


def test_trace_without_annotations_says_so():
    b = TraceBuilder()
    with b.op("aten::mul"):
        b.kernel(MUL)
    with pytest.raises(TraceError, match="no record_function annotations"):  # a region it cannot have
        analyze_trace(b.to_dict(), region="attnprof")
    whole = analyze_trace(b.to_dict())  # no region named: the trace as one window, said in a note
    assert whole.forwards == 1 and whole.kernels_per_forward == 1
    assert "no record_function annotations" in (whole.region_choice or "")


def test_region_outside_every_profiler_step_is_an_error():
    b = TraceBuilder()
    with b.region():
        five_kernels(b)
    with b.step():
        b.advance(3.0)
    with pytest.raises(TraceError, match="never inside a ProfilerStep"):
        analyze_trace(b.to_dict())


def test_only_regions_inside_steps_count():
    b = TraceBuilder()
    with b.region():  # a warm-up call before the scheduled steps
        five_kernels(b)
        five_kernels(b)
    for _ in range(2):
        with b.step():
            with b.region():
                five_kernels(b)
    analysis = analyze_trace(b.to_dict())
    assert analysis.forwards == 2 and analysis.kernels_per_forward == 5


def test_without_profiler_steps_every_region_is_a_forward():
    b = TraceBuilder()
    for _ in range(4):
        with b.region():
            five_kernels(b)
    analysis = analyze_trace(b.to_dict())
    assert analysis.forwards == 4 and analysis.kernels_per_forward == 5


def test_nested_region_of_the_same_name_is_one_forward():
    b = TraceBuilder()
    with b.step():
        with b.region():
            with b.region(gpu_annotation=False):
                five_kernels(b)
    analysis = analyze_trace(b.to_dict())
    assert analysis.forwards == 1 and analysis.kernels_per_forward == 5


def test_varying_forwards_report_low_median_and_spread():
    b = TraceBuilder()
    for n in (5, 6, 5):
        with b.step():
            with b.region():
                for _ in range(n):
                    b.kernel(MUL, gpu_us=4.0)
    analysis = analyze_trace(b.to_dict())
    assert analysis.kernels_per_forward == 5
    assert analysis.spread["kernels_per_forward"] == {"min": 5, "max": 6}


def test_launches_on_another_thread_fall_back_to_the_process():
    data = build(naive_forward, steps=2)
    for e in data["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            e["tid"] = 777
    analysis = analyze_trace(data)
    assert analysis.kernels_per_forward == 5
    assert any("not on the region's thread" in note for note in analysis.notes)


def test_launch_without_device_event_is_noted():
    b = TraceBuilder()
    with b.step():
        with b.region():
            five_kernels(b)
            b.call("cudaLaunchKernel")  # its kernel never made it into the trace
    analysis = analyze_trace(b.to_dict())
    assert analysis.kernels_per_forward == 5
    assert any("no device event" in note for note in analysis.notes)


def test_old_style_region_written_as_cpu_op():
    data = build(naive_forward, steps=2)
    for e in data["traceEvents"]:
        if e.get("name") == "attnprof" and e.get("cat") == "user_annotation":
            e["cat"] = "cpu_op"
    analysis = analyze_trace(data)
    assert analysis.forwards == 2 and analysis.kernels_per_forward == 5
    assert analysis.cpu_ops_per_forward == 13  # the region itself is not one of its ops


def test_math_forward_counts():
    analysis = analyze_trace(build(math_forward))
    assert analysis.kernels_per_forward == 13
    assert analysis.launch_apis == {"cudaLaunchKernel": 11, "cudaLaunchKernelExC": 2}
    assert analysis.self_device_time_total_us == pytest.approx(3 * analysis.kernel_time_us, rel=1e-6)


def test_a_launch_seen_as_runtime_and_driver_call_counts_once():
    b = TraceBuilder()
    with b.step():
        with b.region():
            with b.op("aten::mul"):
                kernel = b.kernel(MUL, api="cudaLaunchKernel", launch_us=6.0)
                corr = kernel["args"]["correlation"]
                runtime = next(e for e in b.events if e.get("cat") == "cuda_runtime"
                               and e["args"].get("correlation") == corr)
                # the driver call the runtime made, inside it, with the same correlation id
                b.events.append({"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": b.pid,
                                 "tid": b.tid, "ts": runtime["ts"] + 1.0, "dur": 2.0,
                                 "args": {"cbid": 307, "correlation": corr}})
    analysis = analyze_trace(b.to_dict())
    assert analysis.kernels_per_forward == 1
    assert analysis.launch_apis == {"cudaLaunchKernel": 1}
    assert analysis.kernels[0].launch_api == "cudaLaunchKernel"


def test_old_style_profiler_steps_written_as_cpu_ops():
    b = TraceBuilder()
    with b.region():  # outside any step: must be dropped
        five_kernels(b)
    for _ in range(2):
        with b.step():
            with b.region():
                five_kernels(b)
    data = b.to_dict()
    for e in data["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["cat"] = "cpu_op"
    analysis = analyze_trace(data)
    assert analysis.forwards == 2 and analysis.kernels_per_forward == 5


def test_without_device_properties_theoretical_occupancy_is_null():
    analysis = analyze_trace(build(naive_forward, builder=TraceBuilder(device_properties=[])))
    assert analysis.kernels_per_forward == 5 and analysis.device is None
    assert all(k.theoretical_occupancy_pct is None for k in analysis.kernels)
    assert any("deviceProperties" in note for note in analysis.notes)
