"""The JSON contract of `attnprof analyze` (`results.records.analysis_record`), and dispatched_backend."""

from __future__ import annotations

import json

import pytest
from analysis_json import analysis_json
from tracegen import TraceBuilder, build, fused_forward, math_forward, naive_forward

from attnprof.analysis import TraceAnalysis, analyze_trace, dispatched_backend, load_trace

TOP_LEVEL = {"region", "forwards", "kernels_per_forward", "memcpy_per_forward", "memset_per_forward", "gpu_time_us",
             "gpu_annotation_time_us", "kernel_time_us", "cpu_time_us", "self_device_time_total_us", "launch_apis",
             "transposes_per_forward", "cpu_ops_per_forward", "kernels", "findings", "spread", "device",
             "input_dtype", "annotation_mismatches", "notes", "region_choice", "phases", "attention", "comm",
             "top_cpu_ops", "counters"}
PHASE_FIELDS = {"kernels", "memcpy", "memset", "kernel_time_us", "gpu_time_us"}
KERNEL_FIELDS = {"name", "short_name", "kind", "family", "library", "count_per_forward", "time_us", "grid", "block",
                 "registers_per_thread", "shared_memory_bytes", "blocks_per_sm", "warps_per_sm",
                 "achieved_occupancy_pct", "theoretical_occupancy_pct", "occupancy_limiter", "occupancy_arithmetic",
                 "occupancy_note", "tensor_cores", "launch_api"}
ATTENTION_FIELDS = {"time_base", "calls_per_forward", "backends", "attention_impl", "kernel_time_us",
                    "backward_kernel_time_us",
                    "gpu_time_pct", "cpu_time_pct", "overhead_us", "bytes_per_forward", "achieved_gbps",
                    "pct_of_read_bandwidth", "read_bandwidth_gbps", "read_bandwidth_basis", "read_bandwidth_source",
                    "calls", "overhead"}
CALL_FIELDS = {"op", "backend", "attention_impl", "phase", "kernels", "time_us", "bytes", "achieved_gbps",
               "pct_of_read_bandwidth",
               "forward_call", "varlen"}


def test_the_json_field_names_are_the_contract():
    d = analysis_json(analyze_trace(build(fused_forward, backend="cudnn")))
    assert set(d) == TOP_LEVEL
    assert d["kernels"] and all(set(k) == KERNEL_FIELDS for k in d["kernels"])
    finding_fields = {"id", "message", "severity", "impact_us", "impact_pct", "evidence", "no_impact_reason"}
    assert all(set(f) == finding_fields for f in d["findings"])
    assert set(d["phases"]) == {"forward", "backward"}
    assert set(d["phases"]["forward"]) == PHASE_FIELDS
    assert set(d["phases"]["backward"]) == PHASE_FIELDS | {"outside_region"}
    assert set(d["attention"]) == ATTENTION_FIELDS
    assert d["attention"]["calls"] and all(set(c) == CALL_FIELDS for c in d["attention"]["calls"])
    assert json.loads(json.dumps(d)) == d  # plain JSON types only


def test_the_json_values():
    d = analysis_json(analyze_trace(build(fused_forward, backend="cudnn")))
    assert (d["forwards"], d["kernels_per_forward"], d["memcpy_per_forward"], d["memset_per_forward"]) == (3, 1, 0, 1)
    assert d["launch_apis"] == {"cuLaunchKernelEx": 1, "cudaMemsetAsync": 1}
    assert d["device"] == {"name": "NVIDIA H200", "compute_capability": "9.0", "num_sms": 132}
    kernel = next(k for k in d["kernels"] if k["kind"] == "kernel")
    assert kernel["achieved_occupancy_pct"] is None  # reported 0 means unreported
    assert kernel["theoretical_occupancy_pct"] == 12.5 and kernel["tensor_cores"] is True
    assert kernel["launch_api"] == "cuLaunchKernelEx"
    assert kernel["grid"] == [64, 1, 1] and kernel["block"] == [256, 1, 1]
    assert kernel["registers_per_thread"] == 240 and kernel["shared_memory_bytes"] == 134144
    memset = next(k for k in d["kernels"] if k["kind"] == "memset")
    assert memset["tensor_cores"] is False and memset["grid"] is None
    # a forward-only trace: everything in the forward phase, the backward phase all zero
    assert d["phases"]["forward"] == {"kernels": 1, "memcpy": 0, "memset": 1, "kernel_time_us": 186.3,
                                      "gpu_time_us": d["gpu_time_us"]}
    assert d["phases"]["backward"] == {"kernels": 0, "memcpy": 0, "memset": 0, "kernel_time_us": 0.0,
                                       "gpu_time_us": 0.0, "outside_region": False}
    assert d["kernel_time_us"] == pytest.approx(186.3)
    assert d["self_device_time_total_us"] == pytest.approx(3 * (186.3 + 0.8))
    assert d["gpu_time_us"] >= d["kernel_time_us"]
    assert d["input_dtype"] == "bf16"


