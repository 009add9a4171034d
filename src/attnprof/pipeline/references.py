"""One reference per device for every percentage of a run's rows: % of peak and % of read bandwidth.

A row's percentages divide its achieved rates by the ceilings measured on its device: the matmul ceiling
(`peak_tflops`, per dtype) and the read bandwidth (`peak_read_gbps`, the read probe's). A row can beat one
(the probe is one kernel; an attention may read faster), and a beaten ceiling is no ceiling. Then the
reference is raised to the best figure achieved, for every row of that device (and, for the matmul, that
dtype) in the run, so one table never divides by two references: the best row reads 100% and the others
their share of it. The row records the reference (`peak_reference_tflops`, `read_reference_gbps`) and, when
raised, what from and by whose figure (`peak_reference_note`, `read_bandwidth_note`); the tables print the
notes as a legend. `cell_row` applies this to each row alone (a stream's rows), `pipeline.sharded` to all
the rows of a run once they are gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from attnprof.results.keys import cell_label
from attnprof.results.schema import Row


@dataclass(frozen=True)
class Reference:
    """What a group's percentages divide by: `value`, the best of the `measured` ceiling and the figures its
    rows achieved; `note` says so when an achieved figure raised it, else None."""

    value: float
    measured: float
    note: str | None = None


def attach_references(rows: list[Row]) -> None:
    """Set the percentages and bound of every timed cell row against its device's references (see the
    module docstring): `pct_of_peak`, `kernel_pct_of_peak`, `pct_of_read_bandwidth`, `bound`, the references
    and their notes, from the rates the row records. Rows without a measured ceiling keep their percentages
    None (and `pct_of_peak_note`)."""
    from attnprof.analysis.roofline import arithmetic_intensity

    timed = [r for r in rows if r.subject == "cell" and r.tflops is not None]
    peaks = _references(timed, lambda r: (r.hostname, r.device, r.dtype), _compute_figures, "matmul")
    reads = _references(timed, lambda r: (r.hostname, r.device), _read_figures, "read")
    for row in timed:
        peak, read = peaks.get((row.hostname, row.device, row.dtype)), reads.get((row.hostname, row.device))
        if peak is not None:
            row.pct_of_peak, row.pct_of_peak_note = _pct(row.tflops, peak.value), None
            row.kernel_pct_of_peak = _pct(row.kernel_tflops, peak.value)
            row.peak_reference_tflops, row.peak_reference_note = peak.value, peak.note
        if read is not None:
            row.pct_of_read_bandwidth = _pct(row.achieved_gbps, read.value)
            row.read_reference_gbps, row.read_bandwidth_note = read.value, read.note
        if peak is not None and read is not None and row.flops is not None and row.bytes_moved is not None:
            ridge = peak.value * 1e3 / read.value  # FLOPs per byte
            row.bound = "compute" if arithmetic_intensity(row.flops, row.bytes_moved) >= ridge else "memory"


def _pct(rate: float | None, reference: float) -> float | None:
    """`rate` in percent of `reference`, which is at least every rate of its group (100 but for rounding)."""
    return None if rate is None else min(100.0, 100.0 * (rate / reference))


#: A row's achieved figures against one ceiling: (the figure, what it is called in a note).
Figures = Callable[[Row], list[tuple[float, str]]]


def _compute_figures(row: Row) -> list[tuple[float, str]]:
    figures = [(float(row.tflops or 0.0), "by latency")]
    return figures + ([(row.kernel_tflops, "by kernel time")] if row.kernel_tflops is not None else [])


def _read_figures(row: Row) -> list[tuple[float, str]]:
    return [(row.achieved_gbps, "by latency")] if row.achieved_gbps is not None and row.bytes_moved else []


def _references(
    rows: list[Row], key: Callable[[Row], Hashable], figures: Figures, kind: str
) -> dict[Hashable, Reference]:
    """Each group's Reference (`kind` "matmul": the rows' `peak_tflops`; "read": `peak_read_gbps`), for the
    groups whose rows have a measured ceiling."""
    groups: dict[Hashable, list[Row]] = {}
    for row in rows:
        if _measured(row, kind):
            groups.setdefault(key(row), []).append(row)
    found = {}
    for group, members in groups.items():
        measured = max(_measured(r, kind) or 0.0 for r in members)
        found[group] = Reference(measured, measured)
        achieved = [(value, index, how) for index, r in enumerate(members) for value, how in figures(r)]
        if achieved and (best := max(achieved))[0] > measured:
            value, index, how = best
            found[group] = Reference(value, measured, _raised_note(kind, value, measured, members[index], how))
    return found


def _measured(row: Row, kind: str) -> float | None:
    return row.peak_tflops if kind == "matmul" else row.peak_read_gbps if row.bytes_moved else None


def _raised_note(kind: str, best: float, measured: float, row: Row, how: str) -> str:
    """One sentence: the raised reference, whose figure it is, and the measured ceiling it replaced."""
    whose = f"{row.variant} at {cell_label(row)}"
    if kind == "matmul":
        return (
            f"% of peak is of {best:.3g} TFLOP/s ({whose}, {how}), above the {row.dtype} matmul "
            f"measured on {row.device} ({measured:.3g} TFLOP/s)"
        )
    return (
        f"% of read BW is of {best:.3g} GB/s ({whose}), above the read bandwidth measured on "
        f"{row.device} ({measured:.3g} GB/s)"
    )
