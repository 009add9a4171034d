"""Typed rows (`results.schema.Row`) for the renderers' tests, built from live trace analyses."""

from __future__ import annotations

from typing import Any

from attnprof.results.schema import Row


def analysed_row(analysis: Any, **fields: Any) -> Row:
    """A row holding a live trace analysis's part (`results.records.analysis_record`: the fields of the same
    names, the attention ledger's flat figures beside it) and `fields` (variant, seq, mode, timing, ...)."""
    from attnprof.results.records import analysis_record

    record = analysis_record(analysis)
    shared = {name: getattr(record, name) for name in record.__struct_fields__ if name in Row.__struct_fields__}
    ledger = record.attention
    if ledger is not None:
        shared |= {
            "attention_calls_per_forward": ledger.calls_per_forward,
            "attention_backends": ledger.backends_text,
            "attention_impl": ledger.attention_impl,
            "attention_time_us": ledger.kernel_time_us,
            "attention_gpu_pct": ledger.gpu_time_pct,
            "attention_overhead_us": ledger.overhead_us,
            "kernel_gbps": ledger.achieved_gbps,
        }
    shared["trace_device"] = shared.pop("device")
    return Row(**(shared | fields))
