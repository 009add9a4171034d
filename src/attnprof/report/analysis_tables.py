"""Tables for `attnprof analyze` and `attnprof explain`: formatting only, no metrics computed here.

`render_analysis(analysis, fmt, width)` takes a `TraceAnalysis`, fmt "table"
(tabulate "simple") or "markdown" (tabulate "github"), and returns one string: a summary table,
the forward/backward phases (only with backward work), the attention ledger (its calls and the
overhead around them), a per-kernel table (for a CPU-only trace, the top ops by self CPU time instead)
the kernel counters of an Nsight Compute report when attached (`report.counters_tables`) and the
findings (fitted: the problems, with their impact; see `report.impact`); `analyze_report` ends it
with "What to look at". Headers and text count per step where the instances run a backward (see
`instance_unit`).
Missing values read "n/a" (never 0); an occupancy the profiler did not report reads
"unreported"; tensor cores read yes / no / ?. `width` None (`--wide`, and always for markdown)
gives the full tables; a number fits every line of the table style to it: kernel names are cut
shorter, the less wanted kernel columns dropped, and the finding bullets wrapped (see
`report.layout`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnprof.report.counters_tables import counters_section
from attnprof.report.formatting import fmt_number, table_style
from attnprof.report.impact import finding_line, left_out, shown, what_to_look_at
from attnprof.report.layout import Column, bullets, limit, table, wrap

NAME_WIDTH = 60


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}%"


def _dims(value: Any) -> str:
    if not value:
        return ""
    return "x".join(str(v) for v in value)


def _bytes(value: Any) -> str:
    if value is None:
        return ""
    if value >= 1024:
        return f"{value / 1024:,.1f} KB"
    return f"{value} B"


def _megabytes(value: Any) -> str:
    return "" if value is None else f"{value / 1e6:,.1f}"


def _gbps(gbps: float) -> str:
    """GB/s: whole above 100 ("4,359"), else three significant digits ("0.848", as on a CPU)."""
    return f"{gbps:,.0f}" if gbps >= 100 else f"{gbps:.3g}"


def _rate(gbps: Any, pct: Any) -> str:
    """ "4,359 (90.8%)": GB/s and its % of the read bandwidth; "" without a rate."""
    if gbps is None:
        return ""
    return _gbps(gbps) + ("" if pct is None else f" ({pct:g}%)")


def _tensor_cores(value: Any) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _short(name: str, fmt: str) -> str:
    if fmt == "table" and len(name) > NAME_WIDTH:
        return name[: NAME_WIDTH - 1] + "…"
    return name


SUMMARY_COLUMNS = (Column("metric"), Column("median", narrow=12), Column("min – max"))

KERNEL_COLUMNS = (
    Column("kernel", narrow=40, cut=True),
    Column("count / fwd", drop=8),
    Column("µs / fwd"),
    Column("grid", drop=5),
    Column("block", drop=1),
    Column("regs", drop=2),
    Column("shared mem", drop=3),
    Column("achieved occ.", drop=6),
    Column("theoretical occ.", drop=7),
    Column("tensor cores", drop=9),
    Column("launched by", drop=4),
)

PHASE_COLUMNS = (
    Column("phase", narrow=10),
    Column("kernels"),
    Column("memcpy"),
    Column("memset"),
    Column("kernel µs", drop=2),
    Column("GPU µs", drop=1),
)

COMM_COLUMNS = (Column("communication per forward", narrow=20), Column("median", narrow=20))
CALL_COLUMNS = (
    Column("#"),
    Column("attention call", narrow=24),
    Column("backend"),
    Column("phase", drop=2),
    Column("kernels", drop=1),
    Column("µs / fwd"),
)
BYTES_COLUMNS = (Column("MB / fwd", drop=3), Column("GB/s (% read bw)", drop=4))
CPU_OP_COLUMNS = (
    Column("op", narrow=30, cut=True),
    Column("calls / fwd"),
    Column("self CPU µs"),
    Column("self CPU %"),
    Column("CPU total µs", drop=2),
    Column("input shapes", narrow=16, drop=1),
)
OVERHEAD_COLUMNS = (
    Column("overhead"),
    Column("count / fwd"),
    Column("µs / fwd"),
    Column("launched by", narrow=20, drop=1),
)
CHAINS_SHOWN = 2

EXPLAIN_COLUMNS = (Column(""), Column("", narrow=20))
PART_COLUMNS = (Column("part", narrow=12), Column("meaning", narrow=20))


def render_analysis(analysis: Any, fmt: str = "table", width: int | None = None) -> str:
    """Summary, kernels and findings of a `TraceAnalysis` as one string, fitted to `width` (None: in full)."""
    return render_analysis_dict(analysis.to_dict(), fmt, width)


def analyze_report(analysis: Any, fmt: str = "table", width: int | None = None) -> str:
    """`attnprof analyze`: `render_analysis`, then "What to look at" when a finding has a measured impact."""
    data = analysis.to_dict()
    text = render_analysis_dict(data, fmt, width)
    look = what_to_look_at([("", instance_unit(data), data.get("findings") or [])], fmt, limit(width, fmt))
    return text + ("\n\n" + look if look else "")


def per_unit(columns: tuple[Column, ...], unit: str) -> tuple[Column, ...]:
    """The columns with `/ fwd` read as `/ step` when an instance is a step."""
    if unit == "forward":
        return columns
    return tuple(replace(c, header=c.header.replace("/ fwd", "/ step")) for c in columns)


def _spread(data: dict[str, Any], key: str, digits: int = 1) -> str:
    s = (data.get("spread") or {}).get(key)
    if not s:
        return ""
    return f"{fmt_number(s.get('min'), digits)} – {fmt_number(s.get('max'), digits)}"


def instance_unit(data: dict[str, Any]) -> str:
    """What the tables call one instance of the region ("step" or "forward"), by the rule the
    findings use (`analysis.instance.phases.instance_unit`)."""
    from attnprof.analysis.instance.phases import instance_unit as unit_of

    return unit_of(data.get("phases"))


def summary_table(data: dict[str, Any], fmt: str, width: int | None = None) -> str:
    """One row per per-forward metric: median and, where forwards differ, min – max (per step on
    training traces: see `instance_unit`)."""
    u = instance_unit(data)
    apis = data.get("launch_apis") or {}
    api_text = ", ".join(f"{api} {n}" for api, n in sorted(apis.items(), key=lambda kv: (-kv[1], kv[0])))
    rows = [
        [f"{u}s", fmt_number(data.get("forwards")), ""],
        [f"kernels / {u}", fmt_number(data.get("kernels_per_forward")), _spread(data, "kernels_per_forward", 0)],
        [f"memcpy / {u}", fmt_number(data.get("memcpy_per_forward")), _spread(data, "memcpy_per_forward", 0)],
        [f"memset / {u}", fmt_number(data.get("memset_per_forward")), _spread(data, "memset_per_forward", 0)],
        [f"GPU time / {u} (µs)", fmt_number(data.get("gpu_time_us")), _spread(data, "gpu_time_us")],
    ]
    if data.get("gpu_annotation_time_us") is not None:
        rows.append(
            [
                f"GPU annotation / {u} (µs)",
                fmt_number(data.get("gpu_annotation_time_us")),
                _spread(data, "gpu_annotation_time_us"),
            ]
        )
    rows += [
        [f"kernel time / {u} (µs)", fmt_number(data.get("kernel_time_us")), _spread(data, "kernel_time_us")],
        [f"CPU time / {u} (µs)", fmt_number(data.get("cpu_time_us")), _spread(data, "cpu_time_us")],
        [f"self device time, all {u}s (µs)", fmt_number(data.get("self_device_time_total_us")), ""],
        [f"launch calls / {u}", api_text or ("n/a" if data.get("kernels_per_forward") is None else "none"), ""],
        [
            f"aten::transpose / {u}",
            fmt_number(data.get("transposes_per_forward")),
            _spread(data, "transposes_per_forward", 0),
        ],
        [f"CPU ops / {u}", fmt_number(data.get("cpu_ops_per_forward")), _spread(data, "cpu_ops_per_forward", 0)],
        ["input dtype", data.get("input_dtype") or "n/a", ""],
    ]
    if data.get("annotation_mismatches") is not None:
        rows.append(["GPU annotation mismatches", fmt_number(data.get("annotation_mismatches")), ""])
    return table(SUMMARY_COLUMNS, rows, fmt, width)


def phases_table(data: dict[str, Any], fmt: str, width: int | None = None) -> str | None:
    """Forward and backward work per forward (medians); None when the trace shows no backward work."""
    phases = data.get("phases") or {}
    backward = phases.get("backward") or {}
    if not any(backward.get(key) for key in ("kernels", "memcpy", "memset")):
        return None
    rows = []
    for phase in ("forward", "backward"):
        facts = phases.get(phase) or {}
        label = phase + (" (after the region)" if facts.get("outside_region") else "")
        rows.append(
            [
                label,
                *(fmt_number(facts.get(key)) for key in ("kernels", "memcpy", "memset")),
                fmt_number(facts.get("kernel_time_us")),
                fmt_number(facts.get("gpu_time_us")),
            ]
        )
    return table(PHASE_COLUMNS, rows, fmt, width)


def comm_table(data: dict[str, Any], fmt: str, width: int | None = None) -> str | None:
    """Communication kernels (or c10d ops on CPU) against compute, per forward (or step); None without
    communication."""
    comm = data.get("comm")
    if not comm:
        return None
    rows = [
        ["c10d ops", fmt_number(comm.get("ops_per_forward"))],
        ["communication kernels", fmt_number(comm.get("kernels_per_forward"))],
    ]
    if comm.get("source") == "device":
        rows += [
            ["communication time (µs)", fmt_number(comm.get("comm_time_us"))],
            ["compute time (µs)", fmt_number(comm.get("compute_time_us"))],
            ["hidden under compute (µs)", fmt_number(comm.get("overlapped_us"))],
            ["exposed (µs)", fmt_number(comm.get("exposed_us"))],
            ["overlap", _pct(comm.get("overlap_pct"))],
            ["kernels", ", ".join(comm.get("kernels") or [])],
        ]
    else:
        rows.append(["time", "n/a (CPU: the communication runs on the backend's own threads)"])
    first = replace(COMM_COLUMNS[0], header=f"communication per {instance_unit(data)}")
    return table((first, *COMM_COLUMNS[1:]), rows, fmt, width)


def attention_section(data: dict[str, Any], fmt: str, width: int | None = None) -> list[str]:
    """The attention ledger: a summary line, one row per call and one per overhead kind ([] without a ledger)."""
    ledger = data.get("attention")
    if not ledger:
        return []
    backends = ", ".join(f"{b}:{n}" for b, n in (ledger.get("backends") or {}).items())
    u = instance_unit(data)
    on_cpu = ledger.get("time_base") == "cpu"
    line = f"{fmt_number(ledger.get('calls_per_forward'))} attention call(s) per {u}" + (
        f" ({backends})" if backends else ""
    )
    line += f"; their {'CPU' if on_cpu else 'device'} time {fmt_number(ledger.get('kernel_time_us'))} µs per {u}"
    if ledger.get("gpu_time_pct") is not None:
        line += f", {fmt_number(ledger['gpu_time_pct'])}% of the GPU time"
    if ledger.get("cpu_time_pct") is not None:
        line += f", {fmt_number(ledger['cpu_time_pct'])}% of the CPU time"
    if ledger.get("backward_kernel_time_us") is not None:
        line += f" ({fmt_number(ledger['backward_kernel_time_us'])} µs of it in the backward)"
    if ledger.get("bytes_per_forward") is not None:
        line += f"; they move {ledger['bytes_per_forward'] / 1e6:,.1f} MB per {u}"
        if ledger.get("achieved_gbps") is not None:
            line += f" at {_gbps(ledger['achieved_gbps'])} GB/s"
        if ledger.get("pct_of_read_bandwidth") is not None:
            line += f", {ledger['pct_of_read_bandwidth']:g}% of the {ledger.get('read_bandwidth_source')}"
    if on_cpu:
        line += " (a CPU-only trace: times are the calls' ops on the CPU)."
    else:
        line += f"; overhead around them {fmt_number(ledger.get('overhead_us'))} µs per {u}."
    parts = [*wrap(line, width)]
    calls = ledger.get("calls") or []
    if calls:
        with_bytes = any(c.get("bytes") is not None for c in calls)
        rows = [
            [
                str(i + 1),
                c["op"],
                c["backend"],
                c["phase"] if c.get("forward_call") is None else f"{c['phase']} of #{c['forward_call'] + 1}",
                "n/a" if on_cpu else str(len(c["kernels"])),
                fmt_number(c.get("time_us")),
            ]
            + (
                [_megabytes(c.get("bytes")), _rate(c.get("achieved_gbps"), c.get("pct_of_read_bandwidth"))]
                if with_bytes
                else []
            )
            for i, c in enumerate(calls)
        ]
        parts += ["", table(per_unit(CALL_COLUMNS + (BYTES_COLUMNS if with_bytes else ()), u), rows, fmt, width)]
    overhead = ledger.get("overhead") or []
    if overhead:
        rows = [
            [
                o["kind"],
                fmt_number(o["count_per_forward"]),
                fmt_number(o["time_us"]),
                "; ".join(o["ops"][:CHAINS_SHOWN]) + (" …" if len(o["ops"]) > CHAINS_SHOWN else ""),
            ]
            for o in overhead
        ]
        parts += ["", table(per_unit(OVERHEAD_COLUMNS, u), rows, fmt, width)]
    return parts


def cpu_ops_table(data: dict[str, Any], fmt: str, width: int | None = None) -> str | None:
    """A CPU-only trace's top ops by self CPU time per instance, as key_averages counts them; None without."""
    ops = data.get("top_cpu_ops")
    if not ops:
        return None
    u = instance_unit(data)
    columns = (replace(CPU_OP_COLUMNS[0]), replace(CPU_OP_COLUMNS[1], header=f"calls / {u}"), *CPU_OP_COLUMNS[2:])
    rows = [
        [
            _short(op["name"], fmt),
            fmt_number(op.get("calls_per_forward")),
            fmt_number(op.get("self_cpu_us")),
            _pct(None if op.get("self_cpu_pct") is None else round(op["self_cpu_pct"], 1)),
            fmt_number(op.get("cpu_total_us")),
            op.get("input_shapes") or "",
        ]
        for op in ops
    ]
    return table(columns, rows, fmt, width)


