"""The result row, typed and versioned: one `Row` for a cell of run/compare/sweep and for a row of `attnprof
model` (`subject` says which), its nested parts, and the document that holds the rows.

The JSON of a results file, its CSV and the rows the renderers read are all this schema: `msgspec` encodes a
`Row` to JSON, the CSV columns are the scalar fields named in `CELL_COLUMNS` / `MODEL_COLUMNS`, and a file read
back is decoded into `Row`s (`results.files.load_results`, upgrading older versions first). A missing
measurement is None, never 0. Field names are those of the JSON, which earlier versions wrote too.
"""

from __future__ import annotations

from typing import Any, Literal

from attnprof.results.parts import (
    AttentionRecord,
    CommRecord,
    CountersRecord,
    CpuOpRecord,
    DeviceRecord,
    FindingRecord,
    KernelRecord,
    MaskAlternative,
    MinMax,
    PhasesRecord,
    Record,
)

#: The version of the row schema this attnprof writes (`schema_version` of every file). Version 1 is every
#: file written before the field existed; `results.upgrade` reads it.
SCHEMA_VERSION = 2

Subject = Literal["cell", "model"]


class Row(Record):
    """One row: a cell (`subject` "cell": one variant at one shape, dtype, mask and mode) or a row of
    `attnprof model` (`subject` "model": one attention implementation inside a whole model at one seq and
    mode). `status` is ok, skipped or failed, and `reason` says why not ok. The scalar fields are the CSV's
    columns (`CELL_COLUMNS`, `MODEL_COLUMNS`); the nested parts follow them."""

    subject: Subject = "cell"
    variant: str = ""
    source: str | None = None
    # what ran: a cell's spec, or the model's attention as the model states it
    implementation: str | None = None
    model: str | None = None
    params: int | None = None
    shape: str | None = None
    batch: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    seq: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    device: str | None = None
    causal: bool | None = None
    mode: str = "fwd"
    mask: str | None = None
    score_mod: str | None = None
    q_len: int | None = None
    kv_len: int | None = None
    page_size: int | None = None
    seq_lens: list[int] | None = None  # a packed variable-length batch's lengths (attnprof.varlen); seq is their total
    seq_lens_count: int | None = None
    seq_lens_min: int | None = None
    seq_lens_mean: float | None = None
    seq_lens_max: int | None = None
    causal_alignment: str | None = None
    fully_masked_rows: int | None = None
    dense_mask: bool | None = None
    status: str = "ok"
    reason: str | None = None
    # the trace
    region: str | None = None  # the profiler region analysed
    forwards: int | None = None
    kernels_per_forward: int | None = None
    memcpy_per_forward: int | None = None
    memset_per_forward: int | None = None
    gpu_time_us: float | None = None
    gpu_annotation_time_us: float | None = None
    kernel_time_us: float | None = None
    cpu_time_us: float | None = None
    self_device_time_total_us: float | None = None
    transposes_per_forward: int | None = None
    cpu_ops_per_forward: int | None = None
    input_dtype: str | None = None  # the inputs' dtype as the trace shows it
    annotation_mismatches: int | None = None
    forward_kernels: int | None = None
    forward_kernel_time_us: float | None = None
    backward_kernels: int | None = None
    backward_memcpy: int | None = None
    backward_memset: int | None = None
    backward_kernel_time_us: float | None = None
    backward_outside_region: bool | None = None
    backend: str | None = None
    attention_calls_per_forward: int | None = None
    attention_backends: str | None = None  # "cudnn:2"; None: no call
    attention_impl: str | None = None  # "FA2", "cuDNN 9.10.2 native-sdpa knob 7", ...: from the kernels' names
    attention_time_us: float | None = None
    attention_gpu_pct: float | None = None
    attention_overhead_us: float | None = None
    # timing without the profiler
    latency_us: float | None = None
    latency_iqr_us: float | None = None
    cold_ms: float | None = None
    unstable: bool | None = None
    retimed: int | None = None
    retimed_for_contention: int | None = None  # samples thrown away because other processes held the CPU
    cpu_contention: float | None = None
    quantized_tick_ms: float | None = None  # the scheduler tick the samples sit on multiples of
    contended: bool | None = None  # the kept timing measured other processes too (share or tick)
    timing_method: str | None = None
    cuda_graph: bool | None = None  # the latency is of CUDA-graph replays (timing_method says how many forwards)
    l2_state: str | None = None  # the L2 each timed call found: "warm", "flushed" or "rotated"; None on a CPU
    l2_bytes: int | None = None  # the GPU's L2 cache size
    working_set_bytes: int | None = None  # a CUDA cell's inputs (q, k, v, grad_out, a paged pool), one copy
    # throughput
    flops: float | None = None
    executed_flops: float | None = None
    tflops: float | None = None
    kernel_tflops: float | None = None
    tflops_convention: str | None = None
    pct_of_peak: float | None = None
    kernel_pct_of_peak: float | None = None
    pct_of_peak_note: str | None = None  # why pct_of_peak is None (no measured ceiling)
    peak_tflops: float | None = None  # the matmul ceiling measured on the device, in the row's dtype
    peak_reference_tflops: float | None = None  # what pct_of_peak divides by (pipeline.references)
    peak_reference_note: str | None = None  # set when an achieved figure raised it above peak_tflops
    bytes_moved: float | None = None
    achieved_gbps: float | None = None
    kernel_gbps: float | None = None  # the attention calls' bytes over their device time (the ledger's)
    kernel_pct_of_read_bandwidth: float | None = None  # kernel_gbps in % of the ledger's read bandwidth
    pct_of_read_bandwidth: float | None = None
    peak_read_gbps: float | None = None  # the read bandwidth measured on the device (the read probe)
    read_reference_gbps: float | None = None  # what pct_of_read_bandwidth divides by (pipeline.references)
    read_bandwidth_note: str | None = None  # set when an achieved figure raised it above peak_read_gbps
    bound: str | None = None
    # the best known at the row's cell (pipeline.best_known): the run's fastest variant there, else the shipped table
    best_known_variant: str | None = None
    best_known_latency_us: float | None = None  # its latency; None for the table's (which holds rates only)
    pct_of_best_known: float | None = None  # the row's rate in % of the best known's at the cell
    best_known_basis: str | None = None  # what pct_of_best_known compares: "kernel time" or "latency"
    best_known_source: str | None = None  # "this run", or the table's words ("H200 table 2026-05-01, ...")
    peak_memory_mib: float | None = None
    # correctness
    rel_error: float | None = None
    passed: bool | None = None
    grad_rel_error_dq: float | None = None
    grad_rel_error_dk: float | None = None
    grad_rel_error_dv: float | None = None
    grad_rel_error_dsinks: float | None = None  # a `sinks` cell's sink-logit gradient
    # fp8 cells: how q, k, v were scaled (per-tensor, per-head), the output's dtype, the quantization's
    # wall time (beside the latency, never in it) and the output against float64 of the dequantized inputs
    # (rel_error, sqnr_db) and of the bf16 sources (..._vs_bf16)
    fp8_scaling: str | None = None
    output_dtype: str | None = None
    quantize_ms: float | None = None
    sqnr_db: float | None = None
    rel_error_vs_bf16: float | None = None
    sqnr_db_vs_bf16: float | None = None
    nan_on_fully_masked: bool | None = None
    logits_baseline: str | None = None
    logits_max_abs_diff: float | None = None
    logits_rel_diff: float | None = None
    # the clock, the timing's details
    sm_clock_mhz: float | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    clock_limits: str | None = None
    # the GPU over the timed calls alone, sampled through NVML (profiling.gpu_health)
    timed_sm_clock_mhz: float | None = None
    timed_sm_clock_min_mhz: float | None = None
    sm_clock_application_mhz: float | None = None
    timed_power_pct: float | None = None
    timed_power_max_pct: float | None = None
    timed_temperature_max_c: float | None = None
    timed_clock_limits: str | None = None
    nvml_samples: int | None = None
    latency_p25_us: float | None = None
    latency_p75_us: float | None = None
    latency_min_us: float | None = None
    timing_reps: int | None = None
    warmup_reps: int | None = None
    forwards_per_sample: int | None = None
    rel_error_threshold: float | None = None
    grad_rel_error_threshold: float | None = None
    correctness_scope: str | None = None
    flops_convention: str | None = None
    speedup_vs_baseline: float | None = None
    speedup_reliable: bool | None = None
    speedup_vs_dtype: str | None = None  # the baseline row's dtype when not the row's own (an fp8 row against bf16)
    trace: str | None = None
    ncu_report: str | None = None
    ncu_note: str | None = None
    comm_kernels_per_forward: int | None = None
    comm_time_us: float | None = None
    comm_overlap_pct: float | None = None
    comm_exposed_us: float | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    hostname: str | None = None
    gpu: str | None = None
    ncu_seconds: float | None = None
    # nested parts
    findings: list[FindingRecord] = []
    grad_rel_error: dict[str, float | None] | None = None
    launch_apis: dict[str, int] = {}
    kernels: list[KernelRecord] = []
    spread: dict[str, MinMax] = {}
    phases: PhasesRecord | None = None
    attention: AttentionRecord | None = None
    trace_device: DeviceRecord | None = None
    comm: CommRecord | None = None
    top_cpu_ops: list[CpuOpRecord] | None = None  # a CPU-only trace's ops by self CPU time
    counters: CountersRecord | None = None
    mask_alternatives: list[MaskAlternative] = []
    phases_s: dict[str, float] = {}
    notes: list[str] = []
    warnings: list[str] = []

    @property
    def ok(self) -> bool:
        """True when the row ran to the end and passed its checks."""
        return self.status == "ok"

    @property
    def finding_ids(self) -> list[str]:
        """The ids of its findings, in order."""
        return [f.id for f in self.findings]

    def finding(self, finding_id: str) -> FindingRecord | None:
        """The finding with this id, or None."""
        return next((f for f in self.findings if f.id == finding_id), None)


