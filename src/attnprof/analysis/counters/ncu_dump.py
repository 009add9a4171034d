"""What a `.ncu-rep` holds, read through Nsight Compute's own `ncu_report` module, as plain data.

`report_contents(ncu_report, path)` gives `{"kernels": [{"name": demangled, "metrics": {name: [value, unit]}}]}`
(every kernel of every range, in order; each metric as the module reports it, in its unit) or
`{"error": "..."}` when the module cannot load the file. `analysis.counters.readers` runs this file as a
script in a Python process of its own (`python ncu_dump.py FOLDER REPORT`, FOLDER holding ncu_report.py),
which prints that object as JSON: the script imports nothing but the standard library and `ncu_report`,
because loading `_ncu_report` beside torch crashed attnprof on the H200 (a segmentation fault).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def report_contents(ncu_report: Any, path: str) -> dict[str, Any]:
    """The kernels of the report at `path` through the module `ncu_report` (see the module docstring)."""
    try:
        context = ncu_report.load_report(path)
    except Exception as exc:  # the native loader raises its own kinds
        return {"error": f"{type(exc).__name__}: {exc}"}
    demangled = ncu_report.IAction.NameBase_DEMANGLED
    kernel_type = getattr(ncu_report.IAction, "WorkloadType_KERNEL", None)
    kernels = []
    for r in range(context.num_ranges()):
        found = context.range_by_idx(r)
        for a in range(found.num_actions()):
            action = found.action_by_idx(a)
            if kernel_type is not None and hasattr(action, "workload_type") and action.workload_type() != kernel_type:
                continue
            metrics = {}
            for name in action.metric_names():
                value = _value(action.metric_by_name(name))
                if value is not None:
                    metrics[name] = value
            kernels.append({"name": action.name(demangled), "metrics": metrics})
    return {"kernels": kernels}


def _value(metric: Any) -> list[Any] | None:
    """[value, unit] of one metric (None when it has none): text, an integer as a float, or a double."""
    if metric is None or not metric.has_value():
        return None
    kind = metric.kind()
    if kind == metric.ValueKind_STRING:
        value: Any = metric.as_string()
    elif kind in (metric.ValueKind_UINT32, metric.ValueKind_UINT64):
        value = float(metric.as_uint64())
    else:
        value = metric.as_double()
    return None if value is None else [value, metric.unit() or ""]


if __name__ == "__main__":
    sys.path[0] = sys.argv[1]  # the folder of ncu_report.py instead of this one (whose modules it needs not see)
    import ncu_report

    print(json.dumps(report_contents(ncu_report, sys.argv[2])))