def kernel_table(kernels: list[dict[str, Any]], fmt: str, width: int | None = None, unit: str = "forward") -> str:
    """One row per distinct kernel, memcpy or memset, in the order they first ran (counts and times per `unit`)."""
    return table(per_unit(KERNEL_COLUMNS, unit), kernel_rows(kernels, fmt), fmt, width)


def kernel_rows(kernels: list[dict[str, Any]], fmt: str) -> list[list[str]]:
    """The cells of `KERNEL_COLUMNS` for each kernel entry (names cut to NAME_WIDTH in the table style)."""
    rows = []
    for k in kernels:
        is_kernel = k.get("kind", "kernel") == "kernel"
        achieved = (
            _pct(k.get("achieved_occupancy_pct"))
            if k.get("achieved_occupancy_pct") is not None
            else ("unreported" if is_kernel else "")
        )
        theoretical = ""
        if k.get("theoretical_occupancy_pct") is not None:
            theoretical = _pct(k["theoretical_occupancy_pct"])
            if k.get("occupancy_limiter"):
                theoretical += f" ({k['occupancy_limiter']})"
        rows.append(
            [
                _short(k.get("short_name") or k.get("name", ""), fmt),
                fmt_number(k.get("count_per_forward")),
                fmt_number(k.get("time_us")),
                _dims(k.get("grid")),
                _dims(k.get("block")),
                "" if k.get("registers_per_thread") is None else str(k["registers_per_thread"]),
                _bytes(k.get("shared_memory_bytes")),
                achieved,
                theoretical,
                _tensor_cores(k.get("tensor_cores")),
                k.get("launch_api") or "",
            ]
        )
    return rows