#: The CSV columns of a cell's row, in order.
CELL_COLUMNS: tuple[str, ...] = (
    *("variant", "source", "shape", "batch", "heads", "kv_heads", "seq", "head_dim", "dtype", "device"),
    *("causal", "mode", "mask", "score_mod", "q_len", "kv_len", "page_size", "causal_alignment"),
    *("seq_lens_count", "seq_lens_min", "seq_lens_mean", "seq_lens_max"),
    *("fully_masked_rows", "dense_mask", "status", "reason", "forwards", "kernels_per_forward"),
    *("memcpy_per_forward", "memset_per_forward", "gpu_time_us", "kernel_time_us", "cpu_time_us"),
    *("self_device_time_total_us", "transposes_per_forward", "cpu_ops_per_forward", "forward_kernels"),
    *("forward_kernel_time_us", "backward_kernels", "backward_memcpy", "backward_memset"),
    *("backward_kernel_time_us", "backward_outside_region", "backend", "attention_calls_per_forward"),
    *("attention_backends", "attention_impl", "attention_time_us", "attention_gpu_pct", "attention_overhead_us"),
    *("latency_us", "latency_iqr_us", "cold_ms", "unstable", "retimed", "retimed_for_contention", "cpu_contention"),
    *("quantized_tick_ms", "contended", "timing_method", "cuda_graph", "l2_state", "l2_bytes", "working_set_bytes"),
    "flops",
    *("executed_flops", "tflops", "kernel_tflops", "tflops_convention", "pct_of_peak", "kernel_pct_of_peak"),
    *("pct_of_peak_note", "peak_tflops", "peak_reference_tflops", "peak_reference_note", "bytes_moved"),
    *("achieved_gbps", "kernel_gbps", "kernel_pct_of_read_bandwidth", "pct_of_read_bandwidth", "peak_read_gbps"),
    *("read_reference_gbps", "read_bandwidth_note", "bound", "best_known_variant", "best_known_latency_us"),
    *("pct_of_best_known", "best_known_basis", "best_known_source", "peak_memory_mib"),
    *("rel_error", "passed", "grad_rel_error_dq", "grad_rel_error_dk", "grad_rel_error_dv"),
    "grad_rel_error_dsinks",
    *("nan_on_fully_masked", "sm_clock_mhz", "sm_clock_min_mhz", "sm_clock_max_mhz", "clock_limits"),
    *("timed_sm_clock_mhz", "timed_sm_clock_min_mhz", "sm_clock_application_mhz", "timed_power_pct"),
    *("timed_power_max_pct", "timed_temperature_max_c", "timed_clock_limits", "nvml_samples"),
    *("latency_p25_us", "latency_p75_us", "latency_min_us", "timing_reps", "warmup_reps"),
    *("forwards_per_sample", "rel_error_threshold", "grad_rel_error_threshold", "correctness_scope"),
    *("fp8_scaling", "output_dtype", "quantize_ms", "sqnr_db", "rel_error_vs_bf16", "sqnr_db_vs_bf16"),
    *("flops_convention", "speedup_vs_baseline", "speedup_reliable", "speedup_vs_dtype", "findings", "trace"),
    "ncu_report",
    *("ncu_note", "comm_kernels_per_forward", "comm_time_us", "comm_overlap_pct", "comm_exposed_us"),
    *("rank", "local_rank", "world_size", "hostname", "gpu", "ncu_seconds"),
)

