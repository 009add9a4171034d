"""Tables for `attnprof analyze`: formatting only, no metrics computed here.

`render_analysis(analysis, fmt, width)` takes the typed `results.schema.Analysis` (or a live
`TraceAnalysis`, typed by `results.records.analysis_record`), fmt "table" (tabulate "simple") or
"markdown" (tabulate "github"), and returns one string: a summary table, the forward/backward phases
(only with backward work), the attention ledger (its calls and the overhead around them,
`report.attention_tables`), a per-kernel table (for a CPU-only trace, the top ops by self CPU time
instead, `report.kernel_tables`), the kernel counters of an Nsight Compute report when attached
(`report.counters_tables`) and the findings (fitted: the problems, with their impact; see
`report.impact`); `analyze_report` ends it with "What to look at". Headers and text count per step
where the instances run a backward (see `instance_unit`). `attnprof explain` is `report.explain_tables`.
Missing values read "n/a" (never 0). `width` None (`--wide`, and always for markdown) gives the full
tables; a number fits every line of the table style to it: kernel names are cut shorter, the less
wanted kernel columns dropped, and the finding bullets wrapped (see `report.layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from attnprof.report.attention_tables import attention_section
from attnprof.report.counters_tables import counters_section
from attnprof.report.formatting import fmt_number, table_style
from attnprof.report.impact import finding_line, left_out, shown, what_to_look_at
from attnprof.report.kernel_tables import KERNEL_COLUMNS, cpu_ops_table, kernel_rows, kernel_table, pct_text
from attnprof.report.layout import Column, bullets, limit, table, wrap
from attnprof.results.files import to_builtins
from attnprof.results.parts import Analysis, FindingRecord

if TYPE_CHECKING:
    from attnprof.analysis import TraceAnalysis

__all__ = ["KERNEL_COLUMNS", "analyze_report", "kernel_rows", "render_analysis"]

SUMMARY_COLUMNS = (Column("metric"), Column("median", narrow=12), Column("min – max"))
PHASE_COLUMNS = (
    Column("phase", narrow=10),
    Column("kernels"),
    Column("memcpy"),
    Column("memset"),
    Column("kernel µs", drop=2),
    Column("GPU µs", drop=1),
)
COMM_COLUMNS = (Column("communication per forward", narrow=20), Column("median", narrow=20))
CPU_OPS_NOTE = (
    "Self CPU: each op's time less its children's; % of the CPU time per {unit} (the rest ran between ops: "
    "Python, the profiler). CPU total includes the children."
)


def typed(analysis: Analysis | TraceAnalysis) -> Analysis:
    """The typed analysis: `analysis` itself, or the record of a live `TraceAnalysis`."""
    if isinstance(analysis, Analysis):
        return analysis
    from attnprof.results.records import analysis_record

    return analysis_record(analysis)


def render_analysis(analysis: Analysis | TraceAnalysis, fmt: str = "table", width: int | None = None) -> str:
    """Summary, kernels and findings of a trace analysis as one string, fitted to `width` (None: in full)."""
    return render(typed(analysis), fmt, width)


def analyze_report(analysis: Analysis | TraceAnalysis, fmt: str = "table", width: int | None = None) -> str:
    """`attnprof analyze`: `render_analysis`, then "What to look at" when a finding has a measured impact."""
    record = typed(analysis)
    text = render(record, fmt, width)
    look = what_to_look_at([("", instance_unit(record), record.findings)], fmt, limit(width, fmt))
    return text + ("\n\n" + look if look else "")


def instance_unit(analysis: Analysis) -> str:
    """What the tables call one instance of the region ("step" or "forward"), by the rule the
    findings use (`analysis.instance.phases.instance_unit`)."""
    from attnprof.analysis.instance.phases import instance_unit as unit_of

    return unit_of(None if analysis.phases is None else to_builtins(analysis.phases))


def _spread(analysis: Analysis, key: str, digits: int = 1) -> str:
    s = analysis.spread.get(key)
    return "" if s is None else f"{fmt_number(s.min, digits)} – {fmt_number(s.max, digits)}"


def summary_table(analysis: Analysis, fmt: str, width: int | None = None) -> str:
    """One row per per-forward metric: median and, where forwards differ, min – max (per step on
    training traces: see `instance_unit`)."""
    a, u = analysis, instance_unit(analysis)
    apis = sorted(a.launch_apis.items(), key=lambda kv: (-kv[1], kv[0]))
    api_text = ", ".join(f"{api} {n}" for api, n in apis)

    def median(label: str, value: float | None, key: str | None = None, digits: int = 1) -> list[str]:
        return [label, fmt_number(value), "" if key is None else _spread(a, key, digits)]

    rows = [
        median(f"{u}s", a.forwards),
        median(f"kernels / {u}", a.kernels_per_forward, "kernels_per_forward", 0),
        median(f"memcpy / {u}", a.memcpy_per_forward, "memcpy_per_forward", 0),
        median(f"memset / {u}", a.memset_per_forward, "memset_per_forward", 0),
        median(f"GPU time / {u} (µs)", a.gpu_time_us, "gpu_time_us"),
    ]
    if a.gpu_annotation_time_us is not None:
        rows.append(median(f"GPU annotation / {u} (µs)", a.gpu_annotation_time_us, "gpu_annotation_time_us"))
    rows += [
        median(f"kernel time / {u} (µs)", a.kernel_time_us, "kernel_time_us"),
        median(f"CPU time / {u} (µs)", a.cpu_time_us, "cpu_time_us"),
        median(f"self device time, all {u}s (µs)", a.self_device_time_total_us),
        [f"launch calls / {u}", api_text or ("n/a" if a.kernels_per_forward is None else "none"), ""],
        median(f"aten::transpose / {u}", a.transposes_per_forward, "transposes_per_forward", 0),
        median(f"CPU ops / {u}", a.cpu_ops_per_forward, "cpu_ops_per_forward", 0),
        ["input dtype", a.input_dtype or "n/a", ""],
    ]
    if a.annotation_mismatches is not None:
        rows.append(median("GPU annotation mismatches", a.annotation_mismatches))
    return table(SUMMARY_COLUMNS, rows, fmt, width)


def phases_table(analysis: Analysis, fmt: str, width: int | None = None) -> str | None:
    """Forward and backward work per forward (medians); None when the trace shows no backward work."""
    phases = analysis.phases
    if phases is None or instance_unit(analysis) == "forward":
        return None
    label = "backward" + (" (after the region)" if phases.backward.outside_region else "")
    rows = [
        [
            name,
            *(fmt_number(n) for n in (facts.kernels, facts.memcpy, facts.memset)),
            fmt_number(facts.kernel_time_us),
            fmt_number(facts.gpu_time_us),
        ]
        for name, facts in (("forward", phases.forward), (label, phases.backward))
    ]
    return table(PHASE_COLUMNS, rows, fmt, width)


def comm_table(analysis: Analysis, fmt: str, width: int | None = None) -> str | None:
    """Communication kernels (or c10d ops on CPU) against compute, per forward (or step); None without
    communication."""
    comm = analysis.comm
    if comm is None:
        return None
    rows = [
        ["c10d ops", fmt_number(comm.ops_per_forward)],
        ["communication kernels", fmt_number(comm.kernels_per_forward)],
    ]
    if comm.source == "device":
        rows += [
            ["communication time (µs)", fmt_number(comm.comm_time_us)],
            ["compute time (µs)", fmt_number(comm.compute_time_us)],
            ["hidden under compute (µs)", fmt_number(comm.overlapped_us)],
            ["exposed (µs)", fmt_number(comm.exposed_us)],
            ["overlap", pct_text(comm.overlap_pct)],
            ["kernels", ", ".join(comm.kernels)],
        ]
    else:
        rows.append(["time", "n/a (CPU: the communication runs on the backend's own threads)"])
    first = replace(COMM_COLUMNS[0], header=f"communication per {instance_unit(analysis)}")
    return table((first, *COMM_COLUMNS[1:]), rows, fmt, width)


def findings_list(findings: Sequence[FindingRecord], fmt: str, width: int | None = None, unit: str = "forward") -> str:
    """One bullet per finding, its id first and its impact per `unit` last, wrapped to `width` in the
    table style; fitted, the info findings are counted in a note instead."""
    if not findings:
        return "No findings." if fmt == "table" else "_No findings._"
    if fmt == "markdown":
        return "\n".join("- " + finding_line(f, unit).replace(f"[{f.id}]", f"**`{f.id}`**", 1) for f in findings)
    width = limit(width, fmt)
    listed = shown(list(findings), width)
    note = left_out([Analysis(findings=list(findings))], width)
    if not listed:
        return "\n".join(["No problem found.", *note])
    return "\n".join([bullets([finding_line(f, unit) for f in listed], width), *note])


def _title(analysis: Analysis, unit: str) -> str:
    device = analysis.device
    where = ""
    if device is not None and device.name:
        where = f" on {device.name}"
        if device.compute_capability:
            where += f" (compute capability {device.compute_capability})"
    choice = f"; {analysis.region_choice}" if analysis.region_choice else ""
    return f"Trace analysis: region {analysis.region!r}, {analysis.forwards} {unit}(s){where}{choice}"


def render(analysis: Analysis, fmt: str = "table", width: int | None = None) -> str:
    """`render_analysis` of the typed analysis (see the module docstring)."""
    table_style(fmt)
    width = limit(width, fmt)
    u = instance_unit(analysis)
    heading: Callable[[str], str] = (lambda text: f"### {text}") if fmt == "markdown" else (lambda text: text)
    parts = [*wrap(heading(_title(analysis, u)), width), "", summary_table(analysis, fmt, width)]
    phases = phases_table(analysis, fmt, width)
    if phases:
        parts += ["", heading(f"Phases per {u}"), "", phases]
    attention = attention_section(analysis.attention, fmt, width, u)
    if attention:
        parts += ["", heading(f"Attention per {u}"), "", *attention]
    if analysis.kernels:
        parts += ["", heading(f"Kernels per {u}"), "", kernel_table(analysis.kernels, fmt, width, u)]
    elif analysis.kernels_per_forward is None:
        parts += ["", *wrap("No GPU activity in the trace: GPU metrics are n/a.", width)]
        cpu_ops = cpu_ops_table(analysis.top_cpu_ops, fmt, width, u)
        if cpu_ops and analysis.top_cpu_ops:
            top = len(analysis.top_cpu_ops)
            parts += ["", heading(f"Top {top} ops by self CPU time per {u}"), "", cpu_ops]
            parts += wrap(CPU_OPS_NOTE.format(unit=u), width)
    comm = comm_table(analysis, fmt, width)
    if comm:
        parts += ["", heading("Communication"), "", comm]
    counters = counters_section([("", analysis.counters)], fmt, width, u)
    if counters:
        parts += ["", *counters]
    parts += ["", heading("Findings"), "", findings_list(analysis.findings, fmt, width, u)]
    if analysis.notes:
        parts += ["", heading("Notes"), "", bullets(analysis.notes, width)]
    return "\n".join(parts)
