"""Each fp8 row of a run beside the fastest bf16 row of its shape and mode (`attach_fp8_comparisons`).

After a run, its timed cell rows are grouped by cell without the dtype (`results.keys.cell_key`). Where a
group holds fp8 rows (`fp8`, `fp8_e5m2`) and bf16 rows, each fp8 row is judged against the bf16 row of the
lowest latency (timed without the profiler; the fp8 quantization is outside it): `fp8-not-faster` when it
is slower (`analysis.findings.fp8`, through the judge). A group without bf16 rows leaves its fp8 rows as
they are.
"""

from __future__ import annotations

from typing import Any

from attnprof.analysis.findings.registry import Fp8AgainstBf16
from attnprof.pipeline.rows import join_fp8_comparison
from attnprof.registry import FP8_DTYPES
from attnprof.results.keys import cell_key
from attnprof.results.schema import Row

BF16 = "bf16"


def _timed(row: Row) -> bool:
    return row.subject == "cell" and row.ok and row.latency_us is not None and row.latency_us > 0


def _shape(row: Row) -> tuple[Any, ...]:
    """The row's cell key less its dtype (the second field)."""
    key = cell_key(row)
    return key[:1] + key[2:]


def attach_fp8_comparisons(rows: list[Row]) -> None:
    """Judge each timed fp8 row against the fastest bf16 row of its shape and mode in `rows` (module docstring)."""
    shapes: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        if _timed(row) and row.dtype in (BF16, *FP8_DTYPES):
            shapes.setdefault(_shape(row), []).append(row)
    for members in shapes.values():
        bf16 = [r for r in members if r.dtype == BF16]
        if not bf16:
            continue
        best = min(bf16, key=lambda r: r.latency_us or 0.0)
        for row in members:
            if row.dtype in FP8_DTYPES:
                against = Fp8AgainstBf16(str(row.dtype), row.latency_us or 0.0, best.variant, best.latency_us or 0.0)
                join_fp8_comparison(row, against)