#: The CSV columns of a row of `attnprof model`, in order.
MODEL_COLUMNS: tuple[str, ...] = (
    *("variant", "implementation", "source", "model", "params", "batch", "shape", "seq", "heads"),
    *("kv_heads", "head_dim", "dtype", "device", "causal", "mask", "score_mod", "mode", "status", "reason"),
    *("latency_us", "latency_iqr_us", "cold_ms", "unstable", "timing_method", "l2_state", "cpu_contention"),
    *("quantized_tick_ms", "contended", "retimed_for_contention"),
    *("latency_min_us", "speedup_vs_baseline", "speedup_reliable", "forwards", "kernels_per_forward"),
    *("memcpy_per_forward", "memset_per_forward", "gpu_time_us", "kernel_time_us", "cpu_time_us"),
    *("peak_memory_mib", "attention_calls_per_forward", "attention_backends", "attention_impl", "attention_time_us"),
    *("attention_gpu_pct", "attention_overhead_us", "kernel_gbps", "logits_baseline", "logits_max_abs_diff"),
    *("logits_rel_diff", "sm_clock_mhz", "sm_clock_max_mhz", "clock_limits", "timed_sm_clock_mhz"),
    *("timed_sm_clock_min_mhz", "sm_clock_application_mhz", "timed_power_pct", "timed_power_max_pct"),
    *("timed_temperature_max_c", "timed_clock_limits", "nvml_samples", "findings", "trace"),
    *("ncu_seconds", "ncu_report", "ncu_note"),
)


