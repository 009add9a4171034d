"""`attention_impl`: the implementation that served each attention call, read from its kernels' names
(`analysis.names.attention_impl`), per call in the ledger, summarized per trace and row, and the same as
`attnprof explain` says of the kernel."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tracegen import CUDNN, EFFICIENT, FLASH, GEMM_FP32, SOFTMAX, TraceBuilder, build
from typer.testing import CliRunner

from attnprof.analysis import analyze_trace, explain_kernel
from attnprof.analysis.analyze import CUDNN_VERSION_KEY
from attnprof.analysis.instance.ledger import FLEX_FLASH
from attnprof.analysis.names import UNFUSED, attention_impl, cudnn_version_text
from attnprof.profiling.profiler import CUDNN_VERSION_KEY as PROFILER_KEY
from attnprof.profiling.profiler import trace_metadata
from attnprof.report.attention_tables import attention_section
from attnprof.report.explain_tables import render_explanation
from attnprof.report.model_tables import model_table
from attnprof.report.run_tables import run_summary_table
from attnprof.results.records import analysis_record
from attnprof.results.schema import CELL_COLUMNS, MODEL_COLUMNS

H200 = Path(__file__).parent / "data" / "h200"
FA3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
       "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, 128, "
       "cutlass::bfloat16_t, float, cutlass::arch::Sm90> > > >(flash::FlashAttnFwdSm90<>::Params)")
FA4 = ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__tensor0000o11101213_"
       "tensor0000o11101213_tensor0000o11101213_tensor0000o11101213_None_None_None_None__0")
FA2_PACKAGE = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t>>()"


@pytest.mark.parametrize("name,impl", [
    (FLASH, "FA2"),  # SDPA's flash backend: FlashAttention-2 vendored into PyTorch
    (FA2_PACKAGE, "FA2"),  # the flash-attn package's
    ("void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<64>>()", "FA2"),
    (FA3, "FA3"),
    (FA4, "FA4"),
    (CUDNN, "cuDNN native-sdpa knob 7"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "cuDNN native-sdpa knob 26"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_64x128x64_kernel0_0", "cuDNN native-sdpa"),
    (EFFICIENT, "mem-efficient"),
    ("triton_tem_fused_flex_attention_0", "flex Triton"),
    ("triton_per_fused_flex_attention_backward_0", "flex Triton"),
    ("_attn_fwd", "Triton"),  # triton-flash's kernel (the Triton tutorial's name)
    (GEMM_FP32, None),
    (SOFTMAX, None),
    ("some_kernel_no_rule_knows", None),
])
def test_explain_names_the_implementation_of_each_fused_attention_kernel(name: str, impl: str | None) -> None:
    assert explain_kernel(name).impl == impl
    assert attention_impl([name]) == impl


def test_a_call_is_served_by_its_first_fused_kernel_else_unfused_from_a_gemm_and_a_softmax() -> None:
    assert attention_impl(["Memset (Device)", CUDNN], "9.10.2") == "cuDNN 9.10.2 native-sdpa knob 7"
    assert attention_impl([FLASH], "9.10.2") == "FA2"  # the version is cuDNN's only
    assert attention_impl([GEMM_FP32, SOFTMAX, GEMM_FP32]) == UNFUSED
    assert attention_impl([GEMM_FP32]) is None and attention_impl([]) is None
    compiled = ["triton_per_fused__softmax_exp_mul_0", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"]
    assert attention_impl(compiled) == UNFUSED


@pytest.mark.parametrize("raw,text", [
    (91002, "9.10.2"), ("90800", "9.8.0"), (8907, "8.9.7"), ("9.1.0", "9.1.0"), (None, None), ("", None), ("x", None),
])
def test_cudnn_version_as_torch_gives_it_is_written_dotted(raw: object, text: str | None) -> None:
    assert cudnn_version_text(raw) == text


#: The checked-in H200 traces and the implementation the summary names (the calls' kernels decide it).
CASES = {
    "8x16x1024x64/sdpa-cudnn": "cuDNN native-sdpa knob 7",
    "8x16x1024x64/sdpa": "cuDNN native-sdpa knob 7",  # sdpa dispatched to cuDNN on the H200
    "8x16x1024x64/sdpa-flash": "FA2",
    "8x16x1024x64/sdpa-efficient": "mem-efficient",
    "8x16x1024x64/flash-attn": "FA4",  # the attnprof-flash-attn plugin runs flash_attn.cute
    "8x16x1024x64/triton-flash": "Triton",
    "8x16x1024x64/flex": "flex Triton",
    "8x16x1024x64/naive": UNFUSED,
    "8x16x1024x64/compiled": UNFUSED,  # Inductor fuses the softmax, the scores still go through memory
    "8x16x1024x64/sdpa-math": UNFUSED,
    "4x16x8192x128/sdpa-flash": "FA2",
    "masks/decode-flash": "FA2",  # split-KV and its combine kernel: one call
    "masks/decode-cudnn": "cuDNN native-sdpa knob 35",
    "training/fwd+bwd/8x16x1024x64/sdpa-cudnn": "cuDNN native-sdpa knob 7, cuDNN native-sdpa knob 26",
    "training/fwd+bwd/8x16x1024x64/sdpa-flash": "FA2",
    "model/llama2l-sdpa": "cuDNN native-sdpa knob 7",
    "model/llama2l-eager": UNFUSED,
    "model/llama2l-flex_attention": "flex Triton",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_impl_on_the_checked_in_h200_traces(case: str) -> None:
    analysis = analyze_trace(H200 / f"{case}.json.gz")
    ledger = analysis.attention
    assert ledger is not None and ledger.attention_impl == CASES[case]
    record = analysis_record(analysis).attention
    assert record is not None and record.attention_impl == CASES[case]
    for call, written in zip(ledger.calls, record.calls, strict=True):
        fused = [n for n in (call.names[i] for i in call.kernel_ids) if explain_kernel(n).impl]
        # the call's implementation is what explain says of its first fused kernel
        assert written.attention_impl == (explain_kernel(fused[0]).impl if fused else UNFUSED)
    shown = "\n".join(attention_section(record, "table"))
    assert f"served by {CASES[case]}" in shown


def test_explain_shows_the_implementation_the_ledger_names() -> None:
    from attnprof.cli.app import app

    analysis = analyze_trace(H200 / "8x16x1024x64" / "sdpa-cudnn.json.gz")
    assert analysis.attention is not None
    call = analysis.attention.calls[0]
    kernel = next(n for n in (call.names[i] for i in call.kernel_ids) if n.startswith("cudnn_generated"))
    assert "cuDNN native-sdpa knob 7" in render_explanation(explain_kernel(kernel))
    out = CliRunner().invoke(app, ["--no-plugins", "explain", kernel, "--format", "json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["impl"] == analysis.attention.attention_impl


def test_the_cudnn_version_comes_from_the_trace_s_metadata_else_it_is_left_out() -> None:
    with gzip.open(H200 / "8x16x1024x64" / "sdpa-cudnn.json.gz", "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    assert CUDNN_VERSION_KEY not in trace and CUDNN_VERSION_KEY == PROFILER_KEY  # what the profiler writes
    trace[CUDNN_VERSION_KEY] = "91002"
    ledger = analyze_trace(trace).attention
    assert ledger is not None and ledger.attention_impl == "cuDNN 9.10.2 native-sdpa knob 7"


def test_fa4_kernels_inside_a_compiled_flex_graph_are_flex_s_flash_backend() -> None:
    def compiled_flash(b: TraceBuilder) -> None:
        with b.op("Torch-Compiled Region: 0/0"), b.op("## Call CompiledFxGraph f0 ##"):
            b.kernel(FA4, gpu_us=40.0, api="cuLaunchKernel")

    def plain_fa4(b: TraceBuilder) -> None:
        with b.op("attnprof:flash-attn"):
            b.kernel(FA4, gpu_us=40.0, api="cuLaunchKernel")

    flex = analyze_trace(build(compiled_flash)).attention
    assert flex is not None and flex.attention_impl == FLEX_FLASH
    plain = analyze_trace(build(plain_fa4)).attention
    assert plain is not None and plain.attention_impl == "FA4"


def test_a_cpu_only_trace_has_no_kernels_to_tell() -> None:
    analysis = analyze_trace(Path(__file__).parent / "data" / "cpu" / "sdpa-math.json.gz")
    assert analysis.attention is not None and analysis.attention.attention_impl is None
    assert trace_metadata("cpu") == {}


def test_rows_carry_it_and_the_run_view_and_the_model_table_show_it() -> None:
    import msgspec
    from typed_rows import analysed_row

    assert "attention_impl" in CELL_COLUMNS and "attention_impl" in MODEL_COLUMNS
    analysis = analyze_trace(H200 / "8x16x1024x64" / "sdpa-flash.json.gz")
    row = analysed_row(analysis, variant="sdpa-flash", shape="8x16x1024x64", seq=1024, mode="fwd")
    assert row.attention_impl == "FA2"
    summary = run_summary_table(row, "table").splitlines()
    assert any(line.startswith("attention implementation (from kernel names)") and line.endswith("FA2")
               for line in summary)
    model = msgspec.structs.replace(row, subject="model", variant="triton-flash", model="llama")
    table = model_table([model], "table", "sdpa", None).splitlines()
    assert "attn impl" in table[0] and table[2][table[0].index("attn impl") :].startswith("FA2")