def findings_list(findings: list[dict[str, Any]], fmt: str, width: int | None = None, unit: str = "forward") -> str:
    """One bullet per finding, its id first and its impact per `unit` last, wrapped to `width` in the
    table style; fitted, the info findings are counted in a note instead."""
    if not findings:
        return "No findings." if fmt == "table" else "_No findings._"
    if fmt == "markdown":
        return "\n".join("- " + finding_line(f, unit).replace(f"[{f['id']}]", f"**`{f['id']}`**", 1) for f in findings)
    width = limit(width, fmt)
    listed = shown(findings, width)
    note = left_out([{"findings": findings}], width)
    if not listed:
        return "\n".join(["No problem found.", *note])
    return "\n".join([bullets([finding_line(f, unit) for f in listed], width), *note])


def render_analysis_dict(data: dict[str, Any], fmt: str = "table", width: int | None = None) -> str:
    """Like `render_analysis`, from the JSON dict (as `run` stores it)."""
    table_style(fmt)
    width = limit(width, fmt)
    device = data.get("device") or {}
    where = ""
    if device.get("name"):
        where = f" on {device['name']}"
        if device.get("compute_capability"):
            where += f" (compute capability {device['compute_capability']})"
    u = instance_unit(data)
    title = f"Trace analysis: region {data.get('region', 'attnprof')!r}, {data.get('forwards')} {u}(s){where}" + (
        f"; {data['region_choice']}" if data.get("region_choice") else ""
    )
    heading = (lambda text: f"### {text}") if fmt == "markdown" else (lambda text: text)
    parts = [*wrap(heading(title), width), "", summary_table(data, fmt, width)]
    phases = phases_table(data, fmt, width)
    if phases:
        parts += ["", heading(f"Phases per {u}"), "", phases]
    attention = attention_section(data, fmt, width)
    if attention:
        parts += ["", heading(f"Attention per {u}"), "", *attention]
    kernels = data.get("kernels") or []
    if kernels:
        parts += ["", heading(f"Kernels per {u}"), "", kernel_table(kernels, fmt, width, u)]
    elif data.get("kernels_per_forward") is None:
        parts += ["", *wrap("No GPU activity in the trace: GPU metrics are n/a.", width)]
        cpu_ops = cpu_ops_table(data, fmt, width)
        if cpu_ops:
            top = len(data["top_cpu_ops"])
            parts += ["", heading(f"Top {top} ops by self CPU time per {u}"), "", cpu_ops]
            parts += [
                *wrap(
                    f"Self CPU: each op's time less its children's; % of the CPU time per {u} (the rest ran "
                    "between ops: Python, the profiler). CPU total includes the children.",
                    width,
                )
            ]
    comm = comm_table(data, fmt, width)
    if comm:
        parts += ["", heading("Communication"), "", comm]
    counters = counters_section([("", data.get("counters"))], fmt, width, u)
    if counters:
        parts += ["", *counters]
    parts += ["", heading("Findings"), "", findings_list(data.get("findings") or [], fmt, width, u)]
    notes = data.get("notes") or []
    if notes:
        parts += ["", heading("Notes"), "", bullets(notes, width)]
    return "\n".join(parts)


def _tensor_cores_text(value: bool | None) -> str:
    return "yes" if value is True else "no" if value is False else "? (the name does not tell)"


def render_explanation(explanation: Any, fmt: str = "table", width: int | None = None) -> str:
    """`attnprof explain`: what a kernel name says, part by part, fitted to `width` (None: in full)."""
    data = explanation.to_dict() if hasattr(explanation, "to_dict") else dict(explanation)
    facts: list[list[str]] = [
        ["kernel", str(data.get("short_name") or data.get("name"))],
        ["family", str(data.get("family"))],
        ["library", data.get("library") or "n/a"],
        ["what it is", data.get("meaning") or "not decoded: no rule matches this name"],
        ["tensor cores", _tensor_cores_text(data.get("tensor_cores"))],
    ]
    if data.get("backend"):
        facts.append(["SDPA backend", str(data["backend"])])
    out = [table(EXPLAIN_COLUMNS, facts, fmt, width)]
    parts = data.get("parts") or []
    rows = [[p["token"], p["meaning"]] if isinstance(p, dict) else list(p) for p in parts]
    if rows:
        out += ["", table(PART_COLUMNS, rows, fmt, width)]
    return "\n".join(out)