def test_spread_appears_only_where_forwards_differ():
    d = analysis_json(analyze_trace(build(naive_forward)))
    assert "kernels_per_forward" not in d["spread"]
    for key, value in d["spread"].items():
        assert set(value) == {"min", "max"} and value["min"] < value["max"], key


def test_kernels_are_in_execution_order_with_counts():
    d = analysis_json(analyze_trace(build(naive_forward)))
    order = [k["short_name"] for k in d["kernels"]]
    assert order == ["ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
                     "vectorized_elementwise_kernel<MulFunctor>", "Memcpy DtoD",
                     "elementwise_kernel<masked_fill_kernel>", "softmax_warp_forward"]
    gemm = d["kernels"][0]
    assert gemm["count_per_forward"] == 2 and gemm["time_us"] == pytest.approx(7.4 + 6.2)


@pytest.mark.parametrize("forward,kwargs,backend", [
    (fused_forward, {"backend": "flash"}, "flash"), (fused_forward, {"backend": "efficient"}, "efficient"),
    (fused_forward, {"backend": "cudnn"}, "cudnn"), (math_forward, {}, "math"), (naive_forward, {}, None)])
def test_dispatched_backend(forward, kwargs, backend):
    analysis = analyze_trace(build(forward, **kwargs))
    assert dispatched_backend(analysis) == backend


def test_dispatched_backend_on_a_cpu_trace_uses_the_ops():
    b = TraceBuilder(device_properties=[])
    with b.step():
        with b.region():
            with b.op("aten::scaled_dot_product_attention"):
                b.leaf("aten::_scaled_dot_product_flash_attention_for_cpu")
    assert dispatched_backend(analyze_trace(b.to_dict())) == "flash"


def test_analysis_accepts_paths_dicts_and_parsed_traces(tmp_path):
    b = TraceBuilder()
    data = build(naive_forward, builder=b)
    path = b.write(tmp_path / "trace.json.gz")
    from_path = analysis_json(analyze_trace(path))
    from_dict = analysis_json(analyze_trace(data))
    from_parsed = analysis_json(analyze_trace(load_trace(data)))
    assert from_path == from_dict == from_parsed
    assert isinstance(analyze_trace(str(path)), TraceAnalysis)


def test_other_region_name():
    analysis = analyze_trace(build(naive_forward, region="attn_fwd"), region="attn_fwd")
    assert analysis.region == "attn_fwd" and analysis_json(analysis)["region"] == "attn_fwd"


#: The evidence a fix timed by `analyze --time-fixes` adds to its finding (`findings.timed_fixes`), and an untimed one.
TIMED_FIX_EVIDENCE = {"impact_basis", "timed_alternative", "timed_before_us", "timed_after_us", "saved_us",
                      "timed_alternatives"}


def test_a_timed_fix_and_an_untimed_one_put_their_fields_in_the_findings_evidence():
    from attnprof.analysis.findings import FixNotTimed, TimedFix
    from attnprof.pipeline.fixes import FixTiming, judged

    analysis = analyze_trace(build(math_forward))
    timed_id, untimed_id = [f.id for f in analysis.findings if f.severity == "problem"][:2]
    fixes = FixTiming(
        (TimedFix(timed_id, "sdpa-flash", 100.0, 40.0),),
        (FixNotTimed(timed_id, "sdpa-cudnn", "refused"), FixNotTimed(untimed_id, "", "no shapes")),
        "",
    )
    judged(analysis, fixes)
    d = analysis_json(analysis)
    timed = next(f for f in d["findings"] if f["id"] == timed_id)
    assert TIMED_FIX_EVIDENCE <= set(timed["evidence"]) and timed["impact_us"] == 60.0
    assert timed["evidence"]["impact_basis"] == "timed"
    assert timed["evidence"]["timed_alternatives"] == "sdpa-flash 40.0 us; sdpa-cudnn: refused"
    untimed = next(f for f in d["findings"] if f["id"] == untimed_id)
    assert untimed["evidence"]["timed_fix_reason"] == "no shapes"
    assert json.loads(json.dumps(d)) == d