def columns(subject: Subject) -> tuple[str, ...]:
    """The CSV columns of rows of this subject."""
    return MODEL_COLUMNS if subject == "model" else CELL_COLUMNS


class Document(Record):
    """A results file: what wrote it and when, the environment, the config, the ceiling and the rows.
    `config`, `environment`, `ceiling` and `measure` are kept as written (their own schemas: `config.Config`,
    `profiling.environment`, `profiling.ceiling.Ceiling`, `config.MeasureOptions`)."""

    schema_version: int = SCHEMA_VERSION
    attnprof_version: str | None = None
    command: str | None = None
    created: str | None = None
    interrupted: bool = False
    files: dict[str, Any] | None = None
    environment: dict[str, Any] = {}
    config: dict[str, Any] | None = None
    ceiling: dict[str, Any] | None = None
    measure: dict[str, Any] | None = None
    resumed_from: str | None = None
    ceilings: dict[str, Any] | None = None  # one ceiling per dtype, when the run measured several
    distributed: dict[str, Any] | None = None  # a torchrun group: its ranks and what each ran
    ncu: dict[str, Any] | None = None  # --ncu: what Nsight Compute took over the run
    placement: dict[str, Any] | None = None  # a rank's stream: where it ran
    format: str | None = None  # `STREAM_FORMAT` on the first line of a results stream
    results: list[Row] = []

    @property
    def subject(self) -> Subject:
        """ "model" for a document of `attnprof model`, else "cell"."""
        return "model" if self.command == "model" else "cell"
