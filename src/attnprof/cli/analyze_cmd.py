"""`attnprof analyze`: per-forward facts and findings for any torch.profiler Chrome trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnprof.cli import common as c

TraceArg = Annotated[Path, typer.Argument(help="A torch.profiler Chrome trace (.json or .json.gz).")]
RegionOpt = Annotated[
    str | None,
    typer.Option(
        "--region",
        show_default=False,
        help="The record_function name around one forward, or a glob pattern such as 'ProfilerStep#*'. "
        "Default: chosen from the trace (see above).",
    ),
]
NcuReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--ncu-report",
        show_default=False,
        help="An Nsight Compute report of the same run (.ncu-rep, or its raw page as .csv: `ncu --import "
        "FILE.ncu-rep --csv --page raw > FILE.csv`): its counters are attached to the trace's kernels.",
    ),
]
DtypeHintOpt = Annotated[
    str | None,
    typer.Option("--dtype", help="Input dtype (bf16/fp16/fp32) when the trace does not record it.", show_default=False),
]
CalibrateOpt = Annotated[
    bool,
    typer.Option(
        "--calibrate-profiler",
        help="Measure the profiler's own cost per recorded op on this machine (about a second, needs torch; "
        "cached) and judge cpu-bound and gpu-idle net of it. Without it the cached figure is used, if any.",
    ),
]
TimeFixesOpt = Annotated[
    bool,
    typer.Option(
        "--time-fixes",
        help="Re-create each finding's attention calls (or GEMMs, or mask conversions) from the trace's recorded "
        "shapes on this machine (a CUDA trace needs a CUDA GPU), time them as traced and with the fix the finding "
        "proposes, and give the measured saving as its impact, labelled timed. Needs torch and record_shapes.",
    ),
]
TimeFixesBudgetOpt = Annotated[
    float,
    typer.Option("--time-fixes-budget", min=0.1, metavar="SECONDS", help="With --time-fixes: seconds for all timings."),
]
#: The findings whose host time includes the profiler's own recording.
RECORDING_FINDINGS = ("cpu-bound", "gpu-idle")


@c.handle_errors
def analyze_command(
    trace: TraceArg,
    region: RegionOpt = None,
    dtype: DtypeHintOpt = None,
    ncu_report: NcuReportOpt = None,
    calibrate_profiler: CalibrateOpt = False,
    time_fixes: TimeFixesOpt = False,
    time_fixes_budget: TimeFixesBudgetOpt = 10.0,
    fmt: c.FormatOpt = c.OutputFormat.table,
    wide: c.WideOpt = False,
) -> None:
    """Analyse a trace: attribute GPU work to each forward and explain what it shows.

    A forward is one range of --region; its GPU work is what was launched inside it (by correlation).

    --region: a record_function name, or a glob pattern (* ? [...]) whose every match is one forward.
    'ProfilerStep#*' makes each profiler step (prof.step()) one forward.
    A string that is exactly a name in the trace means that name only.

    Without --region: 'attnprof' if the trace has it, else the only user annotation, else 'ProfilerStep#*'.
    The choice is said on stderr (and in the JSON as region_choice).

    Attention's % of read bandwidth uses the read bandwidth measured on this machine when its ceiling
    cache holds one for the GPU and dtype of the trace (a run or compare measured it), else the GPU's
    datasheet; the JSON's attention.read_bandwidth_basis and the text say which.

    --ncu-report: the i-th kernel of a name in the report is the i-th launch of that name in the trace.
    Each attention kernel gets its share of the attention FLOPs (by tensor-pipe time) and its place on the
    roofline; the kernel counters table, the counter findings and the JSON's `counters` follow.

    cpu-bound and gpu-idle are judged net of the profiler's own recording (ops per forward x its cost per op)
    when this machine's cost per op is cached for the trace's record_shapes setting; --calibrate-profiler
    measures it (and caches it) first.

    --time-fixes: each finding that proposes a fix (unfused-attention, dense-mask, mask-convert, backend-fallback,
    fp32-cuda-cores) has its calls re-created at the recorded shapes and dtypes and timed on this machine, as
    traced and with each alternative (fused SDPA per backend, is_causal or a BlockMask, the mask converted once,
    bf16); the fastest alternative's saving becomes the impact, labelled timed, and the others are named in the
    evidence. A note on stderr says what was timed and how long it took.
    """
    from attnprof.analysis import analyze_trace, attach_counters, load_trace
    from attnprof.analysis.attainable import table_reference
    from attnprof.analysis.trace.load import gc_paused
    from attnprof.peaks import cached_peaks
    from attnprof.profiling.profiler_cost import ProfilerCost, cached_cost, profiler_cost

    report = None
    if ncu_report is not None:  # a bad report fails before the trace is read
        from attnprof.analysis.counters import load_counters

        report = load_counters(ncu_report)
    with gc_paused():  # the analysis keeps many containers until its output is written
        parsed = load_trace(trace, every_concrete_input=time_fixes)
        if c.STATE.debug:
            for line in parsed.read_notes:
                c.note(f"debug: {line}")
        looked_up: list[bool] = []  # whether a cost per op was found, once the analysis asked

        def recording(record_shapes: bool, cuda: bool) -> ProfilerCost | None:
            cost = profiler_cost(record_shapes, cuda) if calibrate_profiler else cached_cost(record_shapes, cuda)
            looked_up.append(cost is not None)
            return cost

        analysis = analyze_trace(
            parsed, region=region, dtype=dtype, peaks=cached_peaks, recording=recording, attainable=table_reference
        )
        if looked_up == [False] and any(f.id in RECORDING_FINDINGS for f in analysis.findings):
            c.note(
                "note: cpu-bound/gpu-idle count the profiler's own recording as host time; "
                "--calibrate-profiler measures its cost on this machine (about a second, cached) to judge them net"
            )
        if report is not None:
            attach_counters(analysis, parsed, report, cached_peaks, table_reference)
            if analysis.counters is not None and analysis.counters.match is not None:
                c.note(analysis.counters.match.text)
        if time_fixes:
            from attnprof.pipeline.fixes import judged
            from attnprof.pipeline.fixes import time_fixes as timed_fixes

            fixes = timed_fixes(analysis, parsed, time_fixes_budget)
            judged(analysis, fixes)
            c.note(f"note: {fixes.note}")
        del parsed
        if analysis.region_choice:
            c.note(analysis.region_choice)
        from attnprof.results.records import analysis_record

        record = analysis_record(analysis)  # the typed JSON contract, which the tables read too
        if fmt is c.OutputFormat.json:
            from attnprof.results.files import to_json

            text = to_json(record)
        else:
            from attnprof.report.analysis_tables import analyze_report  # tables only: not needed for JSON

            text = analyze_report(record, fmt.value, c.table_width(fmt, wide))
        del analysis, record  # freed while the collector is off, so it has none of it to walk when back on
    c.emit(text)
