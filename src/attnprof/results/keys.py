"""The key that matches a row to its cell across runs, ranks and files: `RunSpec.cell_key` of a row."""

from __future__ import annotations

from typing import Any

from attnprof.results.schema import Row


def cell_key(row: Row) -> tuple[Any, ...]:
    """`RunSpec.cell_key` of a row: device type, dtype, shape, mask, mode, lengths and page size (a q_len or
    kv_len equal to seq, or missing in rows written before decode existed, is None, as RunSpec keeps it)."""
    return (
        str(row.device).split(":", 1)[0],
        row.dtype,
        row.batch,
        row.heads,
        row.kv_heads,
        row.seq,
        row.head_dim,
        row.causal,
        row.mode or "fwd",
        row.mask or ("causal" if row.causal else "none"),
        row.score_mod or None,
        None if row.q_len == row.seq else row.q_len,
        None if row.kv_len == row.seq else row.kv_len,
        row.page_size or None,
    )
